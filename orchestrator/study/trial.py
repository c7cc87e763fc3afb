"""One trial: suggest its config, get a gang, decode the workload prompt by prompt (reporting to
the pruner), compare with the baseline, and record everything in Optuna and MLflow.

The baseline (k = 0) decodes its workload max(workload.repeats, study.baseline_repeats) times, so the
noise of a measurement is known before anything is ranked. speedup_vs_baseline = the trial's median
throughput over its repeats / the median over every repeat of the k = 0 trials at the same TP size.
User attrs for readers (orchestrator/search/ranking.py): `spectune.params` (every resolved parameter, also
the MLflow params) and `spectune.repeat_tok_s` (throughput of each repeat). A trial that violates a
constraint of the space (space.constraint_violation) is recorded PRUNED with the reason, never run.

Outcomes: COMPLETE (a value), PRUNED (clearly losing), FAIL (the gang failed, a backend refused,
or the result is invalid: greedy output that differs from the baseline). FAIL and invalid
trials never become the best. The MLflow run always ends, whatever happens.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.config.emulation import deployed_tp
from orchestrator.config.envpolicy import inherited_nccl_env
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.space import TrialConfig, constraint_violation, trial_config
from orchestrator.errors import INPUT_ERRORS
from orchestrator.execution.pool import GangPool
from orchestrator.execution.slots import TrialSite
from orchestrator.execution.workload import ABLATION_ITERS, PreparedWorkload, profile_widths
from orchestrator.record import (
    BASELINE_OUTPUTS_ATTR,
    BASELINE_TAG,
    CO_RUNNING_ATTR,
    DUPLICATE_ATTR,
    FAIL_TAG,
    GANG_ATTR,
    GPUS_ATTR,
    HEARTBEAT_ATTR,
    HOST_ATTR,
    INHERITED_TAG,
    INVALID_TAG,
    MOE_EXPERTS_TAG,
    NODE_ATTR,
    PARAMS_ATTR,
    PRUNE_TAG,
    RACE_TAG,
    RETRY_TAG,
    RUN_ID_ATTR,
    SAMPLES_ATTR,
    SIMULATED_TAG,
    batch_metric,
    flag,
    requeue,
)
from orchestrator.search.ranking import baseline_median, is_baseline, median_mad, trial_params
from orchestrator.study.ask_lock import taking_turns
from orchestrator.study.equivalence import outputs_verdict
from orchestrator.tracking.runs import Tracker, config_label, experiment_params, label_defaults, rounded
from workers.errors import GangError
from workers.spec import RunResult

# the baseline trial's tokens and per-token logit margins, for telling a near-tie divergence of a
# later trial's greedy output from a wrong one (orchestrator/study/equivalence.py): a JSON artifact of the
# baseline's MLflow run (bulky: not an Optuna user attr); studies recorded before kept the attr
BASELINE_OUTPUTS_FILE = "baseline_outputs.json"


def baseline_outputs(base, tracker: Tracker) -> dict | None:
    """{"tokens": [...], "margins": [...]} of a baseline trial, or None."""
    if BASELINE_OUTPUTS_ATTR in base.user_attrs:
        return json.loads(base.user_attrs[BASELINE_OUTPUTS_ATTR])
    run_id = base.user_attrs.get(RUN_ID_ATTR)
    return tracker.load_json(run_id, BASELINE_OUTPUTS_FILE) if run_id else None


@dataclass
class TrialOutcome:
    state: str  # COMPLETE | PRUNED | FAIL
    config: TrialConfig | None
    metrics: dict = field(default_factory=dict)
    reason: str | None = None
    invalid: bool = False  # FAIL because its greedy output differs from the baseline (a known configuration)
    lost_node: str | None = None  # FAIL because its node left the cluster: that node's id (the params are queued again)
    unlaunchable: str | None = None  # FAIL because its gang's launch failed for good: the gang (pool.gang_identity)


def outputs_digest(result: RunResult) -> list[str]:
    return [hashlib.sha256(json.dumps(p.tokens).encode()).hexdigest()[:16] for p in result.prompts]


def find_baseline(study, tp: int):
    """The first COMPLETE k = 0 trial to compare outputs with: same TP if there is one, else the first."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_baseline(t)]
    same = [t for t in done if int(trial_params(t).get("parallel.tp", tp)) == tp and "outputs_sha" in t.user_attrs]
    return (same or done or [None])[0]


