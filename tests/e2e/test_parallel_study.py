"""Trials in parallel on a real two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a
head and a worker raylet on loopback).

Two raylets of one machine are one host to `study.isolation: node` (orchestrator/execution/slots.py),
so the first test declares them distinct hosts the one way spectune takes: each node is started with
the Ray label `spectune.io/host` (what a cluster operator would do; no environment variable). Then
`study.max_concurrent_trials: 2` runs one trial on each node at once; the worker's node is then lost
under a trial the test has made unable to finish (its actors frozen before the kill, see
`kill_worker_under_a_trial`), and exactly that trial fails naming the node, its params are retried on
the head, the study still ends at exactly `study.n_trials` COMPLETE, and nothing the study started is
left behind. The second test leaves the raylets unlabelled: one host, one trial at a time, said in one line.
The third runs two at a time with isolation none on the embedded Ray: neighbours are marked, and the
race re-measures alone.

    .venv/bin/python -m pytest tests/e2e/test_parallel_study.py
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
from studyutil import mlflow_runs, optuna_study, ray_temp_dir, run_here, spectune, sql, summary, tiny_experiment

HOST_LABEL = "spectune.io/host"  # orchestrator/execution/slots.py's HOST_LABEL, spelled as a cluster operator would


def _cluster(head_labels: dict | None, worker_labels: dict | None, monkeypatch):
    from ray.cluster_utils import Cluster

    tmp = ray_temp_dir()
    # Cluster records the head's address in <RAY_TMPDIR or /tmp>/ray/ray_current_cluster, whatever the
    # head's temp_dir: keep it in this test's dir (no /tmp/ray on a fresh machine; and on a shared one,
    # that file would point other users' ray.init() at this cluster)
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    os.makedirs(os.path.join(tmp, "ray"), exist_ok=True)
    head = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "temp_dir": tmp, "include_dashboard": False}
    # no idle workers started for a driver up front (as spectune's embedded Ray): gangs start their own actors
    head["_system_config"] = {"prestart_worker_first_driver": False}
    cluster = Cluster(initialize_head=True, head_node_args={**head, **({"labels": head_labels} if head_labels else {})})
    worker = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", **({"labels": worker_labels} if worker_labels else {}))
    cluster.wait_for_nodes()
    return cluster, worker, tmp


@pytest.fixture
def two_hosts(monkeypatch):
    """Two raylets of this machine, declared two hosts by their `spectune.io/host` labels."""
    cluster, worker, tmp = _cluster({HOST_LABEL: "test-host-a"}, {HOST_LABEL: "test-host-b"}, monkeypatch)
    try:
        yield cluster, worker, tmp
    finally:
        cluster.shutdown()


@pytest.fixture
def one_host(monkeypatch):
    """Two raylets of this machine as they are: one address, one host."""
    cluster, worker, tmp = _cluster(None, None, monkeypatch)
    try:
        yield cluster, worker, tmp
    finally:
        cluster.shutdown()


def _intervals_overlap(trials) -> bool:
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials if t.datetime_complete)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


@pytest.mark.timeout(600)
def test_two_trials_at_once_one_per_node_and_a_lost_node_is_retried(tmp_path, tiny_ckpt, two_hosts):
    cluster, worker, ray_tmp = two_hosts
    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        parallel={"tp": 1, "cpus_per_worker": 0.1},
        workload={"prompts": str(tmp_path / "prompts.jsonl"), "num_prompts": 3, "max_new_tokens": 32},
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 1, 2, 3, 4, 5]}}},
        study={"n_trials": 4, "sampler": "random", "seed": 0, "pruner": "none", "max_concurrent_trials": 2, "isolation": "node"},
    )
    home = tmp_path / "home"
    db = home / "optuna.db"
    killed: dict = {}
    raylet = psutil.Process(worker.all_processes["raylet"][0].process.pid)

    def kill_worker_under_a_trial() -> None:
        """Lose the worker node under a trial that cannot finish, with no race against it finishing:
        1. while a trial runs on the worker, freeze (SIGSTOP) every process of the worker node (Ray starts
           a node's actors as children of its raylet), and wait until every thread of each has stopped:
           from then on none of them runs an instruction until the test says so;
        2. read the study again: a trial on the worker still RUNNING and short of its last prompt has not
           recorded its last prompt yet, and the driver asks its actors for the peak memory only after that
           (orchestrator/study/trial.py `measure`), so it needs at least one more answer from those frozen
           actors and cannot complete while they stay frozen; otherwise let them go and wait for the next
           trial on the worker;
        3. SIGKILL the worker's raylet, and let the frozen actors go only once the driver has ended that
           trial (Ray marks the node dead, the calls to its actors fail): they then notice their dead
           raylet and must exit by themselves (the leak check below). Where the trial has not ended
           (a wait past its limit, an error here), they are killed instead, never let go: let go while
           the trial still waits on them, they would answer it and it could complete."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and "trial" not in killed:
            if _unfinished_on(db, worker.node_id, retry_s=0) is None:
                time.sleep(0.02)
                continue
            frozen = raylet.children(recursive=True)
            for p in frozen:
                _signal(p, signal.SIGSTOP)
            number = state = None
            try:
                if not _all_stopped(frozen, timeout_s=30):
                    continue  # a thread that never stopped (stuck in the kernel): let them go, try again
                number = _unfinished_on(db, worker.node_id, retry_s=30)  # read after the freeze: decides
                if number is None:
                    continue  # it got past its last prompt before the freeze: the next trial on the worker
                killed.update(trial=number, pids=[raylet.pid] + [p.pid for p in frozen])
                cluster.remove_node(worker, allow_graceful=False)
                until = time.monotonic() + 240
                while time.monotonic() < until and (state := _state(db, number)) not in FINISHED:
                    time.sleep(0.2)
                killed["ended_while_frozen"] = state in FINISHED  # the driver saw the node leave, not its actors die
            finally:  # never leave them frozen, nor let them answer the decided trial while it still runs
                for p in frozen:
                    _signal(p, signal.SIGCONT if number is None or state in FINISHED else signal.SIGKILL)

    killer = threading.Thread(target=kill_worker_under_a_trial, daemon=True)
    killer.start()
    r = spectune(["run", str(exp), "--json"], home, env={"RAY_ADDRESS": cluster.address})
    killer.join(timeout=5)
    assert r.returncode == 0, r.stderr[-4000:]
    assert summary(r)["complete"] == 4
    assert "2 trials at once (isolation node) on test-host-a/" in r.stderr and "test-host-b/" in r.stderr, r.stderr[-3000:]
    assert "trial" in killed, r.stderr[-3000:]  # the kill landed under a trial on the worker
    assert killed.get("ended_while_frozen"), "the driver did not end the trial while its actors stayed frozen"

    study = optuna_study(f"sqlite:///{db}", "tiny-study")
    by_state = {s: [t for t in study.trials if t.state.name == s] for s in ("COMPLETE", "FAIL", "RUNNING", "WAITING")}
    assert len(by_state["COMPLETE"]) == 4 and not by_state["RUNNING"] and not by_state["WAITING"]
    # exactly the trial the test froze fails, naming the node; its params run again on the head
    fails = [(t.number, t.user_attrs.get("spectune.fail_reason")) for t in by_state["FAIL"]]
    assert [n for n, _ in fails] == [killed["trial"]], (
        fails,
        [(t.number, t.state.name, t.user_attrs) for t in study.trials],
        r.stderr[-6000:],
    )
    lost = by_state["FAIL"][0]
    reason = lost.user_attrs["spectune.fail_reason"]
    assert reason.startswith("node test-host-b/") and "left the cluster mid-trial" in reason and worker.node_id[:8] in reason, fails
    assert lost.user_attrs["spectune.node"] == worker.node_id and lost.user_attrs["spectune.host"] == "test-host-b"
    assert f"trial {lost.number} failed: node" in r.stderr
    retry = [t for t in by_state["COMPLETE"] if t.user_attrs.get("spectune.retry_of") == lost.number]
    assert len(retry) == 1 and retry[0].params == lost.params and retry[0].user_attrs["spectune.node"] != worker.node_id
    # both nodes measured, two trials at a time, never two on one host (isolation node): nobody beside anybody
    ran = [t for t in study.trials if "spectune.node" in t.user_attrs]
    assert len({t.user_attrs["spectune.node"] for t in ran}) == 2
    assert _intervals_overlap(ran)
    assert all(not t.user_attrs.get("spectune.co_running") for t in ran)
    # distinct configurations, but for the retry the study asked for
    measured = [str(t.params) for t in by_state["COMPLETE"] if "spectune.retry_of" not in t.user_attrs]
    assert len(measured) == len(set(measured))
    parents, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    assert len(parents) == 1 and {r_.data.tags["spectune.trial"] for r_ in runs} == {str(t.number) for t in study.trials}
    # nothing of the worker node left (its raylet was killed: its actors must be gone too)
    deadline = time.monotonic() + 30
    while (left := [p for p in killed["pids"] if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], left


@pytest.mark.timeout(600)
def test_raylets_of_one_machine_are_one_host_and_run_one_trial_at_a_time(tmp_path, tiny_ckpt, one_host, capsys):
    """The README's multi-raylet cluster of one machine (infra/services.sh's SPECTUNE_RAY_WORKERS): two
    trials at once asked for with isolation node, one given, and the line says the nodes share a host."""
    cluster, _, _ = one_host
    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        parallel={"tp": 1, "cpus_per_worker": 0.1},
        workload={"prompts": str(tmp_path / "prompts.jsonl"), "num_prompts": 2, "max_new_tokens": 8},
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 2]}}},
        study={"n_trials": 2, "sampler": "random", "seed": 0, "pruner": "none", "max_concurrent_trials": 2, "isolation": "node"},
    )
    # spectune's main in this process (studyutil.run_here), which holds the cluster: joined and left as the command does
    r = run_here(capsys, ["run", str(exp), "--json"], tmp_path / "home", env={"RAY_ADDRESS": cluster.address})
    assert r.returncode == 0, r.stderr[-4000:]
    assert summary(r)["complete"] == 2
    line = "study.max_concurrent_trials=2, but isolation node gives 1 slot(s) on this cluster (2 node(s) on 1 host(s): "
    assert line in r.stderr and "one trial per host): 1 at a time" in r.stderr, r.stderr[-3000:]
    assert "trials at once" not in r.stderr
    study = optuna_study(f"sqlite:///{tmp_path / 'home' / 'optuna.db'}", "tiny-study")
    assert not _intervals_overlap(study.trials) and all(not t.user_attrs.get("spectune.co_running") for t in study.trials)


