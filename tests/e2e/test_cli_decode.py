"""`spectune decode` as a user runs it: a JSON object with the contract's metric names, and one
clear line with exit code 2 for every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from studyutil import CONTRACT_METRICS

from workers.model.checkpoint import tiny_config

REQUIRED = [*CONTRACT_METRICS, "accept_rate_pos_1"]  # a decode with a drafter reports its acceptance by position too


def spectune(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=timeout)


def test_decode_json_on_tiny_model(tiny_ckpt):
    r = spectune(
        "decode",
        "--model",
        str(tiny_ckpt),
        "--tp",
        "2",
        "--drafter",
        "ngram",
        "-k",
        "3",
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "24",
        "--gemv",
        "off",
        "--no-overlap",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in REQUIRED:
        assert key in out, key
    assert out["outputs_match_baseline"] == 1
    assert out["params"]["parallel.tp"] == 2 and out["params"]["drafter.kind"] == "ngram"
    # the engine flags are the trial's engine.* params (the YAML section `engine:`)
    assert out["params"]["engine.gemv"] == "off" and out["params"]["engine.overlap"] is False
    assert out["params"]["engine.attention"] == "auto" and out["params"]["spec.num_draft_tokens"] == 3
    assert out["tokens_generated"] == 2 * 24
    assert out["allreduce_per_step"] == 4 and out["comm_ms_per_step"] > 0


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
        "unknown gemv choice": ([*m, "--gemv", "fast"], "argument --gemv: invalid choice: 'fast'"),
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
    "tree at batch size 2",
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


def test_decode_as_ray_actors(tmp_path, tiny_ckpt):
    """`--ray`: the same run with the gang as actors of an embedded local Ray (as a study places
    them); the same metrics, the outputs still match the baseline, and Ray is gone afterwards."""
    import os

    from studyutil import ray_temp_dir

    from orchestrator.study.drivers import _writes_under

    ray_tmp = ray_temp_dir()
    env = {**os.environ, "SPECTUNE_RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "decode",
            "--ray",
            "--model",
            str(tiny_ckpt),
            "--tp",
            "2",
            "--drafter",
            "ngram",
            "-k",
            "3",
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "16",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["gang"] == "ray" and out["outputs_match_baseline"] == 1 and out["tokens_generated"] == 2 * 16
    assert "gang as Ray actors: embedded local ray" in r.stderr
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _writes_under(int(pid), ray_tmp)]
    assert left == []
