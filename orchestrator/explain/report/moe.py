"""The report's MoE section: on an MoE verifier a verify pass of k + 1 tokens reads the union of the
experts those tokens route to, so its cost grows with k far faster than a dense model's (which streams
the same weights for 1 or k + 1 tokens at small batch), the breakeven accepted length rises and the
best k falls. Per drafter and k the study measured: the accepted length, the breakeven (from the
performance model, on the measured width profile where the trials timed one), the breakeven the same k
would have if scoring k + 1 tokens cost what one does ("flat"), and the pass's cost against width 1.
Where a k's accepted length clears the flat breakeven but not the real one, the expert union is what
makes that k lose: said in one sentence.

    s = moe_summary(done, model, cfg); moe_sentences(s); moe_html(s)

A dense verifier (no trial recorded spectune.moe_experts) has no section.
"""

from __future__ import annotations

import html

from orchestrator.record import MOE_EXPERTS_TAG


def moe_summary(done: list, model, cfg, points: list) -> dict | None:
    """{"random_weights", "profiled", "rows": [...], "union_losses": [...]} or None (dense verifier, no model)."""
    if model is None or not any(t.user_attrs.get(MOE_EXPERTS_TAG) for t in done):
        return None
    base = next((p.env for p in points if p.k == 0), None)
    rows = []
    for env, kind, k in sorted({(p.env, p.kind, p.k) for p in points if p.k > 0}):
        if base is not None and env != base and any(q.env == base and q.kind == kind for q in points):
            continue  # one setup speaks for the drafter: the baseline's where the drafter ran there
        accept, be, flat = model.accept_len(kind, k), model.breakeven(env, kind, k), model.flat_breakeven(env, kind, k)
        rows.append(
            {
                "env": env,
                "kind": kind,
                "k": k,
                "accept_len": round(accept, 3),
                "breakeven": round(be, 3),
                "flat_breakeven": round(flat, 3),
                "verify_x_width1": round(model.verify_ms(env, k, kind) / model.verify_ms(env, 0), 3),
                "experts_per_pass": experts_read(done, k + 1),
            }
        )
    profiled = any(len(p.width_ms) >= 2 for p in points)
    return {
        "random_weights": str(cfg.model.path).startswith("random:"),
        "profiled": profiled,
        "rows": rows,
        "union_losses": [r for r in rows if r["flat_breakeven"] < r["accept_len"] < r["breakeven"]],
    }


def experts_read(done: list, width: int) -> float | None:
    """The distinct routed experts per layer a pass of `width` tokens read (the trials' moe_experts_w<W>,
    counted over their own decoded tokens, the model's: workers/engine/experts.py; a trial under imposed
    acceptance counts none), median over trials; None unrecorded."""
    values = sorted(float(t.user_attrs[key]) for t in done if (key := f"moe_experts_w{width}") in t.user_attrs)
    return round(values[len(values) // 2], 2) if values else None


def moe_sentences(s: dict | None) -> list[str]:
    if not s or not s["rows"]:
        return []
    how = "the trials' measured width profile" if s["profiled"] else "a line through the trials' widths (no width profile was timed)"
    # the deepest k's pass under the drafter that leaves least of its own work in it (an in-rank head's
    # feed is timed with the pass): the experts' union and the width, not the drafter
    deepest = max(r["k"] for r in s["rows"])
    widest = min((r for r in s["rows"] if r["k"] == deepest), key=lambda r: r["verify_x_width1"])
    out = [
        f"MoE verifier: a verify pass of {widest['k'] + 1} tokens costs x{widest['verify_x_width1']:.2f} one token's ({how}, "
        f"under {widest['kind']}): its tokens route to more distinct experts, so each deeper k must accept more to break even."
    ]
    read = {r["k"]: r["experts_per_pass"] for r in s["rows"] if r.get("experts_per_pass") is not None}
    if read:
        out.append(
            "  Distinct routed experts a verify pass read, per layer (counted over the decoded tokens): "
            + ", ".join(f"{k + 1} tokens {v:.1f}" for k, v in sorted(read.items()))
            + "."
        )
    for kind in sorted({r["kind"] for r in s["rows"]}):
        mine = [r for r in s["rows"] if r["kind"] == kind]
        out.append(f"  {kind}: breakeven accepted length by k: " + ", ".join(f"k={r['k']} {r['breakeven']:.2f}" for r in mine))
    for r in s["union_losses"]:
        out.append(
            f"  {r['kind']} k={r['k']} accepts {r['accept_len']:.2f}: above the {r['flat_breakeven']:.2f} it would need if scoring "
            f"{r['k'] + 1} tokens cost what one does, below its breakeven {r['breakeven']:.2f}: the expert union is what makes k={r['k']} lose."
        )
    if s["random_weights"]:
        out.append(
            "  Random weights route tokens almost uniformly, so the union of experts per pass is larger here than real text's: "
            "measure a real checkpoint before trusting the best k."
        )
    return out


def _one_decimal(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def moe_html(s: dict | None) -> str:
    lines = moe_sentences(s)
    if not lines:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(r['kind'])}</td><td>{r['k']}</td><td>{r['accept_len']:.2f}</td><td>{r['breakeven']:.2f}</td>"
        f"<td>{r['flat_breakeven']:.2f}</td><td>x{r['verify_x_width1']:.2f}</td>"
        f"<td>{_one_decimal(r.get('experts_per_pass'))}</td></tr>"
        for r in s["rows"]
    )
    return (
        "<h2>MoE verifier: the verify pass against its width</h2>"
        + "".join(f"<p>{html.escape(line.strip())}</p>" for line in lines)
        + "<table><tr><th>drafter</th><th>k</th><th>accepted length</th><th>breakeven</th>"
        "<th>breakeven if k + 1 tokens cost one</th><th>verify pass / width 1</th><th>experts per pass</th></tr>" + rows + "</table>"
    )
