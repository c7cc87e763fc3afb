"""Helpers for the study tests: a tiny experiment on disk, `spectune` in a subprocess, the stores."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

# the metrics every measured configuration reports (docs/reference.md): a trial's MLflow metrics and
# Optuna attributes, `spectune decode --json`'s keys
CONTRACT_METRICS = (
    "throughput_tok_s",
    "accept_len_mean",
    "step_ms_p50",
    "step_ms_p90",
    "verify_ms_p50",
    "draft_ms_p50",
    "comm_ms_per_step",
    "comm_fraction",
    "speedup_vs_baseline",
    "outputs_match_baseline",
    "setup_s",
)

PROMPTS = [
    "Summarize: the cat sat on the mat. The cat sat on the mat again, and again the cat sat.",
    "Translate to French: good morning, good morning, good night, good night.",
    "Write a haiku about a river, a river bank and the river's bend.",
]


def write_prompts(path: Path, texts=PROMPTS) -> Path:
    path.write_text("".join(json.dumps({"question_id": i, "category": "test", "turns": [t]}) + "\n" for i, t in enumerate(texts)))
    return path


def ray_temp_dir() -> str:
    """A fresh Ray temp dir under /tmp (short: Ray's socket paths must stay < 108 bytes), removed
    when the test session ends (each holds a Ray session's logs)."""
    import atexit
    import shutil

    path = tempfile.mkdtemp(prefix="st-ray-", dir="/tmp")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def tiny_experiment(tmp: Path, ckpt: Path, **sections) -> Path:
    """An experiment YAML on the tiny model at TP 2 with a drafter actor; `sections` override whole sections."""
    cfg = {
        "name": "tiny-study",
        "model": {"path": str(ckpt)},
        "drafter": {"kind": "ngram", "layers": 1},
        "parallel": {"tp": 2, "cpus_per_worker": 0.1},
        "workload": {"prompts": str(write_prompts(tmp / "prompts.jsonl")), "num_prompts": 3, "max_new_tokens": 12},
        "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4]}, "drafter.kind": {"choices": ["ngram", "layer_skip"]}}},
        "study": {"n_trials": 4, "sampler": "random", "seed": 1, "pruner": "none"},
        # the baseline's repeats are not measured again when noisy: a loaded CI machine always is, and no
        # test here is about that rule (tests/unit covers it); a test that wants it sets its own limits
        "limits": {"trial_timeout_s": 300, "max_rel_spread": 1.0},
    }
    cfg.update(sections)
    path = tmp / "experiment.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def spectune_here(capsys, *args: str, home: Path | None = None, env: dict | None = None, main=None) -> subprocess.CompletedProcess:
    """`spectune ARGS` through the command's own `main` in this process (or another command's `main`, such
    as `python -m orchestrator.explain.perfcheck`'s), with SPECTUNE_HOME = `home` and the variables of
    `env` set while it runs: its flags, its exit status and what it prints on stdout and stderr, as a
    subprocess's `CompletedProcess`, without an interpreter to start and torch, transformers, MLflow or a
    gang's forkserver to import per call (a gang's ranks are processes either way: they fork from this
    process's forkserver). For checks that are not about the process itself; `run_here` for a study.
    tests/e2e/test_nvls_env.py, test_cli_decode.py and the fault tests run the real command."""
    if main is None:
        from orchestrator.cli import main

    env = {**({"SPECTUNE_HOME": str(home)} if home is not None else {}), **(env or {})}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's own errors
        code = e.code
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["spectune", *args], code, out, err)


def run_here(capsys, args: list[str], home: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`spectune run ...` (args) as `spectune` does it, but through its `main` in this process: a real
    embedded local Ray (its own temp dir, returned as `.ray_tmp`), its driver record and watchdog, SQLite
    Optuna storage and a local MLflow store, without an interpreter to start and MLflow, Optuna, Ray and
    matplotlib to import per study (~5 CPU-s); with RAY_ADDRESS in `env`, the cluster there (a
    `ray.cluster_utils.Cluster` the test runs), joined and left as the command does. The run connects Ray
    and disconnects (or shuts its embedded Ray down) itself: no Ray may be connected here before or after.
    For studies whose checks are about what they record, not about the driver's process (signals, process
    groups, two drivers at once: tests/e2e/test_faults_*)."""
    import ray

    assert not ray.is_initialized() and not os.environ.get("RAY_ADDRESS"), "run_here connects a Ray of its own"
    # this process's CPU-gang forkserver (the driver's allreduce benchmark forks its ranks from it) starts
    # before the run puts its driver token in the environment: a process started under the token is the
    # run's, and the run's end kills it (orchestrator/study/drivers.py)
    from multiprocessing import forkserver

    from workers.runtime.procs import rank_context

    rank_context("cpu")
    forkserver.ensure_running()
    ray_tmp = ray_temp_dir()
    r = spectune_here(capsys, *args, home=home, env={"SPECTUNE_RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled", **(env or {})})
    assert not ray.is_initialized(), "the run left its Ray connected"
    r.ray_tmp = ray_tmp
    return r


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`spectune ARGS` in this test's environment as it is (no home or Ray of its own: commands that start none)."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=timeout)


def spectune(args: list[str], home: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    ray_tmp = ray_temp_dir()
    full_env = {**os.environ, "SPECTUNE_HOME": str(home), "SPECTUNE_RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled", **(env or {})}
    if "RAY_ADDRESS" not in (env or {}):
        full_env.pop("RAY_ADDRESS", None)  # an embedded local Ray, never a cluster someone else runs
    r = subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=timeout, env=full_env)
    r.ray_tmp = ray_tmp
    return r


def processes_mentioning(needle: str) -> list[str]:
    """Command lines of live processes that mention `needle` (e.g. a Ray temp dir): leak check."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            out.append(f"{pid}: {cmd[:200]}")
    return out


def summary(r: subprocess.CompletedProcess) -> dict:
    """The JSON summary of a `spectune run`: stdout with --json, else the file its stdout names
    (stdout then holds short lines only: the summary's path and the verdict)."""
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        return json.loads(lines[-1])
    assert all(len(line) <= 300 for line in lines), lines
    named = [line.removeprefix("spectune: summary: ") for line in lines if line.startswith("spectune: summary: ")]
    assert named, r.stdout[-2000:]
    return json.loads(Path(named[-1]).read_text())


def optuna_study(storage: str, name: str):
    import optuna

    return optuna.load_study(study_name=name, storage=storage)


def mlflow_runs(uri: str, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("spectune.role") == "study"]
    trials = [r for r in runs if "spectune.trial" in r.data.tags]
    return parents, trials


def processes_with_env(var: str, value: str, folder: str | None = None) -> list[str]:
    """Live processes (zombies excluded) whose environment has var=value, or (given `folder`, a
    test's Ray temp dir) that write a file there: catches Ray workers and agents too, which rename
    themselves (`ray::WorkerActor`) and whose setproctitle may overwrite part of their environment."""
    from orchestrator.study.drivers import _writes_under

    out, needle = [], f"{var}={value}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if needle not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") and not (folder and _writes_under(int(pid), folder)):
                continue
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append(f"{pid}: {cmd[:160]}")
    return out