@pytest.mark.timeout(600)
def test_trials_beside_each_other_are_marked_and_the_race_re_measures_alone(tmp_path, tiny_ckpt, capsys):
    """isolation none on the embedded one-node Ray, two at a time: said once; trials that ran at once are
    marked with each other (spectune.co_running), so the ranking trusts none of them, and the race trial
    (study.race_trials 1; two where the first two trials end together) re-measures the fastest of them
    alone: asked while another trial still ran, it waits for it (when that happens is the machine's
    timing), and nothing runs beside it (which the MLflow runs' spans show)."""
    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        parallel={"tp": 1, "cpus_per_worker": 0.1},
        workload={"prompts": str(tmp_path / "prompts.jsonl"), "num_prompts": 2, "max_new_tokens": 8},
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 1, 2, 3]}}},
        study={
            "n_trials": 4, "sampler": "random", "seed": 0, "pruner": "none", "baseline_repeats": 1, "race_trials": 1,
            "max_concurrent_trials": 2, "isolation": "none",
        },
    )  # fmt: skip
    home = tmp_path / "home"
    r = run_here(capsys, ["run", str(exp), "--json"], home)  # spectune's main in this process: its embedded Ray is processes
    assert r.returncode == 0, r.stderr[-4000:]
    assert summary(r)["complete"] == 4
    assert r.stderr.count("isolation none: trials may run anywhere") == 1, r.stderr[-3000:]
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    raced = [t for t in complete if "spectune.race_of" in t.user_attrs]
    others = [t for t in complete if t not in raced]
    # one race trial, or two where the first two trials ended together and the race came before a third
    assert len(complete) == 4 and raced and len(others) >= 2, r.stderr[-3000:]
    assert all(t.user_attrs.get("spectune.co_running") for t in others[:2])  # the first two ran at once
    assert "re-measures trial" in r.stderr, r.stderr[-3000:]
    # whether the race was asked while the other trial still ran (then it says it waits) is the machine's timing;
    # that it ran alone is not: the MLflow spans below
    if "configuration alone" in r.stderr:
        assert "when the running trials end" in r.stderr
    _, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    span = {run.data.tags["spectune.trial"]: (run.info.start_time, run.info.end_time) for run in runs}
    ranking = summary(r)["ranking"]
    for race in raced:
        assert not race.user_attrs.get("spectune.co_running")
        # while its MLflow run was open, no other trial's was: it ran alone
        lo, hi = span[str(race.number)]
        assert all(end <= lo or start >= hi for n, (start, end) in span.items() if n != str(race.number)), span
        # its configuration is now ranked by that measurement alone, the disturbed one left out
        config = next(c for c in ranking["configs"] if race.number in c["trials"])
        assert config["trials"] == [race.number] and race.user_attrs["spectune.race_of"] in config["measured_beside_others"]


