"""The report's context-length section (studies with `workload.context_lengths`): the schedule by batch
size and context bucket (orchestrator/export/schedule.py `by_context`, beside the rows at the prompts'
own lengths), and in words where the best k or drafter moves as the context grows: each decode step's
attention reads the whole KV cache, so a longer context makes every step, plain or verify, costlier
by the same bytes, and a verify pass of k + 1 tokens reads them once for all its tokens.

    s = context_summary(schedule, prompt_tokens); context_sentences(s); context_html(s)
"""

from __future__ import annotations

import html

from orchestrator.export.schedule import config_words


def context_summary(schedule: dict, prompt_tokens: int | None) -> dict | None:
    """None for a study without context buckets; else {"rows": one per batch size and context (None: the
    prompts as they are, `prompt_tokens` their median length), by batch size and then length, "prompt_tokens",
    "noise_rel"}."""
    if not schedule.get("by_context"):
        return None

    def length(r: dict) -> int:
        return r["context_len"] if r["context_len"] is not None else (prompt_tokens or 0)

    rows = sorted(schedule["schedule"] + schedule["by_context"], key=lambda r: (r["batch_size"], length(r)))
    return {"rows": rows, "prompt_tokens": prompt_tokens, "noise_rel": schedule.get("noise_rel")}


def _context_words(context: int | None, prompt_tokens: int | None) -> str:
    if context is not None:
        return f"context {context}"
    return f"the prompts' own lengths (median {prompt_tokens} tokens)" if prompt_tokens else "the prompts' own lengths"


def _clear_lead(row: dict, noise_rel: float | None) -> bool:
    """The cell's winner leads its runner-up by more than twice the noise of one measurement (a cell is
    measured once per trial); no runner-up or no noise measured: taken as it stands."""
    other = row.get("runner_up")
    if not other or noise_rel is None:
        return True
    return row["throughput_tok_s"] - other["throughput_tok_s"] > 2 * noise_rel * row["throughput_tok_s"]


def context_sentences(s: dict) -> list[str]:
    """Per batch size: the best configuration at the shortest and at the longest context, whether it moved,
    and whether the lead at the long end is more than the noise."""
    out = []
    sizes = sorted({r["batch_size"] for r in s["rows"]})
    for batch in sizes:
        rows = [r for r in s["rows"] if r["batch_size"] == batch]
        short, long = rows[0], rows[-1]
        at = f"At batch size {batch}"
        speed = f" ({long['speedup_vs_plain']:.2f}x plain)" if long.get("speedup_vs_plain") else ""
        first, last = _context_words(short["context_len"], s["prompt_tokens"]), _context_words(long["context_len"], s["prompt_tokens"])
        if config_words(short) == config_words(long):
            line = f"{at} the best configuration is the same at {first} and at {last}: {config_words(long)}{speed}."
        else:
            line = f"{at} the best configuration moves from {config_words(short)} at {first} to {config_words(long)}{speed} at {last}."
        if not _clear_lead(long, s["noise_rel"]):
            other = long["runner_up"]
            line += f" At {last} its lead over {config_words(other)} is within the noise of one measurement: not a finding."
        out.append(line)
    out.append(
        "Each context bucket's prompts are drawn to exactly that many tokens from the workload's other prompts; every "
        "cell is measured once per trial, after the batch-1 repeats, and ranked by throughput with the prefill (which a "
        "long context makes most of the time). Engines take their speculation settings by batch size only: the exports "
        "carry the schedule at the prompts' own lengths, and schedule.json (spectune export --to json) every bucket."
    )
    return out


def context_html(s: dict | None) -> str:
    if s is None:
        return ""
    e = html.escape
    head = "<tr><th>batch</th><th>context</th><th>best configuration</th><th>tok/s</th><th>plain tok/s</th><th>speedup</th><th>trials</th></tr>"
    body = []
    for r in s["rows"]:
        ctx = str(r["context_len"]) if r["context_len"] is not None else f"prompts ({s['prompt_tokens'] or '?'})"
        plain = f"{r['plain_throughput_tok_s']:.2f}" if r["plain_throughput_tok_s"] else "-"
        speed = f"{r['speedup_vs_plain']:.2f}x" if r["speedup_vs_plain"] else "-"
        body.append(
            f"<tr><td>{r['batch_size']}</td><td>{e(ctx)}</td><td>{e(config_words(r))}, tp {r['tp']}, {e(r['backend'])}</td>"
            f"<td>{r['throughput_tok_s']:.2f}</td><td>{plain}</td><td>{speed}</td><td>{e(', '.join(map(str, r['trials'])))}</td></tr>"
        )
    notes = "<br>".join(e(x) for x in context_sentences(s))
    return f'<h2>Context length</h2><p class="verdict" id="context-verdict">{notes}</p><table id="context-schedule">{head}{"".join(body)}</table>'
