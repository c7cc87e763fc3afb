"""A plain decoder for the Llama family and its kin (Llama / Qwen2 / Mistral / Qwen3 / Qwen3-MoE /
DeepSeek-V3): GQA, RoPE, RMSNorm, SwiGLU; Qwen3's per-head q/k RMSNorm; DeepSeek-V3's multi-head
latent attention (`LatentAttention`); MoE layers (workers/model/moe.py) where the config puts them.

No distributed code lives here. Module names match Hugging Face checkpoints (`embed_tokens`,
`layers.N.self_attn.q_proj`, ...), so `load_state_dict` takes a checkpoint's tensors as they are.
Tensor parallelism is a separate pass (`workers/model/tp.py`) that slices the weights in place and
sets the two hooks this file leaves open: `reduce` on every row-parallel output (attention
`o_proj`, MLP `down_proj`, the MoE's routed + shared sum) and `gather_vocab` on a vocab-parallel `lm_head`.

Attention heads: each rank holds some query heads and the KV heads they read; `kv_map[h]` is
the local KV head of local query head h, so uneven head splits and GQA share one code path. Latent
attention has one KV head per query head (its K/V expanded from the latent per head).

The KV cache keeps one position per sequence and can be rolled back to any earlier position:
entries past a sequence's length are masked out and overwritten later, never read.

A batched prefill (`prefill_packed`) feeds several fresh sequences in one pass: their tokens packed
into one row (no padding through the matrix products), each token rotated at its own position and
written to its own cache row; attention runs per sequence, causal from position 0 (`Packed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workers.model.args import ModelArgs
from workers.model.moe import MoE
from workers.model.rope import apply_rope, deinterleave, mla_softmax_scale, rope_tables


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def aux_rows(aux: list[torch.Tensor], row: int, n: int) -> torch.Tensor:
    """EAGLE-3: row `row`'s first n positions of a pass's captured aux states (`Transformer.aux`, one
    [B, T, dim] tensor per layer) -> [n, n_aux x dim], the layers side by side."""
    return torch.cat([a[row, :n] for a in aux], dim=-1)


class Linear(nn.Linear):
    """nn.Linear that leaves a weight on `meta` uninitialised: a model built as shapes (checkpoint.py
    load_model) is filled from the checkpoint, and nn.init on meta runs through torch's Python
    references, whose import of torch._dynamo costs every worker process about a second."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class Embedding(nn.Embedding):
    """nn.Embedding, uninitialised on `meta` (as `Linear`)."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalised in float32, scaled in the input dtype (as Hugging Face's Llama does)."""
    dtype = x.dtype
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


