"""The report as one self-contained HTML page (charts embedded as PNG data URIs) that fits a
laptop screen: text wraps, tables and images shrink to the page width, nothing scrolls sideways."""

from __future__ import annotations

import base64
import html
import math

from orchestrator.explain.report.batches import batch_html
from orchestrator.explain.report.contexts import context_html
from orchestrator.explain.report.engines import engine_html
from orchestrator.explain.report.moe import moe_html
from orchestrator.explain.report.rows import Row, within_noise
from orchestrator.explain.report.verdict import OBJECTIVE_MEANS, config_loo_sentence, verdict
from orchestrator.record import IMPORTANCE_MIN_TRIALS, OBJECTIVE

CAPTIONS = {
    "objective": f"Every complete trial by configuration, configurations ranked as the study ranks them (the median of every "
    f"repeat of their trials), a configuration's trials together; bars: each trial's {OBJECTIVE}, whiskers: median +- MAD of its repeats.",
    "per_token": "Time per generated token, not per step: each part of the step (p50) divided by the tokens the step emits. "
    "A longer speculative step can still cost less per token. Diamonds: the measured mean, 1000 / decode_tok_s.",
    "breakeven": "Why a configuration wins: speculation with k drafts beats plain decoding exactly when the accepted length "
    "(tokens a step emits) is above breakeven = its step time / the plain step time of the same setup.",
    "throughput_k": f"{OBJECTIVE} against the number of draft tokens, per drafter and allreduce setup (best trial at each k; "
    "k = 0 is plain decoding).",
    "batches": "throughput_tok_s against batch size (sequences decoded together), per configuration: batch 1 pools the "
    "repeats, larger sizes are one run per trial. Where the plain line (dashed) crosses above the others, speculation stops paying.",
    "model": "The performance model predicts decode_tok_s (decode steps only, no prefill) of each trial from a fit on the other "
    "trials; the dashed line is a perfect prediction.",
}
STYLE = """
body{font-family:system-ui,sans-serif;max-width:1080px;margin:1.5em auto;padding:0 1em;line-height:1.45;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
p.verdict{font-size:1.08em;background:#f6f8fb;border-left:4px solid #d8703b;padding:.7em 1em}
table{border-collapse:collapse;width:100%;font-size:.88em} th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f0f0f0} td.l,th.l{text-align:left} td.l{overflow-wrap:break-word;min-width:9em} tr.win td{background:#fdf0e6}
figure{margin:1em 0} figure img{max-width:100%;height:auto} figcaption{font-size:.88em;color:#444}
pre{background:#f4f4f4;padding:.8em;white-space:pre-wrap;overflow-wrap:anywhere}
.note{font-size:.88em;color:#555} li{overflow-wrap:anywhere}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def trials_table(rows: list[Row]) -> str:
    head = (
        f'<tr><th>trial</th><th class="l">configuration</th><th>{OBJECTIVE}</th><th class="l">noise band: median &plusmn; MAD</th>'
        "<th>accepted length</th><th>breakeven</th><th>comm fraction</th><th>ms per token</th><th>decode_tok_s</th></tr>"
    )
    body = []
    best = rows[0]
    for i, r in enumerate(rows):
        band = f"{r.median:.2f} &plusmn; {r.mad:.2f} ({r.repeats} repeats)" if r.median is not None and r.repeats > 1 else "one repeat"
        tie = " (within noise)" if i > 0 and within_noise(best, r) else ""
        be = "" if r.breakeven is None else f"{r.breakeven:.2f}" + (" (model)" if r.breakeven_source == "model" else "")
        parts = f"<td>{sum(r.per_token.values()):.1f}</td>" if r.per_token else "<td></td>"
        dec = "" if r.decode_tok_s is None else f"{r.decode_tok_s:.2f}"
        body.append(
            f'<tr data-trial="{r.number}" class="{"win" if i == 0 else ""}"><td>{r.number}</td><td class="l">{_e(r.label)}{tie}</td>'
            f'<td><b>{r.value:.2f}</b></td><td class="l">{band}</td><td>{r.accept_len:.2f}</td><td>{be}</td><td>{_pct(r.comm_fraction)}</td>'
            f"{parts}<td>{dec}</td></tr>"
        )
    return f'<table id="trials">{head}{"".join(body)}</table>'


def predictions_table(s: dict, labels: dict[int, str]) -> str:
    head = (
        '<tr><th>trial</th><th class="l">configuration</th><th class="l">allreduce term</th><th>measured decode_tok_s</th>'
        '<th>predicted decode_tok_s</th><th>error</th><th class="l">note</th></tr>'
    )
    rows = "".join(
        f'<tr><td>{r["trial"]}</td><td class="l">{_e(labels.get(r["trial"], r["env"]))}</td>'
        f'<td class="l">{r["allreduce_term"]}</td><td>{r["measured_tok_s"]:.2f}</td>'
        f"<td>{r['predicted_tok_s']:.2f}</td><td>{r['rel_error']:+.1%}</td>"
        f'<td class="l">{"" if r["drafter_in_fit"] else "drafter in no other trial: draft time taken as 0"}</td></tr>'
        for r in s["model_loo_predictions"]
    )
    err = s["model_loo_median_rel_error"]
    median = f"<p>median |error| {err:.1%} over {s['model_loo_trials']} held-out trials.</p>" if math.isfinite(err) else ""
    return f'<table id="model-predictions">{head}{rows}</table>{median}'


def config_model_html(s: dict) -> str:
    """Leave one configuration out, and the best untried configurations, labelled predicted."""
    err = s.get("model_config_loo_median_rel_error")
    if err is None:
        return ""
    out = []
    if err == err:
        text = config_loo_sentence(s, lambda figure: f"<b>{figure}</b>")
        out.append(f'<p id="model-config-loo">{text[0].upper()}{text[1:]}.</p>')
    if s["predicted_untried"]:
        head = (
            f'<tr><th class="l">configuration (not measured)</th><th>predicted {OBJECTIVE}</th><th>predicted decode_tok_s</th>'
            '<th>predicted accepted length</th><th class="l">from</th></tr>'
        )
        body = "".join(
            f'<tr><td class="l">{_e(r["label"])}</td><td>{r["predicted_tok_s"]:.2f}</td><td>{r["predicted_decode_tok_s"]:.2f}</td>'
            f'<td>{r["predicted_accept_len"]:.2f}</td><td class="l">{_e(r["how"])}</td></tr>'
            for r in s["predicted_untried"]
        )
        out.append(
            f'<h2>Predicted, not measured</h2><p class="note">The best of the {s["predicted_untried_count"]} configurations no '
            "trial ran that the performance model predicts from measured parts (no assumption for a part no trial measured). "
            f'These are estimates, not results.</p><table id="predicted-untried">{head}{body}</table>'
        )
    if s.get("partly_measured"):
        out.append(partly_measured_html(s["partly_measured"]))
    return "".join(out)


def partly_measured_html(partly: list[dict]) -> str:
    """Configurations only pruned trials ran: measured on their first prompts, then stopped as slower."""
    head = (
        f'<tr><th class="l">configuration</th><th class="l">pruned trials</th><th>{OBJECTIVE} when pruned</th>'
        f"<th>prompts measured</th><th>predicted {OBJECTIVE}</th></tr>"
    )
    body = "".join(
        f'<tr><td class="l">{_e(r["label"])}</td><td class="l">{", ".join(map(str, r["pruned_trials"]))}</td>'
        f"<td>{r['measured_so_far_tok_s']:.2f}</td><td>{r['prompts_measured']}</td>"
        f"<td>{'' if r.get('predicted_tok_s') is None else format(r['predicted_tok_s'], '.2f')}</td></tr>"
        for r in partly
    )
    return (
        f'<h2>Partly measured</h2><p class="note">{len(partly)} configuration{"s" if len(partly) != 1 else ""} ran only in trials the '
        f"pruner stopped as clearly slower after their first prompts: {OBJECTIVE} over the prompts they measured, not a "
        f'complete measurement (the predicted figure, where the model has one, is an estimate).</p><table id="partly-measured">{head}{body}</table>'
    )


def _model_notes(s: dict) -> str:
    items = []
    for env, term in s["allreduce_term"].items():
        items.append(f"allreduce term for {_e(env)}: {term} ({_e(s['allreduce_term_why'][env])})")
    if s["importances"]:
        items.append("parameter importances (Optuna, fANOVA): " + ", ".join(f"{_e(k)} {v:.2f}" for k, v in s["importances"].items()))
    elif s["complete_trials"] < IMPORTANCE_MIN_TRIALS:
        items.append(
            f"parameter importances (Optuna, fANOVA): not computed, they need at least {IMPORTANCE_MIN_TRIALS} complete trials "
            f"and this study has {s['complete_trials']}"
        )
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else ""


def _what_if(s: dict) -> str:
    if not s["what_if"]:
        return ""
    items = "".join(f"<li>{_e(k)}: <b>{_e(v)}</b></li>" for k, v in s["what_if"].items())
    return (
        '<h2>What-if estimates (not measured)</h2><p class="note">Extrapolations from this study\'s measured compute and '
        "allreduce times, for setups it did not run; read them as orders of magnitude, not results.</p>"
        f'<ul id="what-if">{items}</ul>'
    )


def _verdict_html(rows: list[Row], sentences: list[str] | None = None) -> str:
    """The verdict's sentences (the summary's), one a line, the winner's name in bold."""
    lines = [_e(x) for x in (sentences if sentences is not None else verdict(rows))]
    name = _e(rows[0].label)
    lines[0] = lines[0].replace(name, f"<b>{name}</b>", 1)
    return "<br>".join(lines)


