"""Random-weight models of realistic shape, for engine speed where real large weights cannot be
downloaded: `random:<preset or path/to/config.json>[:layers=N]` wherever a model path goes.

    spectune decode --model random:llama-3-8b --tp 2 ...
    spectune decode --model random:llama-3-70b:layers=8 ...      # the 70B shape, 8 of its 80 layers

Weights are drawn on the target device (no file is written): N(0, 1/fan_in), with the output
projections scaled by 1/sqrt(2 * layers) so the residual stream stays bounded in bf16. Every
rank draws the same full tensors from one seed, so a sharded random model is the slice of one
model. Such models have no tokenizer (prompts go through the byte tokenizer) and no EOS.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from workers.model.args import CheckpointError

PREFIX = "random:"

PRESETS: dict[str, dict] = {
    "llama-3-8b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False,
        "hidden_act": "silu",
    },
    "llama-3-70b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False,
        "hidden_act": "silu",
    },
    "llama-3.2-1b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": True,
        "hidden_act": "silu",
    },
}


def is_random(path) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def random_config(ref: str) -> dict:
    """The HF config dict a `random:` reference names (layers override applied)."""
    body = ref.removeprefix(PREFIX)
    name, _, opts = body.partition(":layers=")
    if name in PRESETS:
        cfg = dict(PRESETS[name])
    elif Path(name).is_file():
        cfg = json.loads(Path(name).read_text())
    else:
        raise CheckpointError(f"model {ref!r}: {name!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json file")
    if opts:
        if not opts.isdigit() or int(opts) < 1:
            raise CheckpointError(f"model {ref!r}: layers must be a positive integer")
        cfg["num_hidden_layers"] = int(opts)
    return cfg


@torch.no_grad()
def init_random_(model, seed: int = 0) -> None:
    """Fill `model`'s parameters in place (on their device) with the scheme in the module docstring."""
    n_layers = max(1, model.args.n_layers)
    device = model.embed_tokens.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif p.ndim == 1:
            p.zero_()
        else:
            std = 1.0 if "embed" in name else p.shape[1] ** -0.5
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std /= (2 * n_layers) ** 0.5
            p.copy_(torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32).mul_(std))
