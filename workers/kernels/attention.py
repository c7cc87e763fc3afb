"""Split-KV ("flash-decoding") attention for decode / verify steps, in Triton, graph-safe.

A step scores T <= 32 new tokens against a static KV cache. SDPA with a position mask reads all
`max_seq` slots and first turns the boolean mask into an additive one (profiled on H200, Llama-3-8B
shape, 512 slots: 9 us of cuDNN attention + 1 us of mask conversion per layer, of a 160 us layer).
Here each query token's last visible key is its position, read from the device tensor `pos`, so a
CUDA graph captured once reads only the filled part of the cache at every replay.

    one kernel, grid (B * H / G, n_split): split s covers keys [s * CHUNK, (s + 1) * CHUNK) up to
        max(pos) + 1; for all T queries of G heads that read one KV head (G = the GQA group where
        its G x T rows fit one 16-row tile, as at a batched decode step; else G = 1: the K/V tile
        is loaded once for the group, not once a head) it keeps the running max m, the sum l of
        exp(score - m) and acc = sum exp(score - m) * v (online softmax), and stores (m, l, acc)
        for its T rows. A split past the row's last position (most of a static cache's grid at a
        short context) returns without storing or counting: what every split's padded rows would store
        grows with B x H x the cache's slots, not with the keys the step reads.
    combine, by the head's last live split to finish (a per-head arrival counter, reset by that split):
        m* = max_s m_s, out = sum_s exp(m_s - m*) acc_s / sum_s exp(m_s - m*) l_s, which is exactly
        softmax(scores) @ V over all visible keys. (A separate combine kernel cost ~3 us a layer
        on the H200, nearly all launch floor.)

A key j is visible to the query at position p iff j <= p (causal inside the step, and rolled-back
slots beyond the sequence are never read). A token tree (EAGLE's tree drafts) writes its T entries
at consecutive slots from `first` = pos[0]; with `tree_bits` [B, T] the query of entry t also needs
bit (j - first) of tree_bits[t] for a key j >= first: its ancestors, itself included, and no
sibling's branch. The prefix before `first` stays visible to every entry. Query heads map to KV heads through `kv_map` (GQA and
uneven tensor-parallel head splits alike). `decode_attend` has `workers.model.transformer.attend`'s signature
(it writes K/V into the cache the same way) and ignores the mask.

    python -m workers.checks.attention_check --selftest       # GPU: against SDPA, several shapes
    python -m pytest tests/test_kernels_attention.py           # the same cases as tests (CPU: Triton's interpreter)
"""

from __future__ import annotations

import math

import torch

from workers.kernels.support import arrival_counters

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without Triton: `available()` says no, SDPA is used
    triton = None

MAX_T = 32  # query tokens per step (MAX_DRAFT_TOKENS + 1 <= 17 fits)
GROUP_ROWS = 16  # a GQA group's heads share a program where their G x T query rows fit one 16-row tile


def available(head_dim: int, device: torch.device) -> str | None:
    """None if the Triton path can run for this head size on this device, else why not."""
    if triton is None:
        return "Triton is not installed"
    if device.type != "cuda":
        return "the Triton attention runs on CUDA (CPU only under TRITON_INTERPRET=1, for tests)"
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} is not a power of two in [16, 256]"
    return None


def _chunk(max_seq: int) -> int:
    # 128 keys per split up to 2048 slots (<= 16 splits), then at most 16 larger splits
    return max(128, triton.next_power_of_2(triton.cdiv(max_seq, 16)))


