"""The report's words: the verdict paragraph (who wins and why, in sentences) and the terminal text.

The verdict names the winner by configuration, its objective with the noise band, its accepted
length against the breakeven of its setup, the allreduce share of its step, and the runner-up
with whether the two can be told apart. It calls the winner clear only outside the noise band, from
at least two trials of it, and with no configuration measured only beside other trials on its
host (orchestrator/search/ranking.py's rule: such a timing is a lower bound).
"""

from __future__ import annotations

from orchestrator.explain.report.rows import Row, within_noise
from orchestrator.record import IMPORTANCE_MIN_TRIALS, OBJECTIVE
from orchestrator.search.ranking import MIN_CLEAR_TRIALS, simplicity, why_simpler

OBJECTIVE_MEANS = (
    f"{OBJECTIVE} is the study's objective: generated tokens per second of wall time, prompt prefill "
    "included, the median over the trial's repeats minus study.mad_penalty x their MAD (one repeat: "
    "the value itself). decode_tok_s, where shown, counts decode steps only (no prefill): it is what "
    "the performance model predicts, and it is higher than " + OBJECTIVE + ". Everything above the batch-size "
    "section is at batch size 1 with the prompts as they are; with workload.batch_sizes or "
    "workload.context_lengths, Optuna's objective is the geometric mean of the throughput over the measured "
    "cells (batch sizes x context buckets)."
)


def value_text(r: Row) -> str:
    if r.repeats > 1 and r.median is not None:
        return f"{r.value:.2f} tok/s (median {r.median:.2f} +- {r.mad:.2f} MAD over {r.repeats} repeats)"
    return f"{r.value:.2f} tok/s (one repeat, no noise band)"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def _spec(r: Row) -> dict:
    return {"spec.num_draft_tokens": r.k, "drafter.kind": r.kind}


def _why(r: Row) -> tuple[float, float | None, float | None]:
    """(accepted length, breakeven, comm fraction) of `r`'s configuration, pooled over its trials where
    `rows_of` pooled them, else the row's own."""
    accept = r.why_accept_len if r.why_accept_len is not None else r.accept_len
    breakeven = r.why_breakeven if r.why_breakeven is not None else r.breakeven
    comm = r.why_comm_fraction if r.why_comm_fraction is not None else r.comm_fraction
    return accept, breakeven, comm


def _over(r: Row) -> str:
    return f" (medians over its {len(r.pooled_trials)} trials)" if len(r.pooled_trials) > 1 else ""


def _key(r: Row):
    return r.config if r.config is not None else ("trial", r.number)


def disturbed(rows: list[Row]) -> list[list[Row]]:
    """The configurations (their rows) every trial of which ran beside another trial on its host, in
    the rows' order: their timings are a lower bound (orchestrator/search/ranking.py's rule)."""
    groups: dict[object, list[Row]] = {}
    for r in rows:
        groups.setdefault(_key(r), []).append(r)
    return [g for g in groups.values() if all(r.co_running for r in g)]


def _trials(r: Row) -> int:
    """Trials of the row's configuration the ranking pooled (its own, where it was not pooled)."""
    return max(1, len(r.pooled_trials))


