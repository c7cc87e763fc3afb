"""Rotary position embeddings: inverse frequencies for every scaling variant Llama-family configs use.

`rope_tables(args, max_seq)` returns (cos, sin) of shape [max_seq, rope_dim] in the
"rotate half" layout that Hugging Face checkpoints are stored in (rope_dim: the head dimension, or
latent attention's rope part). Variants: default, linear, dynamic (NTK; equal to default within the
original context, which is all spectune decodes), llama3 (Llama 3.1 frequency bands) and yarn
(NTK-by-parts + attention scaling). DeepSeek-V3 stores its rope dimensions as interleaved pairs
(x0, x1), (x2, x3), ...: `deinterleave` puts the evens first and the odds after, which turns them
into this layout (a query and its keys permuted alike: their dot products are unchanged).
`mla_softmax_scale` is latent attention's softmax scale under a scaled rope.
"""

from __future__ import annotations

import math

import torch

from workers.model.args import ModelArgs


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    # inv_freq_i = theta^(-2i/d), i = 0 .. d/2-1
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    # Long wavelengths (low frequencies) are divided by `factor`, short ones kept, and the band
    # between the two wavelength thresholds is interpolated linearly in 1/wavelength.
    factor, low, high = p["factor"], p.get("low_freq_factor", 1.0), p.get("high_freq_factor", 4.0)
    old_ctx = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def mscale(scale: float, m: float = 1.0) -> float:
    """YaRN's attention temperature (its Eq. 21): 0.1 m ln(scale) + 1, 1 when not scaled."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _yarn(args: ModelArgs, dim: int) -> tuple[torch.Tensor, float]:
    p = args.rope_scaling
    base = args.rope_theta
    orig = p.get("original_max_position_embeddings") or args.max_position_embeddings
    factor = p.get("factor") or args.max_position_embeddings / orig

    attn = p.get("attention_factor")
    if attn is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attn = mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
        else:
            attn = mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        # the rotary dimension whose wavelength completes `rotations` turns over the original context
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolate = 1 - ramp  # 1: keep the original frequency, 0: interpolate by `factor`
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv, float(attn)


def inv_freq_and_scale(args: ModelArgs) -> tuple[torch.Tensor, float]:
    dim = args.rope_dim
    kind = args.rope_type
    if kind == "yarn":
        return _yarn(args, dim)
    inv = _base_inv_freq(args.rope_theta, dim)
    if kind == "linear":
        inv = inv / args.rope_scaling["factor"]
    elif kind == "llama3":
        inv = _llama3(inv, args.rope_scaling)
    return inv, 1.0  # "default" and "dynamic" (inside the original context)


def mla_softmax_scale(args: ModelArgs) -> float:
    """Latent attention's softmax scale: (qk_nope + qk_rope)^-1/2, times mscale(factor,
    mscale_all_dim)^2 when the rope is scaled (any type but default) and mscale_all_dim is set:
    DeepSeek's code scales every dimension of q.k, not only the rotary ones that yarn's attention
    factor reaches (transformers' `yarn_apply_mscale`; the same float operations, in this order)."""
    scale = args.mla.qk_head_dim ** (-0.5)
    m_all = args.rope_scaling.get("mscale_all_dim") or 0
    if args.rope_type != "default" and m_all:
        m = mscale(args.rope_scaling["factor"], m_all)
        scale = scale * m * m
    return scale


def rope_tables(args: ModelArgs, max_seq: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_seq, rope_dim], computed on the CPU whatever the default device (on `meta`,
    where a model is built as shapes, these ops would run through torch's Python references, whose
    import of torch._dynamo costs every process about a second), then moved to `device`."""
    with torch.device("cpu"):
        inv, scale = inv_freq_and_scale(args)
        t = torch.arange(max_seq, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * scale).to(device), (emb.sin() * scale).to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D]; cos/sin: [B, 1, T, D] gathered at each token's position."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[..., D] with rotary pairs (x0, x1), (x2, x3), ... -> [x0, x2, ..., x1, x3, ...]: the pairs'
    first elements, then their second elements, the layout `apply_rope` turns."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
