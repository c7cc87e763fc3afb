"""orchestrator/export/allreduce.py: the winner's allreduce backend in each engine's spelling (vLLM and
SGLang flags and environment, TensorRT-LLM's allreduce_strategy), and, where the engine has no
equivalent, what that costs: the best configuration the study measured on a backend the engine has
against the winner. Checked on the rendered exports (shell lines parsed with shlex, YAML with yaml) and
on schedules built from recorded Optuna trials.

    .venv/bin/python -m pytest -q tests/unit/test_export_allreduce.py
"""

from __future__ import annotations

import optuna
import pytest
import yaml
from test_export_formats import command, comments, exports, flag, schedule, winner

from orchestrator.export.allreduce import ENGINE_BACKENDS, allreduce_costs, engine_allreduce, header_lines
from orchestrator.export.formats import render
from orchestrator.export.schedule import build_schedule

ENGINES = ("vllm", "sglang", "trtllm")


def _row(batch_size: int, backend: str, tok_s: float, nccl_best: float | None, **kw) -> dict:
    row = winner(batch_size, k=4, backend=backend, throughput_tok_s=tok_s, trial=7, **kw)
    row["best_by_backend"] = {backend: {"throughput_tok_s": tok_s, "trial": 7, "num_draft_tokens": 4, "drafter": "ngram"}}
    if nccl_best is not None:
        row["best_by_backend"]["nccl"] = {"throughput_tok_s": nccl_best, "trial": 3, "num_draft_tokens": 2, "drafter": "ngram"}
    return row


# ---------------------------------------------------------------------------- the engines' settings


@pytest.mark.parametrize("engine", ENGINES)
def test_nccl_is_an_equivalent_everywhere_and_the_symmetric_memory_backends_are_not(engine):
    assert engine_allreduce(engine, "nccl").equivalent
    for backend in ("symm_mem", "symm_mem_ll", "gloo", "mscclpp"):
        assert not engine_allreduce(engine, backend).equivalent, (engine, backend)
    assert ENGINE_BACKENDS[engine] == ("nccl",)


