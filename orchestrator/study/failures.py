"""What a failed trial does to the study (`FailurePolicy`), and how a trial the loop cannot see to
its end is failed (`abandon`). Rules:

- a trial that failed on its own (a gang error, a backend that refused, a timeout, greedy output that
  differs from the baseline) counts toward `study.max_failed_trials`; its params are not queued again
  (a plain failure leaves its configuration open: the sampler may propose it again);
- a trial whose node left the cluster mid-trial, or that was interrupted (Ctrl-C, `ray job stop`),
  is not its configuration's fault: the trial itself queued its params again (orchestrator/study/trial.py),
  and it does not count; a lost node's slots leave the study;
- `max_failed` failures in this run end it with a one-line UserError naming the limit (0: the first
  failure does), once this driver's running trials have ended.

    policy = FailurePolicy(max_failed=2)
    policy.record(outcome)        # Failure.OWN: counted; NODE_LOST, INTERRUPTED: queued again by the trial
    if policy.over_limit: raise policy.error()
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.errors import UserError
from orchestrator.record import FAIL_TAG, RUN_ID_ATTR, requeue
from orchestrator.study.ask_lock import AskLock, taking_turns
from orchestrator.tracking.storage import frozen_trial, set_trial_user_attr

if TYPE_CHECKING:
    import optuna

    from orchestrator.study.trial import TrialOutcome
    from orchestrator.tracking.runs import Tracker


class Failure(enum.Enum):
    """What a finished trial's outcome is, as a failure."""

    NONE = "none"  # COMPLETE or PRUNED
    OWN = "own"  # the trial's own failure: counted, not queued again
    INTERRUPTED = "interrupted"  # stopped from outside: queued again, not counted
    NODE_LOST = "node lost"  # its node left the cluster: queued again, not counted; the node's slots go


def classify(outcome: TrialOutcome) -> Failure:
    if outcome.lost_node:
        return Failure.NODE_LOST
    if outcome.state != "FAIL":
        return Failure.NONE
    return Failure.INTERRUPTED if outcome.reason == "interrupted" else Failure.OWN


@dataclass
class FailurePolicy:
    """Counts this run's failures against the study's limit (study.max_failed_trials)."""

    max_failed: int
    failed: int = 0

    def record(self, outcome: TrialOutcome) -> Failure:
        failure = classify(outcome)
        if failure is Failure.OWN:
            self.failed += 1
        return failure

    @property
    def over_limit(self) -> bool:
        return bool(self.failed) and self.failed >= self.max_failed  # max_failed failures end the run (0: the first does)

    def error(self) -> UserError:
        return UserError(
            f"study: {self.failed} trials failed in this run (limit study.max_failed_trials={self.max_failed}); "
            "see the MLflow runs' spectune.fail_reason"
        )


def abandon(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    number: int,
    reason: str,
    lock: AskLock | None,
    tracker: Tracker,
    log: Callable[[str], None],
) -> None:
    """A trial the loop cannot see to its end (its thread did not stop in time, or the interrupt came
    between its ask and its start): FAIL with `reason` (interrupted), its params queued again where it
    had any to keep (a proposal that never started needs none), its MLflow run ended. The FAIL and the
    retry are one turn of the ask lock (orchestrator/study/ask_lock.py). A trial no longer RUNNING is
    left as it is."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    t = frozen_trial(study, number)
    if t.state != TrialState.RUNNING:
        return
    with taking_turns(lock, log):
        try:
            set_trial_user_attr(storage, study, number, FAIL_TAG, reason)
            study.tell(number, state=TrialState.FAIL)
        except (RuntimeError, ValueError, UpdateFinishedTrialError):
            return  # it finished after all
        if params := (t.system_attrs.get("fixed_params") or (t.params if t.user_attrs.get(RUN_ID_ATTR) else None)):
            requeue(study, params, t.user_attrs, number)
    if run_id := t.user_attrs.get(RUN_ID_ATTR):
        tracker.finish_trial(run_id, "FAIL", reason)
