"""Trial scheduling as named parts (orchestrator/study/controller.py): the slot table, the failure
policy, racing, the trial threads, each alone; then the controller's loop itself (`runner.run_trials`,
with the real `run_trial`) on fake gang pools and a real in-memory Optuna study: no Ray, no
subprocesses. The fake cluster decides, per trial, whether its gang fails or its node dies under it,
and records which node ran which trial and when its gang decoded.

    .venv/bin/python -m pytest -q -n 0 tests/unit/test_scheduling.py
"""

from __future__ import annotations

import io
import threading
import time
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from orchestrator.config.schema import validated
from orchestrator.config.space import distinct_configs
from orchestrator.errors import UserError
from orchestrator.execution.pool import gang_identity
from orchestrator.execution.slot_table import SlotTable
from orchestrator.execution.slots import GangNeed, NodeInfo, Slot, plan_slots
from orchestrator.record import (
    CO_RUNNING_ATTR,
    DRIVER_ATTR,
    FAIL_TAG,
    GANG_ATTR,
    HOST_ATTR,
    NODE_ATTR,
    PARAMS_ATTR,
    PRUNE_TAG,
    RACE_TAG,
    RETRY_TAG,
    SAMPLES_ATTR,
)
from orchestrator.search.racing import Racing, Start
from orchestrator.study.asker import gang_of_params
from orchestrator.study.context import StudyContext
from orchestrator.study.failures import Failure, FailurePolicy
from orchestrator.study.goal import known_configurations
from orchestrator.study.runner import run_trials, trial_controller
from orchestrator.study.threads import TrialThreads
from orchestrator.study.trial import TrialOutcome
from orchestrator.tracking.progress import LiveLine, Progress
from workers.errors import GangError
from workers.spec import PromptResult, RunResult, Workload
from workers.spec.run_stats import RunStats

optuna.logging.set_verbosity(optuna.logging.WARNING)

K = "spec.num_draft_tokens"
A = NodeInfo("a" * 24, "host-a", cpus=4.0, gpus=0.0, address="10.0.0.1")
B = NodeInfo("b" * 24, "host-b", cpus=4.0, gpus=0.0, address="10.0.0.2")
LOCAL = "l" * 24  # where an unpinned slot's gang lands (one node)


def _cfg(ks=(1, 2, 3, 4, 5, 6), **study):
    return validated(
        {
            "name": "t",
            "model": {"path": "random:tiny"},
            "drafter": {"kind": "ngram"},
            "parallel": {"tp": 1, "device": "cpu", "backend": "gloo"},
            "workload": {"num_prompts": 2, "max_new_tokens": 8},
            "search": {"space": {K: {"choices": list(ks)}}},
            "study": {"n_trials": 4, "race_trials": 0, "baseline": False, "pruner": "none", "sampler": "random", "seed": 0, **study},
        }
    )


class FakeCluster:
    """What the fake gangs do, by trial (a trial thread is named trial-<number>): `fail` trials' gangs
    raise GangError; a `lose` trial's node dies under it (then its gang raises); a `gone_after` trial's
    node leaves once that trial has every answer (its peak memory: it completes); a `waits` trial's runs
    wait for another trial's first. A gang on a node that left keeps naming it once it has (as RayGang.node), and its
    runs raise. Records the node each trial decoded on and
    the span of its gang's runs."""

    def __init__(self, fail=(), lose=None, fail_all=False, run_s=0.0, gone_after=None, waits=None):
        self.fail, self.lose, self.fail_all, self.run_s = set(fail), dict(lose or {}), fail_all, run_s
        self.gone_after = dict(gone_after or {})  # trial -> the node that leaves once the trial has its answers
        self.waits = dict(waits or {})  # trial -> the trial whose first run its own runs wait for (at most 10 s)
        self.dead: set[str] = set()
        self.ran: dict[int, str] = {}
        self.spans: dict[int, list[float]] = {}
        self.lock = threading.Lock()

    def alive(self, node_id: str) -> bool:
        return node_id not in self.dead