if triton is not None:

    @triton.jit
    def _partial(
        Q,
        K,
        V,
        POS,
        BITS,
        KVMAP,
        M,
        L,
        ACC,
        CNT,
        OUT,
        NG,
        T,
        NSPLIT,
        scale,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        sks,
        svb,
        svh,
        svs,
        sob,
        sot,
        G: tl.constexpr,
        CHUNK: tl.constexpr,
        BLOCK_N: tl.constexpr,
        T_PAD: tl.constexpr,
        D: tl.constexpr,
        TREE: tl.constexpr,
    ):
        # one program: the G query heads g * G .. g * G + G - 1 of row b (they read one KV head), over
        # one split of the keys; its query rows r = i * T + t are head g * G + i's token t
        bg = tl.program_id(0)
        split = tl.program_id(1)
        b = bg // NG
        g = bg % NG
        kvh = tl.load(KVMAP + g * G)
        r = tl.arange(0, T_PAD)
        t = r % T
        h = g * G + r // T
        d = tl.arange(0, D)
        tmask = r < G * T
        pos = tl.load(POS + b * T + t, mask=tmask, other=-1).to(tl.int32)  # loop bounds below stay int32
        if TREE:  # query t also needs bit (j - first) of bits[t] set for a key j in the step's own slots
            first = tl.load(POS + b * T)
            bits = tl.load(BITS + b * T + t, mask=tmask, other=0).to(tl.int32)
        last = tl.max(pos, axis=0)  # the row's last query position: keys past it are never read
        # splits holding visible keys; the rest of the grid (a static cache's tail) returns at once (a
        # position past the cache, a caller's bug, must still leave the arrival counter reset)
        live = tl.minimum(last // CHUNK + 1, NSPLIT)
        if split < live:
            start = split * CHUNK
            end = tl.minimum(start + CHUNK, last + 1)
            q = tl.load(Q + b * sqb + h[:, None] * sqh + t[:, None] * sqt + d[None, :], mask=tmask[:, None], other=0.0)
            m_i = tl.full([T_PAD], float("-inf"), tl.float32)
            l_i = tl.zeros([T_PAD], tl.float32)
            acc = tl.zeros([T_PAD, D], tl.float32)
            k_base = K + b * skb + kvh * skh
            v_base = V + b * svb + kvh * svh
            for n0 in range(start, end, BLOCK_N):
                n = n0 + tl.arange(0, BLOCK_N)
                k = tl.load(k_base + n[:, None] * sks + d[None, :], mask=(n < end)[:, None], other=0.0)
                s = tl.dot(q, tl.trans(k)) * scale  # [T_PAD, BLOCK_N], float32
                visible = (n[None, :] <= pos[:, None]) & tmask[:, None]
                if TREE:
                    rel = n[None, :] - first  # < 0: the cache before the step, seen by every entry
                    bit = (bits[:, None] >> tl.minimum(tl.maximum(rel, 0), 31)) & 1
                    visible = visible & ((rel < 0) | (bit != 0))
                s = tl.where(visible, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet stay 0
                alpha = tl.exp(m_i - m_safe)
                p = tl.exp(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                v = tl.load(v_base + n[:, None] * svs + d[None, :], mask=(n < end)[:, None], other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            # only the G x T query rows are stored and combined (T_PAD pads them for the tensor cores)
            row = (bg * NSPLIT + split) * T_PAD + r
            tl.store(M + row, m_i, mask=tmask)
            tl.store(L + row, l_i, mask=tmask)
            tl.store(ACC + row[:, None] * D + d[None, :], acc, mask=tmask[:, None])
            # every thread's stores above, then one release/acquire arrival: the live split that arrives
            # last sees all the head's (m, l, acc) and combines them (the CUTLASS semaphore pattern)
            tl.debug_barrier()
            arrived = tl.atomic_add(CNT + bg, 1, sem="acq_rel", scope="gpu")
            if arrived == live - 1:
                _combine(M, L, ACC, OUT, bg, b, h, t, tmask, NSPLIT, live, sob, sot, T_PAD, D)
                tl.store(CNT + bg, 0)  # ready for the next call (the next layer, the next replay)

    @triton.jit
    def _combine(M, L, ACC, OUT, bg, b, h, t, tmask, NSPLIT, live, sob, sot, T_PAD: tl.constexpr, D: tl.constexpr):
        # the live splits' partials (the first `live` of NSPLIT) were written by other SMs: read them
        # from L2 (".cg"), not L1; padding rows (not tmask) were never stored and are not read
        r = tl.arange(0, T_PAD)
        d = tl.arange(0, D)
        m_all = tl.full([T_PAD], float("-inf"), tl.float32)
        for s in range(live):
            m_all = tl.maximum(m_all, tl.load(M + (bg * NSPLIT + s) * T_PAD + r, mask=tmask, other=float("-inf"), cache_modifier=".cg"))
        m_all = tl.where(m_all == float("-inf"), 0.0, m_all)  # padding rows only
        l_all = tl.zeros([T_PAD], tl.float32)
        acc = tl.zeros([T_PAD, D], tl.float32)
        for s in range(live):
            row = (bg * NSPLIT + s) * T_PAD + r
            w = tl.exp(
                tl.load(M + row, mask=tmask, other=float("-inf"), cache_modifier=".cg") - m_all
            )  # 0 for a split with nothing visible (m = -inf)
            l_all += w * tl.load(L + row, mask=tmask, other=0.0, cache_modifier=".cg")
            acc += w[:, None] * tl.load(ACC + row[:, None] * D + d[None, :], mask=tmask[:, None], other=0.0, cache_modifier=".cg")
        out = acc / tl.where(l_all == 0.0, 1.0, l_all)[:, None]
        tl.store(OUT + b * sob + t[:, None] * sot + h[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty), mask=tmask[:, None])

    @triton.jit
    def _rope_write(
        QKV,
        COS,
        SIN,
        POS,
        QOUT,
        KC,
        VC,
        T,
        NQ,
        NKV,
        sxb,
        sxt,
        scb,
        sct,
        ssb,
        sst,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        sks,
        svb,
        svh,
        svs,
        QW,
        KW,
        eps,
        HALF: tl.constexpr,
        QK_NORM: tl.constexpr,
    ):
        # one program per (token, head) of the merged QKV projection [B, T, (NQ + 2 NKV) * D]:
        # [QK_NORM: RMS-norm the q or k head with QW / KW, rounded as `rms_norm` rounds: the normed
        # value to the dtype, then its product with the weight]; rotate q and k ("rotate half":
        # y1 = x1 cos1 - x2 sin1, y2 = x2 cos2 + x1 sin2, in float32 and rounded once), q to QOUT
        # [B, NQ, T, D], k and v into the caches at the token's position
        bt = tl.program_id(0)
        j = tl.program_id(1)
        b = bt // T
        t = bt % T
        d = tl.arange(0, HALF)
        src = QKV + b * sxb + t * sxt + j * (2 * HALF)
        x1 = tl.load(src + d).to(tl.float32)
        x2 = tl.load(src + HALF + d).to(tl.float32)
        if QK_NORM:
            if j < NQ + NKV:
                dt = QOUT.dtype.element_ty
                r = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
                w1 = tl.where(j < NQ, tl.load(QW + d), tl.load(KW + d)).to(tl.float32)
                w2 = tl.where(j < NQ, tl.load(QW + HALF + d), tl.load(KW + HALF + d)).to(tl.float32)
                x1 = ((x1 * r).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
                x2 = ((x2 * r).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
        y1, y2 = x1, x2
        if j < NQ + NKV:
            c = COS + b * scb + t * sct
            sn = SIN + b * ssb + t * sst
            y1 = x1 * tl.load(c + d).to(tl.float32) - x2 * tl.load(sn + d).to(tl.float32)
            y2 = x2 * tl.load(c + HALF + d).to(tl.float32) + x1 * tl.load(sn + HALF + d).to(tl.float32)
        p = tl.load(POS + b * T + t)
        if j < NQ:
            dst = QOUT + b * sqb + j * sqh + t * sqt
        elif j < NQ + NKV:
            dst = KC + b * skb + (j - NQ) * skh + p * sks
        else:
            dst = VC + b * svb + (j - NQ - NKV) * svh + p * svs
        tl.store(dst + d, y1.to(QOUT.dtype.element_ty))
        tl.store(dst + HALF + d, y2.to(QOUT.dtype.element_ty))


def decode_attend(q, k, v, mask, k_cache, v_cache, pos, gqa_group: int, kv_map, tree_bits=None):
    """`workers.model.transformer.attend` for T <= MAX_T: write k/v [B, Hkv, T, D] at `pos` [B, T], attend
    q [B, H, T, D] to each query's visible cache slots; returns [B, T, H * D]. `mask` is unused;
    tree_bits: a token tree's ancestor bits (module docstring)."""
    _check_width(q.shape[2])
    for b in range(q.shape[0]):
        k_cache[b].index_copy_(1, pos[b], k[b])
        v_cache[b].index_copy_(1, pos[b], v[b])
    return attend_cache(q, k_cache, v_cache, pos, kv_map, tree_bits, gqa_group=gqa_group)


def rope_write_attend(
    qkv, cos, sin, k_cache, v_cache, pos, n_heads: int, n_kv_heads: int, kv_map, tree_bits=None, gqa_group: int = 0, qk_norm=None
):
    """One step's attention from the merged QKV projection `qkv` [B, T, (H + 2 Hkv) * D]: rope on q
    and k, k/v written into the caches at `pos` and q to a fresh tensor, all in one kernel (in place
    of two rope kernels and two cache writes per layer), then the split-KV attention. cos/sin:
    [B, 1, T, D] at each token's rotary position (`Transformer.rope_and_mask`; a tree entry's is its
    depth, not its slot). tree_bits: as `attend_cache`. qk_norm: (q weight [D], k weight [D], eps) of
    Qwen3's per-head RMSNorm before rope, applied in the same kernel. Returns [B, T, H * D]."""
    B, T, _ = qkv.shape
    D = k_cache.shape[-1]
    _check_width(T)
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    pos = pos.contiguous()
    q = torch.empty(B, n_heads, T, D, dtype=qkv.dtype, device=qkv.device)
    _rope_write[(B * T, n_heads + 2 * n_kv_heads)](
        qkv,
        cos,
        sin,
        pos,
        q,
        k_cache,
        v_cache,
        T,
        n_heads,
        n_kv_heads,
        qkv.stride(0),
        qkv.stride(1),
        cos.stride(0),
        cos.stride(2),
        sin.stride(0),
        sin.stride(2),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        *(qk_norm or (q, q, 0.0)),  # unread without QK_NORM
        HALF=D // 2,
        QK_NORM=qk_norm is not None,
    )
    return attend_cache(q, k_cache, v_cache, pos, kv_map, tree_bits, gqa_group=gqa_group)


decode_attend.with_rope = rope_write_attend  # what workers/engine/fused_step.py uses when given decode_attend


def _check_width(T: int) -> None:
    # before any cache write: a step too wide for the kernels must leave the cache untouched
    if T > MAX_T:
        raise ValueError(f"decode attention takes at most {MAX_T} tokens per step, not {T}")


def attend_cache(q, k_cache, v_cache, pos, kv_map, tree_bits=None, gqa_group: int = 0):
    """q [B, H, T, D] against the caches (already holding this step's k/v) up to each query's position.
    tree_bits [B, T] (integers, bit i: entry i visible): the step is a token tree at consecutive
    slots from pos[:, 0], and each entry sees only the entries its bits name (its ancestors).
    gqa_group > 0: local query head h reads KV head h // gqa_group (`Attention.gqa_group`); then one
    program takes a whole group's heads where they fit one tile (module docstring), else one a head."""
    B, H, T, D = q.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    pos = pos.contiguous()
    if tree_bits is not None:
        tree_bits = tree_bits.contiguous()
    S = k_cache.shape[2]
    chunk = _chunk(S)
    nsplit = triton.cdiv(S, chunk)
    G = gqa_group if gqa_group > 1 and gqa_group * T <= GROUP_ROWS else 1
    t_pad = max(16, triton.next_power_of_2(G * T))
    NG = H // G
    f32 = dict(dtype=torch.float32, device=q.device)
    m = torch.empty(B * NG * nsplit * t_pad, **f32)
    lsum = torch.empty_like(m)
    acc = torch.empty(B * NG * nsplit * t_pad * D, **f32)
    out = torch.empty(B, T, H * D, dtype=q.dtype, device=q.device)
    _partial[(B * NG, nsplit)](
        q,
        k_cache,
        v_cache,
        pos,
        pos if tree_bits is None else tree_bits,  # unread without TREE
        kv_map,
        m,
        lsum,
        acc,
        arrival_counters(B * NG, q.device),
        out,
        NG,
        T,
        nsplit,
        1.0 / math.sqrt(D),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        G=G,
        CHUNK=chunk,
        BLOCK_N=64,
        T_PAD=t_pad,
        D=D,
        TREE=tree_bits is not None,
    )
    return out