def skip_duplicate(study, trial, cfg: ExperimentConfig, tracker: Tracker, admission) -> TrialOutcome:
    """A proposal that repeats a running or known configuration: PRUNED with its twin's number and the
    reason (an MLflow run says so too), never measured (orchestrator/search/proposals.py)."""
    from optuna.trial import TrialState

    t = configure(study, trial, cfg, tracker)
    run_id = tracker.start_trial(trial.number, t.params, {**t.tags, DUPLICATE_ATTR: str(admission.twin)})
    trial.set_user_attr(RUN_ID_ATTR, run_id)
    trial.set_user_attr(DUPLICATE_ATTR, admission.twin)
    trial.set_user_attr(PRUNE_TAG, admission.reason)
    study.tell(trial, state=TrialState.PRUNED)
    tracker.finish_trial(run_id, "PRUNED", admission.reason)
    return TrialOutcome(state="PRUNED", config=t.tc, reason=admission.reason)


def baseline_tp(t, default_tp: int) -> int | None:
    """The TP size of a k = 0 trial (finished, running or queued: an enqueued trial keeps its params in
    `fixed_params`), or None for any other trial. One reading for the baseline's enqueue and its wait."""
    queued = t.system_attrs.get("fixed_params", {})
    if is_baseline(t) or queued.get("spec.num_draft_tokens") == 0 or flag(t.user_attrs.get(BASELINE_TAG)):
        return int({**trial_params(t), **queued}.get("parallel.tp", default_tp))
    return None


def baseline_pending(study, tp: int, stale_after_s: float) -> bool:
    """A k = 0 trial at TP `tp` is running (in a concurrent study it may finish after others). A queued one
    does not count: it may wait for the very slot the asking trial holds."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if time.time() - float(t.user_attrs.get(HEARTBEAT_ATTR, 0) or 0) >= stale_after_s:
            continue  # its driver is silent: not coming
        if baseline_tp(t, tp) == tp:
            return True
    return False


def await_baseline(study, tp: int, limit_s: float, heartbeat, stopped):
    """The baseline to compare with; in a concurrent study the k = 0 trial may still be running beside
    this one: wait for it (at most `limit_s`, beating the heartbeat) rather than skip the comparison.
    `stopped()` true (the study is being interrupted): GangError, the trial fails as interrupted."""
    deadline = time.monotonic() + limit_s
    while (base := find_baseline(study, tp)) is None and baseline_pending(study, tp, limit_s + 120) and time.monotonic() < deadline:
        if stopped():
            raise GangError("interrupted while waiting for the baseline")
        heartbeat()
        time.sleep(0.5)
    return base


def logged_params(cfg: ExperimentConfig, tc: TrialConfig) -> dict:
    """Every resolved parameter of a trial, searched or fixed (MLflow params, user attr spectune.params):
    the trial's own (TrialConfig.params) and the fixed settings every trial of the study shares."""
    return {**experiment_params(cfg), **tc.params()}


def _acceptance_plot(metrics: dict, k: int, out: Path) -> Path | None:
    if k == 0:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = [i for i in range(1, k + 1) if f"accept_rate_pos_{i}" in metrics]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(pos, [metrics[f"accept_rate_pos_{i}"] for i in pos], color="#3b7dd8")
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1), title=f"accepted length {metrics.get('accept_len_mean', 1):.2f}")
    fig.tight_layout()
    path = out / "acceptance_per_position.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _shown(live, number: int, label: str, mine: list[RunResult], i: int, n: int, r: int, repeats: int):
    """The live line's view of prompt i (0-based) while it decodes: this repeat's tokens and seconds
    so far (earlier prompts plus the running one), or None without a live line."""
    if live is None:
        return None
    before = RunResult.merge(mine).stats if mine else None
    tokens0, seconds0 = (before.tokens, before.seconds) if before else (0, 0.0)
    return lambda tokens, seconds: live.update(number, label, i + 1, n, tokens0 + tokens, seconds0 + seconds, r, repeats)


