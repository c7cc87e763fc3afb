"""Trials in parallel: `study.max_concurrent_trials` trials at once, each on its own gang in its own
slot of the cluster (orchestrator/execution/slots.py decides the slots from `study.isolation`).

The driver thread asks Optuna for the next trial as soon as a slot frees and tells nothing itself:
each trial runs `run_trial` (the same four phases as one at a time) in a thread of its own, on the
slot's gang pool, and tells its own outcome. Rules:

- a proposal equal to the configuration of a running trial is not measured beside it: it is told
  PRUNED with its reason (it never counts toward `study.n_trials`), and the sampler sees it;
- a trial whose node left the cluster mid-trial fails, the node leaves the book, and its params are
  queued again (they run on another node);
- Ctrl-C / `ray job stop`: every running trial's gang is closed, each trial fails as interrupted
  and is queued again; the driver waits for their threads before it returns.

MLflow writes from the trial threads go through one lock (`Locked`).

    run_concurrent(ctx, slots)   # called by orchestrator/study/loop.py when there is more than one slot
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, replace

from orchestrator.errors import UserError
from orchestrator.execution.cluster import Resources
from orchestrator.execution.pool import GangPool
from orchestrator.execution.slots import NodeInfo, Slot, SlotBook
from orchestrator.study.keys import DRIVER_ATTR, NODE_ATTR, PRUNE_TAG, requeue
from orchestrator.study.storage import frozen_trial
from orchestrator.study.trial import TrialOutcome, beat, run_trial, trial_config

MAX_DUPLICATE_ASKS = 20  # proposals in a row that equal running trials: stop filling until one ends


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


def cluster_nodes() -> list[NodeInfo]:
    import ray

    return [
        NodeInfo(
            id=n["NodeID"],
            host=n.get("NodeManagerHostname") or n.get("NodeManagerAddress", "?"),
            cpus=float(n["Resources"].get("CPU", 0)),
            gpus=float(n["Resources"].get("GPU", 0)),
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]


def node_alive(node_id: str) -> bool:
    import ray

    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())


@dataclass
class StudyContext:
    """What the loop hands over: the study and everything a trial needs, and the run's counters."""

    study: object
    cfg: object
    prepared: object
    tracker: object
    progress: object
    res: Resources
    n_goal: int
    max_failed: int
    driver: str
    log: object
    recover: object  # () -> None: fail and requeue trials of dead drivers
    others_running: object  # () -> int: live RUNNING trials of other drivers


def _config_key(trial, cfg) -> str | None:
    try:
        return json.dumps(trial_config(trial, cfg).params(), sort_keys=True, default=str)
    except Exception:  # noqa: BLE001 - run_trial prunes what cannot run, with its reason
        return None


def run_concurrent(ctx: StudyContext, slots: list[Slot]) -> tuple[int, list[GangPool]]:
    """Keep every slot busy until `n_goal` trials are COMPLETE. Returns (failed in this run, pools)."""
    from optuna.trial import TrialState

    study, cfg, log = ctx.study, ctx.cfg, ctx.log
    book, book_lock = SlotBook(slots), threading.Lock()
    pools = {s.index: GangPool(replace(ctx.res, node_id=s.node.id if s.node else None), log) for s in slots}
    tracker = Locked(ctx.tracker)
    finished: queue.Queue = queue.Queue()
    running: dict[int, tuple[threading.Thread, Slot, str | None]] = {}
    failed = 0

    def booked(fn, *args):
        with book_lock:
            return fn(*args)

    def work(trial, slot: Slot) -> None:
        pool = pools[slot.index]
        pool.neighbours = lambda n=trial.number: booked(book.co_running, n)
        pool.on_placed = lambda node_id, n=trial.number: booked(book.placed, n, node_id)
        try:
            out = run_trial(study, trial, cfg, ctx.prepared, pool, tracker, live=ctx.progress.live)
        except BaseException as e:  # noqa: BLE001 - handed to the driver thread, which raises it
            out = e
        finished.put((trial.number, out))

    def complete() -> int:
        return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

    def start_next() -> bool:
        """Ask, and start the trial on a free slot; False when the proposal was a duplicate."""
        trial = study.ask()
        trial.set_user_attr(DRIVER_ATTR, ctx.driver)
        beat(trial)
        key = _config_key(trial, cfg)
        twin = next((n for n, (_, _, k) in running.items() if key is not None and k == key), None)
        if twin is not None:
            reason = f"duplicate of running trial {twin}: one configuration is not measured twice at once"
            trial.set_user_attr(PRUNE_TAG, reason)
            study.tell(trial, state=TrialState.PRUNED)
            return False
        slot = booked(book.acquire, trial.number)
        thread = threading.Thread(target=work, args=(trial, slot), name=f"trial-{trial.number}", daemon=True)
        running[trial.number] = (thread, slot, key)
        thread.start()
        return True

    def node_lost(number: int, slot: Slot) -> str | None:
        node_id = slot.node.id if slot.node else frozen_trial(study, number).user_attrs.get(NODE_ATTR)
        if node_id and not node_alive(node_id):
            return node_id
        return None

    try:
        dupes = 0
        while True:
            done = complete()
            if done >= ctx.n_goal and not running:
                break
            if failed and failed >= ctx.max_failed and not running:
                raise UserError(
                    f"study: {failed} trials failed in this run (limit study.max_failed_trials={ctx.max_failed}); see the MLflow runs' spectune.fail_reason"
                )
            while (
                not (failed and failed >= ctx.max_failed)
                and book.free
                and dupes < MAX_DUPLICATE_ASKS
                and done + len(running) + ctx.others_running() < ctx.n_goal
            ):
                dupes = 0 if start_next() else dupes + 1
            if not running:
                if dupes >= MAX_DUPLICATE_ASKS:
                    raise UserError(f"study: the sampler proposed {dupes} running configurations in a row and nothing runs")
                time.sleep(1.0)  # other drivers hold the open slots; one of their trials may still fail
                ctx.recover()
                continue
            try:
                number, out = finished.get(timeout=5.0)
            except queue.Empty:
                continue
            thread, slot, _ = running.pop(number)
            thread.join()
            booked(book.release, number)
            ctx.progress.live.finished(number)
            dupes = 0
            if isinstance(out, BaseException):
                raise out
            out: TrialOutcome
            if out.state == "FAIL" and out.reason != "interrupted" and (lost := node_lost(number, slot)):
                gone = booked(book.lose_node, lost)
                for s in gone:
                    pools[s.index].close()
                t = frozen_trial(study, number)
                requeue(study, t.params, t.user_attrs, number)
                log(
                    f"spectune: trial {number} failed: node {slot.node.name if slot.node else lost[:8]} left the cluster mid-trial; "
                    f"its params are queued again, {len(book)} slots left"
                )
                if not len(book):
                    raise UserError("study: every node of the study's slots left the cluster")
            else:
                failed += out.state == "FAIL"
            ctx.progress.trial_done(number, out)
    except BaseException:
        for pool in pools.values():  # each running trial fails as interrupted and is queued again
            pool.interrupt()
        deadline = time.monotonic() + 60
        for thread, _, _ in list(running.values()):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        raise
    return failed, list(pools.values())


def describe(slots: list[Slot], cfg) -> str:
    where = sorted({s.node.name for s in slots if s.node})
    on = f" on {', '.join(where)}" if where else ""
    return f"{len(slots)} trials at once (isolation {cfg.study.isolation}){on}"