def render(study: str, rows: list[Row], s: dict, snippet: str, charts: dict[str, bytes]) -> str:
    def fig(name: str) -> str:
        if name not in charts:
            return ""
        data = base64.b64encode(charts[name]).decode()
        return (
            f'<figure id="plot-{name}"><img alt="{name}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(CAPTIONS[name])}</figcaption></figure>"
        )

    labels = {r.number: r.label for r in rows}
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>spectune report: {_e(study)}</title><style>{STYLE}</style></head>
<body><h1>spectune report: {_e(study)}</h1>
{f'<p class="verdict" id="emulated">{_e(s["emulated"])}</p>' if s.get("emulated") else ""}<p class="verdict" id="verdict">{_verdict_html(rows, s.get("verdict"))}</p>
<p class="note">{_e(OBJECTIVE_MEANS)}</p>
<h2>Trials</h2>{trials_table(rows)}
<p class="note">Ms per token: the step's p50 time over its accepted length (split by part in the chart below).
Breakeven: the accepted length at which this configuration's step pays for itself, its step time over the
plain step of the same allreduce setup ("model": estimated, no plain trial of that setup). Comm fraction: allreduce time per
step (the step timed with and without its allreduces) over the step time.</p>
{fig("objective")}{fig("per_token")}
<h2>Why: accepted length against breakeven</h2>{fig("breakeven")}
<h2>Throughput against k</h2>{fig("throughput_k")}
{batch_html(s.get("batches"))}{fig("batches")}
{context_html(s.get("contexts"))}
{engine_html(s.get("engines"))}
{moe_html(s.get("moe"))}
<h2>Performance model</h2>{fig("model")}{predictions_table(s, labels)}{_model_notes(s)}
{config_model_html(s)}
{_what_if(s)}
<h2>Best configuration</h2><p class="note">The experiment pinned to the winner, for <code>spectune run</code> or
<code>spectune export</code>:</p><pre id="best-config">{_e(snippet)}</pre>
</body></html>
"""
