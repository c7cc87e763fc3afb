"""Routed experts of a decode / verify step in two grouped Triton kernels, inside CUDA graphs.

A step of T tokens (B rows x (k + 1) drafts) routes each token to `top_k` experts: P = T x top_k
(token, expert) pairs. The step's cost is reading the union of the chosen experts' weights, so the
pairs are grouped by expert and each expert's weights are streamed once for all its pairs:

    pairs sorted by expert (stable), each expert's run padded to a multiple of BLOCK_M
    kernel 1, grid (blocks, INTER / BLOCK_N):  h[p] = silu(x[tok p] . Wg[e]^T) * (x[tok p] . Wu[e]^T)
    kernel 2, grid (blocks, D / BLOCK_N):  y[p] = route_weight[p] * (h[p] . Wd[e]^T)
    out[t] = sum over t's top_k pairs of y (in routing order)

One token (a decode step) skips the grouping: its top_k experts are distinct, so block p is pair p,
its expert read from the ids in the kernels, and the down kernel's last block to store a column block
sums the pairs there (an arrival counter per column block): the two kernels are the whole layer.

Every shape is static (the grouping is a handful of torch ops: bincount, cumsum, a scatter), so
the whole layer is graph-safe. The number of blocks is bounded by ceil(P / BLOCK_M) + min(P, E)
(each expert's run wastes at most one partly filled block); blocks past the used ones find expert
-1 and do no work. Weights are the stacked tensors of workers/model/moe.py (`Experts`):
gate/up [E, I, D], down [E, D, I], row-major.

    out = grouped_experts(x, weights, ids, experts)       # the `ExpertsFn` a step runs
    out = grouped_experts_chunked(x, weights, ids, experts)   # an eager pass's (prefill), in chunks of tokens
    TRITON_INTERPRET=1 python -m workers.kernels.moe --selftest --device cpu   # CPU: against the eager experts
    python -m workers.kernels.moe --bench                         # GPU: configurations and groupings on a Qwen3-30B-A3B layer, its router, and prefill
"""

from __future__ import annotations

import math
import sys

import torch

from workers.kernels.support import arrival_counters, selftest_main
from workers.model.moe import Experts, experts_by_expert

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

BLOCK_M = 16  # pairs per block: tl.dot's smallest M


