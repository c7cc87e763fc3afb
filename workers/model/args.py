"""Model shape and rotary settings read from a Hugging Face ``config.json``.

`ModelArgs.from_hf_config(dict)` accepts Llama, Qwen2, Mistral, Qwen3 (per-head q/k RMSNorm),
Qwen3-MoE (softmax top-k routed experts on some layers) and DeepSeek-V3 (multi-head latent
attention; grouped sigmoid routing with shared experts; Kimi-K2 is this family) configs, old
(``rope_theta`` + ``rope_scaling``) and new (``rope_parameters``) rotary spellings alike. Every
field of these families that changes the math is honoured or refused: anything else raises
`ModelConfigError` with one line naming the field. A DeepSeek-V3 field the config leaves out takes
transformers' default (`DeepseekV3Config`), as transformers does when it loads the checkpoint.

    python -m workers.model.args path/to/config.json     # prints the parsed arguments
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3", "qwen3_moe", "deepseek_v3")
QK_NORM_TYPES = ("qwen3", "qwen3_moe")  # RMSNorm over each q and k head before rope
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


class CheckpointError(ValueError):
    """A model path that cannot be used (one line, names the path and the problem)."""


class ModelConfigError(ValueError):
    """A checkpoint's config that spectune cannot run (one line, names the field)."""


# transformers' DeepseekV3Config defaults: what a deepseek_v3 config.json that leaves a field out means
DEEPSEEK_V3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "num_nextn_predict_layers": 1,  # transformers' num_mtp_layers
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "rope_interleave": True,
    "attention_bias": False,
}


@dataclass(frozen=True)
class MoEArgs:
    """Routed experts of an MoE layer: each token goes to `top_k` of `n_experts` SwiGLU experts of
    width `intermediate_size`, weighted by its router scores; plus, where `n_shared_experts` > 0,
    a dense SwiGLU of width n_shared_experts x intermediate_size that every token goes through.

    router "softmax" (Qwen3-MoE): softmax over all experts in float32, the top k kept, renormalised
    to sum 1 when `norm_topk_prob`.
    router "sigmoid_grouped" (DeepSeek-V3): sigmoid scores in float32; the choice ranks score +
    e_score_correction_bias, only within the `topk_group` of `n_group` expert groups whose two best
    biased scores sum highest; the chosen experts' unbiased scores are the weights, renormalised
    when `norm_topk_prob`, then multiplied by `routed_scaling_factor`."""

    n_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool = False
    router: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    n_shared_experts: int = 0