def beat(trial) -> None:
    """The driver's sign of life on its trial (a live driver's RUNNING trial is never recovered)."""
    trial.set_user_attr(HEARTBEAT_ATTR, time.time())


def _decode(t: _Trial, prepared, gang, repeats: int, live=None, disturbed=lambda: False) -> tuple[RunResult | None, bool, list[float]]:
    """Run prompt by prompt, `repeats` times, within limits.trial_timeout_s in all; `live`
    (progress.LiveLine) shows each prompt as it finishes; `disturbed()`: another trial may have run
    beside this one on its host so far (`TrialSite.disturbed`).
    Returns (merged result, pruned?, throughput of each repeat). The last prompt of the last repeat
    also times the step with and without its allreduces (the comm/compute split)."""
    trial, cfg, tc = t.trial, t.cfg, t.tc
    label = config_label({**label_defaults(cfg), **tc.params()})  # "... tp8 emulated" where it emulates, as the report says
    parts: list[RunResult] = []
    per_repeat: list[float] = []
    deadline = time.monotonic() + cfg.limits.trial_timeout_s
    n = len(prepared.token_ids)
    first = repeats
    r = 0
    while r < repeats:
        mine: list[RunResult] = []
        for i, prompt in enumerate(prepared.token_ids):
            left = deadline - time.monotonic()
            if left <= 0:
                raise GangError(f"run: the trial's decode did not finish within limits.trial_timeout_s={cfg.limits.trial_timeout_s:g}s")
            w = prepared.workload(cfg, tc, (prompt,))
            if r == repeats - 1 and i == n - 1:  # the last run: the comm split (TP > 1) and the width profile (CPU)
                iters = ABLATION_ITERS[cfg.parallel.device]
                w = replace(
                    w,
                    comm_ablation_iters=iters if deployed_tp({"parallel.tp": tc.tp}, cfg) > 1 else 0,
                    profile_widths=profile_widths(cfg),
                    profile_iters=iters,
                )
            if r == repeats - 1 and not t.simulated:
                # an MoE verifier: the experts each pass width reads, over the last repeat's prompts; not under
                # imposed acceptance, whose kept drafts are not the model's tokens (its plain trial counts them)
                w = replace(w, count_experts=True)
            shown = _shown(live, trial.number, label, mine, i, n, r, repeats)
            mine.append(gang.run(w, timeout_s=left, **({"on_progress": shown} if shown else {})))
            if live is not None:
                so_far = RunResult.merge(mine).stats
                live.update(trial.number, label, i + 1, n, so_far.tokens, so_far.seconds, r, repeats, force=i == n - 1)
            trial.report(RunResult.merge(parts + mine).metrics["throughput_tok_s"], r * n + i)
            beat(trial)
            # the baseline is the reference: never pruned; nor is a trial whose other cells are still to come
            # (batch 1 alone would prune a configuration that wins at batch 32 or at a long context)
            # nor a deliberate repeat of a leader (study.race_trials): the ranking asked for its measurement;
            # nor a trial measured beside another on its host: its timing may be theirs, and a configuration is
            # never ruled out on a disturbed measurement (it completes; the ranking says it is disturbed)
            if not t.plain and RACE_TAG not in trial.user_attrs and not cfg.workload.cells() and not disturbed() and trial.should_prune():
                return RunResult.merge(parts + mine), True, per_repeat
        parts += mine
        per_repeat.append(RunResult.merge(mine).metrics["throughput_tok_s"])
        r += 1
        # noisy: measure again once, as many repeats more (the spread decides, not the value)
        if r == repeats and repeats == first and repeats > 1 and _rel_spread(per_repeat) > cfg.limits.max_rel_spread:
            repeats *= 2
    return RunResult.merge(parts), False, per_repeat


