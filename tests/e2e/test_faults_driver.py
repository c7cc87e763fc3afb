"""Drivers that die or compete: a `spectune run` killed with SIGKILL mid-trial and resumed, two
`spectune run`s on one study at once, and the clean-up of what a dead driver left behind. Real
studies (embedded local Ray, SQLite Optuna storage, SQLite MLflow store) on the tiny model; every
process a driver starts is tagged through its environment and the process table is checked."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest
from studyutil import (
    TAG_VAR,
    mlflow_runs,
    optuna_study,
    processes_with_env,
    run_here,
    sql,
    start_spectune,
    summary,
    tiny_experiment,
    wait_until_gone,
)

from orchestrator.study.drivers import TOKEN_VAR, reap_dead, start_time

# one drafter (in the verifier ranks): every trial runs on one gang, so the test's time goes to the kill and the resume
SPACE = {"space": {"spec.num_draft_tokens": {"choices": [0, 1, 2, 3, 4]}}}


def _stop_mid_trial(p: subprocess.Popen, db, deadline_s: float = 240) -> int:
    """Freeze the driver (SIGSTOP) at a random moment while a trial after the baseline is RUNNING
    with its MLflow run open; returns that trial's number. The caller SIGKILLs it."""
    rng = random.Random()
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        assert p.poll() is None, p.stderr.read()[-3000:]
        running = (
            sql(
                db,
                "select t.number from trials t join trial_user_attributes a on a.trial_id = t.trial_id "
                "where t.state = 'RUNNING' and a.key = 'mlflow_run_id' and t.number >= 1",
            )
            if db.exists()
            else []
        )
        if running:
            time.sleep(rng.uniform(0.0, 0.3))
            os.kill(p.pid, signal.SIGSTOP)
            try:
                now = sql(db, "select number from trials where state = 'RUNNING'", timeout=2)
            except sqlite3.OperationalError:  # frozen inside a write: its lock holds until it runs on
                now = []
            if now:
                return now[0][0]
            os.kill(p.pid, signal.SIGCONT)  # it finished in between, or froze mid-write: try again
        time.sleep(0.05)
    raise AssertionError("no trial was ever seen running")


@pytest.mark.timeout(900)
def test_sigkilled_driver_resumes_without_loss_or_leak(tmp_path, tiny_ckpt, capsys):
    """SIGKILL the driver mid-trial: its Ray processes and actors are gone within seconds (the
    watchdog), the next run fails the interrupted trial (reason in Optuna, MLflow run FAILED),
    retries its params and stops at exactly n_trials COMPLETE, one MLflow run per trial. (The next run is
    spectune's main in the test's process, studyutil.run_here: another driver, with its own embedded Ray
    and record, as a second command would be, without the interpreter and imports to start.)"""
    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        search=SPACE,
        workload={"prompts": str(tmp_path / "prompts.jsonl"), "num_prompts": 3, "max_new_tokens": 24},
        parallel={"tp": 1, "cpus_per_worker": 0.1},  # one actor a gang: the test is about the driver and what it leaves
    )
    home, tag = tmp_path / "home", uuid.uuid4().hex
    db = home / "optuna.db"
    p = start_spectune(["run", str(exp)], home, tag)
    try:
        killed = _stop_mid_trial(p, db)
        assert any("ray::WorkerActor" in line for line in processes_with_env(TAG_VAR, tag))  # its actors are up
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    gone_s, left = wait_until_gone(tag, timeout=30, folder=p.ray_tmp)
    assert left == [], left  # GCS, raylet, agents, idle workers and the gang's actors: all gone
    with capsys.disabled():  # the next run's output is captured, this line is not
        print(f"driver SIGKILLed in trial {killed}: its processes were gone {gone_s:.1f}s later")
    params_of_killed = optuna_study(f"sqlite:///{db}", "tiny-study").trials[killed].params

    tag2 = uuid.uuid4().hex
    r = run_here(capsys, ["run", str(exp)], home, env={TAG_VAR: tag2})
    out = summary(r)
    assert f"trial {killed} was left RUNNING by dead driver" in r.stderr
    assert out["complete"] == 4
    assert wait_until_gone(tag2, timeout=10, folder=r.ray_tmp)[1] == []

    study = optuna_study(f"sqlite:///{db}", "tiny-study")
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") == 4 and "RUNNING" not in states and "WAITING" not in states, states
    dead = study.trials[killed]
    assert dead.state.name == "FAIL" and "died mid-trial" in dead.user_attrs["spectune.fail_reason"]
    retries = [t for t in study.trials if t.user_attrs.get("spectune.retry_of") == killed]
    assert len(retries) == 1 and retries[0].params == params_of_killed and retries[0].state.name == "COMPLETE"
    parents, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    by_id = {run.info.run_id: run for run in runs}
    ids = [t.user_attrs["mlflow_run_id"] for t in study.trials]
    assert len(set(ids)) == len(ids) == len(runs)  # every trial one run: none lost, none twice
    assert by_id[dead.user_attrs["mlflow_run_id"]].info.status == "FAILED"
    assert by_id[dead.user_attrs["mlflow_run_id"]].data.tags["spectune.state"] == "FAIL"
    for t in study.trials:
        assert by_id[t.user_attrs["mlflow_run_id"]].data.tags["spectune.state"] == t.state.name
    assert list((home / "drivers").glob("*.json")) == []  # no driver record left


