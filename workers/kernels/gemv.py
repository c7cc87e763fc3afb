"""Skinny GEMMs of decode / verify steps (T <= 32 token rows) in Triton, used per weight shape only
where they replay faster than cuBLAS in a CUDA graph.

A decode step multiplies 1..k+1 rows by every weight once, so each GEMM is a matrix-vector
product bound by streaming the weight. cuBLAS reaches 93-97% of HBM bandwidth on the large MLP
weights of Llama-3-8B but ~75% on QKV (50 MB) and o_proj (34 MB, plus a split-K reduction
kernel) at TP 1 (H200 profile, README), and those shrink by the TP degree. Here

    y[t, n] = sum_k x[t, k] W[n, k] (+ b[n])      W: [N, K] row-major (an nn.Linear weight)

one program per BLOCK_N output columns and K-split: it streams its [BLOCK_N, K / SPLIT_K] slice of
W in BLOCK_K chunks through tensor cores (the T rows padded to 16), accumulating in float32. With
SPLIT_K > 1 each split stores its partial sums, and the split of a column block that arrives
last (a release/acquire counter, as in workers/kernels/attention.py) adds them in split order and
writes y: deterministic, and no reduction kernel. The SWIGLU epilogue saves a kernel: W is the
merged [gate; up] projection and each program accumulates a gate block and the matching up block,
writing silu(gate) * up (the MLP's SiLU kernel is gone).

`GemvPicker` decides per (role, T) on the first call outside graph capture: it checks each Triton
configuration against cuBLAS (`F.linear`) on the real weights, then times 8 calls cycling through
three layers' weights (so L2 cannot hold them) as a CUDA graph, and keeps the fastest; cuBLAS
wins ties. Its mode is `EngineConfig.gemv` (workers/spec/engine_config.py): auto races, cublas or
triton force the choice inside the same layout; off builds no picker (workers/engine/fused_step.py
then keeps the GEMMs inside its compiled bodies).

    picker = GemvPicker(weights_by_role, mode="auto")   # role -> [W of layer 0, W of layer 1, ...]
    y = picker.linear("qkv", x, w, b)
    act = picker.swiglu("gate_up", h, w_gate_up)
    TRITON_INTERPRET=1 python -m workers.kernels.gemv --selftest   # CPU: every configuration against F.linear
    python -m workers.kernels.gemv --bench --tp 1 2                 # GPU: cuBLAS vs each config, Llama-3-8B's step GEMMs
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from workers.kernels.support import arrival_counters, counters_all_zero, selftest_main
from workers.model.transformer import silu_mul as fused_silu_mul

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

MAX_T = 32
# (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages): the fastest of a 72-configuration sweep on
# Llama-3-8B's step GEMMs at TP 1 and 2, T = 1 and 5 (H200, `--bench --sweep`): split K for the
# small weights (enough programs to cover 132 SMs), no split for the big ones
CONFIGS = (
    (32, 128, 4, 2, 4),
    (64, 128, 4, 2, 4),
    (32, 128, 2, 2, 4),
    (32, 128, 2, 4, 5),
    (64, 128, 1, 2, 4),
    (32, 128, 1, 4, 3),
    (32, 256, 1, 4, 5),
    (64, 256, 1, 4, 5),
)

if triton is not None:

    @triton.jit
    def _epilogue(Y, y, t, n, tm, nm, syt):
        # y [T_PAD, BLOCK_N] in the output type, stored where the rows and columns exist
        tl.store(Y + t[:, None] * syt + n[None, :], y, mask=tm[:, None] & nm[None, :])

    @triton.jit
    def _swiglu(g, u, ty: tl.constexpr):
        # silu(gate) * up as the unfused MLP rounds it: gate and up to the weight type, silu rounded, product rounded
        g = g.to(ty).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(ty).to(tl.float32)
        return (s * u.to(ty).to(tl.float32)).to(ty)

    @triton.jit
    def _gemv(
        X,
        W,
        B,
        Y,
        PART,
        CNT,
        T,
        N,
        K,
        sxt,
        swn,
        syt,
        T_PAD: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLIT_K: tl.constexpr,
        SWIGLU: tl.constexpr,
        HAS_BIAS: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        t = tl.arange(0, T_PAD)
        nm = n < N
        tm = t < T
        ty = Y.dtype.element_ty
        per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
        k_lo = pid_k * per_split
        k_hi = tl.minimum(k_lo + per_split, K)
        acc = tl.zeros([T_PAD, BLOCK_N], tl.float32)
        acc_up = tl.zeros([T_PAD, BLOCK_N], tl.float32)  # SWIGLU: W's rows N + n (the up half)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            km = kk < k_hi
            x = tl.load(X + t[:, None] * sxt + kk[None, :], mask=tm[:, None] & km[None, :], other=0.0)
            w = tl.load(W + n[:, None] * swn + kk[None, :], mask=nm[:, None] & km[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w))
            if SWIGLU:
                wu = tl.load(W + (N + n)[:, None] * swn + kk[None, :], mask=nm[:, None] & km[None, :], other=0.0)
                acc_up += tl.dot(x, tl.trans(wu))
        if SPLIT_K == 1:
            if HAS_BIAS:
                acc += tl.load(B + n, mask=nm, other=0.0).to(tl.float32)[None, :]
            y = _swiglu(acc, acc_up, ty) if SWIGLU else acc.to(ty)
            _epilogue(Y, y, t, n, tm, nm, syt)
        else:  # (SWIGLU runs with SPLIT_K = 1 only)
            part = PART + (pid_n * SPLIT_K + pid_k) * T_PAD * BLOCK_N + t[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            tl.store(part, acc)
            # every thread's partials, then one release/acquire arrival per split; the last one of
            # this column block adds all splits in split order (the same bits whichever comes last)
            tl.debug_barrier()
            arrived = tl.atomic_add(CNT + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                total = tl.zeros([T_PAD, BLOCK_N], tl.float32)
                for s in range(SPLIT_K):
                    src = PART + (pid_n * SPLIT_K + s) * T_PAD * BLOCK_N + t[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                    total += tl.load(src, cache_modifier=".cg")
                if HAS_BIAS:
                    total += tl.load(B + n, mask=nm, other=0.0).to(tl.float32)[None, :]
                _epilogue(Y, total.to(ty), t, n, tm, nm, syt)
                tl.store(CNT + pid_n, 0)  # ready for the next call


SMEM_BYTES = 232448  # shared memory per block on Hopper (sm_90)


def runs_config(config, swiglu: bool, t_pad: int = 16) -> bool:
    """The SwiGLU epilogue needs the whole K sum in one program (no split), and its second weight
    tile must fit the pipeline's shared memory: (stages - 1) x (weight tiles + x tile), bf16 (an
    estimate that matched the one refusal seen: (64, 256, 1, 4, 5) with SwiGLU asked the H200 for
    294912 bytes). The picker also skips any configuration that fails to compile."""
    block_n, block_k, split_k, _, stages = config
    tiles = (stages - 1) * ((2 if swiglu else 1) * block_n * block_k + t_pad * block_k) * 2
    return (not swiglu or split_k == 1) and tiles <= SMEM_BYTES


def gemv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, config=CONFIGS[0], swiglu: bool = False) -> torch.Tensor:
    """x [..., K] @ w[N, K]^T (+ b) with one Triton config. swiglu: w is a merged gate/up [2I, K]
    and the result silu(x @ gate^T) * (x @ up^T) [..., I]."""
    block_n, block_k, split_k, warps, stages = config
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    T = x2.shape[0]
    N, K = w.shape
    t_pad = max(16, triton.next_power_of_2(T))
    if swiglu:
        if N % 2 or b is not None or not runs_config(config, swiglu, t_pad):
            raise ValueError(f"gemv: SwiGLU takes an even number of weight rows, no bias and a config without split K, not {N}, {config}")
        N //= 2
    if T > MAX_T or w.stride(1) != 1 or x2.shape[1] != K:
        raise ValueError(f"gemv takes at most {MAX_T} rows of width {K} and a row-major weight")
    y = torch.empty(T, N, dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(N, block_n)
    part = torch.empty(blocks * split_k * t_pad * block_n if split_k > 1 else 1, dtype=torch.float32, device=x.device)
    cnt = arrival_counters(blocks, x.device) if split_k > 1 else part
    _gemv[(blocks, split_k)](
        x2,
        w,
        b if b is not None else w,
        y,
        part,
        cnt,
        T,
        N,
        K,
        x2.stride(0),
        w.stride(0),
        y.stride(0),
        T_PAD=t_pad,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT_K=split_k,
        SWIGLU=swiglu,
        HAS_BIAS=b is not None,
        num_warps=warps,
        num_stages=stages,
    )
    return y.view(*lead, N)


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, swiglu: bool, silu_fn=fused_silu_mul) -> torch.Tensor:
    return silu_fn(F.linear(x, w)) if swiglu else F.linear(x, w, b)


def _key(role: str, x: torch.Tensor, w: torch.Tensor) -> tuple:
    """What a picker decision is for: the role, the step width (token rows) and the weight's shape."""
    return role, x.numel() // x.shape[-1], tuple(w.shape)


