"""The driver's trial loop: keep every slot busy until `study.n_trials` trials are COMPLETE, one
trial at a time (one unpinned slot) or `study.max_concurrent_trials` at once, each on its own gang
in its own slot of the cluster (orchestrator/execution/slots.py decides the slots from
`study.isolation`).

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
  not clear of its runners-up (`proposals.race_pick`); where the slots let trials share a host
  (isolation gpu or none) such a re-measure runs alone: it waits until the running trials end and
  nothing starts beside it, so the measurement that settles the ranking is undisturbed;
- a trial that ran beside another on its host (orchestrator/execution/slots.py) records them
  (`spectune.co_running`) and is never pruned on that measurement (orchestrator/study/trial.py);
- another driver may take the last open slot between our count and our ask: the surplus trial is
  given back (FAIL, never run) and its enqueued params go back in the queue;
- a trial whose node left the cluster mid-trial fails naming the node, its params are queued again
  (they run on another node) and the node's slots leave the study;
- Ctrl-C / `ray job stop`: every running trial's gang is closed, each trial fails as interrupted
  and is queued again; the driver waits for their threads before it returns.

MLflow writes from the trial threads go through one lock (`Locked`).

    pools = slot_pools(slots, res, log)
    failed = run_trials(ctx, slots, pools, nodes)   # called by orchestrator/study/loop.py; it closes the pools
"""

from __future__ import annotations

import queue
import random
import socket
import threading
import time
from dataclasses import dataclass, replace

from orchestrator.config.space import identity_of
from orchestrator.errors import UserError
from orchestrator.execution.cluster import Resources
from orchestrator.execution.pool import GangPool
from orchestrator.execution.slots import NodeInfo, Slot, SlotBook
from orchestrator.record import (
    BASELINE_TAG,
    DRIVER_ATTR,
    DUPLICATE_ATTR,
    FAIL_TAG,
    INVALID_TAG,
    RACE_TAG,
    RETRY_TAG,
    RUN_ID_ATTR,
    flag,
    requeue,
)
from orchestrator.search.proposals import Admission, Proposals, race_pick
from orchestrator.search.ranking import rank
from orchestrator.study.ask_lock import AskLock, ask_lock, taking_turns
from orchestrator.study.trial import TrialOutcome, beat, run_trial, skip_duplicate
from orchestrator.tracking.runs import config_label, label_defaults
from orchestrator.tracking.storage import frozen_trial, set_trial_user_attr

# duplicates in a row, with nothing running and no unknown configuration left to pick, before the
# driver gives up on a sampler that only repeats itself (an unbounded space it cannot leave)
MAX_IDLE_DUPLICATES = 200


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


def node_alive(node_id: str) -> bool:
    """The node counts as alive in the cluster and its raylet takes a connection. A killed raylet
    refuses at once, while the cluster itself marks the node dead only after its health checks time out."""
    import ray

    node = next((n for n in ray.nodes() if n["NodeID"] == node_id), None)
    if node is None or not node.get("Alive"):
        return False
    try:
        with socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])), timeout=5.0):
            return True
    except ConnectionRefusedError:
        return False  # nothing listens where its raylet did: gone
    except OSError:
        return True  # slow or unreachable for a moment is not dead: the cluster's own health checks decide


@dataclass
class StudyContext:
    """What the loop hands over: the study and everything a trial needs, and the run's counters."""

    study: object
    storage: object  # the study's Optuna storage (to mark a trial this process holds no live handle of)
    cfg: object
    prepared: object
    tracker: object
    progress: object
    res: Resources
    n_goal: int
    max_failed: int
    driver: str
    log: object
    proposals: Proposals
    recover: object  # () -> None: fail and requeue trials of dead drivers
    others_running: object  # () -> int: live RUNNING trials of other drivers
    running_below: object  # (number) -> int: live RUNNING trials numbered below `number` (any driver)


def counts_as_known(t) -> bool:
    """A finished trial whose configuration is measured: COMPLETE, pruned, invalid. A duplicate points at
    its twin; a plain failure (a gang error, an interruption) is retried, not known."""
    from optuna.trial import TrialState

    if t.state not in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) or DUPLICATE_ATTR in t.user_attrs:
        return False
    return t.state != TrialState.FAIL or INVALID_TAG in t.user_attrs


def known_configurations(study, cfg, space: dict | None, seed: int | None) -> Proposals:
    """The study's record as `Proposals`: every finished trial's configuration that counts as known."""
    book = Proposals(space, random.Random(seed))
    for t in study.get_trials(deepcopy=False):
        if counts_as_known(t) and (identity := identity_of(t, cfg)) is not None:
            book.known(identity, t.number)
    return book


