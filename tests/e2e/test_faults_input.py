"""Faults that must end before anything launches (bad YAML, resources, storage) and results that
must never win (wrong allreduce sums, greedy output that differs from the baseline). In-process
and fast: no Ray cluster is started here (a guard fails the test if one would be)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from studyutil import serve_on_free_port, stop_group, tiny_experiment

from orchestrator import cli
from orchestrator.config.schema import load_config
from orchestrator.execution.cluster import PlacementError


@pytest.fixture
def no_ray(monkeypatch):
    """`spectune run` must fail before connecting to (or starting) Ray."""
    import orchestrator.study.loop as study

    def refuse(*a, **k):
        raise AssertionError("Ray was started although the input was bad")

    monkeypatch.setattr(study, "connect", refuse)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("spectune: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ------------------------------------------------------------------ bad YAML (property-based)
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-3, 20), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
    st.sampled_from(["gloo", "nccl", "NVLS", "layer_skip", "ngram", "none", "draft_model", "/nonexistent", "cuda", "", "~", "0"]),
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _mutate(raw: dict, data) -> dict:
    raw = copy.deepcopy(raw)
    paths = [p for p in _paths(raw) if p]
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path = data.draw(st.sampled_from(paths), label="path")
        *parent_path, last = path
        parent = raw
        try:
            for p in parent_path:
                parent = parent[p]
            op = data.draw(st.sampled_from(["replace", "delete", "add_key", "rename"]), label="op")
            if op == "replace":
                parent[last] = data.draw(VALUES, label="value")
            elif op == "delete":
                del parent[last]
            elif op == "add_key" and isinstance(parent, dict):
                parent[data.draw(st.text(min_size=1, max_size=8), label="key")] = data.draw(VALUES, label="value")
            elif op == "rename" and isinstance(parent, dict):
                parent[str(last) + data.draw(st.sampled_from(["_", "s", "X"]))] = parent.pop(last)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed or replaced this path
    return raw


@settings(max_examples=300, deadline=10_000, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_configs_end_in_one_line(tmp_path_factory, tiny_ckpt, data, capsys):
    """Any mutation of a valid experiment: `spectune validate` exits 0 (still valid) or 2 with one
    line `spectune: error: ...`; never a traceback, never another exit code, never a hang."""
    tmp = tmp_path_factory.mktemp("mut")
    raw = yaml.safe_load(tiny_experiment(tmp, tiny_ckpt).read_text())
    mutated = _mutate(raw, data)
    text = yaml.safe_dump(mutated)
    if data.draw(st.booleans(), label="garble"):
        # drawn independently of the text: its length follows the numbered temp dir's name (mut9,
        # mut10...), and a draw whose bounds change between replays makes Hypothesis call it flaky
        cut = data.draw(st.integers(0, 1 << 16), label="cut") % (len(text) + 1)
        text = text[:cut] + data.draw(st.sampled_from(["", ":", "\t", "[", "{a: }", "- x", "\x00", "'"]), label="junk") + text[cut:]
    path = tmp / "mutated.yaml"
    path.write_text(text)
    capsys.readouterr()
    try:
        rc = cli.main(["validate", str(path)])
    except SystemExit as e:  # argparse: still one line, exit 2
        rc = e.code
    out, err = capsys.readouterr()
    assert rc in (0, 2), (rc, err[-2000:])
    if rc == 2:
        _one_error_line(err)
    else:
        assert err.strip() == "" and out.strip().endswith(f"{', '.join(load_config(path).search.space)}")


# ------------------------------------------------------------------ resources
def test_gang_larger_than_the_machine_is_one_line_before_launch(tmp_path, tiny_ckpt, capsys, no_ray, monkeypatch):
    exp = tiny_experiment(tmp_path, tiny_ckpt)
    home = tmp_path / "home"
    monkeypatch.setenv("SPECTUNE_HOME", str(home))
    rc = cli.main(["run", str(exp), "--set", "parallel.cpus_per_worker=4", "--set", f"study.storage=sqlite:///{home}/o.db"])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and line.startswith("spectune: error: parallel.tp: ") and "needs 12 CPUs on one node" in line, line
    assert not home.exists()  # nothing written: no storage, no MLflow run


def test_gang_needs_more_gpus_than_on_offer(tmp_path, tiny_ckpt):
    from orchestrator.study.loop import check_gang_fits

    exp = tiny_experiment(tmp_path, tiny_ckpt)
    cfg = load_config(exp, ["parallel.device=cuda", "search.space.parallel.tp={choices: [1, 2, 4]}"])
    check_gang_fits(load_config(exp, ["parallel.device=cuda"]), [{"CPU": 8, "GPU": 2}])  # tp 2 fits on 2 GPUs
    with pytest.raises(PlacementError, match=r"search.space.parallel.tp: a gang of tp=4 \+ drafter needs 4 GPUs"):
        check_gang_fits(cfg, [{"CPU": 64, "GPU": 2}, {"CPU": 64, "GPU": 2}])  # 4 GPUs, but not on one node


# ------------------------------------------------------------------ storage
@pytest.mark.parametrize(
    "storage, words",
    [
        ("sqlite:///{tmp}/experiment.yaml/optuna.db", "is not a directory"),
        ("sqlite:////proc/spectune/optuna.db", "cannot create /proc/spectune"),
        ("sqlite:////sys/optuna.db", "cannot open sqlite:////sys/optuna.db"),
        ("postgresql://user:secret@127.0.0.1:1/spectune", "nothing accepts connections at 127.0.0.1:1 (connection refused)"),
    ],
)
def test_storage_problems_are_one_line_and_leave_nothing(tmp_path, tiny_ckpt, capsys, no_ray, monkeypatch, storage, words):
    home = tmp_path / "home"
    monkeypatch.setenv("SPECTUNE_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    exp = tiny_experiment(tmp_path, tiny_ckpt)
    rc = cli.main(["run", str(exp), "--set", f"study.storage={storage.format(tmp=tmp_path)}"])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and line.startswith("spectune: error: study.storage: ") and words in line, line
    assert "secret" not in line
    if storage.startswith("postgresql"):
        import importlib.util

        if any(importlib.util.find_spec(m) for m in ("psycopg", "psycopg2")):
            assert "Background on this error" not in line and line.count("(") == line.count(")"), line
        else:
            assert "'psycopg" in line and "not installed" in line and "pip install" in line, line
    assert not home.exists()  # no MLflow store, no parent run, no driver record


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of this test's own on a free loopback port: role `spectune` with a password
    (scram-sha-256), database `optuna`, and role-less trust for the user `ghost` (so the server can say
    that role does not exist). Yields (host:port, password); stopped and removed afterwards."""
    import glob
    import os
    import shutil
    import signal
    import subprocess
    import tempfile

    initdb = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
    if initdb is None:
        pytest.skip("PostgreSQL's server (initdb) is not installed")
    bin_dir = os.path.dirname(os.path.realpath(initdb))
    as_pg: list[str] = []
    folder = tempfile.mkdtemp(prefix="st-pg-", dir="/tmp")
    if os.geteuid() == 0:  # PostgreSQL refuses root: run it as `postgres`, as infra/services.sh does
        import pwd

        try:
            pg = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root without a user 'postgres' to run PostgreSQL as")
        as_pg = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
        os.chown(folder, pg.pw_uid, pg.pw_gid)
    password = "pw-" + os.urandom(6).hex()
    pwfile = os.path.join(folder, "pw")
    with open(pwfile, "w") as f:
        f.write(password + "\n")
    if as_pg:
        os.chown(pwfile, pg.pw_uid, pg.pw_gid)
    data = os.path.join(folder, "data")
    subprocess.run(
        [*as_pg, initdb, "-D", data, "-U", "spectune", f"--pwfile={pwfile}", "-A", "scram-sha-256", "-E", "UTF8", "--no-locale"],
        check=True,
        capture_output=True,
        cwd="/",
    )
    hba = os.path.join(data, "pg_hba.conf")
    with open(hba) as f:
        rules = f.read()
    with open(hba, "w") as f:
        f.write("host all ghost 127.0.0.1/32 trust\n" + rules)

    def launch(port: int) -> subprocess.Popen:
        return subprocess.Popen(
            [*as_pg, os.path.join(bin_dir, "postgres"), "-D", data, "-h", "127.0.0.1", "-p", str(port), "-k", folder],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,
        )

    def ready(port: int) -> bool:
        return subprocess.run([os.path.join(bin_dir, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)], cwd="/").returncode == 0

    try:
        server, port = serve_on_free_port(launch, ready, "postgres")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        env = {**os.environ, "PGPASSWORD": password}
        psql = [os.path.join(bin_dir, "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "spectune", "-d", "postgres"]
        subprocess.run([*psql, "-c", "create database optuna"], check=True, capture_output=True, env=env, cwd="/")
        yield f"127.0.0.1:{port}", password
    finally:
        stop_group(server, signal.SIGINT, grace_s=30)  # fast shutdown: open connections (a test's storage) are closed
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(
    "url, words",
    [
        ("postgresql+psycopg://spectune:{pw}@{at}/nodb", "database 'nodb' does not exist on the PostgreSQL server at {at}"),
        ("postgresql+psycopg://ghost@{at}/optuna", "role (user) 'ghost' does not exist on the PostgreSQL server at {at}"),
        (
            "postgresql+psycopg://spectune:not-{pw}@{at}/optuna",
            "refused user 'spectune': the URL's password is wrong, or there is no such role",
        ),
        ("postgresql+psycopg://spectune@{at}/optuna?passfile={tmp}/pgpass", "passfile '{tmp}/pgpass' does not exist"),
    ],
    ids=["database", "role", "password", "passfile"],
)
def test_a_postgresql_url_names_the_part_that_is_wrong(tmp_path, tiny_ckpt, capsys, no_ray, monkeypatch, postgres, url, words):
    """A missing database, a missing role, a wrong password, a passfile that is not there: one line naming
    that part, never the password, exit 2, nothing written; the right URL opens."""
    at, password = postgres
    home = tmp_path / "home"
    monkeypatch.setenv("SPECTUNE_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    exp = tiny_experiment(tmp_path, tiny_ckpt)
    rc = cli.main(["run", str(exp), "--set", f"study.storage={url.format(pw=password, at=at, tmp=tmp_path)}"])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and line.startswith("spectune: error: study.storage: ") and words.format(at=at, tmp=tmp_path) in line, line
    assert password not in line and "Background on this error" not in line and "http" not in line, line
    assert not home.exists()
    from orchestrator.tracking.storage import make_storage

    good = load_config(exp, [f"study.storage=postgresql+psycopg://spectune:{password}@{at}/optuna"])
    assert make_storage(good)[1].endswith("/optuna")


def test_a_non_utf8_experiment_file_is_one_line(tmp_path):
    """An experiment file in another encoding (Latin-1 here): exit 2 and one line naming the file and the
    first byte that is not UTF-8, for every command that reads one; no traceback."""
    import os
    import subprocess
    import sys

    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\nsearch: {space: {spec.num_draft_tokens: 0}}\n".encode("latin-1"))
    env = {**os.environ, "SPECTUNE_HOME": str(tmp_path / "home"), "RAY_AUTH_MODE": "disabled"}
    for command in (["validate"], ["run"], ["report"], ["export", "--to", "vllm"]):
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator", *command, str(path)], capture_output=True, text=True, env=env, timeout=120
        )
        line = _one_error_line(r.stderr)
        assert r.returncode == 2, (command, r.stderr)
        assert line == f"spectune: error: {path}: not UTF-8 text (byte 0xe9 at offset 9); save the experiment file as UTF-8", line
    assert not (tmp_path / "home").exists()


# ------------------------------------------------------------------ results that must never win
def test_wrong_allreduce_sums_are_caught_by_validation():
    import torch

    from workers.comm.base import AllReduce, validate

    class Doubling(AllReduce):  # "sums" by doubling the local part: wrong for any world size > 1
        name = "doubling"

        def _all_reduce(self, x: torch.Tensor) -> None:
            x.mul_(2)

    class Exact(AllReduce):  # rank 0 of 2: the exact sum is 3x its part; rank 1's part is twice rank 0's
        name = "exact"

        def _all_reduce(self, x: torch.Tensor) -> None:
            x.mul_(3)

        def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, 2 * x], dim=-1)

    class SwapsGather(Exact):  # right sums, the gathered parts in the wrong rank order
        def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([2 * x, x], dim=-1)

    assert "returned wrong sums" in validate(Doubling(None, 2), rank=0)
    assert validate(Exact(None, 2), rank=0) is None
    assert "all-gather returned wrong parts" in validate(SwapsGather(None, 2), rank=0)


