"""The names a study's record is keyed by, in one place: Optuna user attributes, MLflow tags and
the objective. Every writer and reader imports them from here; nothing else spells `spectune.*`.
A leaf module: it imports nothing of spectune, so every layer may import it.

Types, one per value: a boolean attribute is stored as a JSON boolean (Optuna) or the string
"true" (MLflow tags are strings); `flag()` reads both, and the forms earlier records hold
(`True`, "1", "true"), so resume, report and export read finished studies of any age.
"""

from __future__ import annotations

OBJECTIVE = "throughput_tok_s"  # the study's objective: Optuna value, MLflow metric, report
# Optuna's parameter importances (fANOVA: a random forest over the COMPLETE trials) fit noise on fewer
# trials than this, and the fit and its scikit-learn import cost seconds at the end of every study
IMPORTANCE_MIN_TRIALS = 10

# MLflow tags (strings). The reasons, the retry, the baseline mark and the inherited NCCL names are
# Optuna user attributes of the trial under the same name (a list, an int, a boolean there)
STUDY_TAG = "spectune.study"
NAME_TAG = "spectune.name"  # the experiment YAML's `name` (on the MLflow experiment and the parent run)
ROLE_TAG = "spectune.role"  # "study" on the parent run, "trial" on a trial's run
TRIAL_TAG = "spectune.trial"
# an MoE verifier's routed experts in the graphed steps: grouped (each chosen expert read once), dense
# (every expert: a deep k looks cheaper than it is), eager (no graphs); also the Optuna user attr
MOE_EXPERTS_TAG = "spectune.moe_experts"
STATE_TAG = "spectune.state"  # the Optuna outcome: RUNNING, COMPLETE, PRUNED, FAIL
FAIL_TAG = "spectune.fail_reason"  # also the Optuna user attr of a failed trial
PRUNE_TAG = "spectune.prune_reason"  # also the Optuna user attr of a pruned trial
RETRY_TAG = "spectune.retry_of"  # the trial number whose params this trial retries (an int attr)
BASELINE_TAG = "spectune.baseline"  # the k = 0 trial of its TP size: tag "true", attr True
INHERITED_TAG = "spectune.nccl_inherited"  # NCCL_* from the driver's shell, comma separated
BEST_PARAMS_TAG = "spectune.best_params"
BEST_CONFIG_TAG = "spectune.best_config"
INVALID_TAG = "spectune.invalid"
SIMULATED_TAG = "spectune.simulated_accept_len"
PARENT_TAG = "mlflow.parentRunId"

# Optuna trial user attributes
DRIVER_ATTR = "spectune.driver"  # host:pid:start time of the driver running the trial
HEARTBEAT_ATTR = "spectune.heartbeat"  # unix time, refreshed after every prompt (a user attr only)
PARAMS_ATTR = "spectune.params"  # every resolved parameter of a trial (searched or fixed), dotted names
SAMPLES_ATTR = "spectune.repeat_tok_s"  # throughput of each repeat of the trial's workload
BASELINE_OUTPUTS_ATTR = "spectune.baseline_outputs"
RUN_ID_ATTR = "mlflow_run_id"
# where a trial ran (also MLflow tags): the Ray node's id and host, the GPU ids of its ranks, and
# the trials that ran at the same time on the same host, whichever of its Ray nodes (a list of numbers;
# tag: comma separated; the "neighbours"): such a measurement is never trusted alone (ranking.py)
NODE_ATTR = "spectune.node"
HOST_ATTR = "spectune.host"
GPUS_ATTR = "spectune.gpus"
CO_RUNNING_ATTR = "spectune.co_running"
# the gang a trial ran on: an id its pool drew when it launched that gang (trials reusing the gang share it)
GANG_ATTR = "spectune.gang"
# a proposal that repeated a running or known configuration: the trial it repeats (an int; the
# trial is PRUNED, never measured, and never counts toward study.n_trials)
DUPLICATE_ATTR = "spectune.duplicate_of"
# a deliberate repeat the ranking asked for (study.race_trials): the first trial of the configuration it re-measures
RACE_TAG = "spectune.race_of"

# Optuna study user attributes
FIXED_ATTR = "spectune.fixed"
PARENT_ATTR = "mlflow_parent_run_id"  # names the study's parent MLflow run

# what a trial's record may carry that is bookkeeping, not a measurement (never logged as a metric)
RECORD_ONLY = frozenset(
    {
        DRIVER_ATTR,
        HEARTBEAT_ATTR,
        RETRY_TAG,
        BASELINE_TAG,
        NODE_ATTR,
        HOST_ATTR,
        GPUS_ATTR,
        CO_RUNNING_ATTR,
        GANG_ATTR,
        DUPLICATE_ATTR,
        RACE_TAG,
    }
)


def flag(value) -> bool:
    """A boolean as any spectune record stored it: True, "true" or "1" (older tags)."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def requeue_attrs(user_attrs: dict, number: int) -> dict:
    """The user attributes a retry of trial `number` is enqueued with: who it retries, and whether
    it is the baseline. The one rule every path that re-queues a trial's params follows."""
    return {RETRY_TAG: number, **({BASELINE_TAG: True} if flag(user_attrs.get(BASELINE_TAG)) else {})}


def requeue(study, params: dict, user_attrs: dict, number: int) -> None:
    """Put trial `number`'s params back in the queue (it failed before it could finish)."""
    study.enqueue_trial(params, user_attrs=requeue_attrs(user_attrs, number), skip_if_exists=False)


def batch_metric(name: str, batch: int, context: int | None = None) -> str:
    """The name a metric of one measured cell is logged under: batch 1 at the prompts' own lengths keeps
    the plain name; batch B > 1 adds _b<B>, a context-length bucket L (workload.context_lengths) _c<L>:
    throughput_tok_s_b8_c4096."""
    return name + (f"_b{batch}" if batch != 1 else "") + (f"_c{context}" if context is not None else "")


def metric_cell(key: str, name: str) -> tuple[int, int | None] | None:
    """(batch, context) of a key `batch_metric(name, ...)` wrote, None for another metric's key."""
    if key == name:
        return 1, None
    if not key.startswith(name + "_"):
        return None
    batch, context = 1, None
    for part in key[len(name) + 1 :].split("_"):
        if part[:1] == "b" and part[1:].isdigit() and context is None and batch == 1:
            batch = int(part[1:])
        elif part[:1] == "c" and part[1:].isdigit() and context is None:
            context = int(part[1:])
        else:
            return None
    return batch, context
