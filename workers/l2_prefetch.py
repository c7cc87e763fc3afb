"""Pull the next GEMM's weight into L2 while the GPU waits on something that is not memory.

A TP decode step streams each weight once, but between the GEMMs the HBM sits idle: the
allreduce (a few µs of NVLink round trips on one or two SMs), attention over a short cache, the
norms. On an H200 that is ~0.8 ms of a 3.1 ms Llama-3-8B step at TP 2 (profile in README). Here a
side stream of the CUDA graph is forked as such a window opens, and a small kernel there asks L2
for the first `budget` bytes of the weight the next GEMM reads, so that GEMM finds them in L2:

    main:  ... down GEMM -> allreduce (+ add + norm) ----------> QKV GEMM (its first MB hit L2)
    side:                 \\-> prefetch(first MB of next QKV) /

The kernel issues `prefetch.global.L2` per 128-byte line: no registers wait on the data, so a few
programs queue megabytes in a microsecond and leave the SMs to the window's own kernel. Under
Triton's CPU interpreter (tests) it reads the same lines with plain loads instead, so the line
arithmetic is checked: every byte of the window is covered, and nothing past it.

    pf = L2Prefetch(budget_bytes, device)   # None budget -> SPECTUNE_L2_PREFETCH_MB (default 0 = off)
    pf.fork(weight)                          # at a window's start (inside or outside graph capture)
    pf.join()                                # before the step's output is read
    python -m workers.l2_prefetch --bench    # GPU: the gain on a synthetic window + GEMM chain
    TRITON_INTERPRET=1 python -m workers.l2_prefetch --selftest
"""
from __future__ import annotations

import os
import sys

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

LINE = 32  # bytes per request: one L2 sector (a 128-byte line fills by 32-byte sectors)
LINES_PER_PROGRAM = 1024  # 128 KB per program
BLOCK = 256  # lines per inner step (one per thread with 8 warps)

if triton is not None:

    @triton.jit
    def _prefetch(SRC, SINK, n_lines, LINE_ELEMS: tl.constexpr, BLOCK: tl.constexpr, STEPS: tl.constexpr,
                  USE_ASM: tl.constexpr, ASM: tl.constexpr):
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], tl.int32)
        for i in tl.static_range(STEPS):
            line = (pid * STEPS + i) * BLOCK + tl.arange(0, BLOCK)
            ptr = SRC + line.to(tl.int64) * LINE_ELEMS
            if USE_ASM:  # fire and forget: the data goes to L2, no register waits for it
                ptr = SRC + tl.minimum(line, n_lines - 1).to(tl.int64) * LINE_ELEMS
                acc += tl.inline_asm_elementwise(ASM, "=r,l", [ptr],
                                                 dtype=tl.int32, is_pure=False, pack=1)
            else:  # the interpreter: read each line's first element (the same addresses)
                acc += tl.load(ptr, mask=line < n_lines, other=0).to(tl.int32)
        tl.store(SINK + pid, tl.sum(acc))


ASMS = {"evict_last": "prefetch.global.L2::evict_last [$1];\n mov.u32 $0, 0;",
        "plain": "prefetch.global.L2 [$1];\n mov.u32 $0, 0;",
        "load": "ld.global.cg.b32 $0, [$1];"}  # a real load (waits for its data)