@dataclass(frozen=True)
class MLAArgs:
    """Multi-head latent attention (DeepSeek-V3). Per token: the query through a rank-`q_lora_rank`
    bottleneck (q_a_proj, RMSNorm, q_b_proj; one q_proj where it is None); one latent of
    `kv_lora_rank` (RMS-normed) plus one rotary key part of `qk_rope_head_dim` shared by all heads
    (kv_a_proj_with_mqa); kv_b_proj expands the latent into each head's key part without rope
    (`qk_nope_head_dim`) and its value (`v_head_dim`). A head's key is [nope, rope], its query the
    same split; rope turns the rope parts only (pairs interleaved when `rope_interleave`). Softmax
    scale: (qk_nope + qk_rope)^-1/2, times mscale(factor, mscale_all_dim)^2 under a scaled rope
    (workers/model/rope.py `mla_softmax_scale`)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


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
    # DeepSeek-V3's latent attention (None: GQA); then head_dim = qk_nope + qk_rope, the width of a
    # head's key in the cache, and n_kv_heads = n_heads (the cache holds each head's expanded K/V)
    mla: MLAArgs | None = None
    # a `random:` shape cut to its first layers (`:layers=N`): the full model's count, so the record
    # says the figures are for n_layers of full_layers (None: the whole model)
    full_layers: int | None = None
    # DeepSeek-V3's multi-token-prediction layers (num_nextn_predict_layers; the MTP drafter uses the
    # first), stored in the checkpoint after the decoder layers; `mtp_moe`: whether its block is MoE
    mtp_layers: int = 0
    mtp_moe: bool = False

    @property
    def mtp_index(self) -> int:
        """The checkpoint's layer index of the first MTP layer: right after the whole model's layers."""
        return self.full_layers or self.n_layers

    @property
    def rope_type(self) -> str:
        return self.rope_scaling.get("rope_type", "default")

    @property
    def rope_dim(self) -> int:
        """The dimensions of a query / key head that rope turns (latent attention: the rope part only)."""
        return self.mla.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def v_head_dim(self) -> int:
        """The width of a value head in the cache (latent attention's differs from the key's)."""
        return self.mla.v_head_dim if self.mla else self.head_dim

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
        if model_type == "deepseek_v3":
            cfg = {**DEEPSEEK_V3_DEFAULTS, **cfg}
        if cfg.get("quantization_config"):
            raise ModelConfigError(
                "quantization_config is not supported (spectune loads unquantized weights: dequantize the checkpoint first)"
            )
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
        mla = _mla(cfg) if model_type == "deepseek_v3" else None
        if mla is not None:
            if n_kv != n_heads:  # transformers repeats the already per-head K/V by heads / kv heads: it cannot run
                raise ModelConfigError(f"num_key_value_heads={n_kv} must equal num_attention_heads={n_heads} for model_type 'deepseek_v3'")
            head_dim = mla.qk_head_dim  # config.json's head_dim is transformers' rope width (qk_rope_head_dim)
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
        if rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ModelConfigError("partial_rotary_factor other than 1 is not supported (rope turns the whole rotary head)")
        qk_norm = model_type in QK_NORM_TYPES
        if (qk_norm or mla) and cfg.get("attention_bias"):
            # Qwen3's and DeepSeek-V3's attention_bias also put a bias on o_proj, after the row-parallel sum
            raise ModelConfigError(f"attention_bias=true is not supported for model_type {model_type!r}")
        if cfg.get("use_sliding_window"):
            raise ModelConfigError("use_sliding_window=true is not supported (spectune attends to the whole context)")
        moe, moe_layers = _moe(cfg, model_type)
        mtp = cfg.get("num_nextn_predict_layers", 0) if model_type == "deepseek_v3" else 0
        if not isinstance(mtp, int) or isinstance(mtp, bool) or mtp < 0:
            raise ModelConfigError(f"config field 'num_nextn_predict_layers' must be a non-negative integer, got {mtp!r}")
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
            norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),  # a deepseek_v3 config has its default merged in
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
            mla=mla,
            full_layers=cfg.get("spectune_full_layers"),
            mtp_layers=mtp,
            # DeepSeek-V3's MTP block is a decoder layer at index num_hidden_layers: MoE past first_k_dense_replace
            # (the whole model's count, also for a `:layers=N` subset, whose MTP layer is still index M)
            mtp_moe=bool(
                mtp and moe is not None and cfg.get("spectune_full_layers", cfg["num_hidden_layers"]) >= cfg.get("first_k_dense_replace", 0)
            ),
        )


def _positive(cfg: dict[str, Any], key: str) -> int:
    if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
        raise ModelConfigError(f"config field {key!r} is missing or not a positive integer")
    return cfg[key]


def _mla(cfg: dict[str, Any]) -> MLAArgs:
    """DeepSeek-V3's latent attention (defaults merged in already)."""
    q_lora = cfg.get("q_lora_rank")
    if q_lora is not None and (not isinstance(q_lora, int) or q_lora <= 0):
        raise ModelConfigError(f"config field 'q_lora_rank' must be null or a positive integer, got {q_lora!r}")
    dims = {key: _positive(cfg, key) for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    if dims["qk_rope_head_dim"] % 2:
        raise ModelConfigError(f"qk_rope_head_dim={dims['qk_rope_head_dim']} must be even (rope turns pairs of dimensions)")
    interleave = cfg.get("rope_interleave")
    if not isinstance(interleave, bool):
        raise ModelConfigError(f"config field 'rope_interleave' must be true or false, got {interleave!r}")
    return MLAArgs(q_lora_rank=q_lora, rope_interleave=interleave, **dims)


def _deepseek_moe(cfg: dict[str, Any]) -> tuple[MoEArgs, tuple[int, ...]]:
    """DeepSeek-V3's routed + shared experts on layers first_k_dense_replace.. (defaults merged in).
    transformers' reference is exactly the routing of DeepSeek-V3's own code for topk_method noaux_tc
    and scoring_func sigmoid on every layer past the dense ones (moe_layer_freq 1); other values
    of those three fields mean other math, refused."""
    for key, only in (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid"), ("moe_layer_freq", 1)):
        if cfg.get(key, only) != only:
            raise ModelConfigError(
                f"{key}={cfg[key]!r} is not supported for model_type 'deepseek_v3' (only {only!r}, as transformers computes it)"
            )
    n_experts, top_k, width = (_positive(cfg, key) for key in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"))
    n_group, topk_group = _positive(cfg, "n_group"), _positive(cfg, "topk_group")
    if n_experts % n_group or n_experts // n_group < 2:
        raise ModelConfigError(f"n_group={n_group} must divide n_routed_experts={n_experts} into groups of at least 2 experts")
    if topk_group > n_group:
        raise ModelConfigError(f"topk_group={topk_group} exceeds n_group={n_group}")
    if top_k > topk_group * (n_experts // n_group):
        raise ModelConfigError(
            f"num_experts_per_tok={top_k} exceeds the {topk_group * (n_experts // n_group)} experts of topk_group={topk_group} groups"
        )
    shared = cfg.get("n_shared_experts") or 0  # DeepSeek's own code: no shared experts where it is null
    if not isinstance(shared, int) or shared < 0:
        raise ModelConfigError(f"config field 'n_shared_experts' must be a non-negative integer, got {shared!r}")
    scale = cfg.get("routed_scaling_factor")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
        raise ModelConfigError(f"config field 'routed_scaling_factor' must be a positive number, got {scale!r}")
    first = cfg.get("first_k_dense_replace")
    if not isinstance(first, int) or first < 0:
        raise ModelConfigError(f"config field 'first_k_dense_replace' must be a non-negative integer, got {first!r}")
    moe = MoEArgs(
        n_experts=n_experts,
        top_k=top_k,
        intermediate_size=width,
        norm_topk_prob=bool(cfg.get("norm_topk_prob")),
        router="sigmoid_grouped",
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=float(scale),
        n_shared_experts=shared,
    )
    return moe, tuple(range(first, cfg["num_hidden_layers"]))


def _moe(cfg: dict[str, Any], model_type: str) -> tuple[MoEArgs | None, tuple[int, ...]]:
    """The routed experts and the layers that have them (Qwen3-MoE: layer i when i is not in
    mlp_only_layers and (i + 1) % decoder_sparse_step == 0, as transformers builds it; DeepSeek-V3:
    layer i >= first_k_dense_replace)."""
    if model_type == "deepseek_v3":
        return _deepseek_moe(cfg)
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
    its query heads read; latent attention's per-head up-projections likewise), so every rank
    needs at least one query head; the MLP's intermediate dimension, and every expert's (shared
    experts' too: a multiple of it), must divide evenly.
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
