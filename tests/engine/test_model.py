"""The plain model against transformers' own implementation, per architecture and rope variant,
and the KV cache's rollback."""

from __future__ import annotations

import pytest
import torch

from workers.checks.parity import reference_logits
from workers.model.args import ModelArgs, ModelConfigError
from workers.model.checkpoint import load_model, tiny_config, write_random_checkpoint

VARIANTS = {
    "llama-gqa": tiny_config(),
    "llama-mha-tied": tiny_config(num_key_value_heads=4, tie_word_embeddings=True),
    "llama3-rope": tiny_config(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    ),
    "linear-rope": tiny_config(rope_scaling={"type": "linear", "factor": 2.0}),
    "yarn-rope": tiny_config(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    "qwen2-bias": tiny_config(model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True),
    "mistral": tiny_config(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_matches_transformers(tmp_path, name):
    path = write_random_checkpoint(tmp_path, VARIANTS[name], seed=3)
    tokens = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(0)).tolist()
    mine, theirs = reference_logits(str(path), tokens)
    assert mine.shape == theirs.shape == (2, 40, 512)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


def test_rope_variants_really_differ(tmp_path):
    """Guards the test above: the scaled variants must change the logits, or it proves nothing."""
    tokens = torch.randint(0, 512, (1, 60), generator=torch.Generator().manual_seed(0)).tolist()
    out = {}
    for name in ("llama-gqa", "llama3-rope", "yarn-rope"):
        m = load_model(write_random_checkpoint(tmp_path / name, VARIANTS[name], seed=3))
        out[name] = m(torch.tensor(tokens), m.new_cache(1))
    assert (out["llama-gqa"] - out["llama3-rope"]).abs().max() > 1e-3
    assert (out["llama-gqa"] - out["yarn-rope"]).abs().max() > 1e-3


@torch.inference_mode()
def test_kv_rollback_equals_fresh_prefix(tiny_ckpt):
    model = load_model(tiny_ckpt)
    seq = torch.randint(0, 512, (1, 30), generator=torch.Generator().manual_seed(1))
    full = model(seq, model.new_cache(1))
    cache = model.new_cache(1)
    model(seq[:, :20], cache)
    model(torch.randint(0, 512, (1, 6)), cache)  # rejected drafts
    cache.rollback(0, 20)
    tail = model(seq[:, 20:], cache)
    torch.testing.assert_close(tail, full[:, 20:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        cache.rollback(0, 31)


@torch.inference_mode()
def test_batch_with_different_positions(tiny_ckpt):
    """Two sequences at different lengths in one batch give each one's own logits."""
    model = load_model(tiny_ckpt)
    a = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(2))
    b = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(3))
    ref_a, ref_b = model(a, model.new_cache(1)), model(b, model.new_cache(1))
    cache = model.new_cache(2)
    model(torch.cat([a[:, :8], b[:, :8]]), cache)
    cache.rollback(1, 5)  # sequence b continues from position 5
    out = model(torch.cat([a[:, 8:10], b[:, 5:7]]), cache)
    torch.testing.assert_close(out[0], ref_a[0, 8:10], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], ref_b[0, 5:7], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "patch, needle",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2'"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"rope_scaling": {"rope_type": "longrope"}}, "rope type 'longrope'"),
        ({"vocab_size": None}, "vocab_size"),
    ],
)
def test_config_errors_name_the_field(patch, needle):
    with pytest.raises(ModelConfigError, match=needle):
        ModelArgs.from_hf_config(tiny_config(**patch))
