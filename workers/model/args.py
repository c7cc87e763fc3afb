"""Model shape and rotary settings read from a Hugging Face ``config.json``.

`ModelArgs.from_hf_config(dict)` accepts Llama, Qwen2, Mistral, Qwen3 (per-head q/k RMSNorm) and
Qwen3-MoE (softmax top-k routed experts on some layers) configs, old (``rope_theta`` +
``rope_scaling``) and new (``rope_parameters``) rotary spellings alike. Every field of these
families that changes the math is honoured or refused: anything else raises `ModelConfigError`
with one line naming the field.

    python -m workers.model.args path/to/config.json     # prints the parsed arguments
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3", "qwen3_moe")
QK_NORM_TYPES = ("qwen3", "qwen3_moe")  # RMSNorm over each q and k head before rope
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


class CheckpointError(ValueError):
    """A model path that cannot be used (one line, names the path and the problem)."""


class ModelConfigError(ValueError):
    """A checkpoint's config that spectune cannot run (one line, names the field)."""


@dataclass(frozen=True)
class MoEArgs:
    """Routed experts of an MoE layer: each token goes to `top_k` of `n_experts` SwiGLU experts of
    width `intermediate_size`, weighted by its router scores.

    router "softmax" (Qwen3-MoE): softmax over all experts in float32, the top k kept, renormalised
    to sum 1 when `norm_topk_prob`. A second family adds its router kind and shared experts here,
    not another MoE layer."""

    n_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool = False
    router: str = "softmax"


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
    qk_norm: bool = False  # Qwen3: RMSNorm of each query and key head (weights [head_dim]) before rope
    moe: MoEArgs | None = None
    moe_layers: tuple[int, ...] = ()  # layers whose MLP is `moe` (the others are dense SwiGLU)
    # a `random:` shape cut to its first layers (`:layers=N`): the full model's count, so the record
    # says the figures are for n_layers of full_layers (None: the whole model)
    full_layers: int | None = None

    @property
    def rope_type(self) -> str:
        return self.rope_scaling.get("rope_type", "default")

    def with_layers(self, n_layers: int) -> ModelArgs:
        return dataclasses.replace(self, n_layers=n_layers, moe_layers=tuple(i for i in self.moe_layers if i < n_layers))

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers

    @property
    def layers_label(self) -> str:
        """ "N of M layers" for a layer subset of a shape, "" for a whole model."""
        full = self.full_layers
        return f"{self.n_layers} of {full} layers" if full and full != self.n_layers else ""

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
        qk_norm = model_type in QK_NORM_TYPES
        if qk_norm and cfg.get("attention_bias"):
            # Qwen3's attention_bias also puts a bias on o_proj, after the row-parallel sum
            raise ModelConfigError(f"attention_bias=true is not supported for model_type {model_type!r}")
        if cfg.get("use_sliding_window"):
            raise ModelConfigError("use_sliding_window=true is not supported (spectune attends to the whole context)")
        moe, moe_layers = _moe(cfg, model_type)
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
            qk_norm=qk_norm,
            moe=moe,
            moe_layers=moe_layers,
            full_layers=cfg.get("spectune_full_layers"),
        )


def _positive(cfg: dict[str, Any], key: str) -> int:
    if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
        raise ModelConfigError(f"config field {key!r} is missing or not a positive integer")
    return cfg[key]


def _moe(cfg: dict[str, Any], model_type: str) -> tuple[MoEArgs | None, tuple[int, ...]]:
    """The routed experts and the layers that have them (Qwen3-MoE: layer i when i is not in
    mlp_only_layers and (i + 1) % decoder_sparse_step == 0, as transformers builds it)."""
    if model_type != "qwen3_moe":
        return None, ()
    # transformers writes the expert count as num_local_experts in its own configs, the hub's as num_experts
    n_experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    if not isinstance(n_experts, int) or n_experts < 0:
        raise ModelConfigError("config field 'num_experts' is missing or not a non-negative integer")
    if n_experts == 0:
        return None, ()
    top_k, width = _positive(cfg, "num_experts_per_tok"), _positive(cfg, "moe_intermediate_size")
    if top_k > n_experts:
        raise ModelConfigError(f"num_experts_per_tok={top_k} exceeds num_experts={n_experts}")
    step = cfg.get("decoder_sparse_step", 1)
    if not isinstance(step, int) or step < 1:
        raise ModelConfigError(f"config field 'decoder_sparse_step' must be a positive integer, got {step!r}")
    dense = set(cfg.get("mlp_only_layers") or [])
    layers = tuple(i for i in range(cfg["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0)
    moe = MoEArgs(n_experts=n_experts, top_k=top_k, intermediate_size=width, norm_topk_prob=bool(cfg.get("norm_topk_prob", False)))
    return moe, layers


def check_tp(args: ModelArgs, tp: int) -> None:
    """Raise ModelConfigError unless `tp` ranks can share this model.

    Attention heads are split by query head (uneven splits allowed, each rank keeps the KV heads
    its query heads read), so every rank needs at least one query head; the MLP's intermediate
    dimension, and every expert's, must divide evenly.
    """
    if tp < 1:
        raise ModelConfigError(f"tp={tp} must be at least 1")
    if tp > args.n_heads:
        raise ModelConfigError(f"tp={tp} does not divide the model's {args.n_heads} attention heads (at most {args.n_heads} ranks)")
    if len(args.moe_layers) < args.n_layers and args.intermediate_size % tp:
        raise ModelConfigError(f"tp={tp} does not divide intermediate_size={args.intermediate_size}")
    if args.moe_layers and args.moe.intermediate_size % tp:
        raise ModelConfigError(
            f"tp={tp} does not divide moe_intermediate_size={args.moe.intermediate_size} (each rank holds 1/tp of every expert)"
        )


if __name__ == "__main__":
    print(ModelArgs.from_hf_config(json.load(open(sys.argv[1]))))
