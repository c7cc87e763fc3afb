"""The main job end to end: real Ray (embedded local cluster), real SQLite Optuna storage, MLflow in
a SQLite store. The TP 2 study against a real `mlflow server` process (n-gram drafting inside the TP 2
ranks) is tests/e2e/test_report.py::test_report_end_to_end: the study its report is checked on.

The commands run through spectune's `main` in the test's process (studyutil.run_here and spectune_here):
each `spectune run` that measures still starts its own embedded Ray (its GCS, raylet, agents and gang
actors are processes, its driver record and watchdog as the command's), and the output is the command's;
what is saved is an interpreter with MLflow, Optuna, Ray and matplotlib to import per command (~5 CPU-s a
study, ~1.5-6 a report or export). What a driver's process does when it is killed, signalled or runs
beside another is tests/e2e/test_faults_*.py's, with `spectune` processes."""

from __future__ import annotations

import json

import pytest
from studyutil import mlflow_runs, optuna_study, run_here, spectune_here, summary, tiny_experiment

pytestmark = pytest.mark.timeout(1800)  # several studies of up to 600 s each


def test_fixed_k_baseline_noise_and_a_resume_that_must_match(tmp_path, tiny_ckpt, capsys):
    """k fixed in the YAML (not searched): the k = 0 baseline still runs first (enqueued, measured
    study.baseline_repeats times), every speculative trial is compared with it (speedup from medians,
    outputs checked), every resolved parameter is an MLflow param, and the summary ranks with the noise
    the repeats show; its trials share one env, so one gang serves them all. Then resuming: with another
    TP size exits 2 naming the field; with n_trials 3 -> 4 reaches 4 complete trials, one parent run, one
    MLflow run per Optuna trial; once done, the same command runs nothing; with more trials, other limits
    and max_failed_trials=1 it stops after exactly one failure and adds no second baseline.
    (One study for both stories, resuming and the fixed k: each study costs its own Ray, gang and driver.
    The name is the fixed-k test's of old: tests/durations.json knows it as the long test it still is.)"""
    import statistics

    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        drafter={"kind": "ngram", "layers": 1, "num_draft_tokens": 2},
        search={"space": {"drafter.ngram_max": {"choices": [2, 3, 4, 5, 6]}}},  # distinct configs enough to resume twice
        # no pruner: a trial the pruner stops as slower (noise on a loaded machine) would leave a resume short
        study={"n_trials": 3, "sampler": "random", "seed": 1, "pruner": "none"},
        parallel={"tp": 1, "cpus_per_worker": 0.1},  # one actor a gang; the resume below tries TP 2
    )
    home = tmp_path / "home"
    storage, tracking = f"sqlite:///{home / 'optuna.db'}", f"sqlite:///{home / 'mlflow.db'}"
    # two at a time asked for, on an embedded one-node Ray: isolation node gives one slot, said in one line
    first_run = run_here(capsys, ["run", str(exp), "--set", "study.max_concurrent_trials=2"], home)
    assert "study.max_concurrent_trials=2, but isolation node gives 1 slot(s) on this cluster (1 node(s)): 1 at a time" in first_run.stderr
    out = summary(first_run)
    assert out["complete"] == 3
    study = optuna_study(storage, "tiny-study")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    # every trial records the gang it ran on; a drafter.ngram_max is part of the gang (so another value means new
    # actors), the plain baseline runs on any gang of its verifier setup. One gang for 3 trials of one env: the
    # batch study below (k searched)
    assert out["gangs_launched"] == len({t.user_attrs["spectune.gang"] for t in complete})
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

    other_tp = spectune_here(capsys, "run", str(exp), "--set", "parallel.tp=2", home=home)
    assert other_tp.returncode == 2
    line = other_tp.stderr.strip().splitlines()[-1]
    assert line.startswith("spectune: error: parallel.tp: differ from the study 'tiny-study'") and "study.name" in line

    second_run = run_here(capsys, ["run", str(exp), "--set", "study.n_trials=4"], home)
    second = summary(second_run)
    assert second["complete"] == 4 and second["parent_run_id"] == out["parent_run_id"]
    assert "3/4 complete" in second_run.stderr
    study = optuna_study(storage, "tiny-study")
    assert len([t for t in study.trials if t.state.name == "COMPLETE"]) == 4
    parents, runs = mlflow_runs(tracking, "tiny-study")
    assert len(parents) == 1
    ids = [t.user_attrs["mlflow_run_id"] for t in study.trials]
    assert len(set(ids)) == len(ids) == len(runs)
    again = spectune_here(capsys, "run", str(exp), "--set", "study.n_trials=4", home=home)  # already done: runs nothing (no Ray)
    third = summary(again)
    assert third["complete"] == 4 and len(optuna_study(storage, "tiny-study").trials) == len(study.trials)
    assert third["gangs_launched"] == 0  # nothing measured: no gang launched

    failing = run_here(
        capsys,
        ["run", str(exp), "--set", "study.n_trials=6", "--set", "limits.trial_timeout_s=0.001", "--set", "study.max_failed_trials=1"],
        home,
    )
    assert failing.returncode == 2 and "1 trials failed in this run" in failing.stderr, failing.stderr[-2000:]
    trials = optuna_study(storage, "tiny-study").trials
    assert [t.state.name for t in trials].count("FAIL") == 1 and [t.state.name for t in trials].count("COMPLETE") == 4
    assert sum(bool(t.user_attrs.get("spectune.baseline")) for t in trials) == 1  # resuming enqueues no second baseline


