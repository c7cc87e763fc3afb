"""`spectune decode` as a user runs it: a JSON object with the contract's metric names, and one
clear line with exit code 2 for every kind of bad input.

The good runs (`--json` on a local TP 2 gang, and `--ray`) are in tests/e2e/test_nvls_env.py, whose
checks of every started process's environment ride on the same two decodes (each decode costs its
own gang, and with `--ray` its own Ray)."""

from __future__ import annotations

import json

import pytest
from studyutil import run_cli as spectune

from workers.model.checkpoint import tiny_config


@pytest.fixture
def bad_inputs(tmp_path, tiny_ckpt):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({**tiny_config(), "model_type": "gpt2"}))
    (gpt2 / "model.safetensors").write_bytes(b"")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"turns": ["fine"]}\n{"turns": [\n')
    no_turns = tmp_path / "no_turns.jsonl"
    no_turns.write_text('{"question": "where are the turns?"}\n')
    m = ["--model", str(tiny_ckpt)]
    return {
        "missing model": (["--model", str(tmp_path / "nope")], "does not exist"),
        "unsupported architecture": (["--model", str(gpt2)], "model_type 'gpt2' is not supported"),
        "tp the heads do not divide": ([*m, "--tp", "8"], "tp=8 does not divide the model's 4 attention heads"),
        "empty prompts": ([*m, "--prompts", str(empty)], "holds no prompts"),
        "malformed prompts": ([*m, "--prompts", str(broken)], "broken.jsonl:2 is not valid JSON"),
        "prompts without turns": ([*m, "--prompts", str(no_turns)], "needs a non-empty 'turns' list"),
        "missing prompts": ([*m, "--prompts", str(tmp_path / "none.jsonl")], "does not exist"),
        "backend that cannot run here": ([*m, "--tp", "2", "--backend", "nccl"], "nccl needs CUDA"),
        "unknown drafter": ([*m, "--drafter", "medusa"], "--drafter 'medusa' is not one of"),
        "draft model without path": ([*m, "--drafter", "draft_model"], "--draft-model: --drafter draft_model needs a checkpoint path"),
        "bad flag type": ([*m, "--tp", "two"], "invalid int value"),
        "unknown gemv choice": ([*m, "--gemv", "fast"], "--gemv 'fast' is not one of auto, cublas, triton, off"),
        "draft tokens past the limit": ([*m, "-k", "17"], "--num-draft-tokens 17 must be an integer between 0 and 16"),
        "lookup past the limit": ([*m, "--draft-lookup", "9"], "--draft-lookup 9 must be an integer between 0 and 8"),
        "tree width past the limit": ([*m, "--tree-width", "9"], "--tree-width 9 must be an integer between 0 and 8"),
        "tree at batch size 2": (
            ["--model", "smollm2-135m", "--drafter", "eagle3", "--draft-model", "smollm2-135m-eagle3", "--draft-placement", "rank0"]
            + ["--tree-width", "3", "--batch-size", "2", "--num-prompts", "2"],
            "--batch-size: batch sizes > 1 draft chains only: a tree (--tree-width >= 2) runs at batch size 1; --tree-width allows 3",
        ),
    }


CASES = [
    "missing model",
    "unsupported architecture",
    "tp the heads do not divide",
    "empty prompts",
    "malformed prompts",
    "prompts without turns",
    "missing prompts",
    "backend that cannot run here",
    "unknown drafter",
    "draft model without path",
    "bad flag type",
    "unknown gemv choice",
    "draft tokens past the limit",
    "lookup past the limit",
    "tree width past the limit",
    pytest.param("tree at batch size 2", marks=pytest.mark.slow),  # fetches the demo model before it refuses
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2(bad_inputs, case):
    args, needle = bad_inputs[case]
    r = spectune("decode", "--num-prompts", "1", "--max-new-tokens", "4", *args, timeout=120)  # a case's flags win
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("spectune: error:") and needle in lines[0], lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
