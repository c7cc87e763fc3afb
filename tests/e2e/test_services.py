"""infra/services.sh on this machine, as the README's cluster section uses it: PostgreSQL, a Ray head
plus one worker raylet, MLflow on PostgreSQL and optuna-dashboard come up listening on loopback only;
the generated password stays in mode-600 files and off every command line; both stores answer; a
parallel study (`study.max_concurrent_trials: 2`, one trial per raylet) submitted with `ray job
submit`, with a second driver from this shell on the same study, ends at exactly `study.n_trials`
COMPLETE in PostgreSQL, no configuration counted twice, trials overlapping, one parent MLflow run on
the server; every socket of the services and the
study, taken while a trial decodes, is on loopback; `stop` leaves none of their processes.
Needs PostgreSQL's server, or root with apt-get to install it (skipped otherwise, saying why).

    .venv/bin/pytest -q -n 0 tests/e2e/test_services.py
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from studyutil import mlflow_runs, tiny_experiment

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ["bash", str(ROOT / "infra" / "services.sh")]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _postgres_available() -> str | None:
    """None where services.sh can run PostgreSQL here, else why not."""
    if shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        return None
    if os.geteuid() == 0 and shutil.which("apt-get"):
        return None  # services.sh installs it
    return "PostgreSQL's server is not installed, and installing it needs root and apt-get"


def _env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    return env


def _members(pgids: set[int]) -> list[psutil.Process]:
    """The live (not zombie) processes of these process groups."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in pgids and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, ProcessLookupError):
            pass
    return out


def _listening(procs: list[psutil.Process]) -> list[tuple]:
    """(pid, name, ip, port) of every TCP listener and unconnected UDP socket of `procs` and their children."""
    seen, out = set(), []
    for p in procs:
        try:
            family = [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for q in family:
            if q.pid in seen:
                continue
            seen.add(q.pid)
            try:
                conns = q.net_connections(kind="inet")
                name = q.name()
            except psutil.Error:
                continue
            for c in conns:
                if c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr):
                    out.append((q.pid, name, c.laddr.ip, c.laddr.port))
    return out


def _decoding(storage) -> bool:
    """A trial of the study is RUNNING and has reported a prompt: its gang is decoding. `storage`: one
    RDBStorage reused across polls (a URL would open a new connection pool each time, and PostgreSQL
    refuses clients past max_connections)."""
    import optuna

    try:
        study = optuna.load_study(study_name="tiny-study", storage=storage)
    except KeyError:
        return False
    return any(t.state.name == "RUNNING" and t.intermediate_values for t in study.get_trials(deepcopy=False))


def _get(url: str) -> bytes:
    return urllib.request.urlopen(url, timeout=10).read()


