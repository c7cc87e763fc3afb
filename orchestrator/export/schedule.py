"""The per-batch-size schedule of a study: for each batch size in `workload.batch_sizes`, the best
configuration measured at that size, its throughput, its speedup over plain decoding at the same
batch size and TP, and its noise band; with `workload.context_lengths`, the same for every batch size
and context bucket in `by_context` (rows with `context_len`; `schedule`'s rows are the prompts as they
are, what engine exports render). `spectune export` renders it for serving engines
(orchestrator/export/formats.py); the report plots it.

    spectune export experiments/smoke-cpu.yaml --to json [--out schedule.json]

Where the numbers come from (COMPLETE trials only; invalid and pruned trials never count):
- batch 1: each configuration's per-repeat throughputs pooled over its trials (as the ranking does,
  orchestrator/search/ranking.py); batch B > 1: the trials' `throughput_tok_s_b<B>` (one run per trial,
  pooled by median over the configuration's trials);
- plain decoding at B: the same, over the k = 0 configurations at the same TP;
- noise band: sigma_rel x throughput, with sigma_rel the study's relative noise of one measurement
  (ranking.noise_rel: from the configurations measured at least twice at batch 1); None where no
  configuration was measured twice;
- decode rate: next to each throughput, the same trials' `decode_tok_s` (batch 1) or
  `decode_tok_s_b<B>` (median over the configuration's trials), plain decoding's, and their ratio;
- best by backend: at each batch size and the winner's TP, the best configuration measured on each
  allreduce backend (`best_by_backend`), so that an export for an engine without the winner's backend
  can say what the best configuration on one it has reached (orchestrator/export/allreduce.py);
- draft and verify times: the winner's `draft_ms_p50` and `verify_ms_p50` at batch 1 (median over its
  trials; the study records them at batch 1 only), the draft-to-target time ratio an adaptive
  speculation controller is profiled with (orchestrator/export/vllm.py).

The schedule ranks by throughput, prefill included (`RANKED_BY`, why: `RANKED_BY_WHY`); the decode
rate is reported beside it, never used to pick.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrator.config.emulation import deployed_tp
from orchestrator.config.registry import PARAMS
from orchestrator.record import INHERITED_TAG, batch_metric, metric_cell
from orchestrator.search.ranking import complete_trials, config_key, is_baseline, rank, trial_params, trial_samples
from workers.spec.allreduce_table import emulated_words, table_label


def drafter_options(kind: str) -> dict[str, str]:
    """What a schedule entry's drafter needs (dotted param -> option name): the parameters declared as that
    drafter's own (orchestrator/config/registry.py)."""
    return {n: p.attr[-1] for n, p in PARAMS.items() if p.needs is not None and kind in p.needs[1]}


# NCCL_* variables the driver's shell passed to the actors (a trial's params name them too): the
# environment of that machine, not a setting the study chose; an export leaves them out


RANKED_BY = "throughput_tok_s"
RANKED_BY_WHY = (
    "a server pays for every prompt's prefill (the verifier's and a drafter's own) as well as for the decode steps, and "
    "speculation speeds up only the steps; throughput counts both, as the study's objective does, so the configuration "
    "ranked first is the one that serves these prompts fastest. The decode rate (steps only) shows what speculation "
    "does to the steps: where served outputs are much longer than the study's, the prefill's share shrinks and the "
    "decode speedup is the closer guide"
)


def cells_of(trials) -> list[tuple[int, int | None]]:
    """(batch size, context bucket) cells the trials were measured in: (1, None), and every cell with a
    throughput_tok_s_b<B>, _c<L> or _b<B>_c<L> (record.batch_metric); the prompts as they are first,
    then by context, each by batch size."""
    cells = {(1, None)}
    for t in trials:
        cells.update(c for key in t.user_attrs if (c := metric_cell(key, "throughput_tok_s")) is not None)
    return sorted(cells, key=lambda c: (c[1] is not None, c[1] or 0, c[0]))


def batch_sizes_of(trials) -> list[int]:
    """Batch sizes measured with the prompts as they are (1, and every throughput_tok_s_b<B>)."""
    return [b for b, c in cells_of(trials) if c is None]


def contexts_of(trials) -> list[int]:
    """Context buckets the trials were measured at (workload.context_lengths), ascending."""
    return sorted({c for _, c in cells_of(trials) if c is not None})


def throughputs(trials, batch: int, context: int | None = None) -> list[float]:
    """A configuration's measurements in one cell: batch 1 as they are, its repeats pooled; elsewhere one per trial."""
    if (batch, context) == (1, None):
        return [x for t in trials for x in trial_samples(t)]
    key = batch_metric("throughput_tok_s", batch, context)
    return [float(t.user_attrs[key]) for t in trials if key in t.user_attrs]


