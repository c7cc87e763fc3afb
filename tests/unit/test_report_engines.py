"""The report's serving-engine section (orchestrator/explain/report/engines.py): the winner's allreduce
in vLLM, SGLang and TensorRT-LLM, and where an engine has no equivalent, the best configuration the
study measured on a backend it has against the winner; on recorded Optuna trials, then through
build_report (summary, terminal text, page).

    .venv/bin/python -m pytest -q tests/unit/test_report_engines.py
"""

from __future__ import annotations

import optuna
import pytest

from orchestrator.explain.report.engines import engine_html, engine_sentences, engine_summary
from orchestrator.export.schedule import build_schedule
from orchestrator.record import PARAMS_ATTR, SAMPLES_ATTR


def _trial(k: int, backend: str, samples: list[float], step_ms: float = 200.0):
    params = {"parallel.tp": 2, "comm.backend": backend, "spec.num_draft_tokens": k, "drafter.kind": "ngram" if k else "none"}
    attrs = {
        PARAMS_ATTR: params,
        SAMPLES_ATTR: samples,
        "accept_len_mean": 1.8 if k else 1.0,
        "step_ms_p50": step_ms,
        "verify_ms_p50": step_ms * 0.9,
        "draft_ms_p50": step_ms * 0.05 if k else 0.0,
        "comm_fraction": 0.4,
        "comm_ms_per_step": step_ms * 0.4,
        "repeats": len(samples),
    }
    return optuna.trial.create_trial(value=sorted(samples)[len(samples) // 2], user_attrs=attrs)


def _study(*trials):
    study = optuna.create_study(direction="maximize")
    for t in trials:
        study.add_trial(t)
    return study


def _ll_wins():
    """symm_mem_ll wins (median 21.0); the best on NCCL is k 2 at 18.0 (trial 2): 0.857 of the win."""
    return _study(
        _trial(0, "nccl", [10.0, 10.2, 9.8]),
        _trial(4, "symm_mem_ll", [21.0, 21.4, 20.6]),
        _trial(2, "nccl", [18.0, 18.2, 17.8]),
    )


def test_an_engine_without_the_winners_allreduce_says_what_that_costs():
    s = engine_summary(build_schedule(_ll_wins()))
    assert set(s) == {"vllm", "sglang", "trtllm"}
    for e in s.values():
        assert e["backend"] == "symm_mem_ll" and not e["equivalent"] and e["has"] == ["nccl"]
        (cost,) = e["costs"]
        assert (cost["winner_tok_s"], cost["fallback_tok_s"], cost["fallback_trial"]) == (21.0, 18.0, 2)
        assert cost["ratio"] == pytest.approx(18.0 / 21.0, abs=1e-4)
    assert s["trtllm"]["setting"] == "allreduce_strategy ONESHOT" and s["vllm"]["setting"] == "custom allreduce"
    (sentence,) = engine_sentences(s)
    assert sentence.startswith("The winner's allreduce, symm_mem_ll, has no equivalent in vLLM (nearest: custom allreduce), ")
    assert "TensorRT-LLM (nearest: allreduce_strategy ONESHOT); on nccl, which they have," in sentence
    assert "the best configuration measured on nccl (trial 2) reaches 18.0 of the winner's 21.0 tok/s (0.857x)" in sentence
    page = engine_html(s)
    assert 'id="engine-allreduce"' in page and page.count("<tr>") == 4 and "18.0 / 21.0 tok/s = 0.857x" in page


def test_an_nccl_winner_runs_as_it_is_and_a_gloo_study_has_no_section():
    s = engine_summary(build_schedule(_study(_trial(0, "nccl", [10.0]), _trial(4, "nccl", [20.0]), _trial(4, "symm_mem", [15.0]))))
    assert all(e["equivalent"] and e["costs"] == [] for e in s.values())
    assert engine_sentences(s) == [
        "vLLM, SGLang and TensorRT-LLM run the winner's allreduce (nccl) as it is; `spectune export` sets it for each."
    ]
    assert engine_summary(build_schedule(_study(_trial(0, "gloo", [10.0]), _trial(4, "gloo", [20.0])))) is None
    assert engine_html(None) == "" and engine_sentences(None) == []


def test_the_report_carries_the_section(tmp_path):
    from orchestrator.config.schema import ExperimentConfig
    from orchestrator.explain.report.core import build_report

    cfg = ExperimentConfig.model_validate(
        {"name": "x", "model": {"path": "random:llama-3-8b"}, "parallel": {"tp": 2},
         "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4]}}}}
    )  # fmt: skip
    text, html_path, summary = build_report(cfg, _ll_wins(), tmp_path / "report")
    assert summary["engines"]["sglang"]["costs"][0]["fallback_tok_s"] == 18.0
    assert "has no equivalent in vLLM (nearest: custom allreduce)" in text and "(0.857x)" in text
    assert 'id="engine-allreduce"' in html_path.read_text()
