"""infra/services.sh on this machine, as the README's cluster section uses it: PostgreSQL, a Ray head
plus one worker raylet, MLflow on PostgreSQL and optuna-dashboard come up listening on loopback only;
the generated secrets (PostgreSQL's password, Ray's token, MLflow's password) stay in mode-600 files
and off every command line; every service refuses a request without its credentials, checked as
another local user (`nobody`, where this runs as root; else as this user without the credentials):
the Ray job API (head and agents) takes no job, Ray's GCS and client server answer no call, the
MLflow REST API neither reads nor creates, optuna-dashboard neither lists nor deletes a study; a
refused RAY_AUTH_MODE starts nothing; with the env file's credentials both stores answer; a
parallel study (`study.max_concurrent_trials: 2`, one trial per raylet) submitted with `ray job
submit`, with a second driver from this shell on the same study, ends at exactly `study.n_trials`
COMPLETE in PostgreSQL, no configuration counted twice, trials overlapping, one parent MLflow run on
the server; every socket of the services and the
study, taken while a trial decodes, is on loopback; `stop` leaves none of their processes.
Needs PostgreSQL's server, or root with apt-get to install it (skipped otherwise, saying why).

    .venv/bin/pytest -q -n 0 tests/e2e/test_services.py
"""

from __future__ import annotations

import base64
import glob
import json
import os
import pwd
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
        if line.startswith("export "):
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


def _get(url: str, auth: str) -> bytes:
    return urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": auth}), timeout=10).read()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _on_command_lines(secrets: dict[str, str]) -> list[str]:
    """'name in /proc/PID/cmdline' for each secret on a command line (every local user reads those)."""
    hits = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            cmdline = Path(path).read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        hits += [f"{name} in {path}" for name, secret in secrets.items() if secret.encode() in cmdline]
    return hits


def _flag_values(procs: list[psutil.Process], flag: str) -> set[int]:
    """The values of `--flag N` on the command lines of `procs` (the `ray start` lines services.sh ran)."""
    out = set()
    for p in procs:
        try:
            args = p.cmdline()
        except psutil.Error:
            continue
        out |= {int(args[i + 1]) for i, a in enumerate(args[:-1]) if a == flag}
    return out


def _agent_ports(state: Path) -> set[int]:
    """The ports the Ray nodes' dashboard agents listen on: each binds one of its own choosing and Ray
    writes it to the node's session folder (in the temporary folders services.sh lists)."""
    out = set()
    for tmp in (state / "tmpdirs").read_text().split():
        out |= {int(f.read_text()) for f in Path(tmp).glob("session_latest/dashboard_agent_listen_port_*")}
    return out