def test_fused_add_norm_is_checked_against_allreduce_add_norm():
    """A backend whose one-kernel allreduce + add + norm (symm_mem_ll on GPUs) computes something
    else than allreduce, then add, then norm is refused before any trial is measured."""

    from workers.comm.base import AllReduce, validate_add_norm

    class Exact(AllReduce):  # rank 0 of 2: the exact sum is 3x its part
        name = "exact"
        fuses_add_norm = True

        def _all_reduce(self, x):
            x.mul_(3)

        def add_norm(self, partial, residual, weight, eps):  # the same math, in float64 and another order
            s = (residual.double() + 3 * partial.double()).float()
            return s, weight * (s * (s.double().square().mean(-1, keepdim=True) + eps).rsqrt().float())

    class ForgetsWeight(Exact):
        def add_norm(self, partial, residual, weight, eps):
            s, n = super().add_norm(partial, residual, weight, eps)
            return s, n / weight

    assert validate_add_norm(Exact(None, 2), rank=0, hidden=64) is None
    err = validate_add_norm(ForgetsWeight(None, 2), rank=0, hidden=64)
    assert "fused add + norm differs" in err and "(norm," in err
    assert validate_add_norm(Exact(None, 1), rank=0, hidden=64) is None  # nothing to fuse in a world of one