def _outputs(prompts) -> dict:
    """{"tokens", "margins"} of a run's prompts: what a greedy output is checked against."""
    return {"tokens": [p.tokens for p in prompts], "margins": [[round(x, 6) for x in p.margins or ()] for p in prompts]}


def _cells(cfg, prepared, gang, tc, references: dict, heartbeat, deadline: float) -> tuple[dict[str, float], dict]:
    """Every other cell of workload.cells() (batch sizes > 1, context buckets), once over all prompts:
    metrics *_b<B>, *_c<L>, *_b<B>_c<L>. Greedy (and not simulated): each sequence's tokens against
    `references` ({context: {"tokens", "margins"}}: the batch-1 baseline's at that context; None is the
    prompts' own lengths), near ties allowed as at batch 1 (outputs_match_*). A bucket without a
    reference is checked against this trial's own batch-1 run of it. Returns (metrics, the batch-1
    outputs of each context bucket: a baseline records them for the trials after it)."""
    out: dict[str, float] = {}
    own: dict = {}
    check = references is not None and not cfg.parallel.emulate_tp  # an emulated rank's tokens are not the model's
    for batch, context in cfg.workload.cells():
        left = deadline - time.monotonic()
        if left <= 0:
            raise GangError(f"run: the trial's decode did not finish within limits.trial_timeout_s={cfg.limits.trial_timeout_s:g}s")
        r = gang.run(prepared.workload(cfg, tc, prompts=prepared.prompts_at(context), batch_size=batch), timeout_s=left)
        heartbeat()
        m = r.metrics
        for name in ("throughput_tok_s", "decode_tok_s", "accept_len_mean", "step_ms_p50"):
            if name in m:
                out[batch_metric(name, batch, context)] = m[name]
        if batch == 1:
            own[context] = _outputs(r.prompts)
        if check:
            # batch 1 of a bucket no baseline recorded is this trial's own reference: nothing to check there
            ref = references.get(context) or (own.get(context) if batch > 1 else None)
            if ref is not None:
                verdict = outputs_verdict(ref["tokens"], ref["margins"], [p.tokens for p in r.prompts], cfg.model.dtype)
                out[batch_metric("outputs_match", batch, context)] = verdict["outputs_match_baseline"]
    return out, own


def cell_objective(metrics: dict, cfg: ExperimentConfig) -> dict[str, float]:
    """Several cells (batch sizes, context buckets): Optuna's objective is the geometric mean over them of
    the throughput (batch 1 at the prompts' lengths: the noise-aware objective), so a relative gain in any
    cell counts alike; `objective_b1` keeps batch 1's."""
    values = [metrics.get("objective", metrics["throughput_tok_s"])]
    values += [metrics[batch_metric("throughput_tok_s", b, c)] for b, c in cfg.workload.cells()]
    if any(v <= 0 for v in values):
        return {"objective_b1": values[0], "objective": 0.0}
    return {"objective_b1": values[0], "objective": math.exp(sum(math.log(v) for v in values) / len(values))}


def cell_speedups(metrics: dict, cfg: ExperimentConfig, study, tp: int, is_plain: bool) -> dict[str, float]:
    """speedup_vs_baseline_<cell>: over the pooled k = 0 trials' throughput in the same cell and at the same TP."""
    from optuna.trial import TrialState

    out = {}
    plain = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_baseline(t)]
    plain = [t for t in plain if int(trial_params(t).get("parallel.tp", tp)) == tp]
    for b, c in cfg.workload.cells():
        key = batch_metric("throughput_tok_s", b, c)
        if key not in metrics:
            continue
        values = [float(t.user_attrs[key]) for t in plain if key in t.user_attrs] + ([metrics[key]] if is_plain else [])
        if values:
            out[batch_metric("speedup_vs_baseline", b, c)] = metrics[key] / median_mad(values)[0]
    return out


def _cell_mismatch(metrics: dict, cfg: ExperimentConfig) -> str | None:
    """Where the first cell's sequences parted from the baseline's, in words (None: none did)."""
    for b, c in cfg.workload.cells():
        if metrics.get(batch_metric("outputs_match", b, c)) == 0:
            return " and ".join(([f"batch size {b}"] if b > 1 else []) + ([f"context {c}"] if c is not None else []))
    return None


