"""The real demo model end to end: SmolLM2-135M-Instruct, bundled Spec-Bench prompts."""

from __future__ import annotations

import pytest

from orchestrator.decode.flags import parse
from orchestrator.decode.run import decode

pytestmark = pytest.mark.slow


def test_ngram_on_summarization_accepts_more_than_1_3(smollm2):
    out = decode(
        *parse("--model smollm2-135m --tp 1 --drafter ngram -k 4 --category summarization --num-prompts 1 --max-new-tokens 64".split())
    )  # one prompt of 769 tokens (prefilled 3 times: warm-up, baseline, n-gram), 64 tokens: about 1.57 accepted
    assert out["outputs_match_baseline"] == 1
    assert out["accept_len_mean"] > 1.3, out["accept_len_mean"]
    assert "summarization" in out["per_category"]
    assert len(out["sample_output"].split()) > 5  # real words from real weights


def test_layer_skip_at_tp2_is_lossless(smollm2):
    # 20 of 30 layers: drafts are accepted (1.21 tokens a step measured), so the equality covers accepted
    # drafts, not only rejected ones (12 layers accepted none)
    out = decode(*parse("--tp 2 --drafter layer_skip --draft-layers 20 -k 3 --num-prompts 1 --max-new-tokens 24".split()))
    assert out["outputs_match_baseline"] == 1 and out["accept_len_mean"] > 1.0, out["accept_len_mean"]
    assert out["allreduce_per_step"] == 60  # 30 layers x (attention + MLP)
    assert 0 < out["comm_fraction"] < 1
