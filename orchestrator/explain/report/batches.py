"""The report's batch-size section (studies with `workload.batch_sizes` beyond 1): the schedule
(orchestrator/export/schedule.py) with throughput (prefill included) and decode rate (decode steps
only) at each batch size and which of the two it ranks by and why, throughput against batch size per
configuration (a chart), the batch size where speculation stops paying, and where the best allreduce
backend changes, with the allreduce message at that batch size: B x (k + 1) tokens x hidden size x
bytes per element.
"""

from __future__ import annotations

import html

import numpy as np

from orchestrator.export.schedule import (
    RANKED_BY_WHY,
    batch_sizes_of,
    build_schedule,
    config_words,
    speculation_stops_paying,
    throughputs,
)
from orchestrator.search.ranking import complete_trials, config_key, trial_params
from orchestrator.tracking.runs import config_label

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_LINES = 8  # configurations drawn (the best at batch 1, and the best plain one)


def message_bytes(batch: int, k: int, hidden: int, dtype: str) -> int:
    """One row-parallel allreduce of a verify pass: every token's hidden state."""
    return batch * (k + 1) * hidden * BYTES.get(dtype, 2)


def batch_summary(study, hidden: int | None, dtype: str) -> dict | None:
    """None for a batch-1 study; else {"schedule", "speculation_stops_paying_at", "backend_changes"}."""
    sched = build_schedule(study, dtype=dtype)
    rows = sched["schedule"]
    if len(rows) < 2:
        return None
    changes = []
    for a, b in zip(rows, rows[1:]):
        if a["backend"] != b["backend"]:
            size = message_bytes(b["batch_size"], b["num_draft_tokens"], hidden, dtype) if hidden else None
            changes.append(
                {
                    "from_batch": a["batch_size"],
                    "to_batch": b["batch_size"],
                    "from": a["backend"],
                    "to": b["backend"],
                    "message_bytes": size,
                }
            )
    return {
        "schedule": rows,
        "ranked_by": sched["ranked_by"],
        "noise_rel": sched["noise_rel"],
        "speculation_stops_paying_at": speculation_stops_paying(rows, sched["noise_rel"]),
        "backend_changes": changes,
    }


def _lines(study) -> tuple[list[int], list[tuple[str, bool, list[float | None]]]]:
    """Batch sizes and, per configuration drawn, (label, plain?, median throughput at each size)."""
    done = complete_trials(study.trials)
    groups: dict[str, list] = {}
    for t in done:
        groups.setdefault(config_key(trial_params(t)), []).append(t)
    sizes = batch_sizes_of(done)
    lines = []
    for trials in groups.values():
        params = trial_params(trials[0])
        values: list[float | None] = []
        for b in sizes:
            xs = throughputs(trials, b)
            values.append(float(np.median(xs)) if xs else None)
        lines.append((config_label(params), int(params.get("spec.num_draft_tokens", 0)) == 0, values))
    lines.sort(key=lambda line: -(line[2][0] or 0))
    shown = lines[:MAX_LINES]
    plain = next((line for line in lines if line[1]), None)
    if plain is not None and plain not in shown:
        shown = shown[: MAX_LINES - 1] + [plain]
    return sizes, shown


def batch_chart(study) -> bytes | None:
    from orchestrator.explain.report.charts import PLAIN, _plt, png

    sizes, lines = _lines(study)
    if len(sizes) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.6))
    for label, plain, values in lines:
        pts = [(b, v) for b, v in zip(sizes, values) if v is not None]
        style = {"color": PLAIN, "ls": "--", "lw": 2} if plain else {}
        ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", label=label + (" (plain)" if plain else ""), **style)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set(
        xlabel="batch size (sequences per verify pass)", ylabel="throughput_tok_s", title="throughput against batch size, per configuration"
    )
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return png(fig)


def batch_sentences(s: dict) -> list[str]:
    out = []
    stop = s["speculation_stops_paying_at"]
    last = s["schedule"][-1]["batch_size"]
    if stop is None:
        out.append(f"Speculation pays at every measured batch size (up to {last}).")
    else:
        row = next(r for r in s["schedule"] if r["batch_size"] == stop)
        why = (
            "plain decoding is the best configuration measured there"
            if row["num_draft_tokens"] == 0
            else f"its best configuration ({row['drafter']} k={row['num_draft_tokens']}, {row['speedup_vs_plain']:.3f}x plain) is within noise of plain decoding"
        )
        out.append(f"Speculation stops paying at batch size {stop}: {why}.")
    for c in s["backend_changes"]:
        size = f" (allreduce message {c['message_bytes'] / 1024:.0f} KiB at batch {c['to_batch']})" if c["message_bytes"] else ""
        out.append(
            f"The best allreduce backend changes from {c['from']} at batch {c['from_batch']} to {c['to']} at batch {c['to_batch']}{size}."
        )
    if not s["backend_changes"]:
        out.append("The best configuration's allreduce backend is the same at every batch size.")
    out.append(f"The schedule ranks configurations by throughput (generated tokens over wall time, prefill included): {RANKED_BY_WHY}.")
    return out


def batch_html(s: dict | None) -> str:
    if s is None:
        return ""
    e = html.escape
    head = (
        "<tr><th>batch</th><th>best configuration</th><th>tok/s</th><th>+-</th><th>plain tok/s</th><th>speedup</th>"
        "<th>decode tok/s</th><th>plain decode tok/s</th><th>decode speedup</th><th>trials</th></tr>"
    )
    body = []
    for r in s["schedule"]:
        what = config_words(r)
        band = f"{r['noise_band_tok_s']:.2f}" if r["noise_band_tok_s"] is not None else "?"
        plain = f"{r['plain_throughput_tok_s']:.2f}" if r["plain_throughput_tok_s"] else "-"
        speed = f"{r['speedup_vs_plain']:.2f}x" if r["speedup_vs_plain"] else "-"
        dec, plain_dec, dec_speed = (r.get(key) for key in ("decode_tok_s", "plain_decode_tok_s", "decode_speedup_vs_plain"))
        body.append(
            f"<tr><td>{r['batch_size']}</td><td>{e(what)}, tp {r['tp']}, {e(r['backend'])}</td><td>{r['throughput_tok_s']:.2f}</td>"
            f"<td>{band}</td><td>{plain}</td><td>{speed}</td><td>{f'{dec:.2f}' if dec else '-'}</td>"
            f"<td>{f'{plain_dec:.2f}' if plain_dec else '-'}</td><td>{f'{dec_speed:.2f}x' if dec_speed else '-'}</td>"
            f"<td>{e(', '.join(map(str, r['trials'])))}</td></tr>"
        )
    notes = "<br>".join(e(x) for x in batch_sentences(s))
    return (
        f'<h2>Batch sizes</h2><p class="verdict" id="batch-verdict">{notes}</p>'
        f'<table id="batch-schedule">{head}{"".join(body)}</table>'
        '<p class="note">Batch 1 pools each configuration\'s repeats; a larger batch size is measured once per trial. '
        "tok/s: throughput, prefill included (what the schedule ranks by); decode tok/s: the decode steps alone, the same "
        "trials' median. +-: the study's noise of one measurement (sigma) at that throughput. <code>spectune export</code> "
        "writes this schedule for vLLM, SGLang, TensorRT-LLM or as an NCCL environment file.</p>"
    )
