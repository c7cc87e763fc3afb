"""The per-batch-size schedule (orchestrator/export/schedule.py) and the report's batch section
(orchestrator/explain/report/batches.py) on an Optuna study built from recorded trials: the best
configuration per batch size (configurations pooled), speedups over plain decoding at the same
size, where speculation stops paying and where the best backend changes, with its message size."""

from __future__ import annotations

import math

import optuna
import pytest

from orchestrator.explain.report.batches import batch_html, batch_sentences, batch_summary, message_bytes
from orchestrator.export.schedule import build_schedule


def _trial(k: int, backend: str, b1: list[float], b4: float, b16: float, nccl: dict | None = None):
    params = {"parallel.tp": 2, "comm.backend": backend, "spec.num_draft_tokens": k, "drafter.kind": "ngram" if k else "none"}
    if k:
        params["drafter.ngram_max"] = 3
    params.update({f"nccl.{n}": v for n, v in (nccl or {}).items()})
    attrs = {
        "spectune.params": params,
        "spectune.repeat_tok_s": b1,
        "throughput_tok_s_b4": b4,
        "throughput_tok_s_b16": b16,
    }
    return optuna.trial.create_trial(value=sum(b1) / len(b1), user_attrs=attrs)


def _study():
    study = optuna.create_study(direction="maximize")
    for t in (
        _trial(0, "nccl", [100, 102, 98], 380, 1400),
        _trial(4, "symm_mem_ll", [210, 214], 600, 1300),  # wins at 1 and 4, loses to plain at 16
        _trial(4, "symm_mem_ll", [208], 640, 1280),  # the same configuration again: pooled
        _trial(2, "nccl", [180], 560, 1350, {"NCCL_ALGO": "Ring"}),
    ):
        study.add_trial(t)
    return study


def test_the_schedule_pools_configurations_and_names_the_best_per_batch_size():
    s = build_schedule(_study(), model="m", dtype="bfloat16")
    rows = {r["batch_size"]: r for r in s["schedule"]}
    assert sorted(rows) == [1, 4, 16]
    assert rows[1]["num_draft_tokens"] == 4 and rows[1]["throughput_tok_s"] == 210.0  # median of 210, 214, 208
    assert rows[1]["trials"] == [1, 2]
    assert rows[4]["throughput_tok_s"] == 620.0 and rows[4]["speedup_vs_plain"] == pytest.approx(620 / 380, abs=1e-3)
    assert rows[16]["num_draft_tokens"] == 0 and rows[16]["drafter"] == "none" and rows[16]["speedup_vs_plain"] == 1.0
    assert rows[1]["drafter_options"] == {"ngram_max": 3, "ngram_min": 1} and rows[1]["backend"] == "symm_mem_ll"
    # noise: the two configurations measured at least twice (1.4826 x the median relative deviation)
    assert s["noise_rel"] is not None and rows[1]["noise_band_tok_s"] == pytest.approx(s["noise_rel"] * 210, abs=0.01)


def test_the_batch_section_says_where_speculation_stops_paying_and_the_backend_changes():
    s = batch_summary(_study(), hidden=4096, dtype="bfloat16")
    assert s["speculation_stops_paying_at"] == 16
    assert s["backend_changes"] == [
        {"from_batch": 4, "to_batch": 16, "from": "symm_mem_ll", "to": "nccl", "message_bytes": 16 * 1 * 4096 * 2}
    ]
    text = " ".join(batch_sentences(s))
    assert "stops paying at batch size 16" in text and "from symm_mem_ll at batch 4 to nccl at batch 16 (allreduce message 128 KiB" in text
    page = batch_html(s)
    assert page.count("<tr>") == 4 and "plain decoding" in page


def test_message_size_of_a_verify_pass():
    assert message_bytes(4, 4, 8192, "bfloat16") == 4 * 5 * 8192 * 2
    assert message_bytes(1, 0, 576, "float32") == 576 * 4


def test_a_batch_one_study_has_no_batch_section():
    study = optuna.create_study(direction="maximize")
    study.add_trial(
        optuna.trial.create_trial(value=1.0, user_attrs={"spectune.params": {"spec.num_draft_tokens": 0}, "spectune.repeat_tok_s": [1.0]})
    )
    assert batch_summary(study, hidden=64, dtype="float32") is None
    assert math.isclose(build_schedule(study)["schedule"][0]["throughput_tok_s"], 1.0)