@pytest.mark.timeout(900)
def test_services_run_a_parallel_study_on_loopback_and_stop_cleanly(tmp_path, tiny_ckpt, monkeypatch):
    if why := _postgres_available():
        pytest.skip(why)
    state = tmp_path / "services"
    for key in [k for k in os.environ if k.startswith("PG")]:
        monkeypatch.delenv(key)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "SPECTUNE_BIND", "MLFLOW_"))}
    env.update(SPECTUNE_RAY_WORKERS="1", SPECTUNE_RAY_CPUS="1", SPECTUNE_RAY_WORKER_CPUS="1", RAY_AUTH_MODE="disabled")
    stopped = False
    try:
        up = subprocess.run([*SERVICES, "start", str(state)], capture_output=True, text=True, timeout=600, env=env)
        if up.returncode != 0 and "install" in up.stderr and "postgres" in up.stderr.lower():
            pytest.skip(f"PostgreSQL could not be installed: {up.stderr.strip().splitlines()[-1]}")
        assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-2000:]
        groups = dict(line.split() for line in (state / "pids").read_text().splitlines())
        assert set(groups) == {"ray", "postgres", "mlflow", "optuna-dashboard", "ray-worker-1"}, groups
        pgids = {int(g) for g in groups.values()}
        procs = _members(pgids)

        # every listening socket of every process started is on loopback
        listening = _listening(procs)
        print("\n".join(f"{pid} {name} {ip}:{port}" for pid, name, ip, port in sorted(listening)))
        assert listening and all(ip in LOOPBACK for _, _, ip, _ in listening), listening
        svc = _env_file(state / "env")
        ports = {port for _, _, _, port in listening}
        assert {int(svc["PGPORT"]), int(svc["MLFLOW_TRACKING_URI"].rsplit(":", 1)[1])} <= ports

        # the password: in mode-600 files only, never on a command line, in an environment or a URL
        pgpass = Path(svc["PGPASSFILE"])
        assert pgpass.parent == state
        for secret_file in (pgpass, state / "env"):
            assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600, secret_file
        password = pgpass.read_text().strip().split(":")[4]
        assert len(password) >= 32
        for path in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                assert password.encode() not in Path(path).read_bytes(), path
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
        for p in procs:
            try:
                assert password.encode() not in Path(f"/proc/{p.pid}/environ").read_bytes(), p
            except (FileNotFoundError, ProcessLookupError):
                pass
        assert password not in (state / "env").read_text()

        # the stores answer: Optuna on PostgreSQL through the URL alone (it names the password file),
        # MLflow with its store on PostgreSQL too
        assert svc["SPECTUNE_STORAGE"] == f"postgresql+psycopg://spectune@127.0.0.1:{svc['PGPORT']}/optuna?passfile={pgpass}"
        import optuna
        import psycopg

        storage = optuna.storages.RDBStorage(svc["SPECTUNE_STORAGE"])
        for key in ("PGHOST", "PGPORT", "PGUSER", "PGPASSFILE"):
            monkeypatch.setenv(key, svc[key])
        optuna.create_study(study_name="services-check", storage=storage).optimize(lambda t: t.suggest_float("x", 0, 1), 1)
        assert len(optuna.load_study(study_name="services-check", storage=svc["SPECTUNE_STORAGE"]).trials) == 1
        assert _get(svc["MLFLOW_TRACKING_URI"] + "/health").strip() == b"OK"
        with psycopg.connect(dbname="mlflow") as db:
            assert db.execute("SELECT count(*) FROM experiments").fetchone()[0] >= 1  # MLflow's tables, its Default
        nodes = json.loads(_get(svc["RAY_ADDRESS"] + "/api/v0/nodes?limit=10"))["data"]["result"]["result"]
        assert sorted((n["node_ip"], n["state"], n["is_head_node"]) for n in nodes) == [
            ("127.0.0.1", "ALIVE", False),
            ("127.0.0.1", "ALIVE", True),
        ]
        assert _get(svc["OPTUNA_DASHBOARD_URL"] + "/")

        # a parallel study as a Ray job: one trial on each raylet, on PostgreSQL and the MLflow server
        exp = tiny_experiment(
            tmp_path,
            tiny_ckpt,
            parallel={"tp": 1, "cpus_per_worker": 0.1},
            workload={"prompts": str(tmp_path / "prompts.jsonl"), "num_prompts": 3, "max_new_tokens": 24},
            search={"space": {"spec.num_draft_tokens": {"choices": [0, 1, 2, 3, 4, 5]}}},
            study={"n_trials": 4, "sampler": "random", "seed": 0, "pruner": "none", "max_concurrent_trials": 2},
        )
        submit = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", svc["RAY_ADDRESS"], "--working-dir", str(ROOT)]
        submit += ["--", "spectune", "run", str(exp), "--set", f"tracking.uri={svc['MLFLOW_TRACKING_URI']}"]
        submit += ["--set", f"study.storage={svc['SPECTUNE_STORAGE']}"]
        job = subprocess.Popen(submit, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env={**env, **svc})
        # a second driver on the same PostgreSQL study, from this shell: the two share the work
        second = [sys.executable, "-m", "orchestrator", "run", str(exp), "--json", "--set", f"tracking.uri={svc['MLFLOW_TRACKING_URI']}"]
        second += ["--set", f"study.storage={svc['SPECTUNE_STORAGE']}"]
        driver_env = {**env, **svc, "RAY_ADDRESS": svc["RAY_GCS_ADDRESS"]}  # a driver joins at the GCS (the http address takes jobs)
        other = subprocess.Popen(second, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=driver_env)
        deadline, decoding, poll = time.monotonic() + 300, False, optuna.storages.RDBStorage(svc["SPECTUNE_STORAGE"])
        while job.poll() is None and not (decoding := _decoding(poll)) and time.monotonic() < deadline:
            time.sleep(0.1)
        during = _listening(_members(pgids))  # the services, the job's driver and the trials' actors
        assert decoding, "no trial was seen decoding: the sockets were not taken while one did"
        out, _ = job.communicate(timeout=600)
        other_out, other_err = other.communicate(timeout=600)
        assert job.returncode == 0, out[-4000:]
        assert other.returncode == 0 and json.loads(other_out.strip().splitlines()[-1])["complete"] == 4, other_err[-3000:]
        assert "2 trials at once (isolation node)" in out and "succeeded" in out, out[-3000:]
        assert len(during) > len(listening), during  # the driver's and the actors' sockets are among them
        assert all(ip in LOOPBACK for _, _, ip, _ in during), [x for x in during if x[2] not in LOOPBACK]
        study = optuna.load_study(study_name="tiny-study", storage=svc["SPECTUNE_STORAGE"])
        complete = [t for t in study.trials if t.state.name == "COMPLETE"]
        assert len(complete) == 4 and not [t for t in study.trials if t.state.name in ("RUNNING", "WAITING")]
        measured = [str(t.params) for t in complete if "spectune.retry_of" not in t.user_attrs]
        assert len(measured) == len(set(measured)), measured  # two drivers, no configuration counted twice
        assert len({t.user_attrs["spectune.node"] for t in complete}) == 2  # both raylets measured
        spans = sorted((t.datetime_start, t.datetime_complete) for t in complete)
        assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans  # trials overlapped
        parents, runs = mlflow_runs(svc["MLFLOW_TRACKING_URI"], "tiny-study")
        # one run per trial that started (a surplus trial, given back unrun when the other driver took the last slot, has none)
        assert len(parents) == 1 and len(runs) == len([t for t in study.trials if "mlflow_run_id" in t.user_attrs])

        down = subprocess.run([*SERVICES, "stop", str(state)], capture_output=True, text=True, timeout=120, env=env)
        stopped = True
        assert down.returncode == 0, down.stderr
        assert not _members(pgids), _members(pgids)
        survivors = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not survivors, survivors
        assert not (state / "pids").exists()
    finally:
        if not stopped:
            subprocess.run([*SERVICES, "stop", str(state)], capture_output=True, text=True, timeout=120, env=env)
        subprocess.run([*SERVICES, "purge", str(state)], capture_output=True, text=True, timeout=120, env=env)