def _rel_spread(values: list[float]) -> float:
    med, mad = median_mad(values)
    return mad / med if med > 0 else 0.0


def noise_aware(per_repeat: list[float], penalty: float) -> dict[str, float]:
    """Objective = median - penalty x MAD of the per-repeat throughputs (one repeat: the value)."""
    med, mad = median_mad(per_repeat)
    return {"throughput_median": med, "throughput_mad": mad, "repeats": float(len(per_repeat)), "objective": med - penalty * mad}


@dataclass
class _Trial:
    """What the phases of one trial share: decided once in `configure`."""

    study: object
    trial: object
    cfg: ExperimentConfig
    tracker: Tracker
    tc: TrialConfig
    params: dict  # the MLflow params (and `spectune.params`)
    tags: dict
    plain: bool  # k = 0: the baseline's rules (more repeats, the reference outputs) apply
    simulated: bool  # acceptance imposed: outputs are not compared with the baseline's
    run_id: str | None = None


@dataclass
class _Measured:
    result: RunResult
    pruned: bool
    per_repeat: list[float]
    metrics: dict
    gang: object
    started: float
    first: list  # the first repeat's prompts (every repeat decodes the same prompts)
    digest: list[str]  # per-prompt digests of their greedy outputs
    stopped: object = lambda: False  # () -> bool: the study is interrupting this trial (its pool's flag)
    context_outputs: dict = field(default_factory=dict)  # {context bucket: batch-1 outputs} (a baseline records them)


def configure(study, trial, cfg: ExperimentConfig, tracker: Tracker) -> _Trial:
    """Phase 1: the trial's configuration, its params and tags; nothing runs yet."""
    tc = trial_config(trial, cfg)
    plain = tc.num_draft_tokens == 0
    # NCCL_* in the driver's shell reach the actors too: logged as nccl.* params and named in a tag
    inherited = {k: v for k, v in inherited_nccl_env().items() if k not in dict(tc.nccl_env)}
    params = {**{f"nccl.{k}": v for k, v in inherited.items()}, **logged_params(cfg, tc)}
    trial.set_user_attr(PARAMS_ATTR, params)
    tags = {BASELINE_TAG: "true"} if plain else {}
    if inherited:
        tags[INHERITED_TAG] = ",".join(inherited)
        trial.set_user_attr(INHERITED_TAG, sorted(inherited))  # not the trial's choice: left out of exports
    simulated = cfg.workload.simulated and not plain
    return _Trial(study, trial, cfg, tracker, tc, params, tags, plain, simulated)


def prune_unrunnable(t: _Trial) -> TrialOutcome | None:
    """A configuration that breaks a constraint of the space is recorded (an MLflow run with the
    reason) and PRUNED, never run."""
    from optuna.trial import TrialState

    if not (why := constraint_violation(t.tc)):
        return None
    run_id = t.tracker.start_trial(t.trial.number, t.params, t.tags)
    t.trial.set_user_attr(RUN_ID_ATTR, run_id)
    t.trial.set_user_attr(PRUNE_TAG, why)  # one tag name in Optuna and MLflow (docs/tags.md)
    t.study.tell(t.trial, state=TrialState.PRUNED)
    t.tracker.finish_trial(run_id, "PRUNED", why)
    return TrialOutcome(state="PRUNED", config=t.tc, reason=why)


def start_run(t: _Trial) -> None:
    if t.simulated:  # timing of a real engine, acceptance imposed: not comparable with drafter-quality runs
        w, kind = t.cfg.workload, t.tc.drafter.kind
        t.tags[SIMULATED_TAG] = (
            f"{w.simulate_accept_len:g}"
            if w.simulate_accept_len is not None
            else "profile " + ",".join(f"{p:g}" for p in w.profile_for(kind) or ()) + w.profile_source(kind)
        )
    for key in (RETRY_TAG, RACE_TAG):  # a retry or a deliberate repeat says of which trial, on its MLflow run too
        if key in t.trial.user_attrs:
            t.tags[key] = str(t.trial.user_attrs[key])
    t.run_id = t.tracker.start_trial(t.trial.number, t.params, t.tags)
    t.trial.set_user_attr(RUN_ID_ATTR, t.run_id)


