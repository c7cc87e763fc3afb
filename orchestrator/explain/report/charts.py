"""The report's charts (matplotlib, PNG bytes), each labelled by configuration:

objective      throughput_tok_s per trial, with its noise band, winner highlighted
per_token      ms per generated token: draft / verify compute / allreduce / rest
breakeven      accepted length against breakeven, per drafter and k (why a config wins or loses)
throughput_k   throughput_tok_s against k, per drafter and allreduce setup
model          the performance model's held-out predictions (decode tok/s)
"""

from __future__ import annotations

import io

from orchestrator.explain.report.rows import PARTS, Row
from orchestrator.record import OBJECTIVE

WIN, OTHER, PLAIN = "#d8703b", "#3b7dd8", "#888888"
PART_COLORS = {"draft": "#3bb37d", "verify compute": "#3b7dd8", "allreduce": "#d83b3b", "rest": "#aaaaaa"}
MAX_BARS = 14  # per-trial bar charts show the best trials (and the plain baseline) up to this many


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    _plt().close(fig)
    return buf.getvalue()


def _shown(rows: list[Row]) -> list[Row]:
    """The best MAX_BARS rows plus the best plain one, best first."""
    shown = rows[:MAX_BARS]
    plain = next((r for r in rows if r.k == 0), None)
    if plain is not None and plain not in shown:
        shown = shown[: MAX_BARS - 1] + [plain]
    return shown


def objective_chart(rows: list[Row]) -> bytes:
    plt = _plt()
    shown = _shown(rows)
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.38 * len(shown)))
    ys = list(range(len(shown)))[::-1]
    lo = [r.value - r.band[0] if r.band[0] < r.value else 0.0 for r in shown]
    hi = [r.band[1] - r.value for r in shown]
    colors = [WIN if i == 0 else PLAIN if r.k == 0 else OTHER for i, r in enumerate(shown)]
    ax.barh(ys, [r.value for r in shown], color=colors, xerr=[lo, hi], capsize=3, error_kw={"elinewidth": 1})
    ax.set_yticks(ys, [f"{r.label}  (#{r.number})" for r in shown], fontsize=8)
    for y, r in zip(ys, shown):
        ax.text(r.band[1], y, f" {r.value:.2f}", va="center", fontsize=7)
    ax.set(
        xlabel=f"{OBJECTIVE} (objective; whiskers: median +- MAD over repeats)",
        title="trials by objective (winner orange, plain decoding grey)",
    )
    ax.set_xlim(0, max(r.band[1] for r in shown) * 1.15)
    return png(fig)


def per_token_chart(rows: list[Row]) -> bytes | None:
    shown = [r for r in _shown(rows) if r.per_token]
    if not shown:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 1.1 + 0.38 * len(shown)))
    ys = list(range(len(shown)))[::-1]
    left = [0.0] * len(shown)
    for part in PARTS:
        vals = [r.per_token.get(part, 0.0) for r in shown]
        ax.barh(ys, vals, left=left, color=PART_COLORS[part], label=part)
        left = [a + b for a, b in zip(left, vals)]
    measured = [(y, 1000.0 / r.decode_tok_s) for y, r in zip(ys, shown) if r.decode_tok_s]
    if measured:
        ax.scatter(
            [m for _, m in measured],
            [y for y, _ in measured],
            marker="D",
            color="black",
            s=14,
            zorder=3,
            label="1000 / decode_tok_s (mean)",
        )
    ax.set_yticks(ys, [f"{r.label}  (#{r.number})" for r in shown], fontsize=8)
    ax.set(xlabel="ms per generated token (step p50 parts / accepted length)", title="where the time of one generated token goes")
    ax.legend(fontsize=7, loc="lower right", ncol=5)
    ax.set_ylim(-1.3, len(shown) - 0.4)
    return png(fig)


