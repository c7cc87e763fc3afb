"""The report's serving-engine section: the allreduce the winner ran, each engine's setting for it
(orchestrator/export/allreduce.py, the same one `spectune export` writes), and where an engine has no
equivalent, how much of the win that costs: at each batch size, the best configuration the study
measured on a backend the engine has against the winner, both figures and their ratio.

    s = engine_summary(build_schedule(study)); engine_sentences(s); engine_html(s)

A study on gloo alone (a CPU study) has no section: no engine serves on it, and its exports already
open with the line saying its figures do not transfer.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict

from orchestrator.export.allreduce import ENGINE_BACKENDS, allreduce_costs, engine_allreduce
from orchestrator.export.versions import ENGINE_NAMES, ENGINE_VERSIONS


def engine_summary(schedule: dict) -> dict | None:
    """{engine: {"version", "backend", "equivalent", "setting", "choice", "costs": [...]}} for the
    schedule's winners; None for an empty schedule or one measured on gloo alone."""
    rows = sorted(schedule.get("schedule") or [], key=lambda r: int(r["batch_size"]))
    if not rows or {r.get("backend") for r in rows} <= {"gloo"}:
        return None
    out = {}
    for engine, name in ENGINE_NAMES.items():
        choice = engine_allreduce(engine, str(rows[0].get("backend")))
        out[engine] = {
            "name": name,
            "version": ENGINE_VERSIONS[engine],
            "backend": choice.backend,
            "equivalent": choice.equivalent,
            "setting": choice.setting,
            "choice": choice.choice,
            "has": list(ENGINE_BACKENDS[engine]),
            "costs": [{**asdict(c), "ratio": None if c.ratio is None else round(c.ratio, 4)} for c in allreduce_costs(rows, engine)],
        }
    return out


def _names(names: list[str], last: str = "and") -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def _cost_clause(c: dict) -> str:
    if c["fallback_tok_s"] is None:
        return f"at batch size {c['batch_size']} the study measured none"
    return (
        f"at batch size {c['batch_size']} the best configuration measured on {c['fallback_backend']} (trial {c['fallback_trial']}) "
        f"reaches {c['fallback_tok_s']:.1f} of the winner's {c['winner_tok_s']:.1f} tok/s ({c['ratio']:.3f}x)"
    )


def engine_sentences(s: dict | None) -> list[str]:
    """The section in words: engines that run the winner's allreduce as it is, and, grouped by what they
    lack (engines with the same backends share a cost), those that do not with what that costs."""
    if not s:
        return []
    out = []
    same = [e["name"] for e in s.values() if e["equivalent"]]
    if same:
        backend = next(e["backend"] for e in s.values() if e["equivalent"])
        out.append(f"{_names(same)} run the winner's allreduce ({backend}) as it is; `spectune export` sets it for each.")
    groups: dict[str, list[dict]] = {}
    for e in (e for e in s.values() if not e["equivalent"]):
        groups.setdefault(json.dumps([e["has"], e["costs"]]), []).append(e)
    for engines in groups.values():
        first = engines[0]
        nearest = _names([f"{e['name']} (nearest: {e['setting']})" for e in engines], "or")
        costs = "; ".join(_cost_clause(c) for c in first["costs"])
        out.append(
            f"The winner's allreduce, {first['backend']}, has no equivalent in {nearest}; on {', '.join(first['has'])}, "
            f"which {'they have' if len(engines) > 1 else 'it has'}, {costs}."
        )
    return out


def engine_html(s: dict | None) -> str:
    """A table engine | version | setting | equivalent | what it costs, and the sentences."""
    if not s:
        return ""
    e_ = html.escape
    head = "<tr><th>engine</th><th>version checked</th><th>its setting for the winner's allreduce</th><th>equivalent</th><th>cost</th></tr>"
    body = []
    for e in s.values():
        cost = "; ".join(
            f"batch {c['batch_size']}: {c['fallback_tok_s']:.1f} / {c['winner_tok_s']:.1f} tok/s = {c['ratio']:.3f}x"
            if c["fallback_tok_s"] is not None
            else f"batch {c['batch_size']}: unmeasured"
            for c in e["costs"]
        )
        body.append(
            f"<tr><td>{e_(e['name'])}</td><td>{e_(e['version'])}</td><td>{e_(e['choice'])}</td>"
            f"<td>{'yes' if e['equivalent'] else 'no'}</td><td>{e_(cost) or '-'}</td></tr>"
        )
    sentences = "<br>".join(e_(x) for x in engine_sentences(s))
    return (
        f'<h2>Serving engines: the allreduce</h2><table id="engine-allreduce">{head}{"".join(body)}</table>'
        f'<p class="note">{sentences} Cost: the best configuration measured on a backend the engine has, over the winner '
        "(the engine's own nearest choice was not measured). <code>spectune export --to vllm|sglang|trtllm|all</code> writes these "
        "settings.</p>"
    )