def verdict(rows: list[Row], noise_one_gang: bool | None = None) -> list[str]:
    """Sentences of the first paragraph (plain text; the HTML page escapes them). `noise_one_gang`: the
    ranking's (the noise band came from one gang only)."""
    best = rows[0]
    plain = next((r for r in rows if r.k == 0), None)
    # configurations the measurements cannot tell from the winner (one row each): a tie, not a win
    ties, seen = [], {best.config if best.config is not None else ("trial", best.number)}
    for r in rows[1:]:
        key = r.config if r.config is not None else ("trial", r.number)
        if r.within_noise and key not in seen:
            ties.append(r)
            seen.add(key)
    # the speedup is the ranking's (pooled medians over the plain baseline's), the figure `run` and `export`
    # print; a ratio of this row's value only where the ranking has none
    speedup = best.pooled_speedup if best.pooled_speedup else (best.value / plain.value if plain else None)
    out = [
        f"{best.label} {'leads' if ties else 'wins'} ({best.trials_text}): {OBJECTIVE} {value_text(best)}"
        + (f", {speedup:.2f}x plain decoding ({plain.value:.2f})." if plain and best is not plain and speedup else ".")
    ]
    beside_only = disturbed(rows)
    if best.co_running and any(best in g for g in beside_only):  # isolation gpu or none: its timing may include theirs
        out.append(
            f"It was measured while trial{'s' if len(best.co_running) > 1 else ''} {', '.join(map(str, best.co_running))} "
            "ran on the same host (study.isolation), so its timing may include their interference: re-measure it alone "
            "before trusting a win."
        )
    if len(best.pooled_trials) > 1 and best.pooled_median is not None:
        times = f", {best.pooled_speedup:.2f}x plain decoding's" if best.pooled_speedup else ""
        out.append(
            f"The same configuration ran in {len(best.pooled_trials)} trials ({', '.join(map(str, best.pooled_trials))}): "
            f"pooled median {best.pooled_median:.2f} tok/s over {best.pooled_n} measurements{times}."
        )
    accept, breakeven, comm = _why(best)
    if best.k > 0 and breakeven:
        margin = accept / breakeven - 1
        source = (
            "measured: its step over the plain step of the same setup"
            if best.breakeven_source == "measured"
            else "estimated by the performance model"
        )
        out.append(
            f"It accepts {accept:.2f} tokens a step where this setup breaks even at {breakeven:.2f} "
            f"({source}){_over(best)}, so each step pays for itself with {margin:+.0%} to spare."
        )
    elif best.k == 0:
        spec = [r for r in rows if r.k > 0 and _why(r)[1]]
        if spec:
            s = max(spec, key=lambda r: _why(r)[0] / _why(r)[1])
            s_accept, s_breakeven, _ = _why(s)
            if s_accept < s_breakeven:
                out.append(
                    f"No drafter accepted enough to pay for its longer step: the closest, {s.label}, accepts "
                    f"{s_accept:.2f} tokens a step where it would break even at {s_breakeven:.2f}{_over(s)}."
                )
            else:
                out.append(
                    f"{s.label} accepts {s_accept:.2f} tokens a step, above its breakeven of {s_breakeven:.2f} by "
                    f"median step time{_over(s)}, yet measured a lower {OBJECTIVE}: prefill, slow steps and the spread between "
                    "repeats outweighed its gain in these measurements."
                )
    if comm is not None and best.tp > 1:
        plain_comm = None if plain is None else _why(plain)[2]
        tail = f" (plain decoding: {_pct(plain_comm)})" if plain is not None and plain is not best and plain_comm is not None else ""
        why = "; speculation spends one round of allreduces on k + 1 tokens instead of one" if best.k > 0 else ""
        if comm >= 0.95:  # the ablation's two timings differ by the whole step: they measured noise
            why += " (the step timed with and without its allreduces differed by about the whole step: read it as noise)"
        out.append(f"Allreduce is {_pct(comm)} of its step{_over(best)}{tail}{why}.")
    # the runner-up is the best other configuration (trials of the winner's own are pooled above)
    second = next((r for r in rows[1:] if r.config is None or r.config != best.config), None)
    if second is not None:
        gap = 1 - second.value / best.value
        close = within_noise(best, second)
        if close is None:
            out.append(
                f"Runner-up: {second.label} ({second.trials_text}) at {second.value:.2f} tok/s, {gap:.1%} behind: "
                "the noise is unknown (no configuration was measured twice), so this is not a clear win."
            )
        elif close:
            pick = min([best, *ties], key=lambda r: (simplicity(_spec(r)), -r.value))
            prefer = (
                f"prefer {pick.label} (trial {pick.number}): {why_simpler(_spec(pick), _spec(best))}"
                if pick is not best
                else f"prefer {best.label}: the simplest of them too"
            )
            tied = f" ({len(ties)} configurations tie with the winner)" if len(ties) > 1 else ""
            out.append(
                f"Runner-up: {second.label} ({second.trials_text}) at {second.value:.2f} tok/s, {gap:.1%} behind: "
                f"within noise, so these measurements do not separate the two{tied}; {prefer}."
            )
        else:
            # clear only from two trials or more of the winner (one trial's repeats share its gang), and with
            # nothing measured only beside other trials (such a configuration may be faster than it measured)
            n = _trials(best)
            if beside_only:
                who = ", ".join(g[0].trials_text for g in beside_only)
                why = f"but {who} ran only beside other trials on their host, so {'that timing' if len(beside_only) == 1 else 'those timings'} may be low: not a clear win until measured alone"
            elif n < MIN_CLEAR_TRIALS:
                why = "but the winner was measured in one trial: not a clear win until a second trial measures it on a fresh gang (study.race_trials)"
            else:
                why = "the winner is clear"
            out.append(
                f"Runner-up: {second.label} ({second.trials_text}) at {second.value:.2f} tok/s, {gap:.1%} behind: "
                f"outside the noise band, {why}."
            )
    if noise_one_gang:
        out.append(
            "The noise band was measured on one gang only (every configuration measured more than once ran on one gang): "
            "it leaves out the spread between gangs of one configuration, which can be larger; study.race_trials "
            "re-measures the leaders on a fresh gang."
        )
    return out


