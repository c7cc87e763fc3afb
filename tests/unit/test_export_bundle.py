"""`spectune export EXP.yaml --to all --out DIR` (orchestrator/export/bundle.py and the CLI): every
format in one folder, each file exactly what `--to FORMAT` prints, and a README.md saying what each
file is and how to use it; bad input (no --out, --out an existing file, a study without a COMPLETE
trial) is one line and exit 2. The CLI runs in-process on a study recorded in a SQLite file.

    .venv/bin/python -m pytest -q tests/unit/test_export_bundle.py
"""

from __future__ import annotations

import json

import optuna
import pytest
import yaml
from test_export_formats import schedule, winner

from orchestrator.cli import main
from orchestrator.export.bundle import FILES, readme, write_bundle
from orchestrator.export.formats import render


def test_every_format_is_written_as_its_own_export_and_the_readme_names_each(tmp_path):
    s = schedule(winner(1, k=4, drafter="eagle3"), winner(8, k=2, drafter="eagle3"))
    paths = write_bundle(s, tmp_path / "out")
    assert [p.name for p in paths] == ["schedule.json", "vllm.sh", "sglang.sh", "trtllm.yaml", "nccl.env", "README.md"]
    for fmt, (name, _, _) in FILES.items():
        assert (tmp_path / "out" / name).read_text() == render(s, fmt), name
    assert json.loads((tmp_path / "out" / "schedule.json").read_text()) == s
    assert yaml.safe_load((tmp_path / "out" / "trtllm.yaml").read_text())["speculative_config"]["decoding_type"] == "Eagle3"
    text = (tmp_path / "out" / "README.md").read_text()
    for name in ("schedule.json", "vllm.sh", "sglang.sh", "trtllm.yaml", "nccl.env"):
        assert f"| `{name}` |" in text
    assert "`bash vllm.sh`" in text and "--extra_llm_api_options trtllm.yaml" in text and "--env-file nccl.env" in text
    assert "Read first" not in text  # nothing to warn about


def test_the_readme_repeats_the_warnings_every_file_opens_with(tmp_path):
    s = {**schedule(winner(tp=8)), "emulated": "emulated TP 8 from table pcie-8x (sha256 0123456789ab)", "simulated_accept_len": 2.5}
    text = readme(s)
    assert "Read first" in text and "# EMULATED: emulated TP 8 from table pcie-8x" in text and "imposed an accepted length of 2.5" in text
    write_bundle(s, tmp_path)
    for fmt, (name, _, _) in FILES.items():
        first = (tmp_path / name).read_text().splitlines()[0]
        assert first.startswith("# EMULATED:") or fmt == "json", (name, first)