def note_placement(t: _Trial, site: TrialSite | None, gang) -> None:
    """Where the trial runs: its node (id, host) and its ranks' GPUs, in Optuna and on the MLflow run.
    The host is as the slots' isolation saw it (a node's `spectune.io/host` label, else its hostname); the
    book keeps it, so a failure there names the node even once the node has left the cluster."""
    if not hasattr(gang, "node"):
        return
    node_id, host = gang.node()
    if site is not None:
        site.placed(node_id, host)
        host = site.host_name(node_id) or host
    gpus = sorted({i for ids in getattr(gang, "instances", [])[: t.tc.tp] for i in ids}) if t.cfg.parallel.device == "cuda" else []
    for key, value in ((NODE_ATTR, node_id), (HOST_ATTR, host), (GPUS_ATTR, gpus)):
        t.trial.set_user_attr(key, value)
        t.tracker.set_tag(t.run_id, key, ",".join(map(str, value)) if isinstance(value, list) else str(value))


def note_neighbours(t: _Trial, site: TrialSite | None) -> None:
    """The trials that ran beside this one on its host (concurrent studies), recorded before the outcome is
    told: the ranking never trusts such a measurement alone (orchestrator/search/ranking.py)."""
    if site is not None and (beside := site.neighbours()):
        t.trial.set_user_attr(CO_RUNNING_ATTR, beside)
        t.tracker.set_tag(t.run_id, CO_RUNNING_ATTR, ",".join(map(str, beside)))


def measure(t: _Trial, prepared: PreparedWorkload, pool: GangPool, live, site: TrialSite | None = None) -> _Measured:
    """Phase 2: a gang, the workload's repeats at batch 1 (reporting to the pruner), the noise of them."""
    cfg, tc = t.cfg, t.tc
    t.tracker.log_json(t.run_id, {"experiment": cfg.model_dump(mode="json"), "trial": t.params}, "trial_config.json")
    before, started = pool.launched, time.monotonic()
    gang = pool.get(prepared.gang_spec(cfg, tc), dict(tc.nccl_env), plain=t.plain)
    beat(t.trial)  # a gang launch can take minutes
    note_placement(t, site, gang)
    if pool.gang_id is not None:  # which gang, for the noise band's gang-to-gang rule (ranking.gangs_of)
        t.trial.set_user_attr(GANG_ATTR, pool.gang_id)
        t.tracker.set_tag(t.run_id, GANG_ATTR, pool.gang_id)
    if getattr(pool, "moe_experts", None):  # an MoE verifier: grouped kernel, every expert, or eager (workers/engine/steps.py)
        t.trial.set_user_attr(MOE_EXPERTS_TAG, pool.moe_experts)
        t.tracker.set_tag(t.run_id, MOE_EXPERTS_TAG, pool.moe_experts)
    # the baseline is measured several times: the noise band every ranking uses comes from its repeats
    repeats = max(cfg.workload.repeats, cfg.study.baseline_repeats) if t.plain else cfg.workload.repeats
    result, pruned, per_repeat = _decode(t, prepared, gang, repeats, live, disturbed=site.disturbed if site is not None else lambda: False)
    metrics = {
        **result.metrics,
        "setup_s": pool.setup_s if pool.launched > before else 0.0,
        "rank_peak_rss_mb_max": max(gang.peak_rss_mb()[: tc.tp]),
    }
    if per_repeat:
        metrics.update(noise_aware(per_repeat, cfg.study.mad_penalty))
    first = result.prompts[: len(prepared.token_ids)]
    digest = outputs_digest(result)[: len(prepared.token_ids)]
    return _Measured(result, pruned, per_repeat, metrics, gang, started, first, digest, stopped=lambda: pool.interrupted)