def space_finished(study, cfg, proposals: Proposals, need_baseline: bool = False) -> bool:
    """Every distinct configuration of a finite space is known and nothing is queued (a retry, the
    baseline). `need_baseline`: also every TP size has its COMPLETE baseline (k = 0 outside the space is
    not among `proposals`; a rerun whose baseline failed must run it, so it is not finished)."""
    from optuna.trial import TrialState

    from orchestrator.config.space import candidates
    from orchestrator.study.trial import find_baseline

    if not proposals.exhausted or study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return False
    if not (need_baseline and cfg.study.baseline):
        return True
    tps = [int(t) for t in candidates(cfg, "parallel.tp")] if "parallel.tp" in cfg.search.space else [cfg.parallel.tp]
    return all(find_baseline(study, tp) is not None for tp in tps)


def complete(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


@dataclass
class Asked:
    """One ask: the trial and what became of it. `verdict`: "run" (measure it now), "surplus" (given
    back: other drivers hold the last open slots), "duplicate" (told PRUNED), "picked" (a duplicate,
    and an unknown configuration is queued in its place). `wait`: a duplicate with nothing new left to
    try while the running trials measure."""

    trial: object
    verdict: str
    admission: Admission | None = None
    wait: bool = False


class Asker:
    """The driver's ask, one critical section under the study's ask lock (orchestrator/study/ask_lock.py):
    fold in what other drivers finished and are measuring (`sync`), queue a race repeat, ask, write the
    trial's params (`identity_of`), then admit it, give it back as surplus, or find it a duplicate
    (queueing the study's own pick when the sampler keeps repeating itself; the duplicate is told PRUNED
    after the section, its MLflow calls holding no other driver's ask). No Ray: a unit
    test drives two of these, in two processes, on one storage.

        asker = Asker(ctx, tracker, ask_lock(ctx.storage, study.study_name, log))
        asked = asker.ask(running)  # running: this driver's running trials, by number
        ...                         # start asked.trial if asked.verdict == "run"; then asker.asking = None
    """

    def __init__(self, ctx: StudyContext, tracker, lock: AskLock, concurrency: int = 1):
        self.ctx, self.tracker, self.lock = ctx, tracker, lock
        self.concurrency = concurrency  # trials this driver runs at once: racing's last round
        self.seen: set[int] = set()  # finished trials already folded into `proposals`
        self.asking: int | None = None  # a trial asked and not yet started or told: an interrupt fails it

    def ask(self, running) -> Asked:
        """Ask for the next trial; `running`: this driver's running trials (numbers)."""
        ctx, study, cfg, proposals = self.ctx, self.ctx.study, self.ctx.cfg, self.ctx.proposals
        with self.lock:
            self.sync(running)
            self.race(len(running))
            trial = study.ask()
            self.asking = trial.number  # until its thread starts or it is told: an interrupt here must not leave it RUNNING
            trial.set_user_attr(DRIVER_ATTR, ctx.driver)
            beat(trial)
            if complete(study) + ctx.running_below(trial.number) >= ctx.n_goal:
                self.release_surplus(trial)
                self.asking = None
                return Asked(trial, "surplus")
            frozen = frozen_trial(study, trial.number)
            asked = "fixed_params" in frozen.system_attrs  # enqueued: the study asked for it
            admission = proposals.admit(trial.number, identity_of(trial, cfg), asked)
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

    def sync(self, running) -> None:
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

    def race(self, running: int) -> None:
        """study.race_trials: the last trials re-measure the leaders while the winner is not clear
        (`running`: this driver's running trials)."""
        from optuna.trial import TrialState

        study, cfg = self.ctx.study, self.ctx.cfg
        if cfg.study.race_trials <= 0 or study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return
        left = self.ctx.n_goal - complete(study) - running - self.ctx.others_running()
        number = race_pick(
            rank(study.get_trials(deepcopy=False)),
            left,
            cfg.study.race_trials,
            self.ctx.proposals.busy_identities(),
            lambda c: identity_of(frozen_trial(study, c.trials[0]), cfg),
            concurrency=self.concurrency,
        )
        if number is not None:
            first = frozen_trial(study, number)
            attrs = {RACE_TAG: number, **({BASELINE_TAG: True} if flag(first.user_attrs.get(BASELINE_TAG)) else {})}
            study.enqueue_trial(first.params, user_attrs=attrs, skip_if_exists=False)

    def release_surplus(self, trial) -> None:
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


def slot_pools(slots: list[Slot], res: Resources, log) -> dict[int, GangPool]:
    """One gang pool per slot (gangs are reused within a slot), pinned to the slot's node if it has one.
    The caller owns them: it closes them and counts their launches, however the loop ends."""
    return {s.index: GangPool(replace(res, node_id=s.node.id if s.node else None), log) for s in slots}


def run_trials(ctx: StudyContext, slots: list[Slot], pools: dict[int, GangPool], nodes: list[NodeInfo] = ()) -> int:
    """Keep every slot busy until `n_goal` trials are COMPLETE (or the space is all known).
    `nodes`: the cluster's nodes the slots were planned on (which share a host). Returns the number of
    trials that failed in this run."""
    from optuna.trial import TrialState

    study, cfg, log, proposals = ctx.study, ctx.cfg, ctx.log, ctx.proposals
    book, book_lock = SlotBook(slots, nodes), threading.Lock()
    tracker = Locked(ctx.tracker)
    finished: queue.Queue = queue.Queue()
    running: dict[int, tuple[threading.Thread, Slot]] = {}
    failed, idle_duplicates, waiting = 0, 0, False
    # a re-measure the ranking asked for (study.race_trials) where slots may share a host: it is measured
    # alone, so `held` waits (asked, not started) until the running trials end, and nothing starts beside
    # `solo` while it runs
    held, solo = None, None
    asker = Asker(ctx, tracker, ask_lock(ctx.storage, study.study_name, log), concurrency=len(slots))

    def work(trial, slot: Slot) -> None:
        try:
            site = book.site(trial.number, book_lock, node_alive)
            out = run_trial(study, trial, cfg, ctx.prepared, pools[slot.index], tracker, live=ctx.progress.live, site=site, lock=asker.lock)
        except BaseException as e:  # noqa: BLE001 - handed to the driver thread, which raises it
            out = e
        finished.put((trial.number, out))

    def start_next() -> bool:
        """Ask; measure the trial on a free slot unless it is surplus or a duplicate. False: stop asking
        until a running trial ends (surplus, nothing new to try while the running ones measure, or a
        re-measure that runs alone)."""
        nonlocal idle_duplicates, held, solo
        asked = asker.ask(running)
        trial = asked.trial
        if asked.verdict == "surplus":
            return False
        if asked.verdict == "picked":
            return True  # the study's own pick is queued: ask for it
        if asked.verdict == "duplicate":
            if asked.wait and running:
                return False  # nothing new to try until a running trial ends: wait for one, do not spin
            idle_duplicates += 1
            return True
        idle_duplicates = 0
        if RETRY_TAG in trial.user_attrs:
            fixed = frozen_trial(study, trial.number).system_attrs.get("fixed_params") or trial.params
            log(
                f"spectune: trial {trial.number} retries trial {trial.user_attrs[RETRY_TAG]} "
                f"({config_label({**label_defaults(cfg), **fixed})}), which did not finish"
            )
        if RACE_TAG in trial.user_attrs and book.hosts_shared:
            if running:
                held = trial
                log(
                    f"spectune: trial {trial.number} re-measures trial {trial.user_attrs[RACE_TAG]}'s configuration alone "
                    f"(study.isolation {cfg.study.isolation} lets trials share a host): it starts when the running trials end"
                )
                return False
            start(trial)
            solo = trial.number
            return False  # nothing starts beside it
        start(trial)
        return True  # started: ask for the next while a slot is free

    def start(trial) -> None:
        """Measure an admitted trial on a free slot, in a thread of its own."""
        with book_lock:
            slot = book.acquire(trial.number)
        if RACE_TAG in trial.user_attrs:  # a deliberate repeat: on a fresh gang (gang-to-gang spread is the noise users meet)
            pools[slot.index].close()
            log(
                f"spectune: trial {trial.number} re-measures trial {trial.user_attrs[RACE_TAG]}'s configuration: "
                "the ranking asked for it (leaders within noise, a lead from one gang, or timings taken beside other trials)"
            )
        thread = threading.Thread(target=work, args=(trial, slot), name=f"trial-{trial.number}", daemon=True)
        running[trial.number] = (thread, slot)
        thread.start()
        asker.asking = None

    def abandon(number: int, reason: str) -> None:
        """A trial the loop cannot see to its end (its thread did not stop in time, or the interrupt came
        between its ask and its start): FAIL (interrupted), its params queued again where it had any
        to keep (a proposal that never started needs none), its MLflow run ended."""
        from optuna.exceptions import UpdateFinishedTrialError

        t = frozen_trial(study, number)
        if t.state != TrialState.RUNNING:
            return
        with taking_turns(asker.lock, log):
            try:
                set_trial_user_attr(ctx.storage, study, number, FAIL_TAG, reason)
                study.tell(number, state=TrialState.FAIL)
            except (RuntimeError, ValueError, UpdateFinishedTrialError):
                return  # it finished after all
            if params := (t.system_attrs.get("fixed_params") or (t.params if t.user_attrs.get(RUN_ID_ATTR) else None)):
                requeue(study, params, t.user_attrs, number)
        if run_id := t.user_attrs.get(RUN_ID_ATTR):
            tracker.finish_trial(run_id, "FAIL", reason)

    def over_failure_limit() -> bool:
        return bool(failed) and failed >= ctx.max_failed  # max_failed failures end the run (0: the first does)

    try:
        while True:
            if held is not None and not running:  # the trials beside it have ended: the re-measure runs alone
                trial, held = held, None
                if complete(study) >= ctx.n_goal:  # other drivers completed the study meanwhile
                    asker.release_surplus(trial)
                    asker.asking = None
                else:
                    start(trial)
                    solo = trial.number
            done = complete(study)
            if not running and (done >= ctx.n_goal or space_finished(study, cfg, proposals)):
                if done < ctx.n_goal:
                    log(
                        f"spectune: every distinct configuration of the search space ({proposals.size}) is measured: "
                        f"the study ends at {done} complete trials (study.n_trials={ctx.n_goal})"
                    )
                break
            if over_failure_limit() and not running:
                raise UserError(
                    f"study: {failed} trials failed in this run (limit study.max_failed_trials={ctx.max_failed}); "
                    "see the MLflow runs' spectune.fail_reason"
                )
            while (
                not over_failure_limit()
                and held is None
                and solo is None
                and book.free
                and not space_finished(study, cfg, proposals)
                and complete(study) + len(running) + ctx.others_running() < ctx.n_goal
            ):
                if not start_next():
                    break
                if idle_duplicates >= MAX_IDLE_DUPLICATES:
                    raise UserError(
                        f"study.sampler: proposed {idle_duplicates} measured configurations in a row, and the space is too "
                        "large to pick an unmeasured one from; finished trials are saved (study.sampler: random explores more)"
                    )
            if not running:
                if space_finished(study, cfg, proposals) or complete(study) >= ctx.n_goal:
                    continue
                # other drivers hold the open slots: wait; one of their trials may still fail
                if not waiting:
                    log("spectune: the remaining trials are running in other drivers; waiting for them")
                waiting = True
                for pool in pools.values():
                    pool.close()
                time.sleep(1.0)
                ctx.recover()
                continue
            waiting = False
            try:
                number, out = finished.get(timeout=5.0)
            except queue.Empty:
                if held is not None:
                    beat(held)  # asked and waiting: a live driver's trial, not a stale one
                continue
            thread, slot = running.pop(number)
            thread.join()
            solo = None if solo == number else solo
            with book_lock:
                book.release(number)
            ctx.progress.live.finished(number)
            if isinstance(out, BaseException):
                raise out
            out: TrialOutcome
            proposals.finished(number, known=out.state != "FAIL" or out.invalid)
            if out.lost_node:
                with book_lock:
                    gone = book.lose_node(out.lost_node)
                for s in gone:
                    pools[s.index].close()
                name = next((s.node.name for s in gone if s.node), out.lost_node[:8])
                log(
                    f"spectune: trial {number} failed: node {name} left the cluster mid-trial; its params are queued again, {len(book)} slot(s) left"
                )
                if not len(book):
                    raise UserError("study: every node of the study's slots left the cluster")
            elif out.state == "FAIL" and out.reason != "interrupted":
                failed += 1
            ctx.progress.trial_done(number, out)
    except BaseException:
        for pool in pools.values():  # each running trial fails as interrupted and is queued again
            pool.interrupt()
        deadline = time.monotonic() + 60
        for thread, _ in list(running.values()):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for number, (thread, _) in running.items():
            if thread.is_alive():  # stuck past the deadline: fail it here, so no trial stays RUNNING
                abandon(number, "interrupted: the trial did not stop within 60 s")
        if asker.asking is not None and asker.asking not in running:
            abandon(asker.asking, "interrupted before it started")
        raise
    finally:
        asker.lock.close()
    return failed


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