def test_inherited_nccl_variables_and_imposed_acceptance_are_not_exported_as_choices():
    """NCCL_* from the driver's shell are that machine's environment, not the study's choice; a study
    that imposed its accepted length says so above any engine command it exports."""
    from orchestrator.export.formats import render

    study = optuna.create_study(direction="maximize")
    t = _trial(4, "nccl", [200.0], 500, 900, {"NCCL_ALGO": "Ring", "NCCL_P2P_DISABLE": "1"})
    t.user_attrs["spectune.nccl_inherited"] = ["NCCL_P2P_DISABLE"]
    t.user_attrs["spectune.params"]["workload.simulate_accept_len"] = 3.0
    study.add_trial(t)
    s = build_schedule(study, model="m", dtype="bfloat16")
    row = s["schedule"][0]
    assert row["nccl_env"] == {"NCCL_ALGO": "Ring"} and row["inherited_nccl_env"] == {"NCCL_P2P_DISABLE": "1"}
    assert s["simulated_accept_len"] == 3.0
    for fmt in ("vllm", "sglang", "env"):
        text = render(s, fmt)
        assert "# WARNING: this study imposed an accepted length of 3.0" in text
        settings = [line for line in text.splitlines() if not line.startswith("#")]
        assert any("NCCL_ALGO=Ring" in line for line in settings)
        assert not any("NCCL_P2P_DISABLE" in line for line in settings)
        assert "# left out: NCCL variables the study's driver inherited from its shell (NCCL_P2P_DISABLE=1)" in text


def test_a_lead_within_noise_is_no_pay():
    from orchestrator.export.schedule import speculation_stops_paying

    rows = [
        {"batch_size": 1, "num_draft_tokens": 4, "speedup_vs_plain": 1.40},
        {"batch_size": 4, "num_draft_tokens": 2, "speedup_vs_plain": 1.02},  # 2% ahead, one measurement each, noise 1%
        {"batch_size": 16, "num_draft_tokens": 0, "speedup_vs_plain": 1.0},
    ]
    assert speculation_stops_paying(rows, noise_rel=0.01) == 4  # 0.02 < 2 x 0.01 x sqrt(1.02^2 + 1) = 0.0286
    assert speculation_stops_paying(rows, noise_rel=0.001) == 16
    assert speculation_stops_paying(rows[:2], noise_rel=None) is None
    # more measurements behind both medians narrow the band: the same 2% lead is clear with 8 each
    rows[1].update(samples=8, plain_samples=8)
    assert speculation_stops_paying(rows, noise_rel=0.01) == 16  # 0.02 > 2 x 0.01 x sqrt((1.02^2 + 1) / 8) = 0.0101


def test_the_schedule_reports_the_decode_rate_beside_the_throughput_it_ranks_by():
    """Each batch size's winner is picked by throughput (prefill included), even where another
    configuration decodes faster; its decode rate, plain decoding's and their ratio come along, and
    the report and the exports say which of the two ranks."""
    from orchestrator.export.formats import render

    study = optuna.create_study(direction="maximize")
    for k, b1, dec1, b4, dec4 in (
        (0, [100, 101], 120, 380, 500),
        (4, [210, 212], 300, 600, 900),  # the most throughput: the winner
        (2, [190], 400, 560, 1200),  # decodes faster, but its prefill costs more: not the winner
    ):
        t = _trial(k, "nccl", b1, b4, 1000)
        t.user_attrs.update({"decode_tok_s": dec1, "decode_tok_s_b4": dec4})
        study.add_trial(t)
    s = build_schedule(study, model="m", dtype="bfloat16")
    assert s["ranked_by"] == "throughput_tok_s"
    rows = {r["batch_size"]: r for r in s["schedule"]}
    assert rows[1]["num_draft_tokens"] == 4 and rows[4]["num_draft_tokens"] == 4
    assert rows[1]["decode_tok_s"] == 300 and rows[1]["plain_decode_tok_s"] == 120 and rows[1]["decode_speedup_vs_plain"] == 2.5
    assert rows[4]["decode_tok_s"] == 900 and rows[4]["plain_decode_tok_s"] == 500 and rows[4]["decode_speedup_vs_plain"] == 1.8
    assert rows[16]["decode_tok_s"] is None and rows[16]["decode_speedup_vs_plain"] is None  # not logged at 16: no figure
    summary = batch_summary(study, hidden=4096, dtype="bfloat16")
    text = " ".join(batch_sentences(summary))
    assert "ranks configurations by throughput" in text and "prefill" in text and "decode speedup" in text
    page = batch_html(summary)
    assert "<th>decode tok/s</th>" in page and "<td>900.00</td>" in page and "<td>1.80x</td>" in page
    assert "batch size 4: ngram k=4" in render(s, "vllm") and "decode 900.0 tok/s (1.80x plain)" in render(s, "vllm")


def test_decode_logs_throughput_and_decode_rate():
    """`spectune decode`'s lines name both rates of a run (a run without decode steps: throughput alone)."""
    from orchestrator.decode.run import rates

    assert rates({"throughput_tok_s": 19.64, "decode_tok_s": 27.12}) == "19.6 tok/s (decode 27.1 tok/s)"
    assert rates({"throughput_tok_s": 5.0}) == "5.0 tok/s"