class GemvPicker:
    """cuBLAS or a Triton configuration per (role, T), by a checked, timed race on first use.
    mode: auto (race), cublas or triton (forced): `EngineConfig.gemv` other than off."""

    def __init__(self, weights_by_role: dict[str, list[torch.Tensor]], mode: str, log=None, silu_mul=None):
        self.weights = weights_by_role
        self.silu_mul = silu_mul or fused_silu_mul  # the cuBLAS path's SiLU * up (a compiled kernel in FusedStep)
        if mode not in ("auto", "cublas", "triton"):
            raise ValueError(f"GEMV picker mode must be auto, cublas or triton, not {mode!r}")
        self.mode = mode
        self.choice: dict[tuple, tuple | None] = {}  # (role, T, weight shape) -> Triton config or None (cuBLAS)
        self.log = log if log is not None else (lambda line: print(line, file=sys.stderr, flush=True))

    def linear(self, role: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        config = self._config(role, x, w, b, False)
        return _reference(x, w, b, False) if config is None else gemv(x, w, b, config)

    def swiglu(self, role: str, x: torch.Tensor, w_gate_up: torch.Tensor) -> torch.Tensor:
        """silu(x @ gate^T) * (x @ up^T) of a merged [gate; up] weight."""
        config = self._config(role, x, w_gate_up, None, True)
        return _reference(x, w_gate_up, None, True, self.silu_mul) if config is None else gemv(x, w_gate_up, None, config, True)

    def prepare(self, widths, roles=None) -> None:
        """Decide every role (or those named in `roles`) at these step widths now, on random inputs
        and the first layer's weight: the races compile and time kernels for seconds, which must not
        happen between two TP ranks' allreduces (StepRunner.warm calls this, then lines the ranks up)."""
        for role, ws in self.weights.items():
            if not ws or (roles is not None and role not in roles):
                continue
            w = ws[0]
            for T in widths:
                x = torch.randn(T, w.shape[1], dtype=w.dtype, device=w.device) / w.shape[1] ** 0.5
                self._config(role, x, w, None, role == "gate_up")

    def _config(self, role, x, w, b, swiglu):
        key = _key(role, x, w)
        if key not in self.choice:
            if x.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return None  # no race inside a capture: cuBLAS
            self.choice[key] = self._decide(key, x, w, b, swiglu)
        return self.choice[key]

    def _decide(self, key, x, w, b, swiglu) -> tuple | None:
        role, T, _ = key
        if self.mode == "cublas" or triton is None or T > MAX_T:
            return None
        if x.device.type != "cuda" and self.mode != "triton":  # CPU: Triton only when forced (interpreter tests)
            return None
        want = _reference(x, w, b, swiglu).float()
        ok = []
        for config in CONFIGS:  # a configuration that is not exact to bf16 rounding is never timed
            if not runs_config(config, swiglu, max(16, triton.next_power_of_2(T))):
                continue
            try:
                got = gemv(x, w, b, config, swiglu).float()
            except Exception as e:  # noqa: BLE001 - a config this GPU cannot compile is skipped
                self.log(f"spectune: gemv {role} {tuple(w.shape)}: config {config} failed ({type(e).__name__})")
                continue
            if ((got - want).abs() <= 2e-2 * want.abs().max().clamp(min=1.0)).all():
                ok.append(config)
        if not ok:
            return None
        if self.mode == "triton":
            return ok[0]
        ws = [v for v in self.weights.get(role, []) if v.shape == w.shape][:3] or [w]
        try:
            cublas_us = _graph_us(lambda i: _reference(x, ws[i % len(ws)], b, swiglu, self.silu_mul))
            timed = {c: _graph_us(lambda i, c=c: gemv(x, ws[i % len(ws)], b, c, swiglu)) for c in ok}
        except Exception as e:  # noqa: BLE001 - a race that cannot run leaves cuBLAS in place
            self.log(f"spectune: gemv {role} {tuple(w.shape)}: timing failed ({type(e).__name__}: {e}); cuBLAS")
            return None
        fastest = min(timed, key=timed.get)
        best = fastest if timed[fastest] < cublas_us * 0.97 else None  # cuBLAS keeps ties (within 3%)
        self.log(
            f"spectune: gemv {role} T={T} {tuple(w.shape)}: "
            + ("Triton" if best else "cuBLAS")
            + f" (cuBLAS {cublas_us:.2f} us, Triton {fastest} {timed[fastest]:.2f} us)"
        )
        return best


def _graph_us(call, calls: int = 8, replays: int = 20) -> float:
    """Microseconds per call of `call(i)` (i = 0..calls-1) replayed as one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(2):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)


SELFTEST_SHAPES = ((1, 96, 384), (5, 40, 256), (17, 64, 640), (3, 200, 1000))  # T, N, K: ragged against every block size
SELFTEST_TOL = {"cuda": 2e-2, "cpu": 1e-4}  # relative; bf16 on the GPU, float32 under the CPU interpreter


def check_config(shape: tuple[int, int, int], swiglu: bool, config, device: str, seed: int = 0) -> float:
    """Largest error of one configuration against F.linear (with a bias, or the SwiGLU epilogue),
    relative to the largest output, over two calls; asserts the split-K counters are back at zero."""
    T, N, K = shape
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=gen).to(device, dtype)
    w = (torch.randn(2 * N if swiglu else N, K, generator=gen) / K**0.5).to(device, dtype)
    b = None if swiglu else torch.randn(N, generator=gen).to(device, dtype)
    want = _reference(x, w, b, swiglu).float()
    worst = 0.0
    for _ in range(2):  # twice: split-K counters must be back at zero
        got = gemv(x, w, b, config, swiglu).float()
        worst = max(worst, ((got - want).abs().max() / want.abs().max().clamp(min=1.0)).item())
    assert counters_all_zero(), f"{config}: a split-K counter was left set"
    return worst


def selftest(device: str = "cpu") -> float:
    """Every configuration on every SELFTEST_SHAPES shape, plain (with bias) and SwiGLU (one line each
    shape); the worst error. tests/test_kernels_gemv.py runs the same checks one by one."""
    worst = 0.0
    for i, shape in enumerate(SELFTEST_SHAPES):
        for swiglu in (False, True):
            configs = [c for c in CONFIGS if runs_config(c, swiglu)]
            worst = max([worst, *(check_config(shape, swiglu, c, device, seed=i) for c in configs)])
            print("T={} N={} K={} ".format(*shape) + f"swiglu={swiglu}: {len(configs)} configs, worst relative error {worst:.2e}")
    return worst


def step_shapes(config: dict, tp: int) -> dict[str, tuple[int, int, bool]]:
    """role -> (N, K, swiglu) of one TP rank's step GEMM weights for an HF config dict (merged QKV and
    gate/up column-parallel, o_proj and down row-parallel; KV heads replicated below one per rank)."""
    dim, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    hd = config.get("head_dim") or dim // heads
    q, kv_rank = heads // tp * hd, max(1, kv // tp) * hd
    return {
        "qkv": (q + 2 * kv_rank, dim, False),
        "o": (dim, q, False),
        "gate_up": (2 * inter // tp, dim, True),
        "down": (dim, inter // tp, False),
    }


# a wider net for `--bench --sweep` (which configurations are worth a place in CONFIGS)
SWEEP = tuple(
    (bn, bk, sk, w, st) for bn in (16, 32, 64) for bk in (128, 256) for sk in (1, 2, 4) for w, st in ((2, 4), (4, 3), (4, 5), (8, 4))
)


def bench(model: str, tps: list[int], widths: list[int], log=print, configs=CONFIGS, roles=None) -> list[dict]:
    """cuBLAS against every Triton configuration on a model's step GEMMs, as CUDA graphs over three
    copies of each weight (as the picker races them): µs per call and GB/s of weight streamed."""
    from workers.model.random_weights import random_config

    config = random_config(model if model.startswith("random:") else "random:" + model)
    rows = []
    for tp in tps:
        for role, (N, K, swiglu) in step_shapes(config, tp).items():
            if role not in (roles or ("qkv", "o", "gate_up", "down")):
                continue
            ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5 for _ in range(3)]
            for T in widths:
                x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
                gb = N * K * 2 / 1e9
                cands = [("cublas", None)] + [(str(c), c) for c in configs if runs_config(c, swiglu)]
                for name, c in list(cands):
                    # ws is bound as a default: the closure must not see the loop's later `del ws`
                    call = (
                        (lambda i, ws=ws: _reference(x, ws[i % 3], None, swiglu))
                        if c is None
                        else (lambda i, c=c, ws=ws: gemv(x, ws[i % 3], None, c, swiglu))
                    )
                    try:
                        us = _graph_us(call)
                    except Exception as e:  # noqa: BLE001 - a config this GPU cannot build: say so, go on
                        log(f"tp={tp} {role} T={T}: {name} failed ({type(e).__name__})")
                        cands.remove((name, c))
                        continue
                    rows.append(
                        {
                            "tp": tp,
                            "role": role,
                            "N": N,
                            "K": K,
                            "T": T,
                            "swiglu": swiglu,
                            "kernel": name,
                            "us": us,
                            "gb_s": gb / (us * 1e-6),
                        }
                    )
                best = min((r for r in rows[-len(cands) :]), key=lambda r: r["us"])
                base = rows[-len(cands)]["us"]
                top = sorted(rows[-len(cands) + 1 :], key=lambda r: r["us"])[:4]
                log(
                    f"tp={tp} {role:>7} [{N}x{K}] T={T}: cuBLAS {base:6.2f} us ({rows[-len(cands)]['gb_s']:5.0f} GB/s), "
                    f"best {best['kernel']} {best['us']:6.2f} us ({best['gb_s']:5.0f} GB/s); Triton's fastest: "
                    + ", ".join(f"{r['kernel']} {r['us']:.2f}" for r in top)
                )
            del ws
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--bench" in argv:
        import argparse
        import json

        ap = argparse.ArgumentParser(description="cuBLAS against the Triton GEMV on a model's step GEMMs (CUDA graphs)")
        ap.add_argument("--bench", action="store_true")
        ap.add_argument("--model", default="llama-3-8b", help="a random: preset or config.json (shapes only)")
        ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
        ap.add_argument("--widths", type=int, nargs="+", default=[1, 5])
        ap.add_argument("--json", help="write every row here")
        ap.add_argument("--sweep", action="store_true", help=f"time {len(SWEEP)} configurations instead of CONFIGS' {len(CONFIGS)}")
        ap.add_argument("--roles", nargs="+", choices=["qkv", "o", "gate_up", "down"])
        a = ap.parse_args(argv)
        if triton is None or not torch.cuda.is_available():
            sys.exit("gemv --bench: needs a CUDA GPU and Triton (the kernels are timed as CUDA graphs)")
        rows = bench(a.model, a.tp, a.widths, configs=SWEEP if a.sweep else CONFIGS, roles=a.roles)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f)  # one line: infra/gpu-measure.sh reads each JSON file's last line
        return
    selftest_main(argv, __doc__, selftest, "cpu", SELFTEST_TOL, "gemv")


if __name__ == "__main__":
    main()