def test_vllm_nccl_winner_turns_the_custom_and_symmetric_memory_allreduces_off():
    """vLLM tries its custom allreduce before torch symmetric memory and PyNccl last (cuda_communicator.py):
    an NCCL winner needs both off."""
    text = render(schedule(winner(backend="nccl")), "vllm")
    assert "--disable-custom-all-reduce" in command(text)
    assert exports(text)["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"
    assert "vLLM's equivalent: vLLM's PyNccl allreduce" in comments(text)


@pytest.mark.parametrize("backend", ["symm_mem", "symm_mem_ll"])
def test_vllm_symmetric_memory_winner_gets_the_custom_allreduce_and_says_why_not_torch_symm_mem(backend):
    text = render(schedule(_row(1, backend, 214.0, 180.2)), "vllm")
    assert "--disable-custom-all-reduce" not in command(text)  # the custom allreduce (on by default) is the nearest
    assert exports(text)["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"  # it needs multicast, which stays off
    assert exports(text)["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    notes = comments(text)
    assert f"the winner ran {backend}" in notes and "which vLLM has no equivalent of" in notes
    assert "nearest: vLLM's custom allreduce" in notes and "more than two PCIe-only GPUs" in notes


def test_sglang_settings():
    nccl = command(render(schedule(winner(backend="nccl")), "sglang"))
    assert "--disable-custom-all-reduce" in nccl and "--enable-torch-symm-mem" not in nccl
    text = render(schedule(_row(1, "symm_mem_ll", 214.0, 180.2)), "sglang")
    argv = command(text)
    assert "--disable-custom-all-reduce" not in argv and "--enable-torch-symm-mem" not in argv
    assert "nearest: SGLang's custom allreduce" in comments(text) and "no --enable-torch-symm-mem" in comments(text)


@pytest.mark.parametrize(("backend", "strategy"), [("nccl", "NCCL"), ("symm_mem", "ONESHOT"), ("symm_mem_ll", "ONESHOT"), ("gloo", "NCCL")])
def test_trtllm_allreduce_strategy(backend, strategy):
    options = yaml.safe_load(render(schedule(_row(1, backend, 214.0, 180.2)), "trtllm"))
    assert options["allreduce_strategy"] == strategy


def test_an_unknown_backend_gets_the_engines_nccl_setting_marked_as_no_equivalent():
    choice = engine_allreduce("trtllm", "mscclpp")
    assert choice.strategy == "NCCL" and not choice.equivalent


# ---------------------------------------------------------------------------- what a missing one costs


def test_the_cost_is_the_best_on_a_backend_the_engine_has_against_the_winner_per_batch_size():
    rows = [_row(1, "symm_mem_ll", 214.0, 180.2), _row(4, "nccl", 600.0, 600.0), _row(16, "symm_mem", 1300.0, 1250.0)]
    costs = allreduce_costs(rows, "vllm")
    assert [c.batch_size for c in costs] == [1, 16]  # batch size 4 was won on nccl: nothing lost there
    assert (costs[0].winner_tok_s, costs[0].fallback_tok_s, costs[0].fallback_trial) == (214.0, 180.2, 3)
    assert costs[0].ratio == pytest.approx(180.2 / 214.0)
    assert costs[1].ratio == pytest.approx(1250.0 / 1300.0)
    lines = "\n".join(header_lines(rows, "vllm"))
    assert "batch size 1: the best configuration on a backend vLLM has (nccl: ngram k=2, trial 3) ran 180.2 tok/s" in lines
    assert "against the winner's 214.0 on symm_mem_ll: 0.842x (-15.8%)" in lines
    assert (
        "vLLM runs one allreduce: the batch-size-1 winner's is used; batch size 4 was won on nccl; batch size 16 was won on symm_mem"
        in lines
    )


def test_a_cost_no_trial_measured_says_so():
    rows = [_row(1, "symm_mem_ll", 214.0, None)]
    (cost,) = allreduce_costs(rows, "sglang")
    assert cost.fallback_tok_s is None and cost.ratio is None
    assert "no configuration of this study ran on a backend SGLang has (nccl): the cost is unmeasured" in "\n".join(
        header_lines(rows, "sglang")
    )


def test_an_nccl_winner_costs_nothing_and_prints_no_cost_lines():
    rows = [_row(1, "nccl", 214.0, 214.0)]
    assert allreduce_costs(rows, "trtllm") == []
    assert "costs" not in "\n".join(header_lines(rows, "trtllm"))


@pytest.mark.parametrize("fmt", ENGINES)
def test_every_engine_export_of_a_recorded_study_names_the_choice_and_the_cost(fmt):
    """From recorded trials: symm_mem_ll wins batch 1 at 210 tok/s (two trials pooled); the best NCCL
    configuration reached 180 (k 2, trial 2): each engine export names its nearest choice and 0.857x."""
    study = optuna.create_study(direction="maximize")
    for k, backend, b1 in (
        (0, "nccl", [100.0, 102.0]),
        (4, "symm_mem_ll", [210.0, 214.0]),
        (2, "nccl", [180.0]),
        (4, "symm_mem_ll", [208.0]),
    ):
        params = {"parallel.tp": 2, "comm.backend": backend, "spec.num_draft_tokens": k, "drafter.kind": "ngram" if k else "none"}
        study.add_trial(optuna.trial.create_trial(value=b1[0], user_attrs={"spectune.params": params, "spectune.repeat_tok_s": b1}))
    text = render({**build_schedule(study, model="/m", dtype="bfloat16", device="cuda"), "does_not_transfer": []}, fmt)
    notes = comments(text)
    assert "the winner ran symm_mem_ll" in notes and "nearest:" in notes
    assert "(nccl: ngram k=2, trial 2) ran 180.0 tok/s against the winner's 210.0 on symm_mem_ll: 0.857x (-14.3%)" in notes
    if fmt == "trtllm":
        assert yaml.safe_load(text)["allreduce_strategy"] == "ONESHOT"
    else:
        assert flag(command(text), "--tensor-parallel-size" if fmt == "vllm" else "--tp-size") == "2"