class FakeGang:
    def __init__(self, pool: FakePool):
        self.pool, self._closed = pool, False
        self._node = None

    def node(self):
        """As RayGang.node: read once, while the node is there, and kept; a gang first asked after its node
        left gets what Ray's table then says (no node)."""
        if self._node is None:
            if self.pool.node_id in self.pool.cluster.dead:
                return "", ""  # as Ray: the placement group of a node that left maps its bundles to no node
            self._node = (self.pool.node_id, self.pool.host)
        return self._node

    def peak_rss_mb(self):
        number = int(threading.current_thread().name.removeprefix("trial-"))
        if number in self.pool.cluster.gone_after:
            self.pool.cluster.dead.add(self.pool.cluster.gone_after[number])
        return [1.0]

    def run(self, w: Workload, timeout_s: float, on_progress=None) -> RunResult:
        cluster = self.pool.cluster
        number = int(threading.current_thread().name.removeprefix("trial-"))
        start = time.monotonic()
        with cluster.lock:
            cluster.ran[number] = self.pool.node_id
            span = cluster.spans.setdefault(number, [start, start])
        if self.pool.node_id in cluster.dead:
            raise GangError("run: rank 0 died (ActorDiedError)")  # its actors left with the node
        if number in cluster.lose:
            cluster.dead.add(cluster.lose[number])
            raise GangError("the actor died unexpectedly")
        if cluster.fail_all or number in cluster.fail:
            raise GangError("rank 0 failed")
        if number in cluster.waits:
            until = time.monotonic() + 10
            while cluster.waits[number] not in cluster.ran and time.monotonic() < until:
                time.sleep(0.01)
        time.sleep(cluster.run_s)
        k = w.num_draft_tokens
        seconds = 1.0 / (k + 1)  # the more drafts, the faster: a ranking with leaders
        prompt = PromptResult(tokens=[1] * 8, seconds=seconds, steps=4, accepted=4)
        with cluster.lock:
            span[1] = time.monotonic()
        return RunResult(prompts=[prompt], stats=RunStats(tokens=8, seconds=seconds), num_draft_tokens=k)


class FakePool:
    """A slot's gang pool: one gang, reused until closed (as GangPool for an unchanged spec)."""

    def __init__(self, cluster: FakeCluster, node: NodeInfo | None):
        self.cluster = cluster
        self.node_id, self.host = (node.id, node.host) if node else (LOCAL, "host-local")
        self.gang: FakeGang | None = None
        self.launched, self.closes, self.setup_s, self.gang_id = 0, 0, 0.0, None
        self.interrupted = False
        self.launch_failed = None  # GangPool's: the gang whose launch failed for good (OutOfMemoryPool sets it)

    def get(self, spec, env, plain):
        if self.gang is None:
            self.gang = FakeGang(self)
            self.launched += 1
            self.gang_id = f"{self.host}-gang{self.launched}"
        return self.gang

    def close(self):
        self.closes += 1
        self.gang = None

    def interrupt(self):
        self.interrupted = True
        self.close()


class FakeTracker:
    """MLflow as the trials use it: runs started and finished (with their state), the rest ignored."""

    def __init__(self):
        self.finished: dict[str, tuple[str, str | None]] = {}

    def start_trial(self, number, params, tags=None):
        return f"run-{number}"

    def finish_trial(self, run_id, state, reason=None):
        self.finished[run_id] = (state, reason)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class OneDriver:
    """No other driver: none of their trials runs; `running_below` counts this driver's live trials, as
    loop.LiveDrivers does for any driver. `theirs`: trials another driver runs until `recover` (a dead
    driver's: FAIL, params queued again, as loop.recover_stale does)."""

    def __init__(self, study, theirs=()):
        self.study, self.theirs, self.recovered = study, list(theirs), 0

    def running(self) -> int:
        return len(self.theirs)

    def running_below(self, number: int) -> int:
        return len([t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if t.number < number])

    def recover(self) -> None:
        from orchestrator.record import requeue

        self.recovered += 1
        for t in self.theirs:
            self.study.tell(t.number, state=TrialState.FAIL)
            requeue(self.study, t.params, t.user_attrs, t.number)
        self.theirs = []


def _study(*ks):
    """An in-memory study, the given configurations enqueued in order (trial numbers 0, 1, ...)."""
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for k in ks:
        study.enqueue_trial({K: k})
    return study, storage


def _prepared():
    return SimpleNamespace(
        token_ids=((1, 2, 3), (4, 5, 6)),
        workload=lambda cfg, tc, prompts=None, batch_size=1: Workload(prompts=prompts, num_draft_tokens=tc.num_draft_tokens),
        gang_spec=lambda cfg, tc: "one gang for every trial",  # so a re-measure's own gang shows
    )