class _FakeGang:
    """Returns fixed tokens per prompt: `outputs[k]` for a trial with k draft tokens."""

    def __init__(self, outputs):
        self.outputs, self._closed = outputs, False

    def run(self, workload, timeout_s=None, on_progress=None):
        from workers.spec import PromptResult, RunResult
        from workers.spec.run_stats import RunStats

        toks = list(self.outputs[workload.num_draft_tokens])
        return RunResult(
            prompts=[PromptResult(toks, 0.01, len(toks), 0)],
            stats=RunStats(tokens=len(toks), seconds=0.01 if workload.num_draft_tokens else 0.02),
            num_draft_tokens=workload.num_draft_tokens,
        )

    def peak_rss_mb(self) -> list[float]:
        return [100.0]

    def close(self):
        self._closed = True


class _FakePool:
    def __init__(self, gang=None, error=None):
        self.gang, self.error, self.launched, self.setup_s = gang, error, 0, 0.0
        self.interrupted = False  # GangPool's: set when another thread closed the gang on purpose
        self.gang_id = None  # GangPool's: drawn at each launch
        self.launch_failed = None  # GangPool's: the gang whose launch failed for good (none here)

    def get(self, spec, env, plain):
        if self.error:
            raise self.error
        self.launched += 1
        self.gang_id = f"fake-{self.launched}"
        return self.gang

    def close(self):
        pass