def _decode_rates(trials, batch: int, context: int | None = None) -> list[float]:
    """Each trial's decode rate (decode steps only, no prefill) in this cell, where it was logged."""
    key = batch_metric("decode_tok_s", batch, context)
    return [float(t.user_attrs[key]) for t in trials if key in t.user_attrs]


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def _step_times(trials, batch: int, context: int | None = None) -> dict[str, float | None]:
    """The configuration's median draft and verify time per step (ms) at batch 1 with the prompts as they
    are; None elsewhere (the other cells' runs log neither) and where no trial logged them."""
    out: dict[str, float | None] = {}
    for name in ("draft_ms_p50", "verify_ms_p50"):
        values = [float(t.user_attrs[name]) for t in trials if name in t.user_attrs] if (batch, context) == (1, None) else []
        out[name] = round(v, 4) if (v := _median(values)) is not None else None
    return out


def best_by_backend(groups: dict[str, list], batch: int, tp: int, context: int | None = None) -> dict[str, dict]:
    """{backend: the best configuration measured on it at this batch size and TP size}: its median
    throughput, first trial, k and drafter. Backends no configuration at that TP ran are absent."""
    best: dict[str, dict] = {}
    for trials in groups.values():
        params = trial_params(trials[0])
        values = throughputs(trials, batch, context)
        if not values or deployed_tp(params) != tp:
            continue
        backend = str(params.get("comm.backend", ""))
        value = float(np.median(values))
        if backend not in best or value > best[backend]["throughput_tok_s"]:
            k = int(params.get("spec.num_draft_tokens", 0))
            best[backend] = {
                "throughput_tok_s": round(value, 2),
                "trial": min(t.number for t in trials),
                "num_draft_tokens": k,
                "drafter": str(params.get("drafter.kind", "none")) if k > 0 else "none",
            }
    return dict(sorted(best.items()))


def entry(params: dict, batch: int, inherited: tuple[str, ...] = ()) -> dict:
    """A schedule entry's configuration, from a trial's resolved parameters (`inherited`: NCCL
    variables from the driver's environment, listed apart)."""
    k = int(params.get("spec.num_draft_tokens", 0))
    kind = str(params.get("drafter.kind", "none")) if k > 0 else "none"
    # `params` from ranking.trial_params: a parameter declared after the trial ran is filled with its default
    options = {opt: params[name] for name, opt in drafter_options(kind).items() if name in params}
    return {
        "batch_size": batch,
        # an emulated trial ran one rank of TP N in one process (parallel.tp 1): the deployment is TP N
        "tp": deployed_tp(params),
        "num_draft_tokens": k,
        "drafter": kind,
        "drafter_options": options,
        "backend": str(params.get("comm.backend", "")),
        "nccl_env": {n: str(v) for name, v in params.items() if name.startswith("nccl.") and (n := name.split(".", 1)[1]) not in inherited},
        "inherited_nccl_env": {
            n: str(v) for name, v in params.items() if name.startswith("nccl.") and (n := name.split(".", 1)[1]) in inherited
        },
        "engine": {name.split(".", 1)[1]: v for name, v in params.items() if name.startswith("engine.")},
    }


def config_words(row: dict) -> str:
    """A schedule row's (or best_by_backend / runner_up entry's) configuration in a few words: "ngram k=4", "plain decoding"."""
    k = int(row.get("num_draft_tokens") or 0)
    return "plain decoding" if k == 0 or row.get("drafter") in (None, "none") else f"{row['drafter']} k={k}"


def emulated_label(params: dict) -> str | None:
    """How an emulated study's figures were made, from a trial's params (orchestrator/config/emulation.py
    `params`): "emulated TP 8 from table NAME (sha256 ...); acceptance ..."; None for real TP."""
    if not params.get("parallel.emulate_tp"):
        return None
    table = table_label(str(params.get("parallel.allreduce_table")), str(params.get("parallel.allreduce_table_sha256", "")))
    return (
        f"{emulated_words(params['parallel.emulate_tp'], table)}: one rank's compute measured, every allreduce a wait the table "
        f"gives; acceptance {params.get('parallel.emulated_acceptance')}"
    )


def does_not_transfer(device: str, dtype: str, backends) -> list[str]:
    """Why measurements taken this way do not carry over to a GPU serving engine (empty: they may): a
    CPU study, float32 weights, gloo allreduces. Each reason a few words, for the export's header."""
    out = []
    if device == "cpu":
        out.append("measured on CPU (engines serve on GPUs)")
    if dtype == "float32":
        out.append("in float32 (engines serve bfloat16 or float16)")
    if "gloo" in backends:
        out.append("with gloo allreduces (engines use NCCL or their own)")
    return out