def _ctx(study, storage, cfg, max_failed=8, others=None):
    lines: list[str] = []
    ctx = StudyContext(
        study=study,
        storage=storage,
        cfg=cfg,
        prepared=_prepared(),
        tracker=FakeTracker(),
        progress=Progress(study, cfg.study.n_trials, lines.append, live=LiveLine(stream=io.StringIO())),
        n_goal=cfg.study.n_trials,
        max_failed=max_failed,
        driver="test-driver",
        log=lines.append,
        proposals=known_configurations(study, cfg, distinct_configs(cfg), 0),
        others=others or OneDriver(study),
    )
    return ctx, lines


def _by_state(study):
    return {s: [t for t in study.trials if t.state == s] for s in TrialState}


def _two_node_slots(cluster):
    slots = plan_slots([A, B], GangNeed(cpus=1.0), "node", 2)
    assert [s.node.id for s in slots] == [A.id, B.id]
    return slots, {s.index: FakePool(cluster, s.node) for s in slots}


# the parts, each alone


def test_the_slot_table_hands_out_free_slots_and_a_lost_node_takes_its_slots_with_it():
    cluster = FakeCluster()
    slots, pools = _two_node_slots(cluster)
    cluster.dead.add(B.id)
    table = SlotTable(slots, pools, [A, B], cluster.alive)
    assert len(table) == 2 and table.free == 2 and not table.hosts_shared
    assert table.acquire(0).node.id == A.id and table.acquire(1).node.id == B.id and table.free == 0
    with pytest.raises(RuntimeError, match="no free slot for trial 2"):
        table.acquire(2)
    assert table.site(0).lost_node() is None and table.site(1).lost_node() == (B.id, B.name)
    assert table.lose_node(B.id) == [slots[1]] and len(table) == 1
    assert (pools[0].closes, pools[1].closes) == (0, 1)  # the lost node's pool closed, the other kept
    table.release(1)
    assert table.free == 0  # the lost node's slot is not handed out again
    table.release(0)
    assert table.free == 1
    assert table.acquire(3, fresh=True) == slots[0] and pools[0].closes == 1  # a re-measure: its pool's gang goes first
    table.park()
    assert pools[0].closes == 2 and not pools[0].interrupted
    table.interrupt()
    assert pools[0].interrupted and pools[1].interrupted
    assert SlotTable([Slot(0), Slot(1)], {}).hosts_shared  # unpinned slots may share a host


def test_the_failure_policy_counts_a_trials_own_failures_and_ends_the_run_at_its_limit():
    policy = FailurePolicy(max_failed=2)
    assert policy.record(TrialOutcome("COMPLETE", None)) is Failure.NONE
    assert policy.record(TrialOutcome("PRUNED", None, reason="duplicate")) is Failure.NONE
    assert policy.record(TrialOutcome("FAIL", None, reason="interrupted")) is Failure.INTERRUPTED
    lost = TrialOutcome("FAIL", None, reason="node host-b/bbbbbbbb left the cluster mid-trial", lost_node=B.id)
    assert policy.record(lost) is Failure.NODE_LOST
    assert policy.failed == 0 and not policy.over_limit  # queued again by the trial: not counted
    assert policy.record(TrialOutcome("FAIL", None, reason="GangError: rank 0 failed")) is Failure.OWN
    assert policy.failed == 1 and not policy.over_limit
    assert policy.record(TrialOutcome("FAIL", None, reason="invalid: greedy output differs", invalid=True)) is Failure.OWN
    assert policy.failed == 2 and policy.over_limit
    assert str(policy.error()) == (
        "study: 2 trials failed in this run (limit study.max_failed_trials=2); see the MLflow runs' spectune.fail_reason"
    )
    first = FailurePolicy(max_failed=0)  # 0: the first failure ends the run
    assert not first.over_limit
    first.record(TrialOutcome("FAIL", None, reason="GangError: x"))
    assert first.over_limit


def _complete(k: int, tok_s: float):
    return create_trial(
        state=TrialState.COMPLETE,
        value=tok_s,
        params={K: k},
        distributions={K: CategoricalDistribution([1, 2, 3, 4, 5, 6])},
        user_attrs={PARAMS_ATTR: {K: k, "drafter.kind": "ngram", "parallel.tp": 1}, SAMPLES_ATTR: [tok_s]},
    )


