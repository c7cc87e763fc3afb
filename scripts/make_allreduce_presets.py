"""Write the bundled allreduce tables (workers/spec/allreduce_tables/*.json) from the figures and assumptions
stated here; each file repeats its source, date and assumptions in its "source" and "assumes".

    python -m scripts.make_allreduce_presets          # rewrites the three presets
    python -m scripts.make_allreduce_presets --zero .devcarry/zero/zero.json   # the all-zero table of the
                                                      # emulation's overhead check (issue 46 item 3; not a preset)

The presets are what an emulated study (`parallel.emulate_tp`, `parallel.allreduce_table`) waits
for each allreduce. A measured table of your own box (`spectune bench-allreduce --json`) beats
every one of them.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "workers" / "spec" / "allreduce_tables"
DATE = "2026-12-06"
SIZES = [1 << p for p in range(8, 27)]  # 256 B .. 64 MiB: every decode, verify and prefill message of the shapes we emulate
PCIE_BUSBW_GBPS = 20.0  # assumed NCCL ring bus bandwidth of 8 GPUs over PCIe above the latency-bound sizes


def pcie_algbw(world: int = 8) -> float:
    """Bytes per microsecond one ring allreduce moves: busbw x world / (2 (world - 1)) (nccl-tests' rule)."""
    return PCIE_BUSBW_GBPS * 1e3 * world / (2 * (world - 1))


def rows(backend: str, tp: int, times: dict[int, float], note: dict[int, str] | None = None, modes=("graph", "eager")) -> list[dict]:
    out = []
    for mode in modes:
        for s, t in sorted(times.items()):
            row = {"backend": backend, "tp": tp, "mode": mode, "env": "default", "size_bytes": s, "time_us": round(t, 3)}
            if note and s in note:
                row["note"] = note[s]
            out.append(row)
    return out


def pcie() -> dict:
    flat, edge = 24.0, 64 << 10
    times = {s: flat if s <= edge else flat + (s - edge) / pcie_algbw() for s in SIZES}
    note = {s: "published figure" if s <= edge else "assumed: bandwidth-bound" for s in SIZES}
    return {
        "name": "pcie-8x-rtx-pro-6000",
        "date": DATE,
        "source": (
            "public measurements of NCCL allreduce on 8x RTX PRO 6000 over PCIe (no NVLink): ~24 us flat from 256 B to 64 KB "
            "(nccl-tests, out of CUDA graphs). A slower PCIe box for comparison: 45 us at 4 KB on 8x RTX 6000D (not in this table)."
        ),
        "assumes": (
            "1) 24 us at every size from 256 B to 64 KB (the published flat range); "
            f"2) above 64 KB: 24 us + (size - 64 KB) / algbw, with NCCL ring busbw {PCIE_BUSBW_GBPS:g} GB/s "
            f"(algbw = busbw x 8 / 14 = {pcie_algbw() / 1e3:.1f} GB/s), up to 64 MB; "
            "3) the same figures in CUDA graphs and eager (nccl-tests times back-to-back launches; their launch cost is small beside 24 us); "
            "4) TP 8 only, backend nccl only, the default NCCL environment."
        ),
        "rows": rows("nccl", 8, times, note),
    }


def seeds() -> dict:
    flat, edge = 200.0, 1 << 20
    times = {s: flat if s <= edge else flat + (s - edge) / pcie_algbw() for s in SIZES}
    return {
        "name": "seeds-tp8-pcie",
        "date": DATE,
        "source": (
            "the deployment this project was started for, as observed: TP 8 over PCIe, a ~30 ms verify step spent 97% in "
            "122 NCCL allreduces of ~200 us each (one figure, at that model's message sizes)"
        ),
        "assumes": (
            "1) 200 us at every size from 256 B to 1 MB (the observation gives one latency, not a curve); "
            f"2) above 1 MB: 200 us + (size - 1 MB) / algbw with the PCIe preset's assumed busbw {PCIE_BUSBW_GBPS:g} GB/s, up to 64 MB; "
            "3) the same figures in CUDA graphs and eager; 4) TP 8 only, backend nccl only."
        ),
        "rows": rows("nccl", 8, times),
    }


def nvlink() -> dict:
    """TP 2 graph rows measured on an H200 pair (results/2026-11-30/decode-backends-h200/bench_allreduce.json), extended."""
    src = Path(__file__).resolve().parents[1] / "results" / "2026-11-30" / "decode-backends-h200" / "bench_allreduce.json"
    measured = [r for r in json.loads(src.read_text()) if r["env"] == "default"]
    out = []
    for backend in ("nccl", "symm_mem", "symm_mem_ll"):
        for mode in ("graph", "eager"):
            pts = {int(r["size_bytes"]): float(r["time_us"]) for r in measured if r["backend"] == backend and r["mode"] == mode}
            lo, hi = min(pts), max(pts)
            (s0, t0), (s1, t1) = sorted(pts.items())[-2:]
            per_byte = max(0.0, (t1 - t0) / (s1 - s0))  # the last two measured sizes' slope: bandwidth-bound
            times, note = dict(pts), {s: "measured, TP 2" for s in pts}
            for s in SIZES:
                if s < lo:
                    times[s], note[s] = pts[lo], f"extrapolated: the {lo} B figure (latency-bound below it)"
                elif s > hi:
                    times[s], note[s] = pts[hi] + (s - hi) * per_byte, "extrapolated: the last measured slope"
            if backend != "nccl" and hi < max(SIZES):  # one-shot symmetric memory is limited to 8 MiB messages
                times = {s: t for s, t in times.items() if s <= 8 << 20}
            for tp in (2, 4, 8):
                tp_note = note if tp == 2 else {s: f"extrapolated: the TP 2 figure ({n})" for s, n in note.items()}
                out += rows(backend, tp, times, tp_note, modes=(mode,))
    return {
        "name": "nvlink-h200",
        "date": DATE,
        "source": (
            "this project's own measurements: spectune bench-allreduce --device cuda --tp 2 on 2 NVIDIA H200 with NVLink, "
            "torch 2.11, CUDA 13, NCCL 2.28, bf16, NVLS off (results/2026-11-30/decode-backends-h200/bench_allreduce.json; "
            "8 KB in CUDA graphs: nccl 6.5 us, symm_mem 6.2 us, symm_mem_ll 3.3 us)"
        ),
        "assumes": (
            "1) TP 2 rows from 8 KB to 4 MB are measured (graph and eager, default NCCL environment); "
            "2) below 8 KB the 8 KB figure (latency-bound); above 4 MB the last measured slope, to 64 MB for nccl and 8 MB for the "
            "one-shot symm_mem backends; 3) TP 4 and TP 8 rows repeat the TP 2 figures: unmeasured, a lower bound (more ranks never "
            "make an allreduce faster), so an emulated TP 4 or 8 study on this table sees the least allreduce time an NVLink box can give; "
            "an H100 NVLink box is taken to match the H200's (same NVLink generation)."
        ),
        "rows": out,
    }


def zero() -> dict:
    """Every allreduce free: an emulated TP N on it measures the emulation's own overhead."""
    out = []
    for tp in (1, 2, 4, 8):
        out += rows("nccl", tp, {s: 0.0 for s in SIZES})
    return {
        "name": "zero",
        "date": DATE,
        "source": "all-zero latencies: the emulation's own overhead check (issue 46 item 3)",
        "assumes": "every allreduce free",
        "rows": out,
    }


def main() -> None:
    import sys

    if sys.argv[1:2] == ["--zero"]:
        path = Path(sys.argv[2])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(zero()) + "\n")
        print(f"{path}: {len(zero()['rows'])} rows")
        return
    OUT.mkdir(parents=True, exist_ok=True)
    for table in (pcie(), seeds(), nvlink()):
        (OUT / f"{table['name']}.json").write_text(json.dumps(table, indent=1) + "\n")
        print(f"{OUT / table['name']}.json: {len(table['rows'])} rows")


if __name__ == "__main__":
    main()
