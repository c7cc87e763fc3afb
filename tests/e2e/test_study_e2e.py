"""The main job end to end: real Ray (embedded local cluster), real SQLite Optuna storage, real
MLflow (a `mlflow server` process, and a SQLite store), a drafter actor beside the TP 2 gang."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from studyutil import mlflow_runs, optuna_study, processes_mentioning, spectune, summary, tiny_experiment

pytestmark = pytest.mark.timeout(1800)  # several studies of up to 600 s each

CONTRACT_PARAMS = ("spec.num_draft_tokens", "comm.backend", "parallel.tp", "drafter.kind")
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


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def mlflow_server(tmp_path):
    from orchestrator.tracking.local_store import seed_sqlite_store

    port = _free_port()
    bin_dir = Path(sys.executable).parent
    seed_sqlite_store(f"sqlite:///{tmp_path / 'mlflow-server.db'}")  # the server opens a migrated store, as ours do
    proc = subprocess.Popen(
        [
            str(bin_dir / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'mlflow-server.db'}",
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # as infra/services.sh starts it
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("mlflow server did not start")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:  # its workers drain for ~20 s on SIGTERM; nothing of it is checked
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_study_against_mlflow_server(tmp_path, tiny_ckpt, mlflow_server):
    exp = tiny_experiment(tmp_path, tiny_ckpt, search={"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4, 6]}}})
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    r = spectune(
        [
            "run",
            str(exp),
            "--set",
            f"tracking.uri={mlflow_server}",
            "--set",
            f"study.storage={storage}",
            "--set",
            "study.bench_allreduce=true",
        ],
        tmp_path / "home",
    )
    out = summary(r)
    assert out["complete"] == 4
    assert "[4/4]" in r.stderr and "rank trial" in r.stderr  # progress lines and the final table
    assert processes_mentioning(r.ray_tmp) == []  # the embedded Ray and every actor are gone

    study = optuna_study(storage, "tiny-study")
    trials = study.trials
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == 4
    assert complete[0].params["spec.num_draft_tokens"] == 0  # the baseline runs first
    parents, runs = mlflow_runs(mlflow_server, "tiny-study")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    from mlflow.tracking import MlflowClient

    # the baseline's tokens and margins (for near-tie verdicts): an artifact of its run, not a user attr
    assert not any("spectune.baseline_outputs" in t.user_attrs for t in trials)
    with tempfile.TemporaryDirectory() as tmp:
        path = MlflowClient(tracking_uri=mlflow_server).download_artifacts(
            complete[0].user_attrs["mlflow_run_id"], "baseline_outputs.json", tmp
        )
        recorded = json.loads(open(path).read())
    assert [len(m) for m in recorded["margins"]] == [len(t) for t in recorded["tokens"]] and recorded["tokens"]

    logged = {a.path for a in MlflowClient(tracking_uri=mlflow_server).list_artifacts(parents[0].info.run_id)}
    assert {"bench_allreduce_table.json", "bench_allreduce.json", "bench_allreduce_latency.png"} <= logged
    assert parents[0].data.metrics["objective"] == pytest.approx(study.best_value, rel=1e-3)  # the best trial's, 4 significant digits
    assert len(runs) == len(trials)
    by_id = {run.info.run_id: run for run in runs}
    for t in trials:
        run = by_id[t.user_attrs["mlflow_run_id"]]
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.data.tags["spectune.study"] == "tiny-study" and run.data.tags["spectune.trial"] == str(t.number)
        assert run.data.tags["spectune.state"] == t.state.name
        for p in CONTRACT_PARAMS:
            assert p in run.data.params
        assert run.data.params["parallel.tp"] == "2"
    for t in complete:
        run = by_id[t.user_attrs["mlflow_run_id"]]
        for m in CONTRACT_METRICS:
            assert m in run.data.metrics, m
            assert t.user_attrs[m] == pytest.approx(run.data.metrics[m], rel=1e-3)
        assert run.data.metrics["objective"] == pytest.approx(t.value, rel=1e-3)  # median - mad_penalty x MAD of its repeats
        if t.user_attrs["repeats"] == 1:
            assert run.data.metrics["throughput_tok_s"] == pytest.approx(t.value, rel=1e-3)  # MLflow keeps 4 significant digits
        assert run.data.metrics["outputs_match_baseline"] == 1
        if t.params["spec.num_draft_tokens"] > 0:
            assert "accept_rate_pos_1" in run.data.metrics


def test_resume_reaches_the_total_without_duplicates(tmp_path, tiny_ckpt):
    """n_trials=3, then the same command with n_trials=5: 5 complete trials, one parent run,
    one MLflow run per Optuna trial. All trials share one env: the gang is reused."""
    space = {"space": {"spec.num_draft_tokens": {"choices": [0, 1, 2, 3, 4]}}}
    exp = tiny_experiment(tmp_path, tiny_ckpt, search=space, parallel={"tp": 1, "cpus_per_worker": 0.1})  # one actor a gang
    home = tmp_path / "home"
    # two at a time asked for, on an embedded one-node Ray: isolation node gives one slot, said in one line
    first_run = spectune(["run", str(exp), "--set", "study.n_trials=3", "--set", "study.max_concurrent_trials=2"], home)
    assert "study.max_concurrent_trials=2, but isolation node gives 1 slot(s) on this cluster (1 node(s)): 1 at a time" in first_run.stderr
    first = summary(first_run)
    assert first["complete"] == 3
    assert first["gangs_launched"] == 1  # 3+ trials, one gang: the same env and placement throughout
    second_run = spectune(["run", str(exp), "--set", "study.n_trials=5"], home)
    second = summary(second_run)
    assert second["complete"] == 5 and second["parent_run_id"] == first["parent_run_id"]
    assert "3/5 complete" in second_run.stderr
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study")
    assert len([t for t in study.trials if t.state.name == "COMPLETE"]) == 5
    parents, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    assert len(parents) == 1
    ids = [t.user_attrs["mlflow_run_id"] for t in study.trials]
    assert len(set(ids)) == len(ids) == len(runs)
    third = summary(spectune(["run", str(exp), "--set", "study.n_trials=5"], home))  # already done: runs nothing
    assert third["complete"] == 5 and len(optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study").trials) == len(study.trials)


def test_fixed_k_baseline_noise_and_a_resume_that_must_match(tmp_path, tiny_ckpt):
    """k fixed in the YAML (not searched): the k = 0 baseline still runs first (enqueued, measured
    study.baseline_repeats times), every speculative trial is compared with it (speedup from medians,
    outputs checked), every resolved parameter is an MLflow param, and the summary ranks with the noise
    the repeats show. Resuming with another TP size exits 2 naming the field; resuming with more trials,
    other limits and max_failed_trials=1 stops after exactly one failure and does not add a baseline."""
    import json
    import statistics

    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        drafter={"kind": "ngram", "layers": 1, "num_draft_tokens": 2},
        search={"space": {"drafter.ngram_max": {"choices": [2, 3]}}},  # one gang for every trial
        study={"n_trials": 2, "sampler": "random", "seed": 1},
        parallel={"tp": 1, "cpus_per_worker": 0.1},  # one actor a gang; the resume below tries TP 2
    )
    home = tmp_path / "home"
    storage, tracking = f"sqlite:///{home / 'optuna.db'}", f"sqlite:///{home / 'mlflow.db'}"
    out = summary(spectune(["run", str(exp)], home))
    assert out["complete"] == 2
    study = optuna_study(storage, "tiny-study")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    base = [t for t in complete if t.user_attrs["spectune.params"]["spec.num_draft_tokens"] == 0]
    assert [t.number for t in base] == [0] and "spec.num_draft_tokens" not in base[0].params  # not a parameter of the space
    samples = base[0].user_attrs["spectune.repeat_tok_s"]
    assert len(samples) >= 3  # study.baseline_repeats
    _, runs = mlflow_runs(tracking, "tiny-study")
    by_id = {r.info.run_id: r for r in runs}
    assert by_id[base[0].user_attrs["mlflow_run_id"]].data.params["spec.num_draft_tokens"] == "0"
    spec = [t for t in complete if t.number != 0]
    assert spec
    for t in spec:
        m = by_id[t.user_attrs["mlflow_run_id"]].data.metrics
        assert m["outputs_match_baseline"] == 1 and m["speedup_vs_baseline"] != 1
        assert m["speedup_vs_baseline"] == pytest.approx(
            t.user_attrs["throughput_median"] / statistics.median(samples), rel=1e-3
        )  # 4 digits
    for r in runs:  # fixed and searched alike: the compare view lines them up
        assert {"model.path", "parallel.device", "parallel.tp", "comm.backend", "spec.num_draft_tokens", "drafter.kind"} <= set(
            r.data.params
        )
    ranking = out["ranking"]
    assert ranking["noise_rel"] > 0 and 0 in ranking["noise_from_trials"] and ranking["verdict"]
    assert sorted(n for c in ranking["configs"] for n in c["trials"]) == sorted(t.number for t in complete)
    assert json.loads(json.dumps(ranking)) == ranking

    other_tp = spectune(["run", str(exp), "--set", "parallel.tp=2"], home)
    assert other_tp.returncode == 2
    line = other_tp.stderr.strip().splitlines()[-1]
    assert line.startswith("spectune: error: parallel.tp: differ from the study 'tiny-study'") and "study.name" in line

    failing = spectune(
        ["run", str(exp), "--set", "study.n_trials=4", "--set", "limits.trial_timeout_s=0.001", "--set", "study.max_failed_trials=1"], home
    )
    assert failing.returncode == 2 and "1 trials failed in this run" in failing.stderr, failing.stderr[-2000:]
    trials = optuna_study(storage, "tiny-study").trials
    assert [t.state.name for t in trials].count("FAIL") == 1 and [t.state.name for t in trials].count("COMPLETE") == 2
    assert sum(bool(t.user_attrs.get("spectune.baseline")) for t in trials) == 1  # resuming enqueues no second baseline


def test_batch_sizes_study_and_its_exported_schedule(tmp_path, tiny_ckpt):
    """workload.batch_sizes [1, 2]: every trial also decodes in batches of 2 (metrics *_b2, checked
    against the batch-1 baseline), Optuna's objective is the geometric mean over batch sizes, and
    `spectune export` turns the study into a schedule with both sizes, for each engine format."""
    import math
    import statistics

    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        drafter={"kind": "ngram"},
        parallel={"tp": 1, "cpus_per_worker": 0.1},
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4]}}},
        study={"n_trials": 3, "sampler": "grid", "baseline_repeats": 2},
    )
    text = exp.read_text().replace("max_new_tokens: 12", "max_new_tokens: 12\n  batch_sizes: [2]")
    exp.write_text(text)
    home = tmp_path / "home"
    out = summary(spectune(["run", str(exp)], home))
    assert out["complete"] == 3
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study")
    # the grid proposes k = 0 again beside the enqueued baseline: skipped as a duplicate, each point measured once
    assert all("spectune.duplicate_of" in t.user_attrs for t in study.trials if t.state.name != "COMPLETE")
    assert sorted(t.params["spec.num_draft_tokens"] for t in study.trials if t.state.name == "COMPLETE") == [0, 2, 4]
    for t in (t for t in study.trials if t.state.name == "COMPLETE"):
        a = t.user_attrs
        assert a["outputs_match_b2"] == 1, t.number
        assert a["throughput_tok_s_b2"] > 0 and a["accept_len_mean_b2"] >= 1
        want = math.sqrt(a["objective_b1"] * a["throughput_tok_s_b2"])
        assert t.value == pytest.approx(want, rel=1e-3)
    _, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    assert all(r.data.params["workload.batch_sizes"] == "1,2" for r in runs)
    assert all("speedup_vs_baseline_b2" in r.data.metrics for r in runs if r.data.tags["spectune.state"] == "COMPLETE")

    r = spectune(["export", str(exp), "--to", "json"], home)
    assert r.returncode == 0, r.stderr[-2000:]
    exported = json.loads(r.stdout)
    schedule = exported["schedule"]
    assert [row["batch_size"] for row in schedule] == [1, 2]
    # ranked by throughput (prefill included); each size's decode rate (decode steps only) beside it
    assert exported["ranked_by"] == "throughput_tok_s"
    assert all(row["decode_tok_s"] > 0 and row["plain_decode_tok_s"] > 0 and row["decode_speedup_vs_plain"] > 0 for row in schedule)
    # the best configuration at each size: trials of one configuration pooled by median
    pooled: dict[str, dict[int, list[float]]] = {}
    for t in (t for t in study.trials if t.state.name == "COMPLETE"):
        by_size = pooled.setdefault(json.dumps(t.user_attrs["spectune.params"], sort_keys=True), {1: [], 2: []})
        by_size[1] += t.user_attrs["spectune.repeat_tok_s"]
        by_size[2].append(t.user_attrs["throughput_tok_s_b2"])
    for row in schedule:
        best = max(statistics.median(v[row["batch_size"]]) for v in pooled.values())
        assert row["throughput_tok_s"] == pytest.approx(best, rel=2e-3), row
        assert row["speedup_vs_plain"] > 0 and row["plain_throughput_tok_s"] > 0
    for fmt, needle in (("vllm", "NCCL_NVLS_ENABLE=0"), ("sglang", "--tp-size"), ("env", "NCCL_NVLS_ENABLE=0")):
        r = spectune(["export", str(exp), "--to", fmt, "--out", str(tmp_path / f"out.{fmt}")], home)
        assert r.returncode == 0, r.stderr[-2000:]
        assert needle in (tmp_path / f"out.{fmt}").read_text()
    rep = spectune(["report", str(exp), "--out", str(tmp_path / "report")], home)
    assert rep.returncode == 0, rep.stderr[-2000:]
    batches = json.loads((tmp_path / "report" / "summary.json").read_text())["batches"]
    assert [row["batch_size"] for row in batches["schedule"]] == [1, 2]
    stop = batches["speculation_stops_paying_at"]
    assert stop in (None, 1, 2)
    if any(row["num_draft_tokens"] == 0 for row in schedule):  # plain decoding won somewhere: speculation stopped paying by then
        assert stop is not None and stop <= next(row["batch_size"] for row in schedule if row["num_draft_tokens"] == 0)
    page = (tmp_path / "report" / "report.html").read_text()
    assert 'id="batch-schedule"' in page and 'id="plot-batches"' in page
    assert "<th>decode tok/s</th>" in page and "ranks configurations by throughput" in page
    assert ("stops paying at batch size" in rep.stdout) == (stop is not None)
    missing = spectune(["export", str(exp), "--set", "study.name=nope"], home)
    assert missing.returncode == 2 and "no study 'nope'" in missing.stderr


def test_the_last_trials_race_the_leaders_on_a_fresh_gang(tmp_path, tiny_ckpt):
    """study.race_trials 1 with nothing measured twice (the noise unknown, so the leaders tie): the last
    trial re-measures the leading configuration on a fresh gang instead of trying a new one, it counts
    toward study.n_trials, and both stores name the trial it repeats."""
    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        parallel={"tp": 1, "cpus_per_worker": 0.1},
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 1, 2, 3]}}},
        study={"n_trials": 3, "sampler": "random", "seed": 0, "pruner": "none", "baseline_repeats": 1, "race_trials": 1},
    )
    home = tmp_path / "home"
    r = spectune(["run", str(exp)], home)
    out = summary(r)
    assert out["complete"] == 3 and out["gangs_launched"] >= 2  # the race trial's own gang
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    raced = [t for t in complete if "spectune.race_of" in t.user_attrs]
    assert len(complete) == 3 and len(raced) == 1 and raced[0].number == max(t.number for t in complete)
    first = study.trials[raced[0].user_attrs["spectune.race_of"]]
    assert first.params == raced[0].params and first.value == max(t.value for t in complete if t is not raced[0])  # the leader
    assert f"re-measures trial {first.number}'s configuration" in r.stderr
    _, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    assert {run.data.tags.get("spectune.race_of") for run in runs} == {None, str(first.number)}