def test_racing_queues_a_leaders_repeat_at_the_end_and_holds_it_while_others_run():
    cfg = _cfg(n_trials=3, race_trials=1)
    study, _ = _study()
    study.add_trial(_complete(2, 10.0))
    study.add_trial(_complete(5, 12.0))  # the faster: the leader while the noise is unknown
    racing = Racing(race_trials=1, alone=True, concurrency=2)
    assert racing.enqueue_repeat(study, cfg, trials_left=lambda: 2, busy=set()) is None  # not the last trial yet
    assert Racing(0).enqueue_repeat(study, cfg, trials_left=lambda: 1, busy=set()) is None  # racing off
    assert not study.get_trials(states=(TrialState.WAITING,))
    assert racing.enqueue_repeat(study, cfg, trials_left=lambda: 1, busy=set()) == 1
    (queued,) = study.get_trials(states=(TrialState.WAITING,))
    assert queued.user_attrs[RACE_TAG] == 1 and queued.system_attrs["fixed_params"] == {K: 5}
    assert racing.enqueue_repeat(study, cfg, trials_left=lambda: 1, busy=set()) is None  # one queued already: it goes first
    trial = study.ask()
    assert Racing.is_repeat(trial) and trial.suggest_categorical(K, [1, 2, 3, 4, 5, 6]) == 5
    assert racing.place(trial, running=True) is Start.HOLD and racing.held is trial and racing.blocks
    assert racing.take_held() is trial and racing.held is None and not racing.blocks
    assert racing.place(trial, running=False) is Start.ALONE and racing.solo == trial.number and racing.blocks
    racing.ended(trial.number - 1)
    assert racing.blocks  # another trial's end does not free it
    racing.ended(trial.number)
    assert not racing.blocks
    assert Racing(1, alone=False).place(trial, running=True) is Start.NOW  # no two slots share a host
    assert racing.place(study.ask({K: CategoricalDistribution([1, 2, 3, 4, 5, 6])}), running=True) is Start.NOW  # not a repeat


def test_trial_threads_hand_back_each_outcome_or_what_it_raised_and_name_the_stuck():
    threads, release = TrialThreads(), threading.Event()

    def fails():
        raise GangError("boom")

    threads.start(1, Slot(0), lambda: TrialOutcome("COMPLETE", None))
    threads.start(2, Slot(1), fails)
    got = dict(threads.next(5.0) for _ in range(2))
    assert got[1].state == "COMPLETE" and isinstance(got[2], GangError)
    assert 1 in threads and len(threads) == 2  # running until collected
    assert threads.pop(1) == Slot(0) and threads.pop(2) == Slot(1) and len(threads) == 0
    assert threads.next(0.01) is None
    threads.start(3, Slot(0), lambda: release.wait(10) and TrialOutcome("FAIL", None, reason="interrupted"))
    assert threads.stop(0.05) == [3] and 3 in threads  # did not stop in time: named, kept
    release.set()
    assert threads.stop(5.0) == []


# the controller's loop (runner.run_trials) on fake pools


def test_two_slots_a_failed_trial_counts_and_the_study_goes_on_to_its_goal():
    cfg = _cfg(n_trials=4)
    study, storage = _study(1, 2, 3, 4)
    cluster = FakeCluster(fail={1})
    slots, pools = _two_node_slots(cluster)
    ctx, lines = _ctx(study, storage, cfg, max_failed=2)
    assert run_trials(ctx, slots, pools, [A, B], cluster.alive) == 1  # one failure in this run, within the limit
    s = _by_state(study)
    assert len(s[TrialState.COMPLETE]) == 4 and not s[TrialState.RUNNING] and not s[TrialState.WAITING]
    assert [t.number for t in s[TrialState.FAIL]] == [1]
    assert study.trials[1].user_attrs[FAIL_TAG] == "GangError: rank 0 failed"
    assert ctx.tracker.finished["run-1"] == ("FAIL", "GangError: rank 0 failed")
    # the trial's own failure is not queued again (its configuration stays open to the sampler)
    assert not [t for t in study.trials if RETRY_TAG in t.user_attrs]
    # one trial per slot at a time, on both nodes, the first two at once, nobody beside anybody (two hosts)
    assert cluster.ran[0] == A.id and cluster.ran[1] == B.id
    assert {cluster.ran[t.number] for t in s[TrialState.COMPLETE]} == {A.id, B.id}
    assert all(t.user_attrs[NODE_ATTR] == cluster.ran[t.number] for t in study.trials if t.number in cluster.ran)
    assert not [t for t in study.trials if t.user_attrs.get(CO_RUNNING_ATTR)]
    assert len({t.params[K] for t in s[TrialState.COMPLETE]}) == 4  # no configuration measured twice
    assert any("trial 1 FAIL" in line and "GangError: rank 0 failed" in line for line in lines)