def test_batch_sizes_study_and_its_exported_schedule(tmp_path, tiny_ckpt, capsys):
    """workload.batch_sizes [1, 2] and context_lengths [32, 160]: every trial also decodes in batches of 2
    and with its prompts drawn to 32 and 160 tokens, at both sizes (metrics *_b2, *_c32, *_b2_c32, ...,
    each checked against the baseline's outputs in that cell), Optuna's objective is the geometric mean
    over the cells, and `spectune export` turns the study into a schedule with a row per batch size and
    per bucket (the JSON) and engine formats by batch size; the report shows both."""
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
    text = exp.read_text().replace("max_new_tokens: 12", "max_new_tokens: 12\n  batch_sizes: [2]\n  context_lengths: [160, 32]")
    exp.write_text(text)
    home = tmp_path / "home"
    out = summary(run_here(capsys, ["run", str(exp)], home))
    assert out["complete"] == 3
    assert out["gangs_launched"] == 1  # 3 trials, one gang: the same env and placement throughout
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study")
    # the grid proposes k = 0 again beside the enqueued baseline: skipped as a duplicate, each point measured once
    assert all("spectune.duplicate_of" in t.user_attrs for t in study.trials if t.state.name != "COMPLETE")
    assert sorted(t.params["spec.num_draft_tokens"] for t in study.trials if t.state.name == "COMPLETE") == [0, 2, 4]
    for t in (t for t in study.trials if t.state.name == "COMPLETE"):
        a = t.user_attrs
        cells = ["b2", "c32", "b2_c32", "c160", "b2_c160"]
        # the baseline's own batch-1 run of a bucket is that bucket's reference: nothing to check it against
        checked = cells if t.params["spec.num_draft_tokens"] else ["b2", "b2_c32", "b2_c160"]
        assert all(a[f"outputs_match_{c}"] == 1 for c in checked), (t.number, a)
        assert all(a[f"throughput_tok_s_{c}"] > 0 and a[f"accept_len_mean_{c}"] >= 1 for c in cells)
        assert 32 < a["prompt_tokens_median"] < 160  # one bucket keeps each prompt's end, the other draws a context before it
        want = math.exp(sum(math.log(v) for v in [a["objective_b1"], *(a[f"throughput_tok_s_{c}"] for c in cells)]) / 6)
        assert t.value == pytest.approx(want, rel=1e-3)
    parents, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    assert all(r.data.params["workload.batch_sizes"] == "1,2" and r.data.params["workload.context_lengths"] == "32,160" for r in runs)
    from mlflow.tracking import MlflowClient

    # the default local store (SQLite + an artifact folder) holds the report `spectune run` logged
    local = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    names = {a.path for a in local.list_artifacts(parents[0].info.run_id, "report")}
    assert {"report/report.html", "report/best_config.yaml", "report/summary.json"} <= names, names
    assert all("speedup_vs_baseline_b2" in r.data.metrics for r in runs if r.data.tags["spectune.state"] == "COMPLETE")

    r = spectune_here(capsys, "export", str(exp), "--to", "json", home=home)
    assert r.returncode == 0, r.stderr[-2000:]
    exported = json.loads(r.stdout)
    schedule = exported["schedule"]
    assert [row["batch_size"] for row in schedule] == [1, 2] and all(row["context_len"] is None for row in schedule)
    assert [(row["batch_size"], row["context_len"]) for row in exported["by_context"]] == [(1, 32), (2, 32), (1, 160), (2, 160)]
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
        r = spectune_here(capsys, "export", str(exp), "--to", fmt, "--out", str(tmp_path / f"out.{fmt}"), home=home)
        assert r.returncode == 0, r.stderr[-2000:]
        assert needle in (tmp_path / f"out.{fmt}").read_text()
    rep = spectune_here(capsys, "report", str(exp), "--out", str(tmp_path / "report"), home=home)
    assert rep.returncode == 0, rep.stderr[-2000:]
    facts = json.loads((tmp_path / "report" / "summary.json").read_text())
    # no allreduce table (study.bench_allreduce off, no --bench): the allreduce term is fitted, and the report says so
    assert facts["allreduce_term"] == {"tp1 gloo": "fitted"} and not facts["comm_check"]
    assert "allreduce term fitted for tp1 gloo: no allreduce table (study.bench_allreduce off and no --bench)" in rep.stdout
    batches = facts["batches"]
    assert [row["batch_size"] for row in batches["schedule"]] == [1, 2]
    stop = batches["speculation_stops_paying_at"]
    assert stop in (None, 1, 2)
    if any(row["num_draft_tokens"] == 0 for row in schedule):  # plain decoding won somewhere: speculation stopped paying by then
        assert stop is not None and stop <= next(row["batch_size"] for row in schedule if row["num_draft_tokens"] == 0)
    page = (tmp_path / "report" / "report.html").read_text()
    assert 'id="batch-schedule"' in page and 'id="plot-batches"' in page and 'id="context-schedule"' in page
    # by batch size, then by length: the 32-token bucket is shorter than the prompts as they are
    assert [(row["batch_size"], row["context_len"]) for row in facts["contexts"]["rows"]] == [
        (1, 32),
        (1, None),
        (1, 160),
        (2, 32),
        (2, None),
        (2, 160),
    ]
    assert "and at context 160" in rep.stdout or "at context 160." in rep.stdout  # the same winner, or where it moved
    assert "<th>decode tok/s</th>" in page and "ranks configurations by throughput" in page
    assert ("stops paying at batch size" in rep.stdout) == (stop is not None)
    missing = spectune_here(capsys, "export", str(exp), "--set", "study.name=nope", home=home)
    assert missing.returncode == 2 and "no study 'nope'" in missing.stderr


