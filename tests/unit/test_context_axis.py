"""The context-length axis (workload.context_lengths): prompts drawn to exactly L tokens
(orchestrator/prompts/context.py), the cells a trial measures and their metric names
(orchestrator/record.py), the schedule's rows per batch size and bucket (orchestrator/export/schedule.py),
the report's context section and the engine exports' comment lines."""

from __future__ import annotations

import optuna
import pytest
from pydantic import ValidationError

from orchestrator.config.schema import WorkloadSection
from orchestrator.explain.report.contexts import context_html, context_sentences, context_summary
from orchestrator.export.common import header, sorted_rows
from orchestrator.export.schedule import batch_sizes_of, build_schedule, cells_of, contexts_of
from orchestrator.prompts.context import context_repeats, draw_to_length
from orchestrator.record import batch_metric, metric_cell

pytestmark = pytest.mark.unit

BOS = 1
PROMPTS = ((BOS, 10, 11, 12), (BOS, 20, 21), (BOS, 30, 31, 32, 33, 34))
FILLER = [[110, 111, 112], [120, 121], [130, 131, 132, 133]]  # each prompt's text without BOS or template


def test_every_prompt_is_drawn_to_exactly_the_length_with_bos_first_and_its_own_tokens_last():
    out = draw_to_length(PROMPTS, FILLER, 9, BOS)
    assert [len(p) for p in out] == [9, 9, 9]
    for mine, drawn in zip(PROMPTS, out):
        assert drawn[0] == BOS and drawn[-(len(mine) - 1) :] == mine[1:]
    # prompt 0's context comes from prompt 1's text onwards (cycling), the tokens nearest the prompt kept
    assert out[0] == (BOS, 121, 130, 131, 132, 133, 10, 11, 12)
    assert out[2] == (BOS, 110, 111, 112, 30, 31, 32, 33, 34)  # the last prompt's context: the first prompt's text
    # a prompt's own text never makes its context: with two prompts, each is preceded by the other's alone
    pair = draw_to_length(PROMPTS[:2], FILLER[:2], 12, BOS)
    assert set(pair[0][1:-3]) == {120, 121} and set(pair[1][1:-2]) == {110, 111, 112}
    assert context_repeats(FILLER[:2], 12) == 12 / 2  # the smallest other-prompt pool: prompt 0's, 2 tokens


def test_a_prompt_longer_than_the_bucket_keeps_its_bos_and_its_end():
    out = draw_to_length(PROMPTS, FILLER, 4, BOS)
    assert out == ((BOS, 10, 11, 12), (BOS, 133, 20, 21), (BOS, 32, 33, 34))
    assert draw_to_length(((5, 6, 7),), [[8, 9]], 5, None) == ((8, 9, 5, 6, 7),)  # no BOS: nothing held first


def test_no_text_to_draw_from_is_an_error():
    with pytest.raises(ValueError, match="no text"):
        draw_to_length(((BOS, 2),), [[]], 20, BOS)


def test_cell_metric_names_round_trip():
    for batch, context in ((1, None), (8, None), (1, 4096), (8, 4096)):
        assert metric_cell(batch_metric("throughput_tok_s", batch, context), "throughput_tok_s") == (batch, context)
    assert batch_metric("throughput_tok_s", 1) == "throughput_tok_s" and batch_metric("x", 2, 64) == "x_b2_c64"
    for other in ("throughput_tok_s_median", "throughput_tok_s_geomean_over_batch_sizes", "throughput_tok_s_c64_b2", "decode_tok_s_b2"):
        assert metric_cell(other, "throughput_tok_s") is None


def test_the_cells_a_trial_measures_and_bad_buckets():
    w = WorkloadSection(batch_sizes=[2], context_lengths=[512, 64])
    assert w.context_lengths == [64, 512]
    assert w.cells() == [(2, None), (1, 64), (2, 64), (1, 512), (2, 512)]
    assert WorkloadSection().cells() == []
    with pytest.raises(ValidationError, match="at least 16"):
        WorkloadSection(context_lengths=[8])
    with pytest.raises(ValidationError, match="repeat"):
        WorkloadSection(context_lengths=[64, 64])


def _trial(k: int, b1: list[float], cells: dict[tuple[int, int | None], float]):
    params = {"parallel.tp": 1, "comm.backend": "gloo", "spec.num_draft_tokens": k, "drafter.kind": "ngram" if k else "none"}
    attrs = {"spectune.params": params, "spectune.repeat_tok_s": b1, "prompt_tokens_median": 40.0}
    attrs.update({batch_metric("throughput_tok_s", b, c): v for (b, c), v in cells.items()})
    return optuna.trial.create_trial(value=b1[0], user_attrs=attrs)


def _study():
    study = optuna.create_study(direction="maximize")
    for t in (
        _trial(0, [100, 101, 99], {(2, None): 190, (1, 1024): 80, (2, 1024): 150}),
        _trial(4, [150, 152], {(2, None): 250, (1, 1024): 90, (2, 1024): 140}),  # wins short, loses long at batch 2
        _trial(2, [140], {(2, None): 240, (1, 1024): 100, (2, 1024): 160}),  # wins at context 1024
    ):
        study.add_trial(t)
    return study


def test_the_schedule_has_a_row_per_batch_size_and_bucket():
    done = _study().trials
    assert cells_of(done) == [(1, None), (2, None), (1, 1024), (2, 1024)]
    assert batch_sizes_of(done) == [1, 2] and contexts_of(done) == [1024]
    s = build_schedule(_study())
    assert [(r["batch_size"], r["context_len"], r["num_draft_tokens"]) for r in s["schedule"]] == [(1, None, 4), (2, None, 4)]
    by = {(r["batch_size"], r["context_len"]): r for r in s["by_context"]}
    assert sorted(by) == [(1, 1024), (2, 1024)]
    assert by[(1, 1024)]["num_draft_tokens"] == 2 and by[(1, 1024)]["speedup_vs_plain"] == pytest.approx(100 / 80, abs=1e-3)
    assert by[(2, 1024)]["trials"] == [2] and by[(2, 1024)]["plain_throughput_tok_s"] == 150
    assert by[(2, 1024)]["runner_up"] == {"num_draft_tokens": 0, "drafter": "none", "throughput_tok_s": 150.0}
    # engines take rows by batch size only: the exports read the prompts' own rows, and say so for the buckets
    assert [r["batch_size"] for r in sorted_rows(s)] == [1, 2]
    lines = "\n".join(header(s, sorted_rows(s), "vllm"))
    assert "winners by context length" in lines and "context 1024: batch size 1: ngram" in lines and "no context axis" in lines


def test_the_report_says_where_the_best_configuration_moves_with_the_context():
    s = context_summary(build_schedule(_study()), 40)
    text = " ".join(context_sentences(s))
    assert "moves from ngram k=4 at the prompts' own lengths (median 40 tokens) to ngram k=2 (1.25x plain) at context 1024" in text
    assert "within the noise" not in text  # 100 against 90 at context 1024: a lead of 10%, far above the noise
    # the same study with k = 2 only just ahead at context 1024 at batch 1: the sentence says it is no finding
    close = _study()
    close.add_trial(_trial(3, [149, 151], {(2, None): 245, (1, 1024): 99.9, (2, 1024): 155}))
    assert "At context 1024 its lead over ngram k=3 is within the noise of one measurement" in " ".join(
        context_sentences(context_summary(build_schedule(close), 40))
    )
    page = context_html(s)
    assert page.count("<tr>") == 5 and "prompts (40)" in page and 'id="context-schedule"' in page
    assert context_summary(build_schedule(optuna.create_study()), None) is None