def test_a_lost_node_requeues_its_trial_and_its_slots_leave_the_study():
    cfg = _cfg(n_trials=3)
    study, storage = _study(1, 2, 3)
    cluster = FakeCluster(lose={1: B.id})  # trial 1 runs on B, which dies under it
    slots, pools = _two_node_slots(cluster)
    ctx, lines = _ctx(study, storage, cfg, max_failed=0)  # 0: any counted failure would end the run
    assert run_trials(ctx, slots, pools, [A, B], cluster.alive) == 0  # not the trial's fault: not counted
    s = _by_state(study)
    assert [t.number for t in s[TrialState.COMPLETE]] == [0, 2, 3] and not s[TrialState.WAITING] and not s[TrialState.RUNNING]
    lost = study.trials[1]
    assert lost.state == TrialState.FAIL and cluster.ran[1] == B.id
    assert lost.user_attrs[FAIL_TAG].startswith(f"node {B.name} left the cluster mid-trial (GangError: the actor died")
    retry = study.trials[3]
    assert retry.user_attrs[RETRY_TAG] == 1 and retry.params == lost.params
    # the slot on B left the study: every later trial ran on A
    assert [n for n, node in cluster.ran.items() if node == B.id] == [1]
    assert cluster.ran[2] == cluster.ran[3] == A.id and pools[1].gang is None
    assert f"spectune: trial 1 failed: node {B.name} left the cluster mid-trial; its params are queued again, 1 slot(s) left" in lines
    assert any(line.startswith("spectune: trial 3 retries trial 1 (") for line in lines)


def test_a_node_that_left_after_its_trial_ended_fails_the_next_trial_there_naming_it():
    """B leaves once trial 1 has every answer (trial 1 completes: nothing of ours saw B go). Trial 2 takes B's
    slot and reuses its gang, which Ray now maps to no node and whose runs fail: trial 2 fails as a lost
    node, named by host and id (the slot's node, not the empty one), not counted, its params retried on A,
    and B's slot leaves the study."""
    cfg = _cfg(n_trials=3)
    study, storage = _study(1, 2, 3)
    cluster = FakeCluster(gone_after={1: B.id}, waits={0: 2})  # trial 0 holds A's slot until trial 2 has started
    slots, pools = _two_node_slots(cluster)
    ctx, lines = _ctx(study, storage, cfg, max_failed=0)  # 0: a counted failure would end the run
    assert run_trials(ctx, slots, pools, [A, B], cluster.alive) == 0
    s = _by_state(study)
    assert [t.number for t in s[TrialState.COMPLETE]] == [0, 1, 3] and not s[TrialState.RUNNING] and not s[TrialState.WAITING]
    lost = study.trials[2]
    assert lost.state == TrialState.FAIL and cluster.ran[2] == B.id
    reason = lost.user_attrs[FAIL_TAG]
    assert reason == f"node {B.name} left the cluster mid-trial (GangError: run: rank 0 died (ActorDiedError))", reason
    assert lost.user_attrs[NODE_ATTR] == B.id and lost.user_attrs[HOST_ATTR] == B.host
    retry = study.trials[3]
    assert retry.user_attrs[RETRY_TAG] == 2 and retry.params == lost.params and cluster.ran[3] == A.id
    assert f"spectune: trial 2 failed: node {B.name} left the cluster mid-trial; its params are queued again, 1 slot(s) left" in lines


def test_a_ray_gang_keeps_naming_its_node_once_ray_maps_it_to_none(monkeypatch):
    """RayGang.node (no Ray: its placement group table and node table replaced) reads the node once: a
    gang reused after its node left (Ray then maps its bundles to "") still names that node and its host
    label; where Ray maps none from the start, the node the gang was pinned to."""
    import importlib

    from orchestrator.execution.cluster import Resources
    from orchestrator.execution.gang import RayGang

    pg_module = importlib.import_module("ray.util.placement_group")  # the module (ray.util's attribute is its function)
    mapped = {"bundles_to_node_id": {0: B.id}}
    monkeypatch.setattr(pg_module, "placement_group_table", lambda pg: mapped)
    dead_b = {"NodeID": B.id, "Alive": False, "NodeManagerHostname": "vm", "Labels": {"spectune.io/host": "test-host-b"}}
    gang = object.__new__(RayGang)  # as launched: its placement group, no pin
    gang.pg, gang.res, gang._node, gang._ray = None, Resources(), None, SimpleNamespace(nodes=lambda: [dead_b])
    assert gang.node() == (B.id, "test-host-b")
    mapped["bundles_to_node_id"] = {0: ""}  # B left: its placement group waits to be placed again
    assert gang.node() == (B.id, "test-host-b")
    pinned = object.__new__(RayGang)
    pinned.pg, pinned.res, pinned._node, pinned._ray = None, Resources(node_id=B.id), None, gang._ray
    assert pinned.node() == (B.id, "test-host-b")