@dataclass
class KVCache:
    """Per-layer K/V buffers, K [batch, local_kv_heads, max_seq, head_dim] and V [batch,
    local_kv_heads, max_seq, v_head_dim] (the same width but for latent attention), and each
    sequence's length."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    lengths: list[int]

    @property
    def max_seq(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def rollback(self, seq: int, length: int) -> None:
        """Forget everything of sequence `seq` from position `length` on."""
        if not 0 <= length <= self.lengths[seq]:
            raise ValueError(f"cannot roll sequence {seq} back to {length} (it holds {self.lengths[seq]})")
        self.lengths[seq] = length

    def reset(self) -> None:
        self.lengths = [0] * len(self.lengths)

    def keep_path(self, seq: int, base: int, slots: list[int]) -> None:
        """Move sequence `seq`'s K/V at `slots` (increasing, each >= base) to base, base + 1, ... in
        order: a token tree's accepted path made contiguous before the rollback to its end.
        Lengths are the caller's; a path already in place moves nothing."""
        if slots == list(range(base, base + len(slots))):
            return
        device = self.k[0].device
        src = torch.tensor(slots, device=device)
        dst = torch.arange(base, base + len(slots), device=device)
        for t in (*self.k, *self.v):  # gather first: a destination may be a later source's slot
            t[seq].index_copy_(1, dst, t[seq].index_select(1, src))

    def view(self, start: int, n: int) -> KVCache:
        """Sequences start .. start + n - 1 as a cache of their own: the same storage (writes land
        here) and a copy of their lengths, which the caller writes back."""
        return KVCache(
            k=[t[start : start + n] for t in self.k],
            v=[t[start : start + n] for t in self.v],
            lengths=self.lengths[start : start + n],
        )


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, hd = args.dim, args.head_dim
        self.head_dim = hd
        self.q_proj = Linear(d, args.n_heads * hd, bias=args.attention_bias)
        self.k_proj = Linear(d, args.n_kv_heads * hd, bias=args.attention_bias)
        self.v_proj = Linear(d, args.n_kv_heads * hd, bias=args.attention_bias)
        self.o_proj = Linear(args.n_heads * hd, d, bias=False)
        # Qwen3: each query and key head RMS-normed over head_dim before rope (weights shared by heads)
        self.q_norm = RMSNorm(hd, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(hd, args.norm_eps) if args.qk_norm else None
        group = args.n_heads // args.n_kv_heads
        self.register_buffer("kv_map", torch.tensor([h // group for h in range(args.n_heads)]), persistent=False)
        # > 0 when local query head h reads local KV head h // gqa_group (contiguous, equal groups):
        # SDPA then reads K/V unexpanded (enable_gqa); 0 = an uneven split, expand with kv_map
        self.gqa_group = group
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = _identity

    @property
    def n_heads(self) -> int:
        return self.q_proj.out_features // self.head_dim

    @property
    def n_kv_heads(self) -> int:
        return self.k_proj.out_features // self.head_dim

    def cache_dims(self) -> tuple[int, int, int]:
        """(cached heads, K width, V width) of one position of this layer's cache."""
        return self.n_kv_heads, self.head_dim, self.head_dim

    values_in_keys = False  # V is a buffer of its own (latent attention's absorbed cache reads V inside K)
    core = "sdpa"  # what the plain model's attention runs (a step reports it where no fused step runs)

    def forward(self, x, cos, sin, mask, k_cache, v_cache, pos):
        """pos [B, T]: each token's position; keys/values are written there (index_copy_: graph-safe)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)
        return self.reduce(self.o_proj(self.attend(q, k, v, mask, k_cache, v_cache, pos)))

    def attend(self, q, k, v, mask, k_cache, v_cache, pos):
        return attend(q, k, v, mask, k_cache, v_cache, pos, self.gqa_group, self.kv_map)


class LatentAttention(nn.Module):
    """DeepSeek-V3's multi-head latent attention (workers/model/args.py `MLAArgs`), heads expanded:

        q        = q_b_proj(RMSNorm(q_a_proj(x)))  (or q_proj(x))     -> per head [nope | rope]
        c, k_pe  = kv_a_proj_with_mqa(x) split [kv_lora_rank | qk_rope]   (k_pe: one head, shared)
        k_nope, v = kv_b_proj(RMSNorm(c)) per head split [qk_nope | v_head_dim]
        k        = [k_nope | rope(k_pe)],  q = [q_nope | rope(q_pe)]
        out      = o_proj(softmax(q k^T * scale) v)        (scale: rope.py `mla_softmax_scale`)

    Two caches (`absorbed`, EngineConfig.mla; the math is the same). Expanded: each head's K (qk_nope +
    qk_rope) and V (v_head_dim), as transformers computes it. Absorbed (`absorb`): one entry per token,
    the normed latent c and the roped k_pe [kv_lora_rank + qk_rope], shared by every head, and V is a
    view of its first kv_lora_rank dims. kv_b_proj's per-head blocks W_UK [qk_nope, kv_lora_rank] and
    W_UV [v_head_dim, kv_lora_rank] move to the query and the output: q_nope . (W_UK c) = (W_UK^T
    q_nope) . c, so scores are [W_UK^T q_nope | q_pe] . [c | k_pe] under the same softmax scale, and the
    head's output is W_UV (softmax . c). A step then reads kv_lora_rank + qk_rope numbers a cached token,
    not heads x (qk_head_dim + v_head_dim). Tensor
    parallelism (workers/model/tp.py): q_b_proj / q_proj and kv_b_proj by heads, o_proj by its
    input columns; the latent down-projections and their norms replicated. The latent norms use
    eps 1e-6 whatever rms_norm_eps (transformers' DeepseekV3RMSNorm default; DeepSeek's code too)."""

    LATENT_NORM_EPS = 1e-6

    def __init__(self, args: ModelArgs):
        super().__init__()
        m = args.mla
        d, H = args.dim, args.n_heads
        self.nope, self.rope, self.v_dim, self.kv_rank = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        self.head_dim = m.qk_head_dim
        self.interleaved = m.rope_interleave
        self.q_lora = m.q_lora_rank is not None
        if not self.q_lora:
            self.q_proj = Linear(d, H * m.qk_head_dim, bias=False)
        else:
            self.q_a_proj = Linear(d, m.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, self.LATENT_NORM_EPS)
            self.q_b_proj = Linear(m.q_lora_rank, H * m.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = Linear(d, m.kv_lora_rank + m.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, self.LATENT_NORM_EPS)
        self.kv_b_proj = Linear(m.kv_lora_rank, H * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = Linear(H * m.v_head_dim, d, bias=False)
        self.scale = mla_softmax_scale(args)
        # one KV head per query head: the same map and SDPA call as plain multi-head attention
        self.register_buffer("kv_map", torch.arange(H), persistent=False)
        self.gqa_group = 1
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = _identity

    @property
    def n_heads(self) -> int:
        return self.o_proj.in_features // self.v_dim

    @property
    def n_kv_heads(self) -> int:
        return self.n_heads

    absorbed = False  # the compressed cache and absorbed projections (`Transformer.absorb_latent_attention`)

    @property
    def values_in_keys(self) -> bool:
        return self.absorbed

    @property
    def core(self) -> str:
        return "shared-entry GEMM (absorbed latent cache)" if self.absorbed else "sdpa"

    def cache_dims(self) -> tuple[int, int, int]:
        """(cached heads, K width, V width) of one position of this layer's cache."""
        if self.absorbed:
            return 1, self.kv_rank + self.rope, self.kv_rank
        return self.n_heads, self.head_dim, self.v_dim

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, dim] -> q [B, T, local heads x (nope + rope)]."""
        if not self.q_lora:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def forward(self, x, cos, sin, mask, k_cache, v_cache, pos):
        """As `Attention.forward`: K (nope + rope) and V of every local head written at `pos`."""
        B, T, _ = x.shape
        H = self.n_heads
        q_nope, q_pe = self.queries(x).view(B, T, H, self.head_dim).transpose(1, 2).split([self.nope, self.rope], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_rank, self.rope], dim=-1)
        latent = self.kv_a_layernorm(latent)
        k_pe = k_pe.view(B, 1, T, self.rope)
        if self.interleaved:
            q_pe, k_pe = deinterleave(q_pe), deinterleave(k_pe)
        q_pe, k_pe = apply_rope(q_pe, cos, sin), apply_rope(k_pe, cos, sin)
        if self.absorbed:
            return self.reduce(self.o_proj(self._absorbed(q_nope, q_pe, latent, k_pe, mask, k_cache, v_cache, pos)))
        kv = self.kv_b_proj(latent).view(B, T, H, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(B, H, T, self.rope)], dim=-1)
        return self.reduce(self.o_proj(self.attend(q, k, v, mask, k_cache, v_cache, pos)))

    def _absorbed(self, q_nope, q_pe, latent, k_pe, mask, k_cache, v_cache, pos):
        """Attention on the compressed cache: q_nope [B, H, T, nope] and q_pe [B, H, T, rope] (roped),
        the normed latent [B, T, kv_rank] and k_pe [B, 1, T, rope] (roped) -> [B, T, H * v_head_dim]."""
        B, H, T, _ = q_nope.shape
        w = self.kv_b_proj.weight.view(H, self.nope + self.v_dim, self.kv_rank)  # this rank's heads
        w_uk, w_uv = w[:, : self.nope], w[:, self.nope :]
        q = torch.cat([torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk), q_pe], dim=-1)
        c = latent[:, None]  # [B, 1, T, kv_rank]: one cached "head" every query head reads
        entry = torch.cat([c, k_pe], dim=-1)
        if mask is None:  # a fresh prefill from position 0: causal over its own T entries
            mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        if isinstance(mask, Packed):  # packed fresh sequences: SDPA's grouped-query path per sequence
            out = attend(q, entry, c, mask, k_cache, v_cache, pos, H, self.kv_map, scale=self.scale)
        else:
            out = attend_shared_entry(q, entry, mask, k_cache, v_cache, pos, self.scale)
        out = torch.einsum("bthr,hvr->bthv", out.view(B, T, H, self.kv_rank), w_uv)
        return out.reshape(B, T, H * self.v_dim)

    def attend(self, q, k, v, mask, k_cache, v_cache, pos):
        return attend(q, k, v, mask, k_cache, v_cache, pos, 1, self.kv_map, scale=self.scale)


def cache_buffers(attn, rows: int, max_seq: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's K and V buffers [rows, cached heads, max_seq, width] as its attention caches them
    (`cache_dims`); where V lives inside K (the absorbed latent cache) V is a view of K's first dims."""
    heads, k_dim, v_dim = attn.cache_dims()
    k = torch.zeros(rows, heads, max_seq, k_dim, dtype=dtype, device=device)
    return k, (k[..., :v_dim] if attn.values_in_keys else torch.zeros(rows, heads, max_seq, v_dim, dtype=dtype, device=device))


def tree_shape(parents: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A token tree's depths and ancestor bits (bit j of bits[i]: entry j is entry i or one of its
    ancestors, what the split-KV attention reads, workers/kernels/attention.py). parents[i]: the
    index of entry i's parent, < i; entry 0 is the one root (-1). Plain Python, a few microseconds:
    with n-gram branches a drafter's trees take many shapes."""
    if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise ValueError(f"a token tree needs parents[0] = -1 and 0 <= parents[i] < i, got {parents}")
    depth, bits = [0], [1]
    for i, p in enumerate(parents[1:], 1):
        depth.append(depth[p] + 1)
        bits.append(bits[p] | 1 << i)
    return tuple(depth), tuple(bits)


def tree_mask(parents: list[int], start: int, width: int) -> torch.Tensor:
    """SDPA's mask [T, width] of a token tree fed at slots start.. : row i sees the cache before
    start and entry i's ancestors, itself included; nothing after."""
    T, bits = len(parents), tree_shape(parents)[1]
    mask = torch.zeros(T, width, dtype=torch.bool)
    mask[:, :start] = True
    mask[:, start : start + T] = torch.tensor([[b >> j & 1 for j in range(T)] for b in bits], dtype=torch.bool)
    return mask


@dataclass(frozen=True)
class Packed:
    """Fresh sequences packed into one row of N tokens (`Transformer.prefill_packed`): sequence s's
    `lengths[s]` tokens are contiguous, token i is at position pos[i] of cache row rows[i], and every
    sequence starts at position 0."""

    rows: torch.Tensor  # [N] cache row of each token
    pos: torch.Tensor  # [N] its position in that row
    lengths: tuple[int, ...]

    @classmethod
    def of(cls, lengths: list[int], device) -> Packed:
        rows = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        pos = torch.cat([torch.arange(n) for n in lengths])
        return cls(rows=rows.to(device), pos=pos.to(device), lengths=tuple(lengths))

    def spans(self) -> Iterator[tuple[int, int, int]]:
        """(row, first token in the packed row, length) of each sequence."""
        start = 0
        for row, n in enumerate(self.lengths):
            yield row, start, n
            start += n


# tokens per batched prefill pass: what bounds its activations (at the Llama-3-8B shape the MLP's
# are ~1.5 GB for 16384 tokens); matrix products of a few thousand rows already run near a GPU's peak
PREFILL_TOKENS = 16384


def prefill_groups(lengths: list[int], budget: int = PREFILL_TOKENS) -> list[range]:
    """Consecutive sequences in passes of at most `budget` tokens (a longer sequence alone): what
    bounds a batched prefill's activations (an MLP's are N x 2 x intermediate_size)."""
    groups: list[range] = []
    start = total = 0
    for i, n in enumerate(lengths):
        if i > start and total + n > budget:
            groups.append(range(start, i))
            start, total = i, 0
        total += n
    if lengths:
        groups.append(range(start, len(lengths)))
    return groups


def _sdpa(q, keys, values, gqa_group: int, kv_map, **how):
    if gqa_group == 1:
        return F.scaled_dot_product_attention(q, keys, values, **how)
    if gqa_group > 1:
        return F.scaled_dot_product_attention(q, keys, values, enable_gqa=True, **how)
    return F.scaled_dot_product_attention(q, keys.index_select(1, kv_map), values.index_select(1, kv_map), **how)


def attend_packed(q, k, v, p: Packed, k_cache, v_cache, gqa_group: int, kv_map, scale: float | None = None):
    """`attend` for packed fresh sequences: q [1, H, N, D], k/v [1, Hkv, N, D] -> [1, N, H * Dv].
    K/V go to their (row, position) slots; then each sequence's queries attend causally to its own
    row's slots 0 .. length - 1, one SDPA call per sequence with the shapes and strides of that
    sequence's prefill alone (flash attention on GPUs), so its outputs are batch 1's bit for bit
    where the kernels are deterministic (a padded call over all rows would sum over other vector
    lanes: float32 on CPUs then differs in the last bits)."""
    N = q.shape[2]
    k_cache[p.rows, :, p.pos] = k[0].transpose(0, 1)  # [N, Hkv, D] into slots (row, :, pos)
    v_cache[p.rows, :, p.pos] = v[0].transpose(0, 1)
    out = [
        _sdpa(
            q[:, :, start : start + n],
            k_cache[row : row + 1, :, :n],
            v_cache[row : row + 1, :, :n],
            gqa_group,
            kv_map,
            is_causal=True,
            scale=scale,
        )
        for row, start, n in p.spans()
    ]
    return torch.cat(out, dim=2).transpose(1, 2).reshape(1, N, -1)


def attend(q, k, v, mask, k_cache, v_cache, pos, gqa_group: int, kv_map, scale: float | None = None):
    """Write k/v [B, Hkv, T, D] / [B, Hkv, T, Dv] at `pos`, attend q [B, H, T, D] to the first
    mask.shape[-1] cache slots; returns [B, T, H * Dv] (before o_proj). A pure function, so
    compiled callers share it. scale: the softmax scale (None: 1 / sqrt(D)).
    mask=None: every sequence starts at position 0 (a fresh prefill), plain causal attention over
    the T new slots, which SDPA runs without a mask (flash attention on GPUs). mask a `Packed`:
    several fresh sequences in one row (`attend_packed`)."""
    if isinstance(mask, Packed):
        return attend_packed(q, k, v, mask, k_cache, v_cache, gqa_group, kv_map, scale)
    B, T = q.shape[0], q.shape[2]
    write_kv(k, v, k_cache, v_cache, pos)
    kv_len = T if mask is None else mask.shape[-1]
    keys, values = k_cache[:, :, :kv_len], v_cache[:, :, :kv_len]
    how = {"is_causal": True} if mask is None else {"attn_mask": mask}
    out = _sdpa(q, keys, values, gqa_group, kv_map, scale=scale, **how)
    return out.transpose(1, 2).reshape(B, T, -1)


def write_kv(k, v, k_cache, v_cache, pos) -> None:
    """k/v [B, Hkv, T, D] into the caches' slots (row, :, pos[row, t]); v None: V lives inside K."""
    B = k.shape[0]
    if B == 1:
        k_cache[0].index_copy_(1, pos[0], k[0])
        if v is not None:
            v_cache[0].index_copy_(1, pos[0], v[0])
    else:  # one scatter for all rows, not 2 x B launches per layer (train-drafter generates 128 rows at once)
        rows = torch.arange(B, device=pos.device)[:, None]
        k_cache[rows, :, pos] = k.transpose(1, 2)  # [B, T, Hkv, D] into slots (row, :, pos[row, t])
        if v is not None:
            v_cache[rows, :, pos] = v.transpose(1, 2)


SHARED_ENTRY_SCORE_BYTES = 256 << 20  # float32 scores `attend_shared_entry` holds at once (a long prefill goes in chunks)


def attend_shared_entry(q, entry, mask, k_cache, v_cache, pos, scale: float):
    """Attention of every query head to one cached entry a token that all heads share (latent
    attention's compressed cache; V is a view of K's first dims): q [B, H, T, D], entry [B, 1, T, D]
    written at `pos`, `mask` (bool, [.., T, L]: True where key j is visible to query t) -> [B, T, H * Dv].

    The H x T queries are the rows of one GEMM against the L cached entries (scores [B, T x H, L]),
    then softmax in float32 and one GEMM against the V view: the cache is read once for all heads,
    where SDPA's grouped-query path would copy it once per head (H = 128 on DeepSeek-V3). Queries go
    in chunks of positions whose scores fit SHARED_ENTRY_SCORE_BYTES (one chunk for any decode or
    verify width; a long prefill is several)."""
    B, H, T, D = q.shape
    write_kv(entry, None, k_cache, v_cache, pos)
    L = mask.shape[-1]
    keys, values = k_cache[:, :, :L], v_cache[:, :, :L]  # [B, 1, L, D], [B, 1, L, Dv]
    step = max(1, SHARED_ENTRY_SCORE_BYTES // (B * H * L * 4))
    out = []
    for t0 in range(0, T, step):
        n = min(step, T - t0)
        rows = q[:, :, t0 : t0 + n].transpose(1, 2).reshape(B, 1, n * H, D)  # row t * H + h: query t of head h
        scores = torch.matmul(rows, keys.transpose(-1, -2)).float().view(B, 1, n, H, L)
        scores.mul_(scale).masked_fill_(~mask[..., t0 : t0 + n, :].unsqueeze(-2), float("-inf"))  # [.., n, 1, L] over the heads
        probs = torch.softmax(scores, dim=-1).to(q.dtype).view(B, 1, n * H, L)
        out.append(torch.matmul(probs, values).view(B, n, H * values.shape[-1]))
    return out[0] if len(out) == 1 else torch.cat(out, dim=1)


def silu_mul(gate_up):
    """SiLU(gate) * up of a merged gate/up projection [..., 2 I] (gate first)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class MLP(nn.Module):
    """SwiGLU of width `inter` (default: the config's intermediate_size; an MoE's shared experts are
    one of width n_shared_experts x moe_intermediate_size, summed with the routed experts before
    the MoE's one allreduce, so their own `reduce` stays the identity)."""

    def __init__(self, args: ModelArgs, inter: int | None = None):
        super().__init__()
        inter = inter or args.intermediate_size
        self.gate_proj = Linear(args.dim, inter, bias=False)
        self.up_proj = Linear(args.dim, inter, bias=False)
        self.down_proj = Linear(inter, args.dim, bias=False)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = _identity

    def forward(self, x):
        return self.reduce(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, args: ModelArgs, moe: bool = False):
        super().__init__()
        self.self_attn = LatentAttention(args) if args.mla else Attention(args)
        if moe:
            shared = args.moe.n_shared_experts * args.moe.intermediate_size
            self.mlp = MoE(args, shared=MLP(args, shared) if shared else None)
        else:
            self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x, cos, sin, mask, k_cache, v_cache, pos):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, k_cache, v_cache, pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class MtpLayer(Block):
    """DeepSeek-V3's multi-token-prediction layer (checkpoint `layers.{num_hidden_layers}.*`): the token
    after position i, embedded (the model's own embedding), and the model's final hidden state at i,
    each normed, joined by `eh_proj`, then a decoder block (sharded as the model's layers are);
    `shared_head.norm` and the model's own lm_head give the logits of the token two ahead. Its
    output also stands in for the model's hidden state at the next depth (a chain of drafts)."""

    def __init__(self, args: ModelArgs):
        super().__init__(args, moe=args.mtp_moe)
        self.enorm = RMSNorm(args.dim, args.norm_eps)
        self.hnorm = RMSNorm(args.dim, args.norm_eps)
        self.eh_proj = Linear(2 * args.dim, args.dim, bias=False)  # [normed embedding; normed hidden] -> dim
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(args.dim, args.norm_eps)

    def join(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(hidden)], dim=-1))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs, max_seq: int = 2048, mtp: bool = False):
        """mtp: also build the checkpoint's first multi-token-prediction layer (`MtpLayer`, the MTP drafter's)."""
        super().__init__()
        self.args = args
        self.embed_tokens = Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, moe=args.is_moe(i)) for i in range(args.n_layers))
        self.mtp = MtpLayer(args) if mtp else None
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.lm_head = Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.gather_vocab: Callable[[torch.Tensor], torch.Tensor] = _identity
        # hidden-state capture (EAGLE-3): the residual stream entering each layer listed here is kept
        # in `aux` (one [B, T, dim] tensor per id, in order) by every pass of `hidden_at`
        self.aux_layers: tuple[int, ...] = ()
        self.aux: list[torch.Tensor] = []
        cos, sin = rope_tables(args, max_seq, device=torch.get_default_device())
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def max_seq(self) -> int:
        return self.rope_cos.shape[0]

    def new_cache(self, batch: int = 1, max_seq: int | None = None) -> KVCache:
        max_seq = max_seq or self.max_seq
        p = self.embed_tokens.weight
        pairs = [cache_buffers(layer.self_attn, batch, max_seq, p.dtype, p.device) for layer in self.layers]
        return KVCache(k=[k for k, _ in pairs], v=[v for _, v in pairs], lengths=[0] * batch)

    def absorb_latent_attention(self, on: bool = True) -> None:
        """Latent attention (DeepSeek-V3) on the compressed cache with absorbed projections, or (off) on
        each head's expanded K/V (EngineConfig.mla); every block, the MTP layer's too. Before any cache."""
        for block in self.blocks():
            if isinstance(block.self_attn, LatentAttention):
                block.self_attn.absorbed = on

    def hidden(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run the layers on `tokens` [B, T] appended at each sequence's cache length; advance the cache.
        Attention reads only the filled part of the cache (dynamic shapes: the eager path)."""
        B, T = tokens.shape
        starts = list(cache.lengths)
        kv_len = max(starts) + T
        if kv_len > min(cache.max_seq, self.max_seq):
            raise ValueError(f"sequence length {kv_len} exceeds the cache ({min(cache.max_seq, self.max_seq)})")
        device = tokens.device
        pos = torch.tensor(starts, device=device)[:, None] + torch.arange(T, device=device)  # [B, T]
        h = self.hidden_at(tokens, pos, cache, kv_len, fresh=not any(starts))
        cache.lengths = [s + T for s in starts]
        return h

    def prefill_packed(self, prompts: list[list[int]], cache: KVCache) -> torch.Tensor:
        """Logits [n, vocab] (float32) after each of n prompts, fed from position 0 into rows 0 .. n - 1
        of `cache` in one pass (eager, any lengths): the tokens packed into one row, so the matrix
        products run on sum(lengths) tokens, no padding (`Packed`, `attend_packed`); the head reads
        each prompt's last position only. Sets the rows' lengths; `aux` holds the packed states
        [1, N, dim] (`packed_rows` cuts one prompt's out)."""
        lengths = [len(p) for p in prompts]
        if not lengths or min(lengths) < 1:
            raise ValueError("a batched prefill needs at least one prompt, each of at least one token")
        if max(lengths) > min(cache.max_seq, self.max_seq):
            raise ValueError(f"sequence length {max(lengths)} exceeds the cache ({min(cache.max_seq, self.max_seq)})")
        device = self.embed_tokens.weight.device
        packed = Packed.of(lengths, device)
        tokens = torch.tensor([t for p in prompts for t in p], device=device)[None]
        last = (torch.tensor(lengths).cumsum(0) - 1).to(device)  # each prompt's last token in the packed row
        cos, sin, _ = self.rope_and_mask(packed.pos[None], 0, masked=False)
        h = self._layers(tokens, cos, sin, packed, packed.pos[None], cache)
        cache.lengths[: len(lengths)] = lengths
        return self.logits(h[0, last])

    def packed_rows(self, lengths: list[int], i: int) -> torch.Tensor:
        """Prompt i's captured aux states [lengths[i], n_aux x dim] after `prefill_packed` of prompts of these lengths."""
        start = sum(lengths[:i])
        return torch.cat([a[0, start : start + lengths[i]] for a in self.aux], dim=-1)

    def hidden_at(self, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache, kv_len: int, fresh: bool = False) -> torch.Tensor:
        """The layers at explicit positions `pos` [B, T], attending to the first `kv_len` cache slots.
        With kv_len = cache.max_seq every shape is static (what a CUDA graph captures); the caller
        keeps `cache.lengths`. fresh: every sequence starts at 0 (causal attention, no mask)."""
        cos, sin, mask = self.rope_and_mask(pos, kv_len, masked=not fresh)
        return self._layers(tokens, cos, sin, mask, pos, cache)

    def _layers(self, tokens, cos, sin, mask, slots, cache: KVCache) -> torch.Tensor:
        """Embedding, every layer (K/V written at `slots`), final norm; aux states captured on the way
        (aux id n_layers: the final normed state, what an MTP layer reads)."""
        x = self.embed_tokens(tokens)
        seen = {}
        for i, (layer, k_cache, v_cache) in enumerate(zip(self.layers, cache.k, cache.v)):
            if i in self.aux_layers:
                seen[i] = x
            x = layer(x, cos, sin, mask, k_cache, v_cache, slots)
        out = self.norm(x)
        if self.aux_layers:
            seen[len(self.layers)] = out
            self.aux = [seen[i] for i in self.aux_layers]
        return out

    def blocks(self) -> list[Block]:
        """Every decoder block this model holds: its layers, then the MTP layer if built."""
        return [*self.layers, *([self.mtp] if self.mtp is not None else [])]

    def tree_logits(self, tokens: list[int], parents: list[int], cache: KVCache) -> torch.Tensor:
        """Logits [T, vocab] of a token tree fed after sequence 0's cached positions (eager).
        parents[i]: the index in `tokens` of entry i's parent, < i; entry 0 (parents[0] = -1) is
        the one root. Entry i is written at slot start + i and rotated at position start + its
        depth; it attends to the cache before start and to its own ancestors, itself included, so
        each entry sees exactly the sequence it would extend. Advances cache.lengths[0] by T; the
        caller keeps an accepted path with `KVCache.keep_path` and rolls back the rest."""
        T, start = len(tokens), cache.lengths[0]
        kv_len = start + T
        if kv_len > min(cache.max_seq, self.max_seq):
            raise ValueError(f"sequence length {kv_len} exceeds the cache ({min(cache.max_seq, self.max_seq)})")
        depth, _ = tree_shape(parents)
        device = self.embed_tokens.weight.device
        slots = torch.arange(start, kv_len, device=device)[None]
        cos, sin, _ = self.rope_and_mask(torch.tensor([depth], device=device) + start, kv_len, masked=False)
        mask = tree_mask(parents, start, kv_len).to(device)[None, None]
        h = self._layers(torch.tensor([tokens], device=device), cos, sin, mask, slots, cache)
        cache.lengths[0] = kv_len
        return self.logits(h)[0]

    def rope_and_mask(self, pos: torch.Tensor, kv_len: int, masked: bool = True):
        """Rope tables at `pos` and the attention mask (None when not `masked`: plain causal)."""
        dtype = self.embed_tokens.weight.dtype  # tables are float32; applied in the model dtype, as HF does
        cos, sin = self.rope_cos[pos][:, None].to(dtype), self.rope_sin[pos][:, None].to(dtype)  # [B, 1, T, D]
        if not masked:
            return cos, sin, None
        # key j is visible to the query at position p iff j <= p (causal, and hides rolled-back entries)
        mask = (torch.arange(kv_len, device=pos.device)[None, None, :] <= pos[:, :, None])[:, None]
        return cos, sin, mask

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.gather_vocab(self.lm_head(h)).float()

    def forward(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits [B, T, vocab] (float32) for every position of `tokens`."""
        return self.logits(self.hidden(tokens, cache))
