"""`spectune decode --emulate-tp N --allreduce-table T` as a user runs it: one process holds rank 0's
shard of TP 2 and waits the table's latency per allreduce; the JSON says the figures are emulated
and from which table, names the acceptance it used and compares no output with a baseline. Bad
input is one line and exit 2. A whole study on an emulated TP 4 (embedded Ray, SQLite, local MLflow):
its report and export say emulated and name the table, and its steps are split into allreduce waits
and the rest. The decode, the study, its report and export run spectune's `main` in the test's process
(studyutil.spectune_here and run_here: the same flags and output, no interpreter and imports per
command; the study's Ray and actors are processes either way); the refusals are `spectune` processes."""

from __future__ import annotations

import json

import pytest
from studyutil import run_cli as spectune
from studyutil import run_here, spectune_here

LATENCY_US = 300.0


def _table(path, sizes, backend="gloo", tp=2):
    rows = [{"backend": backend, "tp": tp, "mode": "eager", "env": "default", "size_bytes": s, "time_us": LATENCY_US} for s in sizes]
    path.write_text(json.dumps(rows))
    return str(path)


def test_emulated_decode_json(tiny_ckpt, tmp_path, capsys):
    # a table of nccl alone: without --backend the decode takes the table's one backend (not the default gloo)
    table = _table(tmp_path / "cpu-tp2.json", [1 << p for p in range(6, 22)], backend="nccl")
    r = spectune_here(
        capsys,
        "decode",
        "--model",
        str(tiny_ckpt),
        "--emulate-tp",
        "2",
        "--allreduce-table",
        table,
        "--drafter",
        "ngram",
        "-k",
        "3",
        "--simulate-accept-profile",  # P(accepted >= i), as a real run's accept_rate_pos_i: k = 3 keeps 0.8 + 0.4 + 0
        "0.8,0.4",
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "16",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["emulated"].startswith("emulated TP 2 from table cpu-tp2 (sha256 ")
    assert "emulated TP 2 from table cpu-tp2" in r.stderr  # the console says so too
    p = out["params"]
    assert p["parallel.emulated"] is True and p["parallel.emulate_tp"] == 2 and p["parallel.tp"] == 1 and p["comm.backend"] == "nccl"
    assert p["parallel.allreduce_table"] == "cpu-tp2" and len(p["parallel.allreduce_table_sha256"]) == 64
    assert "simulated" in p["parallel.emulated_acceptance"] and out["acceptance"] == p["parallel.emulated_acceptance"]
    assert "P(accepted >= i) 0.8, 0.4 (workload.simulate_accept_profile)" in out["acceptance"]
    assert out["accept_len_mean"] == pytest.approx(2.2, abs=0.2)
    assert "outputs_match_baseline" not in out  # an emulated rank's tokens are not the model's
    assert out["allreduce_per_step"] == 4  # 2 layers x (attention + MLP)
    assert out["comm_ms_counted"] >= 0.99 * 4 * LATENCY_US / 1e3
    assert out["rank_peak_rss_mb"] and len(out["rank_peak_rss_mb"]) == 1


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--allreduce-table", "no-such-preset"], "--allreduce-table: 'no-such-preset' is neither a preset"),
        (["--allreduce-table", "NARROW"], "--allreduce-table: a message of 256 B is outside table 'narrow'"),
        (["--allreduce-table", "NARROW", "--tp", "2"], "--emulate-tp: emulates TP 2 in one process: --tp must be 1, not 2"),
    ],
)
def test_bad_emulation_input_is_one_line_exit_2(tiny_ckpt, tmp_path, extra, message):
    narrow = _table(tmp_path / "narrow.json", [4096, 8192])
    extra = [narrow if a == "NARROW" else a for a in extra]
    r = spectune("decode", "--model", str(tiny_ckpt), "--emulate-tp", "2", "-k", "0", "--num-prompts", "1", *extra, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"spectune: error: {message}"), r.stderr


def test_a_study_on_emulated_tp4_says_so_in_its_report_and_export(tiny_ckpt, tmp_path, capsys):
    """Issue 46's CPU check: a study on an emulated TP 4 (embedded Ray, SQLite, local MLflow) exits 0; its
    report and its export say "emulated" and name the table; the plain trial's step is split into its
    allreduce waits and the rest (comm_fraction), as a real TP 4 trial's is. Acceptance is imposed per
    drafter kind, one from a real run's JSON: each drafting trial keeps its own kind's drafts."""
    from studyutil import optuna_study, summary, tiny_experiment

    table = _table(tmp_path / "cpu-tp4.json", [1 << p for p in range(6, 22)], tp=4)
    measured = tmp_path / "ngram-run.json"  # a `spectune decode --json` output: its accept_rate_pos_i
    measured.write_text(json.dumps({"throughput_tok_s": 1.0, "accept_rate_pos_1": 0.8, "accept_rate_pos_2": 0.5}))
    exp = tiny_experiment(
        tmp_path,
        tiny_ckpt,
        parallel={"tp": 1, "emulate_tp": 4, "allreduce_table": table, "cpus_per_worker": 0.1},
        workload={
            "prompts": "bundled",
            "num_prompts": 1,
            "max_new_tokens": 12,
            "simulate_accept_profile": {"ngram": str(measured), "layer_skip": [0.5, 0.0]},
        },
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 2]}, "drafter.kind": {"choices": ["ngram", "layer_skip"]}}},
        study={"n_trials": 3, "sampler": "grid", "seed": 0, "pruner": "none", "baseline_repeats": 2},
    )
    home = tmp_path / "home"
    r = run_here(capsys, ["run", str(exp)], home)
    out = summary(r)
    assert out["complete"] == 3, r.stderr[-2000:]
    assert "emulated TP 4 from table cpu-tp4" in r.stderr
    progress = [line for line in r.stderr.splitlines() if ": prompt 1 of 1" in line]  # the live lines name the deployment
    assert progress and all(" tp4 emulated: " in line for line in progress), progress
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study")
    plain = next(t for t in study.trials if t.params["spec.num_draft_tokens"] == 0)
    # 4 allreduces a step (2 layers x 2) of 300 us each, beside a tiny model's compute on CPU
    assert plain.user_attrs["allreduce_per_step"] == 4
    assert 0.05 < plain.user_attrs["comm_fraction"] < 1.0, plain.user_attrs
    # k = 2 keeps 0.8 + 0.5 drafts a step on average under n-gram's profile, 0.5 under layer_skip's
    accepted = {t.params["drafter.kind"]: t.user_attrs["accept_len_mean"] for t in study.trials if t.params["spec.num_draft_tokens"]}
    assert accepted["ngram"] == pytest.approx(2.3, abs=0.15) and accepted["layer_skip"] == pytest.approx(1.5, abs=0.15), accepted
    report = spectune_here(capsys, "report", str(exp), "--out", str(tmp_path / "report"), home=home)
    assert report.returncode == 0, report.stderr
    assert "emulated TP 4 from table cpu-tp4" in (tmp_path / "report" / "report.html").read_text()
    export = spectune_here(capsys, "export", str(exp), "--to", "vllm", home=home)
    assert export.returncode == 0, export.stderr
    header = [line for line in export.stdout.splitlines() if line.startswith("#")]
    assert any(line.startswith("# EMULATED: emulated TP 4 from table cpu-tp4") for line in header), export.stdout[:600]
    assert any("layer_skip 0.5,0.0; ngram 0.8,0.5" in line for line in header), header  # the imposed acceptance, per kind