def breakeven_chart(rows: list[Row], model) -> bytes | None:
    """Accepted length (markers, measured) and breakeven (dashed, per drafter) against k: a
    configuration beats plain decoding exactly where its marker sits above its drafter's line."""
    spec = [r for r in rows if r.k > 0]
    if not spec:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.6))
    kinds = sorted({r.kind for r in spec})
    colors = dict(zip(kinds, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    ks = sorted({r.k for r in spec})
    for kind in kinds:
        mine = sorted((r for r in spec if r.kind == kind), key=lambda r: r.k)
        ax.scatter([r.k for r in mine], [r.accept_len for r in mine], color=colors[kind], s=28, zorder=3, label=f"{kind}: accepted length")
        if model is not None and kind in model.kinds:
            for env in model.envs:
                ax.plot(
                    ks,
                    [model.breakeven(env, kind, k) for k in ks],
                    "--",
                    marker="_",
                    ms=16,
                    color=colors[kind],
                    lw=1,
                    label=f"{kind}: breakeven on {env} (model)",
                )
        pts = sorted((r.k, r.breakeven) for r in mine if r.breakeven and r.breakeven_source == "measured")
        if pts:
            ax.scatter(
                [k for k, _ in pts],
                [b for _, b in pts],
                marker="x",
                color=colors[kind],
                s=30,
                label=f"{kind}: breakeven measured (step / plain step)",
            )
    best = rows[0]
    if best.k > 0:
        ax.annotate(f"winner: {best.label}", (best.k, best.accept_len), xytext=(6, 6), textcoords="offset points", fontsize=7)
    ax.axhline(1.0, color="#cccccc", lw=0.8)
    ax.set(
        xlabel="k (draft tokens per step)",
        ylabel="tokens per step",
        title="accepted length against breakeven: above the line, speculation pays",
    )
    ax.set_xticks(ks)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return png(fig)


def throughput_k_chart(rows: list[Row]) -> bytes:
    """Best objective at each k per (drafter, allreduce setup); k = 0 is plain decoding of that setup."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.6))
    plain = {r.env: r for r in rows[::-1] if r.k == 0}  # best plain trial per setup
    groups = sorted({(r.kind, r.env) for r in rows if r.k > 0})
    for kind, env in groups:
        best_at: dict[int, Row] = {}
        for r in rows:
            if r.kind == kind and r.env == env and (r.k not in best_at or r.value > best_at[r.k].value):
                best_at[r.k] = r
        if env in plain:
            best_at.setdefault(0, plain[env])
        ks = sorted(best_at)
        ax.errorbar(
            ks,
            [best_at[k].value for k in ks],
            marker="o",
            capsize=3,
            label=f"{kind} on {env}",
            yerr=[
                [best_at[k].value - min(best_at[k].band[0], best_at[k].value) for k in ks],
                [best_at[k].band[1] - best_at[k].value for k in ks],
            ],
        )
    for env, r in plain.items():
        ax.axhline(r.value, color=PLAIN, ls=":", lw=1)
        ax.text(0, r.value, f" plain {env}", fontsize=7, va="bottom", color="#555555")
    ax.set(xlabel="k (draft tokens per step)", ylabel=f"{OBJECTIVE}", title="throughput against k, per drafter and allreduce setup")
    ax.set_xticks(sorted({r.k for r in rows} | {0}))
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return png(fig)


def model_chart(preds, rows: list[Row]) -> bytes | None:
    if not preds:
        return None
    plt = _plt()
    labels = {r.number: r.label for r in rows}
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    xs, ys = [p.throughput for p, _, _ in preds], [v for _, v, _ in preds]
    ax.scatter(xs, ys, s=18)
    for (p, v, _), x in zip(preds, xs):
        ax.annotate(labels.get(p.trial, f"#{p.trial}"), (x, v), xytext=(3, 3), textcoords="offset points", fontsize=6)
    lim = [0, max(xs + ys) * 1.15]
    ax.plot(lim, lim, "k--", lw=1)
    ax.set(
        xlim=lim,
        ylim=lim,
        xlabel="measured decode_tok_s",
        ylabel="predicted, trial left out of the fit",
        title="performance model check (decode tok/s)",
    )
    return png(fig)


def all_charts(rows: list[Row], model, preds) -> dict[str, bytes]:
    """name -> PNG bytes, in the order the report shows them (missing ones left out)."""
    out = {
        "objective": objective_chart(rows),
        "per_token": per_token_chart(rows),
        "breakeven": breakeven_chart(rows, model),
        "throughput_k": throughput_k_chart(rows),
        "model": model_chart(preds, rows),
    }
    return {k: v for k, v in out.items() if v is not None}