def build_schedule(study, model: str = "", dtype: str = "", device: str = "") -> dict:
    """{"model", "dtype", "device", "study", "noise_rel", "does_not_transfer", "schedule": [one entry per
    batch size, ascending]}. `does_not_transfer`: why these measurements do not carry over to a GPU
    serving engine (`does_not_transfer()`; empty where nothing says so)."""
    done = complete_trials(study.trials)
    noise = rank(done).noise_rel
    groups: dict[str, list] = {}
    for t in done:
        groups.setdefault(config_key(trial_params(t)), []).append(t)
    rows = [r for cell in cells_of(done) if (r := _row(done, groups, noise, *cell)) is not None]
    tau = next((trial_params(t).get("workload.simulate_accept_len") for t in done), None)
    profile = next((trial_params(t).get("workload.simulate_accept_profile") for t in done), None)
    if profile is None and done:  # one per drafter kind: "mtp 0.85,0.6; ngram 0.5"
        prefix = "workload.simulate_accept_profile."
        per = {name[len(prefix) :]: v for name, v in trial_params(done[0]).items() if name.startswith(prefix)}
        profile = "; ".join(f"{kind} {v}" for kind, v in sorted(per.items())) or None
    return {
        "emulated": emulated_label(trial_params(done[0])) if done else None,
        "model": model,
        "dtype": dtype,
        "device": device,
        "study": study.study_name,
        "does_not_transfer": does_not_transfer(device, dtype, {r["backend"] for r in rows}),
        "noise_rel": noise,
        # acceptance was imposed: the schedule ranks engine speed, not what these drafters accept on real text
        "simulated_accept_len": tau,
        "simulated_accept_profile": profile,  # or imposed position by position: P(accepted >= i)
        "ranked_by": RANKED_BY,  # throughput with the prefill; decode_tok_s is reported beside it
        "schedule": [r for r in rows if r["context_len"] is None],
        # workload.context_lengths: the same for each bucket (prompts drawn to exactly context_len tokens);
        # engines take their speculation settings by batch size only (orchestrator/export/common.py)
        "by_context": [r for r in rows if r["context_len"] is not None],
    }


def _row(done, groups: dict[str, list], noise: float | None, batch: int, context: int | None) -> dict | None:
    """One cell's entry: its best configuration and how it compares (None: nothing measured there)."""
    ranked = sorted(
        ((float(np.median(values)), trials) for trials in groups.values() if (values := throughputs(trials, batch, context))),
        key=lambda pair: -pair[0],
    )
    if not ranked:
        return None
    value, trials = ranked[0]
    params = trial_params(trials[0])
    tp = int(params.get("parallel.tp", 1))
    plain = [t for t in done if is_baseline(t) and int(trial_params(t).get("parallel.tp", tp)) == tp]
    plain_values = throughputs(plain, batch, context)
    plain_med = float(np.median(plain_values)) if plain_values else None
    decode, plain_decode = _median(_decode_rates(trials, batch, context)), _median(_decode_rates(plain, batch, context))
    return {
        **entry(params, batch, tuple(trials[0].user_attrs.get(INHERITED_TAG, ()))),
        "context_len": context,
        "throughput_tok_s": round(value, 2),
        "plain_throughput_tok_s": round(plain_med, 2) if plain_med else None,
        "speedup_vs_plain": round(value / plain_med, 3) if plain_med else None,
        "noise_band_tok_s": round(noise * value, 2) if noise is not None else None,
        "decode_tok_s": round(decode, 2) if decode else None,
        "plain_decode_tok_s": round(plain_decode, 2) if plain_decode else None,
        "decode_speedup_vs_plain": round(decode / plain_decode, 3) if decode and plain_decode else None,
        "samples": len(throughputs(trials, batch, context)),  # measurements behind the median (the noise rule's n)
        "plain_samples": len(plain_values),
        "trials": sorted(t.number for t in trials),
        "trial": min(t.number for t in trials),
        **_step_times(trials, batch, context),
        "best_by_backend": best_by_backend(groups, batch, deployed_tp(params), context),
        # the second-best configuration in this cell: how far ahead the winner is (against the noise band)
        "runner_up": _runner_up(ranked[1]) if len(ranked) > 1 else None,
    }


def _runner_up(pair: tuple[float, list]) -> dict:
    value, trials = pair
    params = trial_params(trials[0])
    k = int(params.get("spec.num_draft_tokens", 0))
    return {
        "num_draft_tokens": k,
        "drafter": str(params.get("drafter.kind", "none")) if k > 0 else "none",
        "throughput_tok_s": round(value, 2),
    }


def pays(row: dict, noise_rel: float | None) -> bool:
    """Speculation pays at this row's batch size: its best configuration drafts and beats plain decoding
    by more than the noise, by the ranking's rule (orchestrator/search/ranking.py): with s = speedup, n and
    n_plain the measurements behind each median, s - 1 > 2 sigma_rel sqrt(s^2 / n + 1 / n_plain)."""
    if row["num_draft_tokens"] == 0:
        return False
    s = row.get("speedup_vs_plain")
    if noise_rel is None or not s:
        return True
    n, n_plain = max(1, row.get("samples", 1)), max(1, row.get("plain_samples", 1))
    return s - 1 > 2 * noise_rel * math.sqrt(s * s / n + 1 / n_plain)


def speculation_stops_paying(schedule: list[dict], noise_rel: float | None = None) -> int | None:
    """The smallest batch size where speculation does not pay (None: it pays at every size measured)."""
    return next((row["batch_size"] for row in schedule if not pays(row, noise_rel)), None)
