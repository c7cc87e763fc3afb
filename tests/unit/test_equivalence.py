"""Greedy outputs against the baseline: exact, parted at a numerical near tie (valid), or wrong
(invalid); the engine records the baseline's per-token logit margins that tell them apart."""

from __future__ import annotations

import pytest

from orchestrator.study.equivalence import TOLERANCE, compare, first_difference, outputs_verdict


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one stopped early (EOS or length)


@pytest.mark.parametrize("margin, verdict", [(0.001, "near_tie"), (0.5, "differs")])
def test_divergence_at_a_near_tie_or_not(margin, verdict):
    base, margins = [4, 8, 15, 16], [0.3, 0.2, margin, 0.4]
    assert compare(base, margins, [4, 8, 15, 16], TOLERANCE["bfloat16"]) == ("same", None)
    assert compare(base, margins, [4, 8, 99, 7], TOLERANCE["bfloat16"]) == (verdict, 2)


def test_verdict_over_prompts_and_dtypes():
    base, margins = [[1, 2, 3], [4, 5, 6]], [[0.5, 0.01, 0.5], [0.5, 0.5, 0.5]]
    near = outputs_verdict(base, margins, [[1, 9, 9], [4, 5, 6]], "bfloat16")
    assert near == {"outputs_match_baseline": 1, "prompts_matching_baseline": 1, "prompts_near_tie": 1}
    strict = outputs_verdict(base, margins, [[1, 9, 9], [4, 5, 6]], "float32")  # 0.01 is no tie in fp32
    assert strict["outputs_match_baseline"] == 0 and strict["prompts_near_tie"] == 0
    wrong = outputs_verdict(base, margins, [[1, 2, 3], [7, 5, 6]], "bfloat16")
    assert wrong["outputs_match_baseline"] == 0 and wrong["prompts_matching_baseline"] == 1