@pytest.mark.timeout(900)
def test_two_drivers_on_one_study(tmp_path, tiny_ckpt):
    """Two `spectune run` at once on the same study and storage: exactly n_trials COMPLETE, one
    parent MLflow run, every trial its own MLflow run, no process left."""
    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 1, 2, 3, 4]}}},
        parallel={"tp": 1, "cpus_per_worker": 0.1},  # one actor a gang: the test is about the drivers
    )
    home, tags = tmp_path / "home", [uuid.uuid4().hex, uuid.uuid4().hex]
    procs = [start_spectune(["run", str(exp), "--json"], home, tag) for tag in tags]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=420)
        assert p.returncode == 0, err[-3000:]
        outs.append(__import__("json").loads(out.strip().splitlines()[-1]))
    assert [o["complete"] for o in outs] == [4, 4]
    assert outs[0]["parent_run_id"] == outs[1]["parent_run_id"]
    for tag, p in zip(tags, procs):
        assert wait_until_gone(tag, timeout=10, folder=p.ray_tmp)[1] == []
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study")
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") == 4 and "RUNNING" not in states, states
    drivers = {t.user_attrs["spectune.driver"] for t in study.trials if t.state.name == "COMPLETE"}
    print(f"trials {states}; COMPLETE ones ran in {len(drivers)} drivers")
    parents, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    assert len(parents) == 1 and parents[0].info.run_id == outs[0]["parent_run_id"]
    ids = [t.user_attrs["mlflow_run_id"] for t in study.trials if "mlflow_run_id" in t.user_attrs]
    assert len(set(ids)) == len(ids) == len(runs)
    assert all(t.state.name == "FAIL" for t in study.trials if "mlflow_run_id" not in t.user_attrs)  # released surplus
    assert study.user_attrs["mlflow_parent_run_id"] == outs[0]["parent_run_id"]


def test_next_run_reaps_what_a_dead_driver_left(tmp_path):
    """The watchdog itself was killed too: `reap_dead` kills the processes of dead drivers' records
    (by token, or by a file they write in the dead driver's Ray session dir: Ray's setproctitle
    can overwrite the token), leaves live drivers, readers of that dir and unrelated processes
    alone, and drops the records."""
    import json
    import socket

    home = tmp_path / "home"
    (home / "drivers").mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    tokens = {"dead": uuid.uuid4().hex, "live": uuid.uuid4().hex, "other": uuid.uuid4().hex}
    host, session = socket.gethostname(), tmp_path / "session"
    (session / "logs").mkdir(parents=True)
    log = session / "logs" / "agent.log"
    log.write_text("")
    for name, pid in (("dead", dead.pid), ("live", os.getpid())):
        (home / "drivers" / f"{host}-{pid}.json").write_text(
            json.dumps(
                {
                    "host": host,
                    "pid": pid,
                    "start_time": start_time(pid) if name == "live" else 1,
                    "token": tokens[name],
                    "session_dir": str(session) if name == "dead" else None,
                }
            )
        )
    sleep = "import time; time.sleep(120)"
    sleepers = {name: subprocess.Popen([sys.executable, "-c", sleep], env={**os.environ, TOKEN_VAR: tok}) for name, tok in tokens.items()}
    sleepers["writer"] = subprocess.Popen([sys.executable, "-c", f"f = open({str(log)!r}, 'a'); {sleep}"])
    sleepers["reader"] = subprocess.Popen([sys.executable, "-c", f"f = open({str(log)!r}); {sleep}"])
    time.sleep(1.0)  # both have opened the log
    try:
        messages = []
        assert reap_dead(home, messages.append) == 2
        assert sleepers["dead"].wait(timeout=10) == -signal.SIGKILL
        assert sleepers["writer"].wait(timeout=10) == -signal.SIGKILL
        assert all(sleepers[n].poll() is None for n in ("live", "other", "reader"))
        assert [p.name for p in (home / "drivers").glob("*.json")] == [f"{host}-{os.getpid()}.json"]
        assert "left 2 Ray processes behind" in messages[0]
    finally:
        for s in sleepers.values():
            s.kill()
            s.wait()


def test_a_racing_mlflow_write_is_retried_and_other_errors_are_not():
    """Two drivers finishing one study together both set the parent run's best-trial tag; on a
    SQLite store the loser's insert fails with UNIQUE constraint (seen in CI). That write is
    retried (and then updates the row); any other error surfaces at once."""
    from orchestrator.tracking.runs import Tracker

    calls = []

    def racing(run_id, key, value):
        calls.append((run_id, key, value))
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: tags.key, tags.run_uuid")

    Tracker._write(racing, "run", "spectune.best_params", "{}")
    assert len(calls) == 2

    def broken(*args):
        calls.append(args)
        raise RuntimeError("no such table: tags")

    with pytest.raises(RuntimeError, match="no such table"):
        Tracker._write(broken, "run")
    assert len(calls) == 3


