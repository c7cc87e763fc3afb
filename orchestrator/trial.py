"""One trial: suggest its config, get a gang, decode the workload prompt by prompt (reporting to
the pruner), compare with the baseline, and record everything in Optuna and MLflow.

Outcomes: COMPLETE (a value), PRUNED (clearly losing), FAIL (the gang failed, a backend refused,
or the result is invalid: greedy output that differs from the baseline). FAIL and invalid
trials never become the best. The MLflow run always ends, whatever happens.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.cluster import GangPool
from orchestrator.config import ExperimentConfig
from orchestrator.errors import INPUT_ERRORS
from orchestrator.space import TrialConfig, suggest
from orchestrator.tracking import Tracker
from orchestrator.workload import PreparedWorkload
from workers.local_gang import GangError
from workers.spec import RunResult

# metrics copied into the Optuna trial's user attrs (the contract's list)
CONTRACT_METRICS = ("throughput_tok_s", "accept_len_mean", "step_ms_p50", "step_ms_p90", "verify_ms_p50", "draft_ms_p50",
                    "comm_ms_per_step", "comm_fraction", "speedup_vs_baseline", "outputs_match_baseline", "setup_s")


@dataclass
class TrialOutcome:
    state: str  # COMPLETE | PRUNED | FAIL
    config: TrialConfig | None
    metrics: dict = field(default_factory=dict)
    reason: str | None = None


def outputs_digest(result: RunResult) -> list[str]:
    return [hashlib.sha256(json.dumps(p.tokens).encode()).hexdigest()[:16] for p in result.prompts]


def find_baseline(study, tp: int):
    """The COMPLETE k = 0 trial to compare with: same TP if there is one, else the first."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.params.get("spec.num_draft_tokens") == 0]
    same = [t for t in done if t.params.get("parallel.tp", tp) == tp and "outputs_sha" in t.user_attrs]
    return (same or done or [None])[0]


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


def _decode(trial, cfg, prepared, gang, tc, heartbeat_attr) -> tuple[RunResult | None, bool]:
    """Run prompt by prompt within limits.trial_timeout_s in all; returns (merged result, pruned?)."""
    parts: list[RunResult] = []
    deadline = time.monotonic() + cfg.limits.trial_timeout_s
    for i, prompt in enumerate(prepared.token_ids):
        left = deadline - time.monotonic()
        if left <= 0:
            raise GangError(f"run: the trial's decode did not finish within limits.trial_timeout_s={cfg.limits.trial_timeout_s:g}s")
        parts.append(gang.run(prepared.workload(cfg, tc, (prompt,)), timeout_s=left))
        trial.report(RunResult.merge(parts).metrics["throughput_tok_s"], i)
        trial.set_user_attr(heartbeat_attr, time.time())
        if trial.should_prune():
            return RunResult.merge(parts), True
    return RunResult.merge(parts), False


def run_trial(study, trial, cfg: ExperimentConfig, prepared: PreparedWorkload, pool: GangPool, tracker: Tracker,
              heartbeat_attr: str) -> TrialOutcome:
    from optuna.trial import TrialState

    tc = suggest(trial, cfg)
    tags = {"spectune.baseline": "1"} if tc.num_draft_tokens == 0 else {}
    run_id = tracker.start_trial(trial.number, tc.params(), tags)
    trial.set_user_attr("mlflow_run_id", run_id)
    state, reason, metrics = "FAIL", None, {}
    try:
        tracker.log_json(run_id, {"experiment": cfg.model_dump(mode="json"), "trial": tc.params()}, "trial_config.json")
        before = pool.launched
        gang = pool.get(prepared.gang_spec(cfg, tc), dict(tc.nccl_env), plain=tc.num_draft_tokens == 0)
        result, pruned = _decode(trial, cfg, prepared, gang, tc, heartbeat_attr)
        metrics = {**result.metrics, "setup_s": pool.setup_s if pool.launched > before else 0.0}
        digest = outputs_digest(result)
        base = find_baseline(study, tc.tp)
        if base is not None and base.user_attrs.get("throughput_tok_s"):
            metrics["speedup_vs_baseline"] = metrics["throughput_tok_s"] / base.user_attrs["throughput_tok_s"]
        elif tc.num_draft_tokens == 0:
            metrics["speedup_vs_baseline"] = 1.0
        if cfg.workload.temperature == 0 and not pruned:
            want = base.user_attrs.get("outputs_sha") if base is not None else (digest if tc.num_draft_tokens == 0 else None)
            if want is not None:
                metrics["outputs_match_baseline"] = int(want == digest)
        tracker.log_metrics(run_id, metrics)
        tracker.log_step_series(run_id, {
            "prompt_throughput_tok_s": [len(p.tokens) / p.seconds for p in result.prompts],
            "prompt_accept_len": [p.accept_len for p in result.prompts],
        })
        with tempfile.TemporaryDirectory() as tmp:
            if plot := _acceptance_plot(metrics, tc.num_draft_tokens, Path(tmp)):
                tracker.log_file(run_id, plot)
        for key in CONTRACT_METRICS:
            if key in metrics:
                trial.set_user_attr(key, metrics[key])
        trial.set_user_attr("outputs_sha", digest)
        if pruned:
            state, reason = "PRUNED", "throughput below the pruner's percentile at the same prompt"
            study.tell(trial, state=TrialState.PRUNED)
        elif metrics.get("outputs_match_baseline") == 0:
            state, reason = "FAIL", "invalid: greedy output differs from the baseline"
            trial.set_user_attr("spectune.invalid", reason)
            study.tell(trial, state=TrialState.FAIL)
        else:
            state = "COMPLETE"
            study.tell(trial, metrics["throughput_tok_s"])
    except (GangError, *INPUT_ERRORS) as e:
        reason = f"{type(e).__name__}: {e}"
        pool.close()
        trial.set_user_attr("spectune.fail_reason", reason)
        study.tell(trial, state=TrialState.FAIL)
    except BaseException as e:  # Ctrl-C, SIGTERM, a bug: the trial fails (and is retried on resume)
        reason = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"
        pool.close()
        try:
            trial.set_user_attr("spectune.fail_reason", reason)
            study.tell(trial, state=TrialState.FAIL)
            study.enqueue_trial(trial.params, user_attrs={"spectune.retry_of": trial.number}, skip_if_exists=False)
        finally:
            tracker.finish_trial(run_id, "FAIL", reason)
        raise
    tracker.finish_trial(run_id, state, reason)
    return TrialOutcome(state=state, config=tc, metrics=metrics, reason=reason)