def test_an_emulated_study_is_labelled_and_exported_as_the_tp_it_emulates():
    """parallel.emulate_tp 8 (one process, parallel.tp 1): the schedule's TP is 8, it says how its figures
    were made, every format but JSON opens with that line, and the trials' labels read "tp8 emulated"."""
    from orchestrator.export.formats import render
    from orchestrator.tracking.runs import config_label

    emulated = {
        "parallel.emulated": True,
        "parallel.emulate_tp": 8,
        "parallel.allreduce_table": "seeds-tp8-pcie",
        "parallel.allreduce_table_sha256": "ab" * 32,
        "parallel.emulated_acceptance": "simulated: accepted length 2.5 (workload.simulate_accept_len)",
    }
    study = optuna.create_study(direction="maximize")
    for k, values in ((0, [10.0, 10.5, 9.5]), (4, [14.0, 14.2])):
        params = {"parallel.tp": 1, "comm.backend": "nccl", "spec.num_draft_tokens": k, "drafter.kind": "ngram" if k else "none"}
        attrs = {"spectune.params": {**params, **emulated}, "spectune.repeat_tok_s": values}
        study.add_trial(optuna.trial.create_trial(value=sum(values) / len(values), user_attrs=attrs))
    s = build_schedule(study, model="m", dtype="bfloat16", device="cuda")
    assert [r["tp"] for r in s["schedule"]] == [8] and s["schedule"][0]["num_draft_tokens"] == 4
    assert s["emulated"].startswith("emulated TP 8 from table seeds-tp8-pcie (sha256 abababababab)")
    for fmt in ("vllm", "sglang", "env"):
        first = render(s, fmt).splitlines()[0]
        assert first.startswith("# EMULATED: emulated TP 8 from table seeds-tp8-pcie"), (fmt, first)
    assert "tensor-parallel-size 8" in render(s, "vllm") or "--tensor-parallel-size=8" in render(s, "vllm")
    assert config_label({"parallel.tp": 1, "comm.backend": "nccl", "spec.num_draft_tokens": 0, **emulated}) == "plain nccl tp8 emulated"
    assert config_label({"parallel.tp": 2, "comm.backend": "nccl", "spec.num_draft_tokens": 0}) == "plain nccl tp2"
    real = build_schedule(_study(), model="m", dtype="bfloat16")
    assert real["emulated"] is None and not render(real, "vllm").startswith("# EMULATED")


def test_each_batch_size_names_the_best_configuration_per_backend():
    """best_by_backend: at each batch size, the best configuration measured on each allreduce backend at the
    winner's TP (what an engine without the winner's backend is left with: orchestrator/export/allreduce.py)."""
    rows = {r["batch_size"]: r for r in build_schedule(_study())["schedule"]}
    assert rows[1]["best_by_backend"] == {
        "nccl": {"throughput_tok_s": 180.0, "trial": 3, "num_draft_tokens": 2, "drafter": "ngram"},  # beats plain's median 100
        "symm_mem_ll": {"throughput_tok_s": 210.0, "trial": 1, "num_draft_tokens": 4, "drafter": "ngram"},
    }
    assert rows[4]["best_by_backend"]["nccl"] == {"throughput_tok_s": 560.0, "trial": 3, "num_draft_tokens": 2, "drafter": "ngram"}
    assert rows[4]["best_by_backend"]["symm_mem_ll"]["throughput_tok_s"] == 620.0  # the two trials of one configuration pooled
    assert rows[16]["best_by_backend"]["nccl"] == {"throughput_tok_s": 1400.0, "trial": 0, "num_draft_tokens": 0, "drafter": "none"}
    # the winner's own backend entry is the winner itself
    for r in rows.values():
        assert r["best_by_backend"][r["backend"]]["throughput_tok_s"] == r["throughput_tok_s"]


def test_best_by_backend_keeps_to_the_winners_tp_size():
    """A faster configuration at another TP size is no option for an engine serving the winner's TP."""
    study = _study()
    params = {"parallel.tp": 4, "comm.backend": "nccl", "spec.num_draft_tokens": 4, "drafter.kind": "ngram", "drafter.ngram_max": 3}
    study.add_trial(optuna.trial.create_trial(value=200.0, user_attrs={"spectune.params": params, "spectune.repeat_tok_s": [205.0]}))
    row = build_schedule(study)["schedule"][0]
    assert row["tp"] == 2 and row["best_by_backend"]["nccl"]["trial"] == 3


def test_the_winners_draft_and_verify_times_are_its_trials_medians_at_batch_one():
    """draft_ms_p50 / verify_ms_p50: the median over the winning configuration's trials at batch 1 (the ratio
    an adaptive-k controller is profiled with); the batched runs log neither, so larger sizes carry None."""
    study = optuna.create_study(direction="maximize")
    for value, draft, verify in ((210.0, 0.5, 6.0), (214.0, 0.7, 6.4), (212.0, 0.9, 7.0)):
        params = {"parallel.tp": 2, "comm.backend": "nccl", "spec.num_draft_tokens": 4, "drafter.kind": "ngram"}
        attrs = {"spectune.params": params, "spectune.repeat_tok_s": [value], "throughput_tok_s_b4": 600.0}
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={**attrs, "draft_ms_p50": draft, "verify_ms_p50": verify}))
    rows = build_schedule(study)["schedule"]
    assert (rows[0]["draft_ms_p50"], rows[0]["verify_ms_p50"]) == (0.7, 6.4)
    assert rows[1]["batch_size"] == 4 and rows[1]["draft_ms_p50"] is None and rows[1]["verify_ms_p50"] is None
    assert build_schedule(_study())["schedule"][0]["draft_ms_p50"] is None  # trials that did not record them