def test_the_last_trials_race_the_leaders_on_a_fresh_gang(tmp_path, tiny_ckpt, capsys):
    """study.race_trials 1 with nothing measured twice (the noise unknown, so the leaders tie): the last
    trial re-measures the leading configuration on a fresh gang instead of trying a new one, it counts
    toward study.n_trials, and both stores name the trial it repeats. The study is started from a shell
    with NCCL_ALGO set: every trial's MLflow params carry `nccl.NCCL_ALGO` and a tag naming it as
    inherited; the metrics carry `rank_peak_rss_mb_max`. Acceptance is imposed (workload.simulate_accept_len
    2.5): speculative trials accept exactly tau - 1 drafts per step on average, are tagged in MLflow, are not
    compared with the baseline's tokens (they are not the model's output) and so stay valid; the baseline
    runs unsimulated; a tau the space's k cannot reach is refused with one line before anything launches.
    (Three studies of old in one: test_ray_placement.py's test_trial_records_inherited_nccl_env_and_rank_peak_rss
    and test_gpu_logic.py's test_study_with_simulated_acceptance; each study costs its own Ray, gangs and driver.)"""
    from workers.spec.engine_config import EngineConfig

    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        parallel={"tp": 1, "cpus_per_worker": 0.1},
        workload={"prompts": str(tmp_path / "prompts.jsonl"), "num_prompts": 2, "max_new_tokens": 16, "simulate_accept_len": 2.5},
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 2, 3]}}},
        study={"n_trials": 3, "sampler": "random", "seed": 0, "pruner": "none", "baseline_repeats": 1, "race_trials": 1},
    )
    home = tmp_path / "home"
    r = run_here(capsys, ["run", str(exp)], home, env={"NCCL_ALGO": "Ring"})
    out = summary(r)
    assert out["complete"] == 3 and out["gangs_launched"] >= 2  # the race trial's own gang
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    raced = [t for t in complete if "spectune.race_of" in t.user_attrs]
    assert len(complete) == 3 and len(raced) == 1 and raced[0].number == max(t.number for t in complete)
    assert any(t.params["spec.num_draft_tokens"] > 0 for t in complete)  # the simulated checks below have a trial to check
    first = study.trials[raced[0].user_attrs["spectune.race_of"]]
    assert first.params == raced[0].params and first.value == max(t.value for t in complete if t is not raced[0])  # the leader
    assert f"re-measures trial {first.number}'s configuration" in r.stderr
    _, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    assert {run.data.tags.get("spectune.race_of") for run in runs} == {None, str(first.number)}
    by_id = {run.info.run_id: run for run in runs}
    for t in complete:  # one repeat each (baseline_repeats 1, workload.repeats 1): the objective is the throughput measured
        assert t.user_attrs["repeats"] == 1
        assert by_id[t.user_attrs["mlflow_run_id"]].data.metrics["throughput_tok_s"] == pytest.approx(t.value, rel=1e-3)  # 4 digits
    for t in complete:  # the driver's NCCL_* reach every trial's record, and each trial its ranks' peak memory
        run = by_id[t.user_attrs["mlflow_run_id"]]
        assert run.data.params["nccl.NCCL_ALGO"] == "Ring" and run.data.tags["spectune.nccl_inherited"] == "NCCL_ALGO"
        assert 100 < run.data.metrics["rank_peak_rss_mb_max"] < 4096
        # every trial run carries the engine settings it ran with, as `engine.<field>` params
        assert {f"engine.{k}": str(v) for k, v in EngineConfig().describe().items()}.items() <= run.data.params.items()
        a, simulated = t.user_attrs, run.data.tags.get("spectune.simulated_accept_len")
        if t.params["spec.num_draft_tokens"] == 0:  # the baseline: the model's own tokens, the reference
            assert a["accept_len_mean"] == 1.0 and a["outputs_match_baseline"] == 1 and simulated is None
        else:
            assert abs(a["accept_len_mean"] - 2.5) < 0.15 and "outputs_match_baseline" not in a and simulated == "2.5", (t.number, a)
    bad = spectune_here(capsys, "validate", str(exp), "--set", "workload.simulate_accept_len=4", home=home)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "workload.simulate_accept_len: 4 needs at least 3 drafts per step" in bad.stderr and "k = 2" in bad.stderr