def test_the_failure_limit_ends_the_study_with_the_reason():
    cfg = _cfg(n_trials=4)
    study, storage = _study(1, 2, 3, 4)
    cluster = FakeCluster(fail_all=True)
    pools = {0: FakePool(cluster, None)}
    ctx, _ = _ctx(study, storage, cfg, max_failed=2)
    with pytest.raises(UserError, match=r"^study: 2 trials failed in this run \(limit study.max_failed_trials=2\)"):
        run_trials(ctx, [Slot(0)], pools, [], cluster.alive)
    s = _by_state(study)
    assert [t.number for t in s[TrialState.FAIL]] == [0, 1] and not s[TrialState.RUNNING] and not s[TrialState.COMPLETE]
    assert [t.number for t in s[TrialState.WAITING]] == [2, 3]  # never asked: no third trial started past the limit
    assert pools[0].interrupted  # the loop's stop path closed every pool


def test_racing_re_measures_the_leader_at_the_end_on_a_fresh_gang():
    cfg = _cfg(n_trials=3, race_trials=1)
    study, storage = _study(2, 5)
    cluster = FakeCluster()
    pools = {0: FakePool(cluster, None)}
    ctx, lines = _ctx(study, storage, cfg)
    assert run_trials(ctx, [Slot(0)], pools, [], cluster.alive) == 0
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert RACE_TAG not in trials[0].user_attrs and RACE_TAG not in trials[1].user_attrs
    assert trials[2].user_attrs[RACE_TAG] == 1 and trials[2].params == trials[1].params == {K: 5}  # the faster: the leader
    # the first two shared one gang; the re-measure had one of its own
    assert trials[0].user_attrs[GANG_ATTR] == trials[1].user_attrs[GANG_ATTR] != trials[2].user_attrs[GANG_ATTR]
    assert pools[0].launched == 2
    assert any(line.startswith("spectune: trial 2 re-measures trial 1's configuration: the ranking asked for it") for line in lines)


def test_where_slots_share_a_host_the_re_measure_waits_for_the_running_trials_and_runs_alone():
    """Two unpinned slots (isolation none): trials 0 and 1 run at once (each marked with the other),
    trial 2 starts when the first ends; the race trial, asked while trial 2 runs, is held, and then
    decodes with nothing beside it."""
    cfg = _cfg(n_trials=4, race_trials=1, isolation="none")
    study, storage = _study(1, 2, 3)
    cluster = FakeCluster(run_s=0.02)
    pools = {0: FakePool(cluster, None), 1: FakePool(cluster, None)}
    ctx, lines = _ctx(study, storage, cfg)
    assert run_trials(ctx, [Slot(0), Slot(1)], pools, [], cluster.alive) == 0
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    raced = [t for t in trials if RACE_TAG in t.user_attrs]
    assert [t.number for t in raced] == [3]
    assert 1 in trials[0].user_attrs[CO_RUNNING_ATTR] and 0 in trials[1].user_attrs[CO_RUNNING_ATTR]
    assert not raced[0].user_attrs.get(CO_RUNNING_ATTR)
    held = f"spectune: trial 3 re-measures trial {raced[0].user_attrs[RACE_TAG]}'s configuration alone (study.isolation none"
    assert any(line.startswith(held) and line.endswith("it starts when the running trials end") for line in lines)
    start = cluster.spans[3][0]
    assert all(end <= start for n, (_, end) in cluster.spans.items() if n != 3), cluster.spans  # nothing ran beside it


