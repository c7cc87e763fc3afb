"""The driver's searcher: each ask is one critical section under the study's ask lock
(orchestrator/study/ask_lock.py): fold in what other drivers finished and are measuring (`sync`),
queue a race repeat (orchestrator/search/racing.py), ask Optuna, write the trial's params
(`identity_of`), then admit it (orchestrator/search/proposals.py), give it back as surplus, or find
it a duplicate (queueing the study's own pick when the sampler keeps repeating itself; the duplicate
is told PRUNED after the section, its MLflow calls holding no other driver's ask). No Ray: a unit
test drives two of these, in two processes, on one storage.

    asker = Asker(ctx, tracker, ask_lock(ctx.storage, study.study_name, log), racing, goal)
    asked = asker.ask(running)  # running: this driver's running trials, by number
    ...                         # start asked.trial if asked.verdict == "run"; then asker.asking = None
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.config.space import identity_of, trial_config
from orchestrator.execution.pool import gang_identity
from orchestrator.record import BASELINE_TAG, DRIVER_ATTR, FAIL_TAG, RETRY_TAG
from orchestrator.search.proposals import Admission
from orchestrator.search.racing import Racing
from orchestrator.study.ask_lock import AskLock
from orchestrator.study.goal import StudyGoal, counts_as_known
from orchestrator.study.trial import beat, skip_duplicate
from orchestrator.tracking.storage import frozen_trial

if TYPE_CHECKING:
    import optuna

    from orchestrator.config.schema import ExperimentConfig
    from orchestrator.execution.workload import PreparedWorkload
    from orchestrator.study.context import StudyContext
    from orchestrator.tracking.runs import Tracker


def gang_of_trial(trial, cfg: ExperimentConfig, prepared: PreparedWorkload) -> str | None:
    """The gang a trial (asked, or an optuna FixedTrial of a configuration's params) runs on
    (pool.gang_identity); None where its configuration does not resolve."""
    try:
        tc = trial_config(trial, cfg)
        return gang_identity(prepared.gang_spec(cfg, tc), dict(tc.nccl_env))
    except Exception:  # noqa: BLE001 - a configuration that does not resolve: the trial says why
        return None


def gang_of_params(cfg: ExperimentConfig, prepared: PreparedWorkload) -> Callable[[dict], str | None]:
    """A configuration's params -> its gang: what `Proposals.gang_of` asks to rule out whole gangs."""
    import optuna

    return lambda params: gang_of_trial(optuna.trial.FixedTrial(params), cfg, prepared)


@dataclass
class Asked:
    """One ask: the trial and what became of it. `verdict`: "run" (measure it now), "surplus" (given
    back: other drivers hold the last open slots), "duplicate" (told PRUNED), "picked" (a duplicate,
    and an unknown configuration is queued in its place). `wait`: a duplicate with nothing new left to
    try while the running trials measure."""

    trial: optuna.Trial
    verdict: str
    admission: Admission | None = None
    wait: bool = False


class Asker:
    """The ask under the lock; `racing` (default: study.race_trials, one trial at a time) and `goal`
    (default: the context's) as the trial loop shares them."""

    def __init__(self, ctx: StudyContext, tracker: Tracker, lock: AskLock, racing: Racing | None = None, goal: StudyGoal | None = None):
        self.ctx, self.tracker, self.lock = ctx, tracker, lock
        self.racing = racing or Racing(ctx.cfg.study.race_trials)
        self.goal = goal or StudyGoal(ctx.study, ctx.cfg, ctx.n_goal, ctx.proposals, ctx.others)
        self.seen: set[int] = set()  # finished trials already folded into `proposals`
        self.asking: int | None = None  # a trial asked and not yet started or told: an interrupt fails it

    def ask(self, running: Collection[int]) -> Asked:
        """Ask for the next trial; `running`: this driver's running trials (numbers)."""
        ctx, study, cfg, proposals = self.ctx, self.ctx.study, self.ctx.cfg, self.ctx.proposals
        with self.lock:
            self.sync(running)
            self.racing.enqueue_repeat(study, cfg, lambda: self.goal.race_left(len(running)), proposals.busy_identities())
            trial = study.ask()
            self.asking = trial.number  # until its thread starts or it is told: an interrupt here must not leave it RUNNING
            trial.set_user_attr(DRIVER_ATTR, ctx.driver)
            beat(trial)
            if self.goal.surplus(trial.number):
                self.release_surplus(trial)
                self.asking = None
                return Asked(trial, "surplus")
            frozen = frozen_trial(study, trial.number)
            asked = "fixed_params" in frozen.system_attrs  # enqueued: the study asked for it
            gang = gang_of_trial(trial, cfg, ctx.prepared) if proposals.rules_out_gangs else None  # only where one is ruled out
            admission = proposals.admit(trial.number, identity_of(trial, cfg), asked, gang)
            if admission.run:
                return Asked(trial, "run", admission)
            then = proposals.after_duplicate()
            if isinstance(then, dict):
                study.enqueue_trial(then)  # the sampler keeps repeating itself: measure an unknown configuration
        # the duplicate is told PRUNED and its MLflow run written outside the section: MLflow calls (a slow
        # server, this driver's trial threads holding the tracker) must not hold every driver's ask. Until
        # told, other drivers see it running with its twin's configuration, which is busy or known anyway.
        skip_duplicate(study, trial, cfg, self.tracker, admission)
        self.asking = None
        if isinstance(then, dict):
            return Asked(trial, "picked", admission)
        return Asked(trial, "duplicate", admission, wait=then is False)

    def sync(self, running: Collection[int]) -> None:
        """Fold in what other drivers finished since, and what they are measuring now."""
        from optuna.trial import TrialState

        ctx, cfg, proposals = self.ctx, self.ctx.cfg, self.ctx.proposals
        others: dict[str, int] = {}
        for t in ctx.study.get_trials(deepcopy=False):
            if t.number in self.seen or t.number in running:
                continue
            if t.state == TrialState.RUNNING:
                if t.user_attrs.get(DRIVER_ATTR) != ctx.driver and (identity := identity_of(t, cfg)) is not None:
                    others[identity] = t.number
            elif t.state != TrialState.WAITING:
                self.seen.add(t.number)
                if counts_as_known(t) and (identity := identity_of(t, cfg)) is not None:
                    proposals.known(identity, t.number)
        proposals.others_running(others)

    def release_surplus(self, trial: optuna.Trial) -> None:
        """Another driver took the last open slot between our count and our ask: give the trial back
        (FAIL, never run, no MLflow run) and put enqueued params (a baseline, a retry) back in the queue."""
        from optuna.trial import TrialState

        study = self.ctx.study
        frozen = frozen_trial(study, trial.number)
        trial.set_user_attr(FAIL_TAG, "surplus: other drivers already hold the last open slots; not run")
        study.tell(trial, state=TrialState.FAIL)
        if fixed := frozen.system_attrs.get("fixed_params"):
            attrs = {k: v for k, v in frozen.user_attrs.items() if k in (BASELINE_TAG, RETRY_TAG)}
            study.enqueue_trial(fixed, user_attrs=attrs, skip_if_exists=False)  # given back as it was, not a retry