def test_a_driver_is_its_pid_and_start_time():
    """A RUNNING trial whose driver's pid now belongs to another process (same pid, other start time)
    is stale; the live driver (pid and start time) is not; records of older drivers (host:pid) still work."""
    import socket

    import optuna

    from orchestrator.record import DRIVER_ATTR
    from orchestrator.study.loop import _stale, driver_id

    study = optuna.create_study()
    me, host, pid = driver_id(), socket.gethostname(), os.getpid()
    assert me == f"{host}:{pid}:{start_time(pid)}"
    cases = {me: False, f"{host}:{pid}:{start_time(pid) + 1}": True, f"{host}:{pid}": False, f"{host}:999999999:1": True}
    for driver, stale in cases.items():
        t = study.ask()
        t.set_user_attr(DRIVER_ATTR, driver)
        assert _stale(study._storage.get_trial(t._trial_id), stale_after_s=1e9) is stale, driver


def _long_trials(tmp_path, tiny_ckpt, **study):
    """Two trials at TP 1 that decode for seconds each (many repeats), so a signal lands mid-decode."""
    return tiny_experiment(
        tmp_path,
        tiny_ckpt,
        parallel={"tp": 1, "cpus_per_worker": 0.1},
        workload={"prompts": str(tmp_path / "prompts.jsonl"), "num_prompts": 3, "max_new_tokens": 96, "repeats": 20},
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 1, 2, 3]}}},
        study={"n_trials": 2, "sampler": "random", "seed": 0, "pruner": "none", **study},
    )


@pytest.mark.timeout(600)
def test_sigterm_fails_and_requeues_every_running_trial(tmp_path, tiny_ckpt):
    """`ray job stop`, `timeout` or `kill -TERM -PGID` (SIGTERM to the driver's whole process group) with
    two trials decoding at once (isolation none, two slots on the embedded Ray): the embedded Ray's
    processes are not in that group (were they, the GCS would die with the signal, every Ray call would
    wait 60 s for it and Ray would end the driver with the trials left RUNNING). The driver exits 130
    within 10 s with one line, as on Ctrl-C: both trials FAIL as interrupted with their MLflow runs FAILED,
    their params queued again (a rerun measures queued params first: the SIGKILL test above), the parent
    run KILLED; no process left. (Once two tests, the signal to the driver alone with two trials and to
    its group with one: one driver carries both, each costing its own driver, Ray and gangs.)"""
    exp = _long_trials(tmp_path, tiny_ckpt, max_concurrent_trials=2, isolation="none")
    home, tag = tmp_path / "home", uuid.uuid4().hex
    db = home / "optuna.db"
    p = start_spectune(["run", str(exp)], home, tag, new_session=True)
    try:
        t0 = time.monotonic()
        decoding = (  # RUNNING trials that reported a prompt: their gangs are decoding
            "select distinct t.number from trials t join trial_intermediate_values v on v.trial_id = t.trial_id where t.state = 'RUNNING'"
        )
        while not (db.exists() and len(sql(db, decoding)) >= 2):
            assert p.poll() is None and time.monotonic() - t0 < 240, p.stderr.read()[-3000:] if p.poll() is not None else "never two"
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGTERM)
        sent = time.monotonic()
        out, err = p.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and err.strip().splitlines()[-1] == (
        "spectune: interrupted; finished trials are saved, run the same command to resume"
    ), err[-3000:]
    print(f"driver exited {took:.1f} s after SIGTERM to its process group, two trials decoding")
    assert took < 10, f"exit took {took:.1f} s"
    assert "GCS" not in err
    assert wait_until_gone(tag, timeout=30, folder=p.ray_tmp)[1] == []
    study = optuna_study(f"sqlite:///{db}", "tiny-study")
    states = {t.number: t.state.name for t in study.trials}
    stopped = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(stopped) >= 2 and all(t.user_attrs["spectune.fail_reason"].startswith("interrupted") for t in stopped), err[-3000:] + str(
        [(t.number, t.state.name, t.user_attrs.get("spectune.fail_reason")) for t in study.trials]
    )
    assert "RUNNING" not in states.values()
    waiting = [t for t in study.trials if t.state.name == "WAITING"]
    assert len(waiting) >= 2  # each decoding trial's params are queued again
    assert all(any(t.user_attrs.get("spectune.retry_of") == s.number for t in waiting) for s in stopped), states
    parents, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    by_id = {r.info.run_id: r for r in runs}
    assert all(by_id[t.user_attrs["mlflow_run_id"]].info.status == "FAILED" for t in stopped)
    assert len(parents) == 1 and parents[0].info.status == "KILLED"