def test_invalid_trials_are_never_best(tmp_path, tiny_ckpt):
    """A speculative trial whose greedy output differs from the baseline is FAIL (spectune.invalid,
    outputs_match_baseline = 0) although it is 2x faster; a trial whose gang failed validation
    (wrong allreduce sums) is FAIL too; the best trial is the baseline."""
    import optuna

    from orchestrator.execution.validate import check_experiment
    from orchestrator.study.trial import run_trial
    from orchestrator.tracking.runs import Tracker
    from workers.errors import GangError

    exp = tiny_experiment(tmp_path, tiny_ckpt, search={"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4]}}})
    cfg = load_config(exp)
    prepared = check_experiment(cfg)
    study = optuna.create_study(direction="maximize")
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "faults", "faults", tmp_path, study=study)
    gang = _FakeGang({0: [5, 6, 7, 8], 2: [5, 6, 9, 9], 4: [5, 6, 7, 8]})
    outcomes = []
    for k, pool in (
        (0, _FakePool(gang)),
        (2, _FakePool(gang)),
        (4, _FakePool(error=GangError("setup: rank 1: WorkerError: allreduce backend 'gloo' returned wrong sums"))),
    ):
        study.enqueue_trial({"spec.num_draft_tokens": k})
        outcomes.append(run_trial(study, study.ask(), cfg, prepared, pool, tracker))
    assert [o.state for o in outcomes] == ["COMPLETE", "FAIL", "FAIL"]
    base, invalid, wrong = study.trials
    assert invalid.user_attrs["outputs_match_baseline"] == 0 and "differs from the baseline" in invalid.user_attrs["spectune.invalid"]
    assert invalid.user_attrs["throughput_tok_s"] > base.value  # faster, and still not the best
    assert "wrong sums" in wrong.user_attrs["spectune.fail_reason"]
    assert study.best_trial.number == base.number
    runs = {t.number: tracker.client.get_run(t.user_attrs["mlflow_run_id"]) for t in study.trials}
    assert runs[invalid.number].info.status == "FAILED" and runs[invalid.number].data.metrics["outputs_match_baseline"] == 0
    assert runs[wrong.number].info.status == "FAILED" and "wrong sums" in runs[wrong.number].data.tags["spectune.fail_reason"]
    assert json.loads(json.dumps(study.user_attrs))["mlflow_parent_run_id"] == tracker.parent_run_id


@pytest.mark.parametrize(
    "workload, drafter, words",
    [
        ({"batch_sizes": [2, 0]}, None, "workload.batch_sizes: each batch size must be between 1 and 64"),
        ({"batch_sizes": [2, 2]}, None, "batch sizes repeat"),
        ({"batch_sizes": [8]}, None, "workload.batch_sizes: 8 exceeds the 3 prompts of the workload"),
        (
            {"batch_sizes": [2], "temperature": 0.7},
            None,
            "with a drafter process of its own need greedy decoding (temperature 0) or simulated acceptance; search.space.drafter.kind allows layer_skip",
        ),
    ],
)
def test_batch_sizes_that_cannot_run_are_one_line(tmp_path, tiny_ckpt, capsys, workload, drafter, words):
    raw = yaml.safe_load(tiny_experiment(tmp_path, tiny_ckpt).read_text())
    raw["workload"].update(workload)
    if drafter:
        raw["drafter"] = drafter
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert cli.main(["validate", str(path)]) == 2
    assert words in _one_error_line(capsys.readouterr().err)