# Answers any GET with 200 and any POST with 405, as a Prometheus exporter does (Ray runs several): the
# stranger that once held a port picked for a service and answered its readiness check in its place
STRANGER = r"""
import http.server
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"# metrics\n")
    def do_POST(self):
        self.send_response(405); self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _venv_giving_away(tmp_path: Path, port: int, nth: int) -> Path:
    """A virtual environment (SPECTUNE_VENV) that is this one but for its python's `nth` free-port pick
    (services.sh's free_port), which returns `port`: as if another process had been given the port
    between the pick and the service's bind."""
    real = Path(sys.executable).parent
    venv = tmp_path / "venv-giving-away"
    (venv / "bin").mkdir(parents=True)
    for entry in real.iterdir():
        if not entry.name.startswith("python"):
            (venv / "bin" / entry.name).symlink_to(entry)
    python, picks = venv / "bin" / "python", venv / "picks"
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "${{1:-}}" = -c ] && [[ "${{2:-}}" == *\'s.bind(("127.0.0.1", 0))\'* ]]; then\n'
        f"  echo >> {picks}\n"
        f'  if [ "$(wc -l < {picks})" = {nth} ]; then echo {port}; exit 0; fi\n'
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return venv


# Runs as the other user: the standard library only (it may not reach the virtualenv). Reads each file,
# sends each request; prints what came of them as JSON.
PROBE = r"""
import json, sys, urllib.error, urllib.request
spec, out = json.loads(sys.argv[1]), {}
for path in spec["files"]:
    try:
        open(path).read()
        out[path] = "read"
    except OSError as e:
        out[path] = type(e).__name__
for name, (method, url, body, auth) in spec["requests"].items():
    headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth else {})}
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers), timeout=30) as r:
            out[name] = r.status
    except urllib.error.HTTPError as e:
        out[name] = e.code
    except OSError as e:
        out[name] = "no connection: " + repr(e)
print(json.dumps(out))
"""


def _other_user() -> tuple[list[str], str]:
    """(the command line of a Python run as another local user, who that is): `nobody` through setpriv
    where this runs as root; else this user (the requests then carry no credentials, but the files
    are this user's own and not checked)."""
    if os.geteuid() == 0 and shutil.which("setpriv"):
        nobody = pwd.getpwnam("nobody")
        as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
        for python in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
            if os.path.exists(python) and subprocess.run([*as_nobody, python, "-c", ""], cwd="/", capture_output=True).returncode == 0:
                return [*as_nobody, python], "nobody"
    return [sys.executable], "this user"


def _probe_as_other_user(files: list[Path], requests: dict[str, tuple]) -> tuple[dict, str]:
    command, who = _other_user()
    spec = {"files": [str(f) for f in files] if who == "nobody" else [], "requests": requests}
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # nothing of this session's: no token, no password
    done = subprocess.run([*command, "-c", PROBE, json.dumps(spec)], cwd="/", env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), who


def _grpc_refused(address: str, call, token: str) -> None:
    """`call(channel, metadata)` at `address`: UNAUTHENTICATED without the token and with a wrong one; answered with it."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        for metadata in (None, [("authorization", "Bearer " + "0" * len(token))]):
            with pytest.raises(grpc.RpcError) as refused:
                call(channel, metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, (address, refused.value)
        call(channel, [("authorization", "Bearer " + token)])  # the same call with the token: the refusal was the token's


def test_services_refuse_ray_auth_disabled(tmp_path):
    """RAY_AUTH_MODE=disabled is refused before anything starts (a Ray job server without its token
    runs any local user's code as the user who started it)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([*SERVICES, "start", str(tmp_path / "services")], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "RAY_AUTH_MODE=disabled" in done.stderr, done.stderr
    assert not (tmp_path / "services" / "pids").exists() and not (tmp_path / "services" / "ray-token").exists()


@pytest.mark.timeout(900)
def test_services_run_a_parallel_study_on_loopback_and_stop_cleanly(tmp_path, tiny_ckpt, monkeypatch):
    if why := _postgres_available():
        pytest.skip(why)
    state = tmp_path / "services"
    for key in [k for k in os.environ if k.startswith("PG")]:
        monkeypatch.delenv(key)
    # no Ray, MLflow or services setting of this session's: the env file is the only source of credentials
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "SPECTUNE_BIND", "MLFLOW_"))}
    # two raylets labelled as two hosts: isolation node then places a trial on each (on one real host)
    env.update(SPECTUNE_RAY_WORKERS="1", SPECTUNE_RAY_CPUS="1", SPECTUNE_RAY_WORKER_CPUS="1", SPECTUNE_RAY_HOST_LABELS="1")
    for key in [k for k in os.environ if k.startswith(("RAY_AUTH", "MLFLOW_TRACKING_"))]:
        monkeypatch.delenv(key)
    stopped = False
    # the third port picked (PostgreSQL's, after MLflow's and optuna-dashboard's) is one a stranger
    # already holds: PostgreSQL cannot start, and the start must find out why, say so, and start
    # everything again on fresh ports (a stranger answering a service's readiness check in its place is
    # the same check's other path: tests/e2e/test_ports_taken.py)
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER], stdout=subprocess.PIPE, text=True)
    try:
        taken = int(stranger.stdout.readline())
        env["SPECTUNE_VENV"] = str(_venv_giving_away(tmp_path, taken, nth=3))
        up = subprocess.run([*SERVICES, "start", str(state)], capture_output=True, text=True, timeout=600, env=env)
        if up.returncode != 0 and "install" in up.stderr and "postgres" in up.stderr.lower():
            pytest.skip(f"PostgreSQL could not be installed: {up.stderr.strip().splitlines()[-1]}")
        assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-2000:]
        assert f"port {taken}, picked for postgres, is held by pid {stranger.pid}" in up.stderr, up.stderr[-3000:]
        assert "starting again on fresh ports (try 2 of 3" in up.stderr and (state / "postgres.try1.log").exists()
        assert f":{taken}" not in (state / "env").read_text()
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

        # the secrets: in mode-600 files only, never on a command line; PostgreSQL's password in no environment or URL
        pgpass, token_file = Path(svc["PGPASSFILE"]), Path(svc["RAY_AUTH_TOKEN_PATH"])
        assert pgpass.parent == state and token_file.parent == state and svc["RAY_AUTH_MODE"] == "token"
        secret_files = [pgpass, token_file, state / "mlflow-auth.ini", state / "env"]
        for secret_file in secret_files:
            assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600, secret_file
        password, token = pgpass.read_text().strip().split(":")[4], token_file.read_text().strip()
        mlflow_user, mlflow_password = svc["MLFLOW_TRACKING_USERNAME"], svc["MLFLOW_TRACKING_PASSWORD"]
        assert f"admin_password = {mlflow_password}" in (state / "mlflow-auth.ini").read_text()
        assert min(len(password), len(token), len(mlflow_password)) >= 32
        secrets = {"PostgreSQL's password": password, "Ray's token": token, "MLflow's password": mlflow_password}
        assert not _on_command_lines(secrets)
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
        ray_auth, mlflow_auth = "Bearer " + token, _basic(mlflow_user, mlflow_password)
        assert _get(svc["MLFLOW_TRACKING_URI"] + "/health", mlflow_auth).strip() == b"OK"
        with psycopg.connect(dbname="mlflow") as db:
            assert db.execute("SELECT count(*) FROM experiments").fetchone()[0] >= 1  # MLflow's tables, its Default
        nodes = json.loads(_get(svc["RAY_ADDRESS"] + "/api/v0/nodes?limit=10", ray_auth))["data"]["result"]["result"]
        assert sorted((n["node_ip"], n["state"], n["is_head_node"]) for n in nodes) == [
            ("127.0.0.1", "ALIVE", False),
            ("127.0.0.1", "ALIVE", True),
        ]
        studies = json.loads(_get(svc["OPTUNA_DASHBOARD_URL"] + "/api/studies", mlflow_auth))["study_summaries"]
        assert [s["study_name"] for s in studies] == ["services-check"], studies
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            monkeypatch.setenv(key, svc[key])  # the MLflow client of this test reads them, as a sourced env file gives them
        from mlflow.tracking import MlflowClient

        assert MlflowClient(svc["MLFLOW_TRACKING_URI"]).get_experiment_by_name("Default") is not None

        # another local user: reads none of the secrets, and every service refuses it (no job, no run, no study deleted)
        ray_url, mlflow_url, dash_url = svc["RAY_ADDRESS"], svc["MLFLOW_TRACKING_URI"], svc["OPTUNA_DASHBOARD_URL"]
        marker = tmp_path / "a-refused-job-ran"
        agents = _agent_ports(state)
        assert len(agents) == 2 and agents <= ports, (agents, ports)  # the head's and the worker's, each by our own process
        wrong_basic = _basic(mlflow_user, "0" * len(mlflow_password))
        study_id = storage.get_study_id_from_name("services-check")
        requests = {
            "ray: submit a job": ("POST", f"{ray_url}/api/jobs/", {"entrypoint": f"touch {marker}"}, None),
            "ray: submit a job, wrong token": ("POST", f"{ray_url}/api/jobs/", {"entrypoint": f"touch {marker}"}, "Bearer " + "0" * 64),
            "ray: list jobs": ("GET", f"{ray_url}/api/jobs/", None, None),
            "ray: list nodes": ("GET", f"{ray_url}/api/v0/nodes?limit=10", None, None),
            **{
                f"ray agent {port}: submit a job": (
                    "POST",
                    f"http://127.0.0.1:{port}/api/job_agent/jobs/",
                    {"entrypoint": f"touch {marker}"},
                    None,
                )
                for port in agents
            },
            "mlflow: search experiments": ("GET", f"{mlflow_url}/api/2.0/mlflow/experiments/search?max_results=10", None, None),
            "mlflow: search experiments, wrong password": (
                "GET",
                f"{mlflow_url}/api/2.0/mlflow/experiments/search?max_results=10",
                None,
                wrong_basic,
            ),
            "mlflow: search runs (UI's API)": ("POST", f"{mlflow_url}/ajax-api/2.0/mlflow/runs/search", {"experiment_ids": ["0"]}, None),
            "mlflow: create an experiment": ("POST", f"{mlflow_url}/api/2.0/mlflow/experiments/create", {"name": "intruder"}, None),
            "mlflow: list artifacts": ("GET", f"{mlflow_url}/api/2.0/mlflow-artifacts/artifacts", None, None),
            "mlflow: the UI": ("GET", f"{mlflow_url}/", None, None),
            "optuna-dashboard: list studies": ("GET", f"{dash_url}/api/studies", None, None),
            "optuna-dashboard: list studies, wrong password": ("GET", f"{dash_url}/api/studies", None, wrong_basic),
            "optuna-dashboard: delete a study": ("DELETE", f"{dash_url}/api/studies/{study_id}", None, None),
            "optuna-dashboard: the UI": ("GET", f"{dash_url}/dashboard", None, None),
        }
        probed, who = _probe_as_other_user(secret_files, requests)
        print(f"as {who}: {probed}")
        allowed = [f"{what}: {probed[what]}" for what in requests if probed[what] not in (401, 403)]
        assert not allowed, f"as {who} without credentials: {allowed}"
        if who == "nobody":
            readable = [path for path in map(str, secret_files) if probed[path] != "PermissionError"]
            assert not readable, {path: probed[path] for path in readable}
        assert not marker.exists()
        jobs = json.loads(_get(f"{ray_url}/api/jobs/", ray_auth))
        assert not [j for j in jobs if str(marker) in j.get("entrypoint", "")], jobs
        assert MlflowClient(mlflow_url).get_experiment_by_name("intruder") is None
        assert optuna.load_study(study_name="services-check", storage=storage).trials  # not deleted
        # Ray's gRPC services (the GCS a driver joins, the Ray client server) answer no call without the token
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc, ray_client_pb2, ray_client_pb2_grpc

        def all_nodes(channel, metadata):
            stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
            return stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=10, metadata=metadata)

        def cluster_info(channel, metadata):
            stub = ray_client_pb2_grpc.RayletDriverStub(channel)
            return stub.ClusterInfo(
                ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING), timeout=10, metadata=metadata
            )

        _grpc_refused(svc["RAY_GCS_ADDRESS"], all_nodes, token)
        (client_port,) = _flag_values(procs, "--ray-client-server-port")
        _grpc_refused(f"127.0.0.1:{client_port}", cluster_info, token)

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
        assert not _on_command_lines(secrets)  # nor on those of the job's driver, the second driver and the actors
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
        studies = json.loads(_get(dash_url + "/api/studies", mlflow_auth))["study_summaries"]
        assert "tiny-study" in [s["study_name"] for s in studies], studies

        down = subprocess.run([*SERVICES, "stop", str(state)], capture_output=True, text=True, timeout=120, env=env)
        stopped = True
        assert down.returncode == 0, down.stderr
        assert not _members(pgids), _members(pgids)
        survivors = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not survivors, survivors
        assert not (state / "pids").exists()
    finally:
        stranger.kill()
        stranger.wait()
        if not stopped:
            subprocess.run([*SERVICES, "stop", str(state)], capture_output=True, text=True, timeout=120, env=env)
        subprocess.run([*SERVICES, "purge", str(state)], capture_output=True, text=True, timeout=120, env=env)