def compare(t: _Trial, m: _Measured, prepared: PreparedWorkload) -> None:
    """Phase 3: against the baseline: speedup, the same greedy outputs, and the larger batch sizes
    (measured here, since their reference is the batch-1 outputs). Adds to m.metrics."""
    from optuna.trial import TrialState

    cfg, tc, study, metrics = t.cfg, t.tc, t.study, m.metrics
    digest, first = m.digest, m.first
    waited = time.monotonic()
    base = None if t.plain else await_baseline(study, tc.tp, cfg.limits.trial_timeout_s, lambda: beat(t.trial), m.stopped)
    base = base or find_baseline(study, tc.tp)
    waited = time.monotonic() - waited  # not the trial's own time: its batch sizes keep their budget
    # medians of repeats on both sides; the baseline's pooled over every k = 0 trial at this TP
    base_med = baseline_median(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), tc.tp)
    if m.per_repeat and base_med:
        metrics["speedup_vs_baseline"] = metrics["throughput_median"] / base_med
    elif t.plain and m.per_repeat:
        metrics["speedup_vs_baseline"] = 1.0
    # an emulated rank exchanges no partial sums: its tokens are not the model's, so none is compared
    if cfg.workload.temperature == 0 and not m.pruned and not t.simulated and not cfg.parallel.emulate_tp:
        want = base.user_attrs.get("outputs_sha") if base is not None else (digest if t.plain else None)
        if want is not None:
            metrics["outputs_match_baseline"] = int(want == digest)
        recorded = baseline_outputs(base, t.tracker) if base is not None and want is not None and want != digest else None
        if recorded:  # parted ways: at a numerical near tie only?
            metrics.update(outputs_verdict(recorded["tokens"], recorded["margins"], [p.tokens for p in first], cfg.model.dtype))
    if not m.pruned and cfg.workload.cells():
        references = None
        if cfg.workload.temperature == 0 and not t.simulated:
            # the batch-1 baseline's tokens and margins per context; without one yet, this trial's own batch-1 runs
            recorded = baseline_outputs(base, t.tracker) if base is not None and not t.plain else None
            references = {None: recorded or _outputs(first)}
            references.update({int(c): v for c, v in ((recorded or {}).get("contexts") or {}).items()})
        deadline = m.started + waited + cfg.limits.trial_timeout_s
        cells, m.context_outputs = _cells(cfg, prepared, m.gang, tc, references, lambda: beat(t.trial), deadline)
        metrics.update(cells)
        if cfg.workload.context_lengths:  # what the buckets are compared with: the prompts' own lengths
            metrics["prompt_tokens_median"] = float(statistics.median(len(ids) for ids in prepared.token_ids))
        metrics.update(cell_speedups(metrics, cfg, study, tc.tp, t.plain))
        if "objective" in metrics:
            metrics.update(cell_objective(metrics, cfg))


def record(t: _Trial, m: _Measured, site: TrialSite | None = None) -> tuple[str, str | None]:
    """Phase 4: metrics, series and files to MLflow, every metric as a user attr (the report's model
    reads them), then the outcome told to Optuna. Returns (state, reason)."""
    from optuna.trial import TrialState

    cfg, trial, tracker, metrics, run_id = t.cfg, t.trial, t.tracker, m.metrics, t.run_id
    result = m.result
    note_neighbours(t, site)
    tracker.log_metrics(run_id, metrics)
    tracker.log_step_series(
        run_id,
        {
            "prompt_throughput_tok_s": [len(p.tokens) / p.seconds for p in result.prompts],
            "prompt_accept_len": [p.accept_len for p in result.prompts],
        },
    )
    with tempfile.TemporaryDirectory() as tmp:
        if plot := _acceptance_plot(metrics, t.tc.num_draft_tokens, Path(tmp)):
            tracker.log_file(run_id, plot)
    for key, value in metrics.items():  # every metric: the report's performance model reads them
        if isinstance(value, (int, float)):
            trial.set_user_attr(key, rounded(value))  # 4 significant digits, as in MLflow
    trial.set_user_attr("outputs_sha", m.digest)
    trial.set_user_attr(SAMPLES_ATTR, m.per_repeat)
    first = m.first
    if t.plain and cfg.workload.temperature == 0 and first and first[0].margins:
        contexts = {str(c): v for c, v in m.context_outputs.items() if c is not None}  # JSON keys: the bucket's length
        tracker.log_json(run_id, {**_outputs(first), **({"contexts": contexts} if contexts else {})}, BASELINE_OUTPUTS_FILE)
    if m.pruned:
        reason = "throughput below the pruner's percentile at the same prompt, and outside the noise band of the best"
        trial.set_user_attr(PRUNE_TAG, reason)  # every pruned trial says why, in Optuna as in MLflow
        t.study.tell(trial, state=TrialState.PRUNED)
        return "PRUNED", reason
    if metrics.get("outputs_match_baseline") == 0 or (bad := _cell_mismatch(metrics, cfg)):
        at = "" if metrics.get("outputs_match_baseline") == 0 else f" at {bad}"
        reason = f"invalid: greedy output{at} differs from the baseline"
        trial.set_user_attr(INVALID_TAG, reason)
        t.study.tell(trial, state=TrialState.FAIL)
        return "FAIL", reason
    t.study.tell(trial, metrics.get("objective", metrics["throughput_tok_s"]))
    return "COMPLETE", None


