"""The trial loop's controller: keep every slot busy until the study's goal, wiring the named parts
together (after Ray Tune's TuneController). Each part owns one concern and is tested alone
(tests/unit/test_scheduling.py):

- `Asker` (orchestrator/study/asker.py), the searcher: one ask under the study's ask lock;
- `StudyGoal` (orchestrator/study/goal.py), the limit on concurrency: may another trial start, is the study done;
- `SlotTable` (orchestrator/execution/slot_table.py), placement: which slot runs which trial, lost nodes;
- `Racing` (orchestrator/search/racing.py): re-measures of the leaders, alone where hosts are shared;
- `FailurePolicy` (orchestrator/study/failures.py): which failures count, the study's failure limit;
- `TrialThreads` (orchestrator/study/threads.py), the actor manager: a thread per running trial;
- `TrialRunner`: how one admitted trial is measured (runner.Measure: `run_trial` on the slot's pool);
- the progress (orchestrator/tracking/progress.py), the callbacks: a trial's live line ends, its result line.

The loop, one turn: start a held re-measure once the running trials ended; stop when the goal is
reached or the space is all known and nothing runs; raise the failure limit once nothing runs; ask
and start trials while a slot is free and the goal has room; with nothing running, wait for the
other drivers (their trials may still fail); else collect the next trial that ends. On any exception
(Ctrl-C, SIGTERM raised as KeyboardInterrupt, the failure limit) every running trial is interrupted
and waited for, and one that does not stop, or was asked and never started, is failed and queued
again here.

    controller = TrialController(ctx, slots, asker, racing, FailurePolicy(ctx.max_failed), goal, measure, tracker)
    failed = controller.run()   # the trials that failed in this run
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from orchestrator.errors import UserError
from orchestrator.record import RACE_TAG, RETRY_TAG
from orchestrator.search.racing import Racing, Start
from orchestrator.study.failures import Failure, FailurePolicy, abandon
from orchestrator.study.threads import TrialThreads
from orchestrator.study.trial import TrialOutcome, beat
from orchestrator.tracking.runs import config_label, label_defaults
from orchestrator.tracking.storage import frozen_trial

if TYPE_CHECKING:
    import optuna

    from orchestrator.execution.slot_table import Pool, SlotTable
    from orchestrator.execution.slots import TrialSite
    from orchestrator.study.asker import Asker
    from orchestrator.study.context import StudyContext
    from orchestrator.study.goal import StudyGoal
    from orchestrator.tracking.runs import Tracker

# duplicates in a row, with nothing running and no unknown configuration left to pick, before the
# driver gives up on a sampler that only repeats itself (an unbounded space it cannot leave)
MAX_IDLE_DUPLICATES = 200
STOP_WAIT_S = 60.0  # on an interrupt, how long every running trial gets to stop before it is failed here


class TrialRunner(Protocol):
    """Measures one admitted trial on its slot's pool, from the trial's own thread."""

    def __call__(self, trial: optuna.Trial, pool: Pool, site: TrialSite) -> TrialOutcome: ...


@dataclass
class TrialController:
    ctx: StudyContext
    slots: SlotTable
    asker: Asker
    racing: Racing
    failures: FailurePolicy
    goal: StudyGoal
    measure: TrialRunner
    tracker: Tracker  # the context's, behind one lock for the trial threads (runner.Locked)
    threads: TrialThreads = field(default_factory=TrialThreads)
    collect_s: float = 5.0  # how long a wait for a trial to end lasts before the loop looks again
    others_poll_s: float = 1.0  # with nothing of ours running, how often the other drivers' trials are looked at
    idle_duplicates: int = 0  # duplicates in a row (MAX_IDLE_DUPLICATES)
    waiting: bool = False  # waiting for other drivers' trials (said once)

    def run(self) -> int:
        """Until the goal is reached or the space is all known. Returns the trials that failed in this run."""
        try:
            while True:
                self.start_held()
                if self.finished():
                    break
                if self.failures.over_limit and not self.threads:
                    raise self.failures.error()
                self.fill()
                if not self.threads:
                    if not (self.goal.space_finished() or self.goal.reached()):
                        self.wait_for_others()
                    continue
                self.waiting = False
                self.collect()
        except BaseException:
            self.stop()
            raise
        return self.failures.failed

    def start_held(self) -> None:
        """A re-measure held for the trials beside it: they have ended, so it starts alone (or, where
        other drivers completed the study meanwhile, it is given back)."""
        if self.racing.held is None or self.threads:
            return
        trial = self.racing.take_held()
        if self.goal.reached():
            self.asker.release_surplus(trial)
            self.asker.asking = None
        else:
            self.racing.place(trial, running=False)
            self.start(trial)

    def finished(self) -> bool:
        """Nothing runs and the goal is reached, or every distinct configuration of the space is known."""
        if self.threads:
            return False
        done = self.goal.complete()
        if done >= self.goal.n_goal:
            return True
        if not self.goal.space_finished():
            return False
        out = self.ctx.proposals.ruled_out
        how = "is measured" if not out else f"is measured or ruled out ({out} on gangs that failed to launch)"
        self.ctx.log(
            f"spectune: every distinct configuration of the search space ({self.ctx.proposals.size}) {how}: "
            f"the study ends at {done} complete trials (study.n_trials={self.goal.n_goal})"
        )
        return True

    def fill(self) -> None:
        """Ask and start trials while a slot is free, the goal has room, and nothing forbids it (the
        failure limit, a re-measure held or running alone)."""
        while (
            not self.failures.over_limit
            and not self.racing.blocks
            and self.slots.free
            and not self.goal.space_finished()
            and self.goal.room(len(self.threads))
        ):
            if not self.ask_and_start():
                break
            if self.idle_duplicates >= MAX_IDLE_DUPLICATES:
                raise UserError(
                    f"study.sampler: proposed {self.idle_duplicates} measured configurations in a row, and the space is too "
                    "large to pick an unmeasured one from; finished trials are saved (study.sampler: random explores more)"
                )

    def ask_and_start(self) -> bool:
        """Ask; measure the trial on a free slot unless it is surplus or a duplicate. False: stop asking
        until a running trial ends (surplus, nothing new to try while the running ones measure, or a
        re-measure that runs alone)."""
        asked = self.asker.ask(self.threads.numbers())
        trial = asked.trial
        if asked.verdict == "surplus":
            return False
        if asked.verdict == "picked":
            return True  # the study's own pick is queued: ask for it
        if asked.verdict == "duplicate":
            if asked.wait and (self.threads or self.ctx.others.running()):
                return False  # nothing new to try until a running trial (ours or another driver's) ends: wait, do not spin
            self.idle_duplicates += 1
            return True
        self.idle_duplicates = 0
        if RETRY_TAG in trial.user_attrs:
            fixed = frozen_trial(self.ctx.study, trial.number).system_attrs.get("fixed_params") or trial.params
            self.ctx.log(
                f"spectune: trial {trial.number} retries trial {trial.user_attrs[RETRY_TAG]} "
                f"({config_label({**label_defaults(self.ctx.cfg), **fixed})}), which did not finish"
            )
        how = self.racing.place(trial, running=bool(self.threads))
        if how is Start.HOLD:
            self.ctx.log(
                f"spectune: trial {trial.number} re-measures trial {trial.user_attrs[RACE_TAG]}'s configuration alone "
                f"(study.isolation {self.ctx.cfg.study.isolation} lets trials share a host): it starts when the running trials end"
            )
            return False
        self.start(trial)
        return how is Start.NOW  # started: ask for the next while a slot is free; nothing starts beside one alone

    def start(self, trial: optuna.Trial) -> None:
        """Measure an admitted trial on a free slot, in a thread of its own."""
        fresh = Racing.is_repeat(trial)  # a deliberate repeat: on a fresh gang (gang-to-gang spread is the noise users meet)
        slot = self.slots.acquire(trial.number, fresh=fresh)
        if fresh:
            self.ctx.log(
                f"spectune: trial {trial.number} re-measures trial {trial.user_attrs[RACE_TAG]}'s configuration: "
                "the ranking asked for it (leaders within noise, a lead from one gang, or timings taken beside other trials)"
            )
        pool = self.slots.pool(slot)
        self.threads.start(trial.number, slot, lambda: self.measure(trial, pool, self.slots.site(trial.number)))
        self.asker.asking = None

    def wait_for_others(self) -> None:
        """Nothing of ours runs and the goal is not reached: other drivers hold the open places, and one
        of their trials may still fail. No gang is kept meanwhile; dead drivers' trials are recovered."""
        import time

        if not self.waiting:
            self.ctx.log("spectune: the remaining trials are running in other drivers; waiting for them")
        self.waiting = True
        self.slots.park()
        time.sleep(self.others_poll_s)
        self.ctx.others.recover()

    def collect(self) -> None:
        """The next trial that ends: its slot back, its outcome into the proposals, the failure policy
        and the progress. What a trial thread raised is raised here."""
        got = self.threads.next(self.collect_s)
        if got is None:
            if self.racing.held is not None:
                beat(self.racing.held)  # asked and waiting: a live driver's trial, not a stale one
            return
        number, out = got
        self.threads.pop(number)
        self.racing.ended(number)
        self.slots.release(number)
        self.ctx.progress.live.finished(number)
        if isinstance(out, BaseException):
            raise out
        self.ctx.proposals.finished(number, known=out.state != "FAIL" or out.invalid)
        if out.unlaunchable is not None and self.ctx.proposals.unlaunchable(out.unlaunchable, number, out.reason or ""):
            self.ctx.log(f"spectune: trial {number}'s gang failed to launch a second time; this driver launches it no more in this run")
        if self.failures.record(out) is Failure.NODE_LOST:
            self.lose_node(number, out.lost_node)
        self.ctx.progress.trial_done(number, out)

    def lose_node(self, number: int, node_id: str) -> None:
        """Trial `number` failed because its node left the cluster (the trial queued its params again):
        the node's slots leave the study; with none left, the study stops."""
        self.slots.lose_node(node_id)
        name = self.slots.node_name(node_id)
        self.ctx.log(
            f"spectune: trial {number} failed: node {name} left the cluster mid-trial; its params are queued again, "
            f"{len(self.slots)} slot(s) left"
        )
        if not len(self.slots):
            raise UserError("study: every node of the study's slots left the cluster")

    def stop(self) -> None:
        """Every running trial's gang is closed and its thread waited for (it fails as interrupted and is
        queued again); a trial whose thread did not stop in time, and one asked but never started, is
        failed and queued again here, so no trial stays RUNNING."""
        self.slots.interrupt()
        for number in self.threads.stop(STOP_WAIT_S):
            self.abandon(number, f"interrupted: the trial did not stop within {STOP_WAIT_S:g} s")
        if self.asker.asking is not None and self.asker.asking not in self.threads:
            self.abandon(self.asker.asking, "interrupted before it started")

    def abandon(self, number: int, reason: str) -> None:
        abandon(self.ctx.study, self.ctx.storage, number, reason, self.asker.lock, self.tracker, self.ctx.log)
