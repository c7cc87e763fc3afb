"""A rank reads only its part of the checkpoint: the lazily loaded parameters equal the slices of
the full tensors (workers/model/tp.py `parts`), the loader takes no more bytes from the file than
the part, and a random model's parts equal the same parts of the full random model.

    .venv/bin/python -m pytest tests/engine/test_shard_loading.py
"""

from __future__ import annotations

import json

import pytest
import torch

from workers.model.checkpoint import CheckpointReader, load_model, tiny_config, write_random_checkpoint
from workers.model.tp import TPPart, parts, slice_params


def _params(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters(remove_duplicate=False))


@pytest.fixture(scope="module")
def uneven_ckpt(tmp_path_factory):
    """6 query / 3 KV heads (a KV head shared by two ranks at TP 4), q/k/v biases, tied embeddings."""
    cfg = tiny_config(
        model_type="qwen2", num_attention_heads=6, num_key_value_heads=3, hidden_size=96, tie_word_embeddings=True, vocab_size=512
    )
    return write_random_checkpoint(tmp_path_factory.mktemp("uneven"), cfg, seed=7)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("vocab_parallel", [False, True])
def test_rank_reads_exactly_its_part(uneven_ckpt, tp, vocab_parallel):
    full = load_model(uneven_ckpt)
    full_bytes = {n: p.numel() * p.element_size() for n, p in _params(full).items()}
    for rank in range(tp):
        part = TPPart(rank, tp, vocab_parallel)
        reader = CheckpointReader(uneven_ckpt)
        mine = load_model(uneven_ckpt, tp=part, reader=reader)
        want = _params(slice_params(load_model(uneven_ckpt), part))
        got = _params(mine)
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), name
        plan = parts(mine.args, part)
        assert "layers.0.self_attn.q_proj.bias" in plan and "layers.1.mlp.down_proj.weight" in plan
        assert ("lm_head.weight" in plan) == vocab_parallel
        # every sliced tensor: the bytes taken from the file are the part's, never the full tensor's
        for name in plan:
            if name != "lm_head.weight":
                assert reader.bytes_read[name] == want[name].numel() * 4 < full_bytes[name], name
        # replicated tensors are read whole, once; a split tied head reads its rows of the embedding
        embed = full_bytes["embed_tokens.weight"]
        assert reader.bytes_read["embed_tokens.weight"] == embed + (embed // tp if vocab_parallel else 0)
        assert reader.bytes_read["norm.weight"] == full_bytes["norm.weight"]


def test_layer_skip_prefix_reads_only_its_layers(tiny_ckpt):
    reader = CheckpointReader(tiny_ckpt)
    model = load_model(tiny_ckpt, n_layers=1, reader=reader)
    assert len(model.layers) == 1
    assert not any(n.startswith("layers.1.") for n in reader.bytes_read)
    full = load_model(tiny_ckpt)
    assert torch.equal(model.layers[0].mlp.down_proj.weight, full.layers[0].mlp.down_proj.weight)


def test_random_model_parts_match_the_full_random_model(tmp_path):
    # an intermediate size above one tile (1024): the TP 2 split at 1280 cuts through a tile
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(tiny_config(intermediate_size=2560, vocab_size=1024)))
    ref = f"random:{cfg}"
    full = load_model(ref, max_seq=32)
    for rank in range(2):
        part = TPPart(rank, 2, vocab_parallel=True)
        got, want = _params(load_model(ref, max_seq=32, tp=part)), _params(slice_params(load_model(ref, max_seq=32), part))
        for name in want:
            assert torch.equal(got[name], want[name]), name
    down = full.layers[0].mlp.down_proj.weight
    assert down.shape == (64, 2560) and 0.5 < down.std().item() * (2560 * 4) ** 0.5 < 2.0  # N(0, 1/fan_in) / sqrt(2 layers)
    assert torch.equal(full.norm.weight, torch.ones(64))
    # a layer-skip prefix draws the same first layers as the whole model
    prefix = load_model(ref, max_seq=32, n_layers=1)
    assert torch.equal(prefix.layers[0].self_attn.o_proj.weight, full.layers[0].self_attn.o_proj.weight)


def test_loading_a_rank_never_imports_torch_dynamo(tiny_ckpt):
    """A worker process builds its part of the model as shapes (meta), slices it and fills it from the
    checkpoint without importing torch._dynamo (about a second of every worker's start-up: torch's
    Python references, which nn.init and a few ops on meta run through, import it)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from workers.model.checkpoint import load_model\n"
        "from workers.model.tp import TPPart\n"
        f"m = load_model({str(tiny_ckpt)!r}, tp=TPPart(rank=1, world=2))\n"
        "assert m.layers[0].self_attn.kv_map.device.type == 'cpu' and not m.rope_cos.is_meta\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