def _interrupted(study, trial, t: _Trial, reason: str, lock=None) -> TrialOutcome:
    """FAIL with `reason`, the params queued again, the MLflow run ended: a trial stopped from outside."""
    from optuna.trial import TrialState

    try:
        trial.set_user_attr(FAIL_TAG, reason)
        with taking_turns(lock):
            study.tell(trial, state=TrialState.FAIL)
            requeue(study, trial.params, trial.user_attrs, trial.number)
    finally:
        t.tracker.finish_trial(t.run_id, "FAIL", reason)
    return TrialOutcome(state="FAIL", config=t.tc, reason=reason)


def run_trial(
    study,
    trial,
    cfg: ExperimentConfig,
    prepared: PreparedWorkload,
    pool: GangPool,
    tracker: Tracker,
    live=None,
    site: TrialSite | None = None,
    lock=None,
) -> TrialOutcome:
    """One trial in four phases: configure, measure, compare with the baseline, record. The MLflow
    run always ends; an interrupted trial fails and its params are queued again. `site`: the trial's
    slot in a concurrent study (where its gang landed, who ran beside it); None one at a time. `lock`: the
    driver's ask lock, which a failure's FAIL and its retry take (None: none)."""
    from optuna.trial import TrialState

    t = configure(study, trial, cfg, tracker)
    if (outcome := prune_unrunnable(t)) is not None:
        return outcome
    start_run(t)
    state, reason, metrics, unlaunchable = "FAIL", None, {}, None
    try:
        m = measure(t, prepared, pool, live, site)
        metrics = m.metrics
        compare(t, m, prepared)
        state, reason = record(t, m, site)
    except (GangError, *INPUT_ERRORS) as e:
        if pool.interrupted:  # another thread closed this gang on purpose: Ctrl-C / ray job stop in a concurrent study
            return _interrupted(study, trial, t, "interrupted", lock)
        if site is not None and (lost := site.lost_node()):  # not the trial's fault: retried on another node
            pool.close()
            node_id, name = lost
            why = f"node {name} left the cluster mid-trial ({type(e).__name__}: {str(e)[:200]})"
            outcome = _interrupted(study, trial, t, why, lock)
            outcome.lost_node = node_id
            return outcome
        reason = f"{type(e).__name__}: {e}"
        unlaunchable = pool.launch_failed
        pool.close()
        note_neighbours(t, site)
        trial.set_user_attr(FAIL_TAG, reason)
        study.tell(trial, state=TrialState.FAIL)
    except BaseException as e:  # Ctrl-C, SIGTERM, a bug: the trial fails (and is retried on resume)
        reason = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"
        pool.close()
        _interrupted(study, trial, t, reason, lock)
        raise
    tracker.finish_trial(t.run_id, state, reason)
    return TrialOutcome(
        state=state, config=t.tc, metrics=metrics, reason=reason, invalid=INVALID_TAG in trial.user_attrs, unlaunchable=unlaunchable
    )
