"""Model shape and rotary settings read from a Hugging Face ``config.json``.

`ModelArgs.from_hf_config(dict)` accepts Llama, Qwen2 and Mistral style configs, old
(``rope_theta`` + ``rope_scaling``) and new (``rope_parameters``) rotary spellings alike, and
raises `ModelConfigError` with one line naming the problem for anything else.

    python -m workers.model.args path/to/config.json     # prints the parsed arguments
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


class CheckpointError(ValueError):
    """A model path that cannot be used (one line, names the path and the problem)."""


class ModelConfigError(ValueError):
    """A checkpoint's config that spectune cannot run (one line, names the field)."""


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=dict)  # rope_type + its parameters
    max_position_embeddings: int = 4096
    tie_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def rope_type(self) -> str:
        return self.rope_scaling.get("rope_type", "default")

    def with_layers(self, n_layers: int) -> ModelArgs:
        return dataclasses.replace(self, n_layers=n_layers)

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelConfigError(f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(f"hidden_act {act!r} is not supported (only silu / SwiGLU)")
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
                raise ModelConfigError(f"config field {key!r} is missing or not a positive integer")
        n_heads = cfg["num_attention_heads"]
        n_kv = cfg.get("num_key_value_heads") or n_heads
        if n_heads % n_kv:
            raise ModelConfigError(f"num_attention_heads={n_heads} is not a multiple of num_key_value_heads={n_kv}")
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
        # Rotary settings: transformers >= 5 writes rope_parameters, older configs rope_theta + rope_scaling.
        rope = dict(cfg.get("rope_parameters") or {})
        legacy = dict(cfg.get("rope_scaling") or {})
        if "type" in legacy and "rope_type" not in legacy:
            legacy["rope_type"] = legacy.pop("type")
        rope = {**legacy, **rope}
        theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope.setdefault("rope_type", "default")
        if rope["rope_type"] not in SUPPORTED_ROPE_TYPES:
            raise ModelConfigError(f"rope type {rope['rope_type']!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        return cls(
            vocab_size=cfg["vocab_size"],
            dim=cfg["hidden_size"],
            n_layers=cfg["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=head_dim,
            intermediate_size=cfg["intermediate_size"],
            norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=rope,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            model_type=model_type,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def check_tp(args: ModelArgs, tp: int) -> None:
    """Raise ModelConfigError unless `tp` ranks can share this model.

    Attention heads are split by query head (uneven splits allowed, each rank keeps the KV heads
    its query heads read), so every rank needs at least one query head; the MLP's intermediate
    dimension must divide evenly.
    """
    if tp < 1:
        raise ModelConfigError(f"tp={tp} must be at least 1")
    if tp > args.n_heads:
        raise ModelConfigError(f"tp={tp} does not divide the model's {args.n_heads} attention heads (at most {args.n_heads} ranks)")
    if args.intermediate_size % tp:
        raise ModelConfigError(f"tp={tp} does not divide intermediate_size={args.intermediate_size}")


if __name__ == "__main__":
    print(ModelArgs.from_hf_config(json.load(open(sys.argv[1]))))