def test_a_study_that_measures_its_space_through_reads_as_it_happened(tmp_path, tiny_ckpt, capsys):
    """Two configurations, study.n_trials 3: the study ends at 2 COMPLETE with exit 0, and its record says
    so: the parent MLflow run FINISHED (not KILLED), in an MLflow experiment of its own named after the
    study (the YAML's name its tag), trial runs named "#<number> <configuration>". The report written at
    the end of the run leaves a best_config.yaml that `spectune run` runs as it is (a study of its own), and
    `spectune export` of this CPU, float32, gloo study opens with the line that its figures do not transfer."""
    import yaml

    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        parallel={"tp": 1, "cpus_per_worker": 0.1},
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 2]}}},
        study={"n_trials": 3, "sampler": "random", "seed": 0, "pruner": "none", "baseline_repeats": 2},
    )
    home = tmp_path / "home"
    r = run_here(capsys, ["run", str(exp), "--set", "study.name=tiny-through"], home)
    out = summary(r)
    assert out["complete"] == 2 and out["space_exhausted"], r.stderr[-3000:]
    tracking = f"sqlite:///{home / 'mlflow.db'}"
    parents, runs = mlflow_runs(tracking, "tiny-through")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking)
    assert client.get_experiment_by_name("tiny-through").tags["spectune.name"] == "tiny-study"
    assert client.get_experiment_by_name("tiny-study") is None  # the YAML's name is a tag, not a second experiment
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-through")
    for run in runs:
        number = int(run.data.tags["spectune.trial"])
        assert run.info.run_name.split(": ")[-1].startswith(f"#{number} "), run.info.run_name
    assert {int(run.data.tags["spectune.trial"]) for run in runs} == {t.number for t in study.trials}

    best = home / "reports" / "tiny-through" / "best_config.yaml"
    pinned = yaml.safe_load(best.read_text())
    assert pinned["study"]["name"] == "tiny-through-best" and pinned["search"]["space"] == {
        "spec.num_draft_tokens": pinned["drafter"]["num_draft_tokens"]
    }
    again = run_here(capsys, ["run", str(best)], home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary(again)["complete"] == 1
    assert [t.state.name for t in optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-through-best").trials] == ["COMPLETE"]

    exported = spectune_here(capsys, "export", str(exp), "--set", "study.name=tiny-through", "--to", "vllm", home=home)
    assert exported.returncode == 0, exported.stderr
    first = exported.stdout.splitlines()[0]
    assert first.startswith("# CAUTION: these measurements do not transfer to a GPU server: measured on CPU"), first
    assert "float32" in first and "gloo" in first
    # the report's speedup and noise band are the run's and the export's
    report = json.loads((home / "reports" / "tiny-through" / "summary.json").read_text())
    winner = out["ranking"]["configs"][0]
    as_json = json.loads(spectune_here(capsys, "export", str(exp), "--set", "study.name=tiny-through", "--to", "json", home=home).stdout)
    row = as_json["schedule"][0]
    assert report["best_speedup_vs_plain"] == row["speedup_vs_plain"] == round(winner["speedup_vs_baseline"], 3)
    assert report["best_noise_band_tok_s"] == row["noise_band_tok_s"]