def prefetch(w: torch.Tensor, nbytes: int, sink: torch.Tensor, use_asm: bool = True, asm: str = "evict_last") -> int:
    """Ask L2 for the first `nbytes` of contiguous `w` (whole lines); returns the programs launched."""
    flat = w.reshape(-1)
    elem = flat.element_size()
    n_lines = min(-(-min(nbytes, flat.numel() * elem) // LINE), flat.numel() * elem // LINE)
    if n_lines <= 0:
        return 0
    programs = -(-n_lines // LINES_PER_PROGRAM)
    if programs > sink.numel():
        raise ValueError(f"prefetch of {nbytes} bytes needs {programs} sink slots, have {sink.numel()}")
    _prefetch[(programs,)](flat, sink, n_lines, LINE_ELEMS=LINE // elem, BLOCK=BLOCK,
                           STEPS=LINES_PER_PROGRAM // BLOCK, USE_ASM=use_asm, ASM=ASMS[asm], num_warps=BLOCK // 32)
    return programs


def budget_from_env() -> int:
    """Bytes per window from SPECTUNE_L2_PREFETCH_MB (0, the default, turns prefetching off)."""
    raw = os.environ.get("SPECTUNE_L2_PREFETCH_MB", "0")
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"SPECTUNE_L2_PREFETCH_MB={raw!r} is not a number of megabytes") from None
    if mb < 0:
        raise ValueError(f"SPECTUNE_L2_PREFETCH_MB={raw!r} is negative")
    return int(mb * 2**20)


class L2Prefetch:
    """Forks weight prefetches onto a side stream; a no-op without CUDA or with a zero budget."""

    def __init__(self, budget: int | None, device: torch.device, serial: bool = False, asm: str = "evict_last"):
        self.budget = budget_from_env() if budget is None else budget
        self.serial, self.asm = serial, asm
        self.on = bool(self.budget) and device.type == "cuda" and triton is not None
        self.forked = False
        if self.on:
            self.side = torch.cuda.Stream(device)
            self.sink = torch.zeros(-(-self.budget // (LINE * LINES_PER_PROGRAM)) + 1, dtype=torch.int32, device=device)

    def fork(self, w: torch.Tensor) -> None:
        if not self.on or not w.is_contiguous():  # a strided view would need a copy first
            return
        if self.serial:  # bench: in line, before the window's own kernel
            prefetch(w, self.budget, self.sink, asm=self.asm)
            return
        main = torch.cuda.current_stream()
        self.side.wait_stream(main)  # after everything queued so far (the previous GEMM)
        with torch.cuda.stream(self.side):
            prefetch(w, self.budget, self.sink, asm=self.asm)
        self.forked = True

    def join(self) -> None:
        if self.forked:
            torch.cuda.current_stream().wait_stream(self.side)
            self.forked = False


def selftest(device: str = "cpu") -> float:
    """The lines the kernel touches (plain-load variant): 0 if exactly the window's first bytes."""
    worst = 0.0
    for n_elems, nbytes in ((35_000, 10_000), (35_000, 1 << 30), (786_432, 2 * 128 * 1024 + 300)):
        # int32 words: each line's first word is 1 inside the window and 1000 past it
        per_line = LINE // 4
        lines = min(-(-min(nbytes, n_elems * 4) // LINE), n_elems * 4 // LINE)
        w = torch.zeros(n_elems, dtype=torch.int32)
        w[::per_line] = 1000
        w[: lines * per_line : per_line] = 1
        sink = torch.zeros(64, dtype=torch.int32, device=device)
        programs = prefetch(w.to(device), nbytes, sink, use_asm=False)
        got = int(sink[:programs].sum())
        print(f"{n_elems * 4} bytes, window {nbytes}: {programs} programs, {lines} lines, {got} read")
        worst = max(worst, abs(got - lines))
    return float(worst)


def bench(window_us: float, budgets_mb: list[float], log=print, variants=(("side", "evict_last"),),
          roles=("qkv", "o", "gate_up", "down"), tps=(2, 1)) -> list[dict]:
    """A chain of (window, GEMM) pairs as one CUDA graph, Llama-3-8B's TP 2 and TP 1 shapes: µs
    per pair with the next weight's first `budget` MB prefetched during the window, against none.
    The window is a one-thread spin kernel (torch.cuda._sleep), like a one-program allreduce."""
    rows = []
    cycles = int(window_us * 1.98e3)  # H200 SM clock ~1.98 GHz
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    for tp in tps:
        shapes = {"qkv": (6144 // tp, 4096), "o": (4096, 4096 // tp), "gate_up": (28672 // tp, 4096), "down": (4096, 14336 // tp)}
        for name in roles:
            N, K = shapes[name]
            layers = 8
            ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
            xs = x if K == 4096 else torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
            base = None
            for mb, (where, asm) in [(0.0, variants[0])] + [(mb, v) for v in variants for mb in budgets_mb]:
                pf = L2Prefetch(int(mb * 2**20), torch.device("cuda"), serial=where == "serial", asm=asm)

                def chain():
                    for w in ws:
                        torch.cuda._sleep(cycles)
                        pf.fork(w)
                        torch.nn.functional.linear(xs, w)
                    pf.join()

                chain()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    chain()
                for _ in range(3):
                    g.replay()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(20):
                    g.replay()
                e.record()
                e.synchronize()
                us = s.elapsed_time(e) * 1e3 / (20 * layers)
                base = us if base is None else base
                rows.append({"tp": tp, "role": name, "N": N, "K": K, "window_us": window_us, "budget_mb": mb, "us": us,
                             "where": where, "asm": asm})
                log(f"tp={tp} {name:>7} [{N}x{K}] {N * K * 2 / 2**20:6.1f} MB, window {window_us} us, {where:>6} {asm:>10} {mb:5.1f} MB: "
                    f"{us:6.2f} us per window + GEMM ({base - us:+.2f} us)")
            del ws
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--bench" in argv:
        import argparse
        import json

        ap = argparse.ArgumentParser(description="L2 prefetch during a window before each GEMM (CUDA graphs)")
        ap.add_argument("--bench", action="store_true")
        ap.add_argument("--window-us", type=float, nargs="+", default=[5.0])
        ap.add_argument("--budget-mb", type=float, nargs="+", default=[8, 16, 24, 32])
        ap.add_argument("--variants", nargs="+", default=["side:evict_last"], help="where:asm (side|serial : evict_last|plain|load)")
        ap.add_argument("--roles", nargs="+", default=["qkv", "o", "gate_up", "down"])
        ap.add_argument("--tp", type=int, nargs="+", default=[2, 1])
        ap.add_argument("--json")
        a = ap.parse_args(argv)
        if triton is None or not torch.cuda.is_available():
            sys.exit("l2_prefetch --bench: needs a CUDA GPU and Triton")
        variants = tuple(tuple(v.split(":")) for v in a.variants)
        rows = [r for wu in a.window_us for r in bench(wu, a.budget_mb, variants=variants, roles=a.roles, tps=a.tp)]
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f)
        return
    from workers.triton_support import selftest_main

    selftest_main(argv, __doc__, selftest, "cpu", {"cuda": 0, "cpu": 0}, "l2_prefetch")


if __name__ == "__main__":
    main()
