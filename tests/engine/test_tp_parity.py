"""Sharded logits (gloo, one process per rank) equal the unsharded model's and transformers'."""

from __future__ import annotations

import pytest
import torch

from workers.checks.parity import reference_logits, sharded_logits
from workers.model.args import ModelConfigError, check_tp
from workers.model.checkpoint import load_args, tiny_config, write_random_checkpoint
from workers.model.tp import head_range


def _tokens(vocab: int, seq: int = 24, batch: int = 1) -> list[list[int]]:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("vocab_parallel", [False, True])
def test_tiny_gqa(tiny_ckpt, tp, vocab_parallel):
    tokens = _tokens(512, batch=2)
    mine, theirs = reference_logits(str(tiny_ckpt), tokens)
    sharded = sharded_logits(str(tiny_ckpt), tp, tokens, vocab_parallel=vocab_parallel)
    torch.testing.assert_close(sharded, mine, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sharded, theirs, atol=1e-4, rtol=1e-4)


def test_uneven_heads_and_tp8(tmp_path):
    """6 query / 3 KV heads: TP 4 splits 2,2,1,1 with a KV head shared by two ranks; TP 8 with 8 heads."""
    path = write_random_checkpoint(tmp_path / "a", tiny_config(num_attention_heads=6, num_key_value_heads=3, hidden_size=96), seed=5)
    tokens = _tokens(512)
    mine, _ = reference_logits(str(path), tokens)
    torch.testing.assert_close(sharded_logits(str(path), 4, tokens), mine, atol=1e-4, rtol=1e-4)
    path8 = write_random_checkpoint(tmp_path / "b", tiny_config(num_attention_heads=8, num_key_value_heads=2, head_dim=8), seed=6)
    mine8, theirs8 = reference_logits(str(path8), tokens)
    torch.testing.assert_close(sharded_logits(str(path8), 8, tokens), theirs8, atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # the demo model
@pytest.mark.parametrize("tp", [2, 4])
def test_smollm2(smollm2, tp):
    tokens = _tokens(load_args(smollm2).vocab_size, seq=20)
    mine, theirs = reference_logits(str(smollm2), tokens)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    sharded = sharded_logits(str(smollm2), tp, tokens)
    torch.testing.assert_close(sharded, theirs, atol=2e-4, rtol=1e-4)
    assert sharded.abs().max() > 1.0  # real weights give real logits, not zeros


def test_head_ranges_cover_all_heads():
    for n in (4, 6, 9, 32):
        for world in range(1, n + 1):
            ranges = [head_range(n, r, world) for r in range(world)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            assert max(e - s for s, e in ranges) - min(e - s for s, e in ranges) <= 1


def test_tp_the_heads_cannot_take(tiny_ckpt):
    args = load_args(tiny_ckpt)
    with pytest.raises(ModelConfigError, match="tp=8 does not divide the model's 4 attention heads"):
        check_tp(args, 8)
    with pytest.raises(ModelConfigError, match="intermediate_size"):
        check_tp(args.__class__(**{**args.__dict__, "intermediate_size": 130}), 4)