TAG_VAR = "SPECTUNE_TEST_TAG"  # every process a test's driver starts inherits it: the leak check's handle


def start_spectune(args: list[str], home: Path, tag: str, env: dict | None = None, new_session: bool = False) -> subprocess.Popen:
    """`spectune` in the background (embedded local Ray), its processes tagged with `tag`; `new_session`:
    in a session (and process group) of its own, as a shell or `timeout` starts it."""
    ray_tmp = ray_temp_dir()
    full_env = {
        **os.environ,
        "SPECTUNE_HOME": str(home),
        "SPECTUNE_RAY_TMPDIR": ray_tmp,
        "RAY_AUTH_MODE": "disabled",
        TAG_VAR: tag,
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    full_env.pop("RAY_ADDRESS", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        start_new_session=new_session,
    )
    p.ray_tmp = ray_tmp
    return p


def wait_until_gone(tag: str, timeout: float = 60.0, folder: str | None = None) -> tuple[float, list[str]]:
    """Seconds until no process carries the tag or writes in `folder` (or the timeout), and what is left then."""
    import time

    t0 = time.monotonic()
    while (left := processes_with_env(TAG_VAR, tag, folder)) and time.monotonic() - t0 < timeout:
        time.sleep(0.1)
    return time.monotonic() - t0, left


def ray_workers(tag: str) -> list[int]:
    """PIDs of the live gang actors (`ray::WorkerActor...`) a tagged driver started."""
    return [int(line.split(":")[0]) for line in processes_with_env(TAG_VAR, tag) if "ray::WorkerActor" in line]


def sql(db: Path, query: str, *args, timeout: float = 30) -> list[tuple]:
    """A read-only look into the Optuna SQLite file while a driver writes to it; [] while the
    driver has not created its tables yet (callers poll)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=timeout)
    except sqlite3.OperationalError:
        return []
    try:
        return con.execute(query, args).fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []
        raise
    finally:
        con.close()


def free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@functools.cache
def _ports_taken():
    """infra/ports_taken.py, the check services.sh runs, as a module (loaded once)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ports_taken", Path(__file__).resolve().parents[1] / "infra/ports_taken.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stop_group(proc: subprocess.Popen, sig: int = 15, grace_s: float = 3) -> None:
    """Signal `proc`'s process group (SIGTERM by default), give its leader `grace_s` seconds, then
    SIGKILL whatever of the group is left (members that outlive the leader too)."""
    import signal

    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is gone
        pass
    proc.wait(timeout=30)


def serve_on_free_port(launch, ready, what: str, tries: int = 3) -> tuple[subprocess.Popen, int]:
    """`launch(port)` (a Popen in a session of its own) on a free port, waited for until `ready(port)`;
    started again on a fresh port when another process was given the port between the pick and the
    server's bind (as infra/services.sh does: such a stranger may even answer `ready` in its place).
    Returns the server and its port."""
    import time

    for _ in range(tries):
        port = free_port()
        proc = launch(port)
        try:
            deadline = time.monotonic() + 120
            while not ready(port) and proc.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} did not start within 120 s")
                time.sleep(0.2)
            taken = _ports_taken().strangers(port, proc.pid)
            if not taken and proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}")
        except BaseException:
            stop_group(proc)
            raise
        if not taken:
            return proc, port
        stop_group(proc)
    raise RuntimeError(f"{tries} ports in a row were taken by other processes before {what} bound them")


@contextlib.contextmanager
def mlflow_server(folder: Path):
    """A real `mlflow server` on loopback (one worker, a migrated SQLite store and an artifact folder
    in `folder`), as infra/services.sh starts it; yields its URL, stops its process group on exit."""
    import urllib.request

    from orchestrator.tracking.local_store import seed_sqlite_store

    store = f"sqlite:///{folder / 'mlflow-server.db'}"
    seed_sqlite_store(store)  # the server opens a migrated store, as ours do

    def launch(port: int) -> subprocess.Popen:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
            + ["--backend-store-uri", store, "--artifacts-destination", str(folder / "artifacts")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # as infra/services.sh starts it
        )

    def ready(port: int) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return True
        except OSError:
            return False

    proc, port = serve_on_free_port(launch, ready, "mlflow server")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(proc)  # its workers drain for ~20 s on SIGTERM; nothing of it is checked
