"""The MLflow record as its users read it, on a real (SQLite) MLflow store: the experiment marked for
MLflow 3's training-runs view, one experiment per study, runs named by trial number and configuration,
PRUNED / FAIL trials with their own status and reason tag, the parent run FINISHED when the study
ended as it should (its space measured through included), the experiment's settings among the params,
metrics to 4 significant digits. And the console's live line, on a pipe and on a real pseudo-terminal."""

from __future__ import annotations

import io
import os

from orchestrator.config.schema import load_config
from orchestrator.record import FAIL_TAG, PRUNE_TAG, RETRY_TAG
from orchestrator.tracking.progress import LiveLine
from orchestrator.tracking.runs import KIND_TAG, Tracker, config_label, experiment_params, rounded

SPACE = {"spec.num_draft_tokens": {"choices": [0, 6]}}


def _cfg(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(
        "name: tags\nmodel: {path: smollm2-135m}\nparallel: {tp: 2}\nworkload: {num_prompts: 3, max_new_tokens: 16}\n"
        "search: {space: {spec.num_draft_tokens: {choices: [0, 6]}}}\n"
    )
    return load_config(str(path), [])


def test_config_label_names_the_configuration():
    assert (
        config_label({"spec.num_draft_tokens": 6, "drafter.kind": "ngram", "comm.backend": "gloo", "parallel.tp": 2})
        == "ngram k=6 gloo tp2"
    )
    assert (
        config_label(
            {"spec.num_draft_tokens": 0, "drafter.kind": "ngram", "comm.backend": "nccl", "parallel.tp": 8, "nccl.NCCL_PROTO": "LL"}
        )
        == "plain nccl PROTO=LL tp8"
    )
    assert (
        config_label(
            {"spec.num_draft_tokens": 2, "drafter.kind": "layer_skip", "drafter.layers": 8, "comm.backend": "gloo", "parallel.tp": 2}
        )
        == "layer_skip L=8 k=2 gloo tp2"
    )
    eagle3 = {"spec.num_draft_tokens": 4, "drafter.kind": "eagle3", "comm.backend": "gloo", "parallel.tp": 2}
    assert config_label({**eagle3, "drafter.placement": "actor", "drafter.lookup": 0}) == "eagle3 actor k=4 gloo tp2"
    assert config_label({**eagle3, "drafter.placement": "rank0", "drafter.lookup": 2}) == "eagle3 rank0 lookup=2 k=4 gloo tp2"
    assert config_label({**eagle3, "drafter.placement": "rank0", "drafter.tree_width": 3}) == "eagle3 rank0 tree=3 k=4 gloo tp2"
    assert config_label({**eagle3, "drafter.placement": "rank0", "drafter.tree_width": 1}) == "eagle3 rank0 k=4 gloo tp2"  # a chain
    both = {**eagle3, "drafter.placement": "actor", "drafter.lookup": 2, "drafter.tree_width": 4}
    assert config_label(both) == "eagle3 actor lookup=2 tree=4 k=4 gloo tp2"


def test_rounded_keeps_four_significant_digits():
    assert rounded(3.14159265) == 3.142 and rounded(0.000123456) == 0.0001235 and rounded(12345.678) == 12350.0
    assert rounded(7.0) == 7.0 and rounded(0.0) == 0.0


def test_mlflow_runs_as_users_read_them(tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = _cfg(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "tags-exp", "tags", tmp_path, base_params=experiment_params(cfg))
    client = MlflowClient(tracking_uri=uri)
    assert client.get_experiment(tracker.experiment_id).tags[KIND_TAG] == "custom_model_development"
    trial = {"spec.num_draft_tokens": 6, "drafter.kind": "ngram", "comm.backend": "gloo", "parallel.tp": 2}
    runs = {}
    for number, state, reason in ((0, "COMPLETE", None), (1, "PRUNED", "below the 25th percentile"), (2, "FAIL", "GangError: rank 1 died")):
        run_id = tracker.start_trial(number, trial, {RETRY_TAG: "0"} if number == 2 else None)
        tracker.log_metrics(run_id, {"throughput_tok_s": 3.14159265, "step_ms_p50": 123.456789, "tokens_generated": 48.0})
        tracker.finish_trial(run_id, state, reason)
        runs[number] = client.get_run(run_id)
    for number, run in runs.items():
        # a pruned and a failed run are told apart by name in MLflow's run list (one icon for both)
        mark = {0: "", 1: "pruned: ", 2: "failed: "}[number]
        assert run.info.run_name == f"{mark}#{number} ngram k=6 gloo tp2" and run.data.tags["spectune.trial"] == str(number)
        p = run.data.params
        assert p["model.path"] == "smollm2-135m" and p["model.dtype"] == "float32" and p["parallel.tp"] == "2"
        assert p["workload.num_prompts"] == "3" and p["workload.max_new_tokens"] == "16" and p["workload.prompts"] == "bundled"
        assert p["spec.num_draft_tokens"] == "6" and p["drafter.kind"] == "ngram"
        assert run.data.metrics == {"throughput_tok_s": 3.142, "step_ms_p50": 123.5, "tokens_generated": 48.0}
    assert (runs[0].info.status, runs[0].data.tags["spectune.state"]) == ("FINISHED", "COMPLETE")
    assert (runs[1].info.status, runs[1].data.tags["spectune.state"]) == ("KILLED", "PRUNED")
    assert runs[1].data.tags[PRUNE_TAG] == "below the 25th percentile" and FAIL_TAG not in runs[1].data.tags
    assert (runs[2].info.status, runs[2].data.tags["spectune.state"]) == ("FAILED", "FAIL")
    assert runs[2].data.tags[FAIL_TAG] == "GangError: rank 1 died" and runs[2].data.tags[RETRY_TAG] == "0"
    parent = client.get_run(tracker.parent_run_id)
    assert parent.data.params["model.path"] == "smollm2-135m" and parent.data.tags["spectune.role"] == "study"
    # a second driver of the same study finds the same parent and leaves the experiment's kind alone
    again = Tracker(uri, "tags-exp", "tags", tmp_path, base_params=experiment_params(cfg))
    assert again.parent_run_id == tracker.parent_run_id


def test_one_experiment_per_study_named_after_it_with_the_yaml_name_as_a_tag(tmp_path):
    import optuna
    from mlflow.tracking import MlflowClient

    _cfg(tmp_path)  # writes exp.yaml (name: tags)
    cfg = load_config(str(tmp_path / "exp.yaml"), ["study.name=tags-k6"])
    assert (cfg.name, cfg.study_name, cfg.experiment_name) == ("tags", "tags-k6", "tags-k6")
    assert load_config(str(tmp_path / "exp.yaml"), []).experiment_name == "tags"  # study.name left out: the YAML's name
    assert load_config(str(tmp_path / "exp.yaml"), ["tracking.experiment=shared"]).experiment_name == "shared"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    studies = {}
    for study_name in ("tags-k6", "tags-k2"):  # two studies of one YAML: two experiments
        study = optuna.create_study(study_name=study_name)
        tracker = Tracker(uri, study_name, study_name, tmp_path, study=study, name="tags")
        exp = client.get_experiment(tracker.experiment_id)
        assert exp.name == study_name and exp.tags["spectune.name"] == "tags"
        assert client.get_run(tracker.parent_run_id).data.tags["spectune.name"] == "tags"
        studies[study_name] = (study, tracker)
    assert studies["tags-k6"][1].experiment_id != studies["tags-k2"][1].experiment_id
    # a study begun when studies shared an experiment (its record names its parent run there) resumes in it
    study, old = studies["tags-k2"]
    again = Tracker(uri, "tags-k2-elsewhere", "tags-k2", tmp_path, study=study, name="tags")
    assert (again.experiment_id, again.parent_run_id) == (old.experiment_id, old.parent_run_id)
    assert client.get_experiment_by_name("tags-k2-elsewhere") is None


def test_the_parent_run_ends_as_the_study_did(tmp_path):
    """FINISHED when the study ended as it should, also with fewer COMPLETE trials than study.n_trials (its
    space measured through); KILLED only when it was interrupted, FAILED when it stopped on an error."""
    import optuna
    from mlflow.tracking import MlflowClient

    from orchestrator.tracking.progress import Progress

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    for status in ("FINISHED", "KILLED", "FAILED"):
        study = optuna.create_study(study_name=f"s-{status}", direction="maximize")
        study.add_trial(optuna.trial.create_trial(value=3.0, params={}, distributions={}))
        tracker = Tracker(uri, f"s-{status}", f"s-{status}", tmp_path, study=study)
        summary = Progress(study, n_goal=5, log=lambda m: None).finish(tracker, status)
        assert summary["complete"] == 1 < summary["n_trials"]
        assert client.get_run(tracker.parent_run_id).info.status == status


def test_live_line_on_a_pipe_is_throttled():
    out = io.StringIO()
    live = LiveLine(out, every_s=3600)
    live.update(4, "ngram k=6 gloo tp2", 1, 3, 24, 8.0)
    live.update(4, "ngram k=6 gloo tp2", 2, 3, 48, 16.0)  # within every_s: not printed
    live.update(4, "ngram k=6 gloo tp2", 3, 3, 72, 18.0, repeat=1, repeats=2, force=True)
    assert out.getvalue().splitlines() == [
        "  trial 4 ngram k=6 gloo tp2: prompt 1 of 3, 24 tokens over prompt 1, 3.00 tok/s",
        "  trial 4 ngram k=6 gloo tp2: prompt 3 of 3, repeat 2 of 2, 72 tokens over prompts 1-3, 4.00 tok/s",
    ]


def _drain(master: int) -> str:
    """Everything written to a pty whose other end is closed: a read returns what has arrived so far, so read to EOF."""
    chunks = []
    try:
        while chunk := os.read(master, 4096):
            chunks.append(chunk)
    except OSError:  # EIO on Linux once the slave side is closed and drained
        pass
    finally:
        os.close(master)
    return b"".join(chunks).decode()


def test_live_line_on_a_terminal_rewrites_itself():
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        live = LiveLine(tty, tty_every_s=0)
        assert live.tty
        live.update(1, "plain gloo tp2", 1, 2, 10, 2.0)
        live.update(1, "plain gloo tp2", 2, 2, 20, 4.0)
        live.done()
    text = _drain(master)
    assert text.count("\r\x1b[K") == 3 and "\n" not in text.replace("\r\n", "")  # one line, rewritten, then cleared
    assert "prompt 2 of 2, 20 tokens over prompts 1-2, 5.00 tok/s" in text


def test_experiment_params_hold_model_and_workload(tmp_path):
    p = experiment_params(_cfg(tmp_path))
    assert {
        "model.path",
        "model.dtype",
        "parallel.tp",
        "parallel.device",
        "comm.backend",
        "workload.prompts",
        "workload.num_prompts",
        "workload.max_new_tokens",
        "workload.repeats",
    } <= set(p)


def test_the_last_line_says_why_a_finished_space_has_fewer_complete_trials_than_asked():
    from orchestrator.cli import verdict_line

    ranking = {"verdict": "trial 1 (3.99 tok/s, n=1) and trial 0 tie within noise"}
    short = verdict_line({"complete": 3, "n_trials": 5, "space_exhausted": True, "space_size": 4, "ranking": ranking})
    # tried, not "pruned as slower or failed": a space of fewer configurations than n_trials ends with none pruned
    assert short == f"spectune: 3/5 trials complete (all 4 configurations of the search space were tried); {ranking['verdict']}"
    assert verdict_line({"complete": 5, "n_trials": 5, "ranking": ranking}) == f"spectune: 5/5 trials complete; {ranking['verdict']}"
    assert verdict_line({"complete": 0, "n_trials": 5}) == "spectune: 0/5 trials complete; no COMPLETE trial"