def test_while_other_drivers_hold_the_last_place_the_driver_waits_and_runs_what_they_leave():
    """Two trials to go, one COMPLETE and one RUNNING in another driver: this one asks nothing, says so
    once, keeps no gang, and looks again; once the other driver's trial is recovered (its driver died)
    the retry runs here."""
    cfg = _cfg(n_trials=2)
    study, storage = _study()
    study.add_trial(_complete(1, 10.0))
    theirs = study.ask({K: CategoricalDistribution([1, 2, 3, 4, 5, 6])})
    theirs.set_user_attr(DRIVER_ATTR, "elsewhere:1:1")
    others = OneDriver(study, theirs=[study.trials[theirs.number]])
    ctx, lines = _ctx(study, storage, cfg, others=others)
    cluster = FakeCluster()
    pools = {0: FakePool(cluster, None)}
    controller = trial_controller(ctx, [Slot(0)], pools, [], cluster.alive)
    controller.others_poll_s = 0.01
    try:
        assert controller.run() == 0
    finally:
        controller.asker.lock.close()
    assert lines.count("spectune: the remaining trials are running in other drivers; waiting for them") == 1
    assert others.recovered == 1 and pools[0].closes >= 1  # no gang kept while waiting
    retry = study.trials[-1]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs[RETRY_TAG] == theirs.number
    assert retry.user_attrs[DRIVER_ATTR] == "test-driver" and cluster.ran == {retry.number: LOCAL}
    assert [t.state for t in study.trials].count(TrialState.COMPLETE) == 2


class OutOfMemoryPool(FakePool):
    """A pool whose layer-skip gang never launches: a rank runs out of memory in its setup, as
    GangPool reports it (`launch_failed`: the gang's identity)."""

    def get(self, spec, env, plain):
        self.launch_failed = None
        if "layer_skip" in spec:
            self.launch_failed = gang_identity(spec, env)
            raise GangError("setup: rank 0: OutOfMemoryError: CUDA out of memory. Tried to allocate 1.31 GiB")
        return super().get(spec, env, plain)


def test_a_gang_that_cannot_launch_is_tried_twice_and_its_configurations_are_not_launched_again():
    """The seeds' emulated TP 8 study on an H100: every layer-skip trial ran out of memory at setup and
    the sampler kept proposing layer-skip (20 failures). Now a second failure on a fresh launch rules out
    its gang: the other layer-skip proposals are told PRUNED naming both, and the space ends once the
    rest is measured."""
    cfg = validated(
        {
            "name": "t",
            "model": {"path": "random:tiny"},
            "drafter": {"kind": "ngram"},
            "parallel": {"tp": 1, "device": "cpu", "backend": "gloo"},
            "workload": {"num_prompts": 2, "max_new_tokens": 8},
            "search": {"space": {K: {"choices": [1, 2, 3]}, "drafter.kind": {"choices": ["ngram", "layer_skip"]}}},
            "study": {"n_trials": 6, "race_trials": 0, "baseline": False, "pruner": "none", "sampler": "tpe", "seed": 0},
        }
    )
    study, storage = _study()
    study.enqueue_trial({K: 2, "drafter.kind": "layer_skip"})  # the first two trials need the gang that cannot launch
    study.enqueue_trial({K: 3, "drafter.kind": "layer_skip"})
    ctx, lines = _ctx(study, storage, cfg, max_failed=3)
    prepared = SimpleNamespace(**{**vars(ctx.prepared), "gang_spec": lambda cfg, tc: f"drafter {tc.drafter.kind}"})
    ctx.prepared = prepared
    ctx.proposals.gang_of = gang_of_params(cfg, prepared)
    cluster = FakeCluster()
    pools = {0: OutOfMemoryPool(cluster, None)}
    assert run_trials(ctx, [Slot(0)], pools, [], cluster.alive) == 2  # two failures, within the limit of 3
    s = _by_state(study)
    assert [t.number for t in s[TrialState.FAIL]] == [0, 1]
    assert all(study.trials[n].user_attrs[FAIL_TAG].startswith("GangError: setup: rank 0: OutOfMemoryError") for n in (0, 1))
    # the three n-gram configurations measured once each; every other layer-skip proposal never launched
    assert sorted(t.params[K] for t in s[TrialState.COMPLETE]) == [1, 2, 3]
    assert {t.params["drafter.kind"] for t in s[TrialState.COMPLETE]} == {"ngram"}
    assert sorted(cluster.ran) == sorted(t.number for t in s[TrialState.COMPLETE])  # nothing else decoded
    refused = [t for t in s[TrialState.PRUNED] if t.params["drafter.kind"] == "layer_skip"]
    why = "its gang failed to launch in trials 0 and 1 (GangError: setup: rank 0: OutOfMemoryError"
    assert all(why in t.user_attrs[PRUNE_TAG] for t in refused)  # any later layer-skip proposal (TPE may make none)
    assert ctx.proposals.exhausted and ctx.proposals.ruled_out == 3  # every layer-skip configuration: 3 COMPLETE of n_trials 6
    assert "spectune: trial 1's gang failed to launch a second time; this driver launches it no more in this run" in lines
    end = "spectune: every distinct configuration of the search space (6) is measured or ruled out (3 on gangs that failed to launch)"
    assert any(line.startswith(end) for line in lines), lines