def _unfinished_on(db, node_id: str, retry_s: float) -> int | None:
    """A trial RUNNING on `node_id` (its gang placed there) that has not reported its third prompt yet:
    every trial here decodes at least 3 prompts, so it still needs its actors. `retry_s`: how long to
    retry a read the driver's writes lock out (0: one try, None on failure)."""
    until = time.monotonic() + retry_s
    while True:
        try:
            rows = sql(
                db,
                "select t.number from trials t join trial_user_attributes a on a.trial_id = t.trial_id "
                "left join trial_intermediate_values v on v.trial_id = t.trial_id "
                "where t.state = 'RUNNING' and a.key = 'spectune.node' and a.value_json = ? "
                "group by t.number having count(v.step) < 3",
                f'"{node_id}"',
                timeout=1,
            )
            return rows[0][0] if rows else None
        except Exception:  # noqa: BLE001 - not created yet, or locked for a moment
            if time.monotonic() >= until:
                return None
            time.sleep(0.05)


FINISHED = ("COMPLETE", "PRUNED", "FAIL")  # Optuna's final states, as the trials table spells them


def _state(db, number: int) -> str | None:
    """Trial `number`'s state as stored; None where the read failed (locked for a moment: ask again)."""
    try:
        rows = sql(db, "select state from trials where number = ?", number, timeout=1)
    except Exception:  # noqa: BLE001 - locked for a moment: ask again
        return None
    return rows[0][0] if rows else None


def _all_stopped(procs: list[psutil.Process], timeout_s: float) -> bool:
    """Every thread of every process in `procs` has stopped (state T: the SIGSTOP sent to it has taken
    effect; a signal is acted on only as a thread leaves the kernel), or the process is gone."""
    until = time.monotonic() + timeout_s
    while True:
        if all(_stopped(p.pid) for p in procs):
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.01)


def _stopped(pid: int) -> bool:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # gone
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]  # the field after the command name, which may hold spaces
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # this thread has exited
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
