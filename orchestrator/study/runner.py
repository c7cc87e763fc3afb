"""The driver's trial loop: keep every slot busy until `study.n_trials` trials are COMPLETE, one
trial at a time (one unpinned slot) or `study.max_concurrent_trials` at once, each on its own gang
in its own slot of the cluster (orchestrator/execution/slots.py decides the slots from
`study.isolation`). `run_trials` assembles the loop's parts and runs its controller
(orchestrator/study/controller.py, which names each part and what it owns).

The driver thread asks Optuna for the next trial as soon as a slot frees (`Asker.ask`); each trial
runs `run_trial` (its four phases) in a thread of its own, on its slot's gang pool, and tells its own
outcome. Rules:

- drivers of one study take turns at the ask (orchestrator/study/ask_lock.py): reading what the
  others measure, asking, writing the params and admitting the trial is one section per study, so
  two drivers asking at one moment never both measure one configuration;
- a proposal that repeats a running or known configuration is not measured
  (orchestrator/search/proposals.py): it is told PRUNED with its twin's number and never counts;
  a study whose finite space is all known ends there, with exit 0;
- `study.race_trials`: the last trials re-measure the leaders, on a fresh gang, while the winner is
  not clear of its runners-up (orchestrator/search/racing.py); where the slots let trials share a host
  (isolation gpu or none) such a re-measure runs alone: it waits until the running trials end and
  nothing starts beside it, so the measurement that settles the ranking is undisturbed;
- a trial that ran beside another on its host (orchestrator/execution/slots.py) records them
  (`spectune.co_running`) and is never pruned on that measurement (orchestrator/study/trial.py);
- another driver may take the last open slot between our count and our ask: the surplus trial is
  given back (FAIL, never run) and its enqueued params go back in the queue;
- a trial whose node left the cluster mid-trial fails naming the node, its params are queued again
  (they run on another node) and the node's slots leave the study (orchestrator/study/failures.py);
- `study.max_failed_trials` failures of the trials' own end the run with one line;
- Ctrl-C / `ray job stop`: every running trial's gang is closed, each trial fails as interrupted
  and is queued again; the driver waits for their threads before it returns.

MLflow writes from the trial threads go through one lock (`Locked`).

    pools = slot_pools(slots, res, log)
    failed = run_trials(ctx, slots, pools, nodes)   # called by orchestrator/study/loop.py; it closes the pools
    controller = trial_controller(ctx, slots, pools, nodes, node_alive)  # the same loop, its parts at hand (tests)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.execution.cluster import node_alive as ray_node_alive
from orchestrator.execution.pool import GangPool
from orchestrator.execution.slot_table import SlotTable
from orchestrator.execution.slots import NodeInfo, Slot, SlotBook, TrialSite
from orchestrator.search.racing import Racing
from orchestrator.study.ask_lock import AskLock, ask_lock
from orchestrator.study.asker import Asker
from orchestrator.study.context import StudyContext
from orchestrator.study.controller import TrialController
from orchestrator.study.failures import FailurePolicy
from orchestrator.study.goal import StudyGoal
from orchestrator.study.trial import TrialOutcome, run_trial
from orchestrator.tracking.runs import Tracker

if TYPE_CHECKING:
    import optuna


class Locked:
    """Every method call of `inner` under one lock (the MLflow tracker, shared by trial threads)."""

    def __init__(self, inner):
        self._inner, self._lock = inner, threading.RLock()

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            with self._lock:
                return value(*args, **kwargs)

        return call


@dataclass
class Measure:
    """How the controller measures an admitted trial: `run_trial` with what every trial of the run shares."""

    ctx: StudyContext
    tracker: Tracker  # the context's, behind `Locked`
    lock: AskLock  # the driver's ask lock: a failed trial's FAIL and its retry take it

    def __call__(self, trial: optuna.Trial, pool: GangPool, site: TrialSite) -> TrialOutcome:
        ctx = self.ctx
        return run_trial(ctx.study, trial, ctx.cfg, ctx.prepared, pool, self.tracker, live=ctx.progress.live, site=site, lock=self.lock)


def trial_controller(
    ctx: StudyContext,
    slots: list[Slot],
    pools: dict[int, GangPool],
    nodes: Sequence[NodeInfo] = (),
    node_alive: Callable[[str], bool] = ray_node_alive,
) -> TrialController:
    """The loop's parts for this run, wired into its controller (which holds the ask lock: `asker.lock`).
    `nodes`: the cluster's nodes the slots were planned on (which share a host); `node_alive(node_id)`:
    whether a node is still in the cluster (Ray's view)."""
    table = SlotTable(slots, pools, nodes, node_alive)
    tracker = Locked(ctx.tracker)
    goal = StudyGoal(ctx.study, ctx.cfg, ctx.n_goal, ctx.proposals, ctx.others)
    # racing's last round is as many trials as run at once; a re-measure runs alone where slots share a host
    racing = Racing(ctx.cfg.study.race_trials, alone=table.hosts_shared, concurrency=len(slots))
    asker = Asker(ctx, tracker, ask_lock(ctx.storage, ctx.study.study_name, ctx.log), racing, goal)
    return TrialController(
        ctx=ctx,
        slots=table,
        asker=asker,
        racing=racing,
        failures=FailurePolicy(ctx.max_failed),
        goal=goal,
        measure=Measure(ctx, tracker, asker.lock),
        tracker=tracker,
    )


def run_trials(
    ctx: StudyContext,
    slots: list[Slot],
    pools: dict[int, GangPool],
    nodes: Sequence[NodeInfo] = (),
    node_alive: Callable[[str], bool] = ray_node_alive,
) -> int:
    """Keep every slot busy until `n_goal` trials are COMPLETE (or the space is all known). Returns the
    number of trials that failed in this run."""
    controller = trial_controller(ctx, slots, pools, nodes, node_alive)
    try:
        return controller.run()
    finally:
        controller.asker.lock.close()


def describe(slots: list[Slot], cfg) -> str:
    where = sorted({s.node.name for s in slots if s.node})
    on = f" on {', '.join(where)}" if where else ""
    return f"{len(slots)} trials at once (isolation {cfg.study.isolation}){on}"


def contention_note(slots: list[Slot], nodes: list[NodeInfo], isolation: str) -> str | None:
    """One line, said once at the start, where the slots let trials share a host: their timings may
    disturb each other, and what the study does about it. None where no two slots can share one."""
    if not SlotBook(slots, nodes).hosts_shared:
        return None
    where = "on one host" if isolation == "gpu" else "anywhere, several on one host"
    return (
        f"spectune: isolation {isolation}: trials may run {where}, so their timings may disturb each other; each trial's "
        "record names the trials that ran beside it on its host (spectune.co_running), such a trial is not pruned, and "
        "a configuration measured only beside others neither wins clearly nor is ruled out until it is measured alone "
        "(study.race_trials re-measures it alone)"
    )