def test_a_refused_schedule_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="NVLS"):
        write_bundle(schedule(winner(nccl_env={"NCCL_NVLS_ENABLE": "1"})), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- the CLI


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """An experiment YAML and its study in a SQLite file: one COMPLETE trial (study 'done'), and an empty
    study ('empty')."""
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    done = optuna.create_study(study_name="done", storage=url, direction="maximize")
    params = {"parallel.tp": 2, "comm.backend": "nccl", "spec.num_draft_tokens": 3, "drafter.kind": "ngram", "drafter.ngram_max": 3}
    done.add_trial(optuna.trial.create_trial(value=120.0, user_attrs={"spectune.params": params, "spectune.repeat_tok_s": [120.0]}))
    optuna.create_study(study_name="empty", storage=url, direction="maximize")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "done",
                "model": {"path": "random:llama-3-8b"},
                "parallel": {"tp": 2, "device": "cuda", "backend": "nccl"},
                "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 3]}}},
                "study": {"storage": url},
            }
        )
    )
    return exp


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_cli_writes_every_format_into_the_folder(recorded, tmp_path, capsys):
    out = tmp_path / "deploy"
    assert main(["export", str(recorded), "--to", "all", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([name for name, _, _ in FILES.values()] + ["README.md"])
    assert yaml.safe_load((out / "trtllm.yaml").read_text())["tensor_parallel_size"] == 2
    assert "random:llama-3-8b" in (out / "vllm.sh").read_text()
    assert f"written to {out}" in capsys.readouterr().err


def test_cli_bad_input_is_one_line_and_exit_2(recorded, tmp_path, capsys):
    assert main(["export", str(recorded), "--to", "all"]) == 2
    assert _one_error(capsys) == "spectune: error: --to all: needs --out DIR, the folder for every format"
    a_file = tmp_path / "taken"
    a_file.write_text("not a folder\n")
    assert main(["export", str(recorded), "--to", "all", "--out", str(a_file)]) == 2
    assert _one_error(capsys) == f"spectune: error: --out {a_file}: is a file; --to all writes a folder of files"
    assert a_file.read_text() == "not a folder\n"
    empty = tmp_path / "empty-out"
    assert main(["export", str(recorded), "--set", "name=empty", "--to", "all", "--out", str(empty)]) == 2
    assert _one_error(capsys) == "spectune: error: study 'empty' has no COMPLETE trial to export: run `spectune run` first"
    assert not empty.exists()


def test_cli_trtllm_format(recorded, capsys):
    assert main(["export", str(recorded), "--to", "trtllm"]) == 0
    options = yaml.safe_load(capsys.readouterr().out)
    assert options["allreduce_strategy"] == "NCCL" and options["speculative_config"]["decoding_type"] == "NGram"


def test_cli_on_an_emulated_tp8_study_won_by_symm_mem_ll(tmp_path, monkeypatch, capsys):
    """An emulated TP 8 study (one rank, the allreduce a table's waits) where symm_mem_ll wins at 300 tok/s
    and the best NCCL configuration reached 240: every engine file opens with `# EMULATED:`, names its
    nearest choice and the cost (0.800x); the TensorRT-LLM YAML parses to TP 8 and ONESHOT."""
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="tp8-emulated", storage=url, direction="maximize")
    emulated = {
        "parallel.tp": 1,
        "parallel.emulate_tp": 8,
        "parallel.allreduce_table": "pcie-8x-rtx-pro-6000",
        "parallel.allreduce_table_sha256": "0123456789abcdef",
        "parallel.emulated_acceptance": "imposed profile",
    }
    for k, backend, tok_s in ((0, "nccl", 150.0), (4, "symm_mem_ll", 300.0), (3, "nccl", 240.0)):
        params = {**emulated, "comm.backend": backend, "spec.num_draft_tokens": k, "drafter.kind": "ngram" if k else "none"}
        attrs = {"spectune.params": params, "spectune.repeat_tok_s": [tok_s], "draft_ms_p50": 0.1, "verify_ms_p50": 9.0}
        study.add_trial(optuna.trial.create_trial(value=tok_s, user_attrs=attrs))
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "tp8-emulated",
                "model": {"path": "random:llama-3-8b", "dtype": "bfloat16"},
                "parallel": {"tp": 2, "device": "cuda", "backend": "nccl"},
                "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 3, 4]}}},
                "study": {"storage": url},
            }
        )
    )
    out = tmp_path / "deploy"
    assert main(["export", str(exp), "--to", "all", "--out", str(out)]) == 0
    for name in ("vllm.sh", "sglang.sh", "trtllm.yaml"):
        text = (out / name).read_text()
        assert text.startswith("# EMULATED: emulated TP 8 from table pcie-8x-rtx-pro-6000"), name
        assert "the winner ran symm_mem_ll" in text and "nearest:" in text, name
        assert "(nccl: ngram k=3, trial 2) ran 240.0 tok/s against the winner's 300.0 on symm_mem_ll: 0.800x (-20.0%)" in text, name
    options = yaml.safe_load((out / "trtllm.yaml").read_text())
    assert options["tensor_parallel_size"] == 8 and options["allreduce_strategy"] == "ONESHOT"
    assert "--tensor-parallel-size 8" in (out / "vllm.sh").read_text()
    assert "# EMULATED:" in (out / "README.md").read_text()