def test_a_gang_that_died_or_timed_out_at_launch_stays_open():
    """Only a rank that raised in its setup rules a gang out: one that died, did not answer or was
    interrupted may not fail again, so its configurations stay open (the texts are RayGang._gather's)."""
    from orchestrator.execution.pool import fails_for_good

    assert fails_for_good(GangError("setup: rank 0: OutOfMemoryError: CUDA out of memory. Tried to allocate 1.31 GiB"))
    assert fails_for_good(GangError("setup: rank 1: NotImplementedError: no fused step for latent attention"))
    assert not fails_for_good(GangError("setup: ranks [0, 1] did not answer within 600s"))
    assert not fails_for_good(GangError("setup: rank 0 died (ActorDiedError)"))
    assert not fails_for_good(GangError("interrupted while its gang was launched"))
    assert not fails_for_good(KeyboardInterrupt())


def test_a_space_smaller_than_the_goal_still_races_its_leaders_before_it_ends():
    """The seeds' emulated TP 8 studies measured their 6 launchable configurations of 10 trials and ended
    there: the winner came from one trial, "not a clear win". A space all known now gets its
    study.race_trials re-measures (each a last round), then ends."""
    cfg = _cfg(ks=(1, 2, 3), n_trials=6, race_trials=2, sampler="tpe")
    study, storage = _study()
    cluster = FakeCluster()
    pools = {0: FakePool(cluster, None)}
    ctx, lines = _ctx(study, storage, cfg)
    assert run_trials(ctx, [Slot(0)], pools, [], cluster.alive) == 0
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    races = [t for t in complete if RACE_TAG in t.user_attrs]
    assert sorted({t.params[K] for t in complete}) == [1, 2, 3] and len(complete) == 5 and len(races) == 2
    # the winner (k = 3, the fastest) measured on a second gang first, then the runner-up
    assert [t.params[K] for t in races] == [3, 2]
    assert all(t.user_attrs[GANG_ATTR] not in {u.user_attrs[GANG_ATTR] for u in complete if u is not t} for t in races)
    assert (
        "spectune: every distinct configuration of the search space (3) is measured: the study ends at 5 complete trials (study.n_trials=6)"
        in lines
    )


@pytest.mark.parametrize(
    ("error", "for_good"),
    [
        ("setup: rank 0: OutOfMemoryError: CUDA out of memory", True),
        ("setup: rank 1 died (ActorDiedError)", False),
        ("setup: ranks [0] did not answer within 600s", False),
    ],
)
def test_the_gang_pool_names_a_gang_whose_launch_failed_for_good(monkeypatch, error, for_good):
    """GangPool.get (no Ray: its RayGang replaced) records the gang, as `gang_identity` of the spec and
    NCCL env the trial asked for, where a rank raised in setup; not where one died or timed out, and not
    on the next launch of another gang."""
    from orchestrator.execution import pool as pool_module
    from orchestrator.execution.cluster import Resources
    from workers.spec import DrafterSpec, GangSpec

    class Launch:
        def __init__(self, spec, env, res, progress=None):
            self.spec, self._closed = spec, False

        def setup(self):
            if self.spec.drafter.kind == "layer_skip":
                raise GangError(error)
            return []

        def run(self, workload, **kwargs):
            return None

        def close(self):
            self._closed = True

    monkeypatch.setattr(pool_module, "RayGang", Launch)
    pool = pool_module.GangPool(Resources(), log=lambda line: None)
    pool.progress = object()  # the shared progress queue (a Ray actor) exists already
    spec, env = GangSpec(model_path="m", drafter=DrafterSpec(kind="layer_skip", layers=2)), {"NCCL_PROTO": "LL"}
    with pytest.raises(GangError, match=error.split(":")[0]):
        pool.get(spec, env, plain=False)
    assert pool.launch_failed == (pool_module.gang_identity(spec, env) if for_good else None)
    assert pool.gang is None  # nothing kept of it
    pool.get(GangSpec(model_path="m"), env, plain=False)  # another gang launches, and the record is its own
    assert pool.launch_failed is None and pool.gang is not None
