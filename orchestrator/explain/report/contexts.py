"""The report's context-length section (studies with `workload.context_lengths`): the schedule by batch
size and context bucket (orchestrator/export/schedule.py `by_context`, beside the rows at the prompts'
own lengths), and in words where the best k or drafter moves as the context grows: each decode step's
attention reads the whole KV cache, so a longer context makes every step, plain or verify, costlier
by the same bytes, and a verify pass of k + 1 tokens reads them once for all its tokens.

    s = context_summary(schedule, prompt_tokens); context_sentences(s); context_html(s)
"""

from __future__ import annotations

import html


def _what(row: dict) -> str:
    return "plain decoding" if row["num_draft_tokens"] == 0 else f"{row['drafter']} k={row['num_draft_tokens']}"


def context_summary(schedule: dict, prompt_tokens: int | None) -> dict | None:
    """None for a study without context buckets; else {"rows": one per batch size and context (None: the
    prompts as they are, `prompt_tokens` the median length), "prompt_tokens", "noise_rel"}."""
    if not schedule.get("by_context"):
        return None
    rows = sorted(schedule["schedule"] + schedule["by_context"], key=lambda r: (r["batch_size"], r["context_len"] or 0))
    return {"rows": rows, "prompt_tokens": prompt_tokens, "noise_rel": schedule.get("noise_rel")}


def _context_words(context: int | None, prompt_tokens: int | None) -> str:
    if context is not None:
        return f"context {context}"
    return f"the prompts' own lengths (median {prompt_tokens} tokens)" if prompt_tokens else "the prompts' own lengths"


def context_sentences(s: dict) -> list[str]:
    """Per batch size: the best configuration at the shortest and the longest context, and whether it moved."""
    out = []
    for batch in sorted({r["batch_size"] for r in s["rows"]}):
        rows = [r for r in s["rows"] if r["batch_size"] == batch]
        short, long = rows[0], rows[-1]
        at = f"At batch size {batch}" if batch > 1 or len({r["batch_size"] for r in s["rows"]}) > 1 else "At batch 1"
        speed = f" ({long['speedup_vs_plain']:.2f}x plain)" if long.get("speedup_vs_plain") else ""
        if _what(short) == _what(long):
            out.append(
                f"{at} the best configuration is the same from {_context_words(short['context_len'], s['prompt_tokens'])} "
                f"to {_context_words(long['context_len'], s['prompt_tokens'])}: {_what(long)}{speed}."
            )
        else:
            out.append(
                f"{at} the best configuration moves from {_what(short)} at {_context_words(short['context_len'], s['prompt_tokens'])} "
                f"to {_what(long)}{speed} at {_context_words(long['context_len'], s['prompt_tokens'])}."
            )
    out.append(
        "Each context bucket's prompts are drawn to exactly that many tokens from the workload's other prompts "
        "(held-out text); every bucket is measured once per trial, after the batch-1 repeats. Engines take their "
        "speculation settings by batch size only: the exports carry the schedule at the prompts' own lengths, "
        "and schedule.json (spectune export --to json) carries every bucket."
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
            f"<tr><td>{r['batch_size']}</td><td>{e(ctx)}</td><td>{e(_what(r))}, tp {r['tp']}, {e(r['backend'])}</td>"
            f"<td>{r['throughput_tok_s']:.2f}</td><td>{plain}</td><td>{speed}</td><td>{e(', '.join(map(str, r['trials'])))}</td></tr>"
        )
    notes = "<br>".join(e(x) for x in context_sentences(s))
    return f'<h2>Context length</h2><p class="verdict" id="context-verdict">{notes}</p><table id="context-schedule">{head}{"".join(body)}</table>'