def group_pairs(ids: torch.Tensor, n_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair id of each padded slot [blocks x block_m], P where padding; expert of each block, -1
    where unused) for expert ids [T, k]. Static shapes: graph-safe."""
    flat = ids.flatten()
    P = flat.numel()
    n_blocks = -(-P // block_m) + min(P, n_experts)
    order = torch.argsort(flat, stable=True)
    expert = flat[order]
    # not bincount: on CUDA it reads the ids' min and max back to the host, which a graph capture refuses
    counts = torch.zeros(n_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    start_padded = torch.cumsum(padded, 0) - padded
    start = torch.cumsum(counts, 0) - counts
    # sorted pair j is the (j - start[e])-th of expert e: it goes to slot start_padded[e] + that rank
    dest = start_padded[expert] + torch.arange(P, device=ids.device) - start[expert]
    slots = n_blocks * block_m
    pair_of_slot = torch.full((slots,), P, dtype=torch.int32, device=ids.device).scatter_(0, dest, order.to(torch.int32))
    expert_of_slot = torch.full((slots,), -1, dtype=torch.int32, device=ids.device).scatter_(0, dest, expert.to(torch.int32))
    # an expert's run starts at a block boundary and fills it from its first slot: a block's first slot names its expert
    return pair_of_slot, expert_of_slot.view(n_blocks, block_m)[:, 0].contiguous()


if triton is not None:

    @triton.jit
    def _block(pair_ptr, block_expert_ptr, b, P, BLOCK_M: tl.constexpr, PER_PAIR: tl.constexpr):
        # block b's expert and its BLOCK_M slots' pair ids (P: padding). PER_PAIR: block b is pair b
        # alone, its expert read from the flat expert ids (no grouping kernels before the experts')
        if PER_PAIR:
            e = tl.load(block_expert_ptr + b).to(tl.int32)
            pair = tl.where(tl.arange(0, BLOCK_M) == 0, b, P)
        else:
            e = tl.load(block_expert_ptr + b)
            pair = tl.load(pair_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M))
        return e, pair

    @triton.jit
    def _gate_up_kernel(
        x_ptr, wg_ptr, wu_ptr, h_ptr, pair_ptr, block_expert_ptr, P, TOP_K: tl.constexpr, D, INTER,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PER_PAIR: tl.constexpr,
    ):  # fmt: skip
        b, n = tl.program_id(0), tl.program_id(1)
        e, pair = _block(pair_ptr, block_expert_ptr, b, P, BLOCK_M, PER_PAIR)
        valid = pair < P
        tok = tl.where(valid, pair // TOP_K, 0)
        offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_base = e.to(tl.int64) * INTER * D
        hi = tl.where(e >= 0, D, 0)  # an unused block streams nothing
        for k0 in range(0, hi, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(x_ptr + tok[:, None] * D + offs_k[None, :], mask=valid[:, None] & (offs_k[None, :] < D), other=0.0)
            wmask = (offs_n[:, None] < INTER) & (offs_k[None, :] < D)
            wg = tl.load(wg_ptr + w_base + offs_n[:, None] * D + offs_k[None, :], mask=wmask, other=0.0)
            wu = tl.load(wu_ptr + w_base + offs_n[:, None] * D + offs_k[None, :], mask=wmask, other=0.0)
            acc_g += tl.dot(xk, tl.trans(wg))
            acc_u += tl.dot(xk, tl.trans(wu))
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        keep = valid[:, None] & (offs_n[None, :] < INTER) & (e >= 0)
        tl.store(h_ptr + pair[:, None].to(tl.int64) * INTER + offs_n[None, :], h.to(h_ptr.dtype.element_ty), mask=keep)

    @triton.jit
    def _down_kernel(
        h_ptr, wd_ptr, route_ptr, y_ptr, pair_ptr, block_expert_ptr, P, D, INTER, out_ptr, cnt_ptr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PER_PAIR: tl.constexpr, SUM: tl.constexpr,
    ):  # fmt: skip
        b, n = tl.program_id(0), tl.program_id(1)
        e, pair = _block(pair_ptr, block_expert_ptr, b, P, BLOCK_M, PER_PAIR)
        valid = pair < P
        row = tl.where(valid, pair, 0).to(tl.int64)
        offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_base = e.to(tl.int64) * D * INTER
        hi = tl.where(e >= 0, INTER, 0)
        for k0 in range(0, hi, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            hk = tl.load(h_ptr + row[:, None] * INTER + offs_k[None, :], mask=valid[:, None] & (offs_k[None, :] < INTER), other=0.0)
            w = tl.load(
                wd_ptr + w_base + offs_n[:, None] * INTER + offs_k[None, :],
                mask=(offs_n[:, None] < D) & (offs_k[None, :] < INTER),
                other=0.0,
            )
            acc += tl.dot(hk, tl.trans(w))
        route = tl.load(route_ptr + row, mask=valid, other=0.0).to(tl.float32)
        y = acc * route[:, None]
        keep = valid[:, None] & (offs_n[None, :] < D) & (e >= 0)
        tl.store(y_ptr + row[:, None] * D + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=keep)
        if SUM:
            # one token, a block per pair: the block that stores its columns last sums the P pairs' rows
            # (in routing order, float32, rounded once: `sum_pairs`), from L2 (".cg"): the other blocks'
            # stores, then one release/acquire arrival per column block (as workers/kernels/attention.py)
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + n, 1, sem="acq_rel", scope="gpu")
            if arrived == P - 1:
                total = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for p in range(P):
                    total += tl.load(y_ptr + p * D + offs_n, mask=offs_n < D, other=0.0, cache_modifier=".cg").to(tl.float32)
                tl.store(out_ptr + offs_n, total.to(out_ptr.dtype.element_ty), mask=offs_n < D)
                tl.store(cnt_ptr + n, 0)  # ready for the next call

    @triton.jit
    def _softmax_top_k_kernel(
        logits_ptr, w_ptr, ids_ptr, E, TOP_K: tl.constexpr, NORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        t = tl.program_id(0)
        offs = tl.arange(0, BLOCK_E)
        valid = offs < E
        x = tl.load(logits_ptr + t * E + offs, mask=valid, other=float("-inf")).to(tl.float32)
        e = tl.where(valid, tl.exp(x - tl.max(x, 0)), 0.0)
        left = tl.where(valid, e / tl.sum(e, 0), -1.0)  # probabilities; -1: taken or no expert
        slot = tl.arange(0, BLOCK_K)
        weights = tl.zeros((BLOCK_K,), dtype=tl.float32)
        ids = tl.zeros((BLOCK_K,), dtype=tl.int64)
        for i in tl.static_range(TOP_K):
            best = tl.max(left, 0)
            pick = tl.min(tl.where(left == best, offs, BLOCK_E), 0)  # the lowest id among equals
            weights = tl.where(slot == i, best, weights)
            ids = tl.where(slot == i, pick.to(tl.int64), ids)
            left = tl.where(offs == pick, -1.0, left)
        if NORM:
            weights = weights / tl.sum(tl.where(slot < TOP_K, weights, 0.0), 0)
        keep = slot < TOP_K
        tl.store(w_ptr + t * TOP_K + slot, weights.to(w_ptr.dtype.element_ty), mask=keep)
        tl.store(ids_ptr + t * TOP_K + slot, ids, mask=keep)


def softmax_top_k(x: torch.Tensor, weight: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """workers/model/moe.py `softmax_top_k` (Qwen3-MoE's router) as the router GEMM and one kernel: the
    softmax, the top k (the lowest id first among equal probabilities), the renormalisation and the cast,
    which torch runs as half a dozen kernels (a width-1 step's floor). Graph-safe, static shapes."""
    logits = torch.nn.functional.linear(x, weight)
    T, E = logits.shape
    weights = torch.empty(T, top_k, dtype=x.dtype, device=x.device)
    ids = torch.empty(T, top_k, dtype=torch.long, device=x.device)
    _softmax_top_k_kernel[(T,)](
        logits, weights, ids, E, TOP_K=top_k, NORM=norm_topk_prob,
        BLOCK_E=triton.next_power_of_2(E), BLOCK_K=triton.next_power_of_2(top_k),
    )  # fmt: skip
    return weights, ids


def grouped_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    experts: Experts,
    group=group_pairs,
    per_pair: bool | None = None,
    block_m: int = BLOCK_M,
    combine=None,
) -> torch.Tensor:
    """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) for x [T, D]: the `ExpertsFn` of a graphed step.
    group: `group_pairs`, or a torch.compile'd copy of it (workers/engine/fused_step.py: its dozen small
    ops become a few kernels, which matters where a step's time is a floor per kernel); per_pair: every
    (token, expert) pair its own block, the kernels reading its expert from `ids` (None: for one token,
    whose top-k experts are distinct, so nothing is read twice; a wider step sorts: an expert with
    several pairs would be read once per pair); block_m: pairs a block takes (a prefill's many pairs an
    expert: fewer blocks, each reading its expert once); combine: the sum of each token's pairs ([T,
    top_k, D] -> [T, D]; `sum_pairs` or a compiled copy). One token a block per pair needs none of
    these: no grouping, and its pairs summed by the down kernel's last block per column block."""
    T, D = x.shape
    top_k = ids.shape[1]
    E, INTER, _ = experts.gate_proj.shape
    P = T * top_k
    per_pair = T == 1 if per_pair is None else per_pair
    if per_pair:
        pair_of_slot, block_expert = ids, ids.contiguous().flatten()  # pair_of_slot unread
    else:
        pair_of_slot, block_expert = group(ids, E, block_m)
    n_blocks = block_expert.numel()
    x = x.contiguous()
    h = torch.empty(P, INTER, dtype=x.dtype, device=x.device)
    y = torch.empty(P, D, dtype=x.dtype, device=x.device)
    one_sum = per_pair and T == 1
    out = torch.empty(1, D, dtype=x.dtype, device=x.device) if one_sum else y  # y: unwritten without SUM
    (bn1, bk1, w1), (bn2, bk2, w2) = CONFIG
    _gate_up_kernel[(n_blocks, triton.cdiv(INTER, bn1))](
        x, experts.gate_proj, experts.up_proj, h, pair_of_slot, block_expert, P, top_k, D, INTER,
        BLOCK_M=block_m, BLOCK_N=bn1, BLOCK_K=bk1, PER_PAIR=per_pair, num_warps=w1,
    )  # fmt: skip
    _down_kernel[(n_blocks, triton.cdiv(D, bn2))](
        h, experts.down_proj, weights.contiguous().flatten(), y, pair_of_slot, block_expert, P, D, INTER,
        out, arrival_counters(triton.cdiv(D, bn2), x.device),
        BLOCK_M=block_m, BLOCK_N=bn2, BLOCK_K=bk2, PER_PAIR=per_pair, SUM=one_sum, num_warps=w2,
    )  # fmt: skip
    return out if one_sum else (combine or sum_pairs)(y.view(T, top_k, D))


def sum_pairs(y: torch.Tensor) -> torch.Tensor:
    """Each token's routed outputs summed, [T, top_k, D] -> [T, D] (in routing order)."""
    return y.sum(dim=1)


PREFILL_TOKENS = 2048  # tokens a grouped call of an eager pass takes at most: bounds its [pairs, I] and [pairs, D] buffers
PREFILL_BLOCK_M = 64  # pairs a block of an eager pass takes: a prefill routes dozens of tokens to each expert


def grouped_experts_chunked(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: Experts, chunk: int | None = None):
    """`grouped_experts` over at most `chunk` (default PREFILL_TOKENS) tokens at a time, PREFILL_BLOCK_M
    pairs a block: the `ExpertsFn` of an eager pass of any length (a prefill), whose routed experts would
    otherwise be a loop of small GEMMs, one per expert hit. A step of few tokens (the MTP drafter's)
    keeps the decode blocks."""
    chunk = chunk or PREFILL_TOKENS
    T = x.shape[0]
    block_m = PREFILL_BLOCK_M if T * ids.shape[1] >= 4 * PREFILL_BLOCK_M else BLOCK_M

    def part(i: int) -> torch.Tensor:
        return grouped_experts(x[i : i + chunk], weights[i : i + chunk], ids[i : i + chunk], experts, block_m=block_m)

    return part(0) if T <= chunk else torch.cat([part(i) for i in range(0, T, chunk)])


def warm_chunked(experts: Experts, top_k: int, dtype: torch.dtype) -> None:
    """Compile `grouped_experts_chunked`'s two block sizes now (a few tokens: BLOCK_M; a prefill's
    many: PREFILL_BLOCK_M), so that no timed prefill pays for Triton's compile (~0.8 s on an H100)."""
    E, _, D = experts.gate_proj.shape
    device = experts.gate_proj.device
    # Triton compiles an integer argument apart when it is a multiple of 16: the pair count P = T * top_k,
    # a multiple of 16 exactly when T is one of m; from the first T of each block size, one T each way
    m = 16 // math.gcd(top_k, 16)
    for first in (1, -(-4 * PREFILL_BLOCK_M // top_k)):
        for T in {first + (first % m == 0), -(-first // m) * m}:
            ids = (torch.arange(T * top_k, device=device) % E).view(T, top_k)
            x, w = torch.zeros(T, D, dtype=dtype, device=device), torch.ones(T, top_k, dtype=dtype, device=device)
            grouped_experts_chunked(x, w, ids, experts)


# (BLOCK_N, BLOCK_K, num_warps) of the gate/up kernel and of the down kernel: narrow column blocks, so
# that a decode step's few experts still give every SM programs to stream weights with (`--bench`)
CONFIG = ((32, 128, 4), (64, 128, 4))
BENCH_CONFIGS = (
    ((32, 128, 4), (64, 128, 4)),
    ((16, 128, 4), (32, 128, 4)),
    ((16, 256, 4), (32, 256, 4)),
    ((32, 256, 8), (64, 256, 8)),
    ((64, 128, 4), (128, 128, 4)),
)


# the benches' layer: Qwen3-30B-A3B's experts (128 of 768 x 2048, top 8), bf16 on the GPU
BENCH_SHAPE = (128, 2048, 768, 8)


def _bench_layers(layers: int, gen: torch.Generator) -> list[Experts]:
    """`layers` layers' random experts of BENCH_SHAPE (several, so that L2 cannot hold them)."""
    E, D, INTER, _ = BENCH_SHAPE
    sets = []
    for _ in range(layers):
        ex = Experts(E, D, INTER).to(device="cuda", dtype=torch.bfloat16)
        for p in ex.parameters():
            p.data.normal_(0, D**-0.5, generator=gen)
        sets.append(ex)
    return sets


def _bench_routing(tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, routing weights, expert ids) of `tokens` tokens, each routed to top_k distinct random experts."""
    E, D, _, top_k = BENCH_SHAPE
    x = torch.randn(tokens, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    ids = torch.stack([torch.randperm(E, device="cuda", generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k, device="cuda", generator=gen), -1).to(torch.bfloat16)
    return x, weights, ids


def _graph_us(run, per: int) -> float:
    """Median microseconds of one CUDA-graph replay of `run()` over 50, divided by `per` (run once
    before the capture: Triton and Inductor compile outside it)."""
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(50):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / per)
    return sorted(times)[len(times) // 2]


def bench_router(widths=(1, 5, 9), layers: int = 4) -> list[dict]:
    """A Qwen3-30B-A3B layer's router (128 experts, top 8, renormalised) and its pairs' sum, per step
    width, as CUDA-graph replays: torch eager, torch.compile'd, and the router kernel (microseconds a layer)."""
    from workers.model import moe as model_moe

    E, D, _, top_k = BENCH_SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    routers = [torch.randn(E, D, device="cuda", dtype=torch.bfloat16, generator=gen) * D**-0.5 for _ in range(layers)]
    ways = {
        "router, eager": model_moe.softmax_top_k,
        "router, compiled": torch.compile(model_moe.softmax_top_k, dynamic=False),
        "router, kernel": softmax_top_k,
        "pairs' sum, eager": sum_pairs,
        "pairs' sum, compiled": torch.compile(sum_pairs, dynamic=False),
    }
    rows = []
    for w in widths:
        x, y = (
            torch.randn(w, D, device="cuda", dtype=torch.bfloat16, generator=gen),
            torch.randn(w, top_k, D, device="cuda", dtype=torch.bfloat16, generator=gen),
        )
        for name, fn in ways.items():
            run = (lambda: [fn(y) for _ in routers]) if "sum" in name else (lambda: [fn(x, r, top_k, True) for r in routers])
            us = _graph_us(run, layers)
            rows.append({"width": w, "way": name, "us": us})
            print(f"width {w}, {name}: {us:.1f} us per layer")
    return rows


def bench(widths=(1, 5, 9), layers: int = 4) -> list[dict]:
    """The grouped experts of a Qwen3-30B-A3B-shaped layer (128 experts of 768 x 2048, top 8, bf16)
    as CUDA-graph replays cycling over `layers` layers' weights (L2 cannot hold them), per kernel
    configuration and step width: microseconds and the fraction of the copy bandwidth that the
    distinct experts' bytes take."""
    from scripts.profile_step import copy_bandwidth  # a developer bench, GPU only

    global CONFIG
    device = torch.device("cuda")
    _, D, INTER, _ = BENCH_SHAPE
    bw = copy_bandwidth(device)
    gen = torch.Generator(device=device).manual_seed(0)
    sets = _bench_layers(layers, gen)
    rows, default = [], CONFIG
    compiled = torch.compile(group_pairs, dynamic=False)
    for w in widths:
        x, weights, ids = _bench_routing(w, gen)
        distinct = int(ids.unique().numel())
        expert_bytes = 3 * INTER * D * 2 * distinct
        # one token: its own grouping (one block per pair) beside the sort every wider step takes, eager
        # and torch.compile'd as the fused step runs it (engine.compile on)
        sort = {"sorted": dict(per_pair=False), "sorted, compiled": dict(per_pair=False, group=compiled)}
        groupings = {"one block per pair": {}, **sort} if w == 1 else sort
        for cfg in BENCH_CONFIGS:
            CONFIG = cfg
            for grouping, how in groupings.items():
                us = _graph_us(lambda: [grouped_experts(x, weights, ids, ex, **how) for ex in sets], layers)
                of_bw = expert_bytes / bw / (us * 1e-6)
                rows.append({"width": w, "distinct": distinct, "config": cfg, "grouping": grouping, "us": us, "of_bandwidth": of_bw})
                print(f"width {w} ({distinct} experts) config {cfg}, {grouping}: {us:.1f} us per layer, {of_bw:.0%} of the copy bandwidth")
    CONFIG = default
    return rows


def bench_prefill(tokens=(190, 2048), layers: int = 4) -> list[dict]:
    """An eager prefill's routed experts on Qwen3-30B-A3B-shaped layers (as `bench`): the loop over the
    chosen experts against the grouped kernel in its prefill blocks (PREFILL_BLOCK_M) and in decode's
    (BLOCK_M), milliseconds per layer (median of 10, CUDA events)."""
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    sets = _bench_layers(layers, gen)
    ways = {
        "loop over experts": experts_by_expert,
        f"grouped, {PREFILL_BLOCK_M} pairs a block": lambda x, w, i, e: grouped_experts(x, w, i, e, block_m=PREFILL_BLOCK_M),
        f"grouped, {BLOCK_M} pairs a block": lambda x, w, i, e: grouped_experts(x, w, i, e, block_m=BLOCK_M),
    }
    rows = []
    for T in tokens:
        x, weights, ids = _bench_routing(T, gen)
        for name, fn in ways.items():
            for ex in sets:
                fn(x, weights, ids, ex)  # compile and warm
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(10):
                start.record()
                for ex in sets:
                    fn(x, weights, ids, ex)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / layers)
            ms = sorted(times)[len(times) // 2]
            rows.append({"tokens": T, "way": name, "ms": ms})
            print(f"prefill of {T} tokens, {name}: {ms:.3f} ms per layer")
    return rows


def available(device: torch.device) -> bool:
    """Whether the grouped kernels run on `device` (CUDA with Triton, or Triton's CPU interpreter)."""
    from workers.kernels.support import interpreted

    return triton is not None and (device.type == "cuda" or interpreted(_gate_up_kernel))


def selftest(device: str) -> float:
    """Worst relative max |grouped - eager| over routing shapes: one token, a verify width, a batch whose
    pairs outnumber the experts, all tokens on one expert."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for name, T, E, top_k, D, INTER in (
        ("decode", 1, 8, 2, 64, 48),
        ("verify", 5, 16, 4, 96, 40),
        ("batch", 24, 6, 2, 64, 32),
        ("one-expert", 7, 4, 1, 32, 16),
    ):
        experts = Experts(E, D, INTER)
        for p in experts.parameters():
            p.data = (torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5).to(dtype)
        experts = experts.to(device)
        x = torch.randn(T, D, generator=gen).to(dtype).to(device)
        ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)]).to(device)
        if name == "one-expert":
            ids.zero_()
        w = torch.softmax(torch.randn(T, top_k, generator=gen), -1).to(dtype).to(device)
        want = experts_by_expert(x, w, ids, experts).float()
        variants = (
            {"": {}, ", sorted": dict(per_pair=False)}
            if T == 1
            else {"": {}, f", {PREFILL_BLOCK_M} pairs a block": dict(block_m=PREFILL_BLOCK_M), ", a block per pair": dict(per_pair=True)}
        )
        for grouping, how in variants.items():
            got = grouped_experts(x, w, ids, experts, **how).float()
            err = (want - got).abs().max().item() / max(1e-6, want.abs().max().item())
            print(f"{name}{grouping}: T={T} E={E} top_k={top_k} relative error {err:.2e}")
            worst = max(worst, err)
    return worst


if __name__ == "__main__":
    if "--bench" in sys.argv:
        import json

        print(json.dumps({"steps": bench(), "router": bench_router(), "prefill": bench_prefill()}))
        sys.exit(0)
    sys.exit(selftest_main(sys.argv[1:], __doc__, selftest, "cuda", {"cpu": 1e-5, "cuda": 2e-2}, "relative max |grouped - eager|"))