def terminal_text(study: str, rows: list[Row], s: dict) -> str:
    """What `spectune report` prints: the verdict, the trials, the model's figures, the estimates."""
    best = rows[0]
    lines = [
        f"study {study}: {len(rows)} complete trials",
        "",
        " ".join(s["verdict"]),
        "",
        f"best: trial {best.number}, {best.label}, {OBJECTIVE} {value_text(best)}",
        "",
    ]
    lines.append(f"{'trial':>5}  {'configuration':<34} {OBJECTIVE:>16} {'+-MAD':>6} {'accepted':>8} {'breakeven':>9} {'comm%':>6}")
    for r in rows:
        be = f"{r.breakeven:.2f}" + ("*" if r.breakeven_source == "model" else "") if r.breakeven else "-"
        lines.append(
            f"{r.number:>5}  {r.label[:34]:<34} {r.value:>16.2f} {r.mad:>6.2f} {r.accept_len:>8.2f} {be:>9} {_pct(r.comm_fraction):>6}"
        )
    lines.append("(* breakeven estimated by the performance model: no plain trial of that setup)")
    if s["importances"]:
        lines.append("parameter importances: " + ", ".join(f"{k} {v:.2f}" for k, v in s["importances"].items()))
    elif s["complete_trials"] < IMPORTANCE_MIN_TRIALS:
        lines.append(
            f"parameter importances: not computed, they need at least {IMPORTANCE_MIN_TRIALS} complete trials and this study has {s['complete_trials']}"
        )
    fb, fbest = s["comm_fraction_baseline"], s["comm_fraction_best"]
    lines.append(f"comm_fraction: baseline {fb if fb is None else round(fb, 3)}, best {fbest if fbest is None else round(fbest, 3)}")
    lines.append(
        f"performance model: median |error| predicting left-out trials = {s['model_loo_median_rel_error']:.1%} "
        f"of decode_tok_s ({s['model_loo_trials']} trials, each predicted by a fit on the others)"
    )
    lines += config_model_lines(s)
    terms: dict[tuple[str, str], list[str]] = {}
    for env, term in s["allreduce_term"].items():
        terms.setdefault((term, s["allreduce_term_why"][env]), []).append(env)
    for (term, why), envs in terms.items():
        lines.append(f"allreduce term {term} for {', '.join(envs)}: {why}")
    if "model_loo_median_rel_error_fitted_term" in s:
        lines.append(f"  (with every allreduce term fitted instead: {s['model_loo_median_rel_error_fitted_term']:.1%})")
    if s["comm_check"]:
        lines.append(
            "measured / bench-derived allreduce time per step (min, median, max over trials): "
            + ", ".join(f"{env} x{lo:.2f}, x{med:.2f}, x{hi:.2f}" for env, (lo, med, hi) in s["comm_check"].items())
        )
    if s["model_loo_predictions"]:
        mixed = any(r["allreduce_term"] != "fitted" for r in s["model_loo_predictions"])
        lines.append(
            "held-out trials (measured -> predicted decode tok/s): "
            + "; ".join(
                f"#{r['trial']} {r['kind']} k={r['k']} {r['measured_tok_s']:.2f} -> {r['predicted_tok_s']:.2f} ({r['rel_error']:+.1%}"
                + (f", {r['allreduce_term']})" if mixed else ")")
                + ("" if r["drafter_in_fit"] else " [drafter in no other trial: draft time taken as 0]")
                for r in s["model_loo_predictions"]
            )
        )
    for key, table in s["breakeven"].items():
        lines.append(f"breakeven accepted length ({key}): " + ", ".join(f"k={k}: {v}" for k, v in table.items()))
    for key, value in s["what_if"].items():
        lines.append(f"{key}: {value}")
    lines += ["", OBJECTIVE_MEANS]
    return "\n".join(lines)


def config_loo_sentence(s: dict, figure=lambda text: text) -> str:
    """The leave-one-configuration-out error, in words (the terminal's line and the page's paragraph;
    `figure` marks up the error itself)."""
    err, misses = s["model_config_loo_median_rel_error"], s["model_config_loo_misses"]
    return (
        "each configuration left out (predicted with none of its own measurements, its acceptance included; a miss "
        f"counts as 100%): median |error| {figure(f'{err:.1%}')} of decode_tok_s over {len(s['model_config_loo'])} configurations"
        + (f" ({misses} could not be predicted)" if misses else "")
    )


def config_model_lines(s: dict) -> list[str]:
    """The configuration model's error leaving each configuration out, and the best configurations no
    trial ran, each line saying PREDICTED (terminal text; the page has the same as tables)."""
    err = s.get("model_config_loo_median_rel_error")
    if err is None:
        return []
    out = []
    if err == err:
        out.append("performance model, " + config_loo_sentence(s))
    if s["predicted_untried"]:
        space = f" of the {s['space_size']} in the search space" if s.get("space_size") else ""
        out.append(
            f"PREDICTED, not measured: the best of the {s['predicted_untried_count']} configurations{space} no trial ran "
            "that the model predicts from measured parts: "
            + "; ".join(f"{r['label']} ~{r['predicted_tok_s']:.2f} {OBJECTIVE} (predicted)" for r in s["predicted_untried"])
        )
    return out
