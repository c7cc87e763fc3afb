"""Where one decode run's wall time goes at TP 1: a torch.profiler trace of the timed run and a table of
what the host does while the GPU waits.

    python -m scripts.trace_decode --model random:llama-3-8b --device cuda --drafter eagle3 \
        --draft-model HEAD --draft-placement rank0 -k 4 --simulate-accept-len 3 --out DIR
    python -m scripts.trace_decode --drafter ngram -k 4 --max-new-tokens 16 --out DIR   # CPU
    python -m scripts.trace_decode ... --batch-size 8 --out DIR   # batched decoding: 8 prompts on 8 rows

The verifier rank runs in this process (the gang's Worker, world size 1: the same engine, drafter
and step strategy as `spectune decode --tp 1`; a drafter in its own process is not traced). After a
warm-up run, one prompt (--batch-size B: B prompts together) decodes under the profiler. Each spec step's phases are labelled in the
trace (`spectune.propose`, `.verify`, `.decide`, `.publish`: workers/engine/strategies.py; the
device loop, workers/engine/device_loop.py, has no `.publish`, and its `.decide` holds the wait for
the verify pass while the next chain is queued; batched decoding, workers/engine/batched.py, labels
`.propose`, `.verify` and `.decide`, the last with every row's publish). Written
to DIR: trace.json (chrome://tracing or Perfetto) and summary.json; printed: the run's wall time, the
time some kernel ran (the union of kernel intervals), and, per phase, its host time and the GPU idle
time inside it: what a fused verify + accept + draft would have to remove.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

PHASES = ("spectune.propose", "spectune.verify", "spectune.decide", "spectune.publish")


def busy_intervals(kernels: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals, merged and sorted."""
    out: list[list[float]] = []
    for s, e in sorted(kernels):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def overlap(busy: list[tuple[float, float]], s: float, e: float) -> float:
    """How long the intervals `busy` cover inside [s, e)."""
    return sum(max(0.0, min(e, b) - max(s, a)) for a, b in busy)


def summarize(events: list[dict]) -> dict:
    """From chrome-trace events (microseconds): the window of the timed run, the GPU's busy time in
    it, and per phase label its count, host time and GPU idle time within its spans."""
    gpu_work = ("kernel", "gpu_memcpy", "gpu_memset")
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") in gpu_work]
    # the host's spans (cat user_annotation); the profiler mirrors each label on the GPU's timeline too
    # (gpu_user_annotation), which is not host time
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation"]
    spans = {p: [(e["ts"], e["ts"] + e["dur"]) for e in host if e.get("name") == p] for p in PHASES}
    marks = [s for v in spans.values() for s in v]
    if not marks:
        return {"steps": 0}
    start, end = min(s for s, _ in marks), max(e for _, e in marks)
    busy = busy_intervals([(max(s, start), min(e, end)) for s, e in kernels if e > start and s < end])
    wall = end - start
    gpu = sum(e - s for s, e in busy)
    by_name: dict[str, list[float]] = {}  # kernel name -> [count, total us] inside the window
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel" and start <= e["ts"] < end:
            c = by_name.setdefault(e["name"], [0, 0.0])
            c[0], c[1] = c[0] + 1, c[1] + e["dur"]
    phases = {}
    for p, v in spans.items():
        host = sum(e - s for s, e in v)
        idle = host - sum(overlap(busy, s, e) for s, e in v) if kernels else None
        phases[p.removeprefix("spectune.")] = {"count": len(v), "host_ms": host / 1e3, "gpu_idle_ms": None if idle is None else idle / 1e3}
    steps = len(spans["spectune.verify"])
    return {
        "steps": steps,
        "wall_ms": wall / 1e3,
        "gpu_busy_ms": gpu / 1e3 if kernels else None,
        "gpu_idle_ms": (wall - gpu) / 1e3 if kernels else None,
        "per_step_ms": {"wall": wall / 1e3 / max(1, steps), "gpu_idle": (wall - gpu) / 1e3 / max(1, steps) if kernels else None},
        "phases": phases,
        "top_kernels": [
            {"name": n[:120], "count": c, "total_ms": t / 1e3} for n, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    from orchestrator.decode.flags import DecodeRun
    from orchestrator.decode.run import plan
    from orchestrator.errors import UserError
    from workers.runtime.worker import Rendezvous, Worker

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--draft-placement", default="rank0")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--simulate-accept-len", type=float, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--category", default="writing")
    ap.add_argument("--batch-size", type=int, default=1, help="> 1: that many prompts decode together (batched decoding)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    given = {  # the YAML fields of `spectune decode`'s flags (orchestrator/decode/flags.py)
        "model.path": a.model,
        "parallel.device": a.device,
        "drafter.kind": a.drafter,
        "drafter.model_path": a.draft_model,
        "drafter.placement": a.draft_placement,
        "drafter.num_draft_tokens": a.k,
        "workload.simulate_accept_len": a.simulate_accept_len,
        "workload.max_new_tokens": a.max_new_tokens,
        "workload.categories": [a.category],
        "workload.num_prompts": a.batch_size,
        "workload.batch_sizes": a.batch_size,  # plan() takes the flag's one B
    }
    try:
        p = plan(given, DecodeRun())
    except UserError as e:
        print(f"trace_decode: {e}", file=sys.stderr)
        return 2
    if p.gang.world_size != 1:
        print(
            "trace_decode: the drafter runs in its own process here; trace an in-rank drafter (--draft-placement rank0, ngram)",
            file=sys.stderr,
        )
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        worker = Worker(0, p.gang)
        worker.setup(Rendezvous(file=str(Path(tmp) / "store")))
        prompts = p.token_ids[: a.batch_size]
        worker.run(replace(p.workload, prompts=prompts, max_new_tokens=8, eos_ids=()))  # warm-up: every step taken
        activities = [torch.profiler.ProfilerActivity.CPU]
        if a.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            result = worker.run(replace(p.workload, prompts=prompts))
        prof.export_chrome_trace(str(out / "trace.json"))
    summary = summarize(json.loads((out / "trace.json").read_text())["traceEvents"])
    summary["options"] = vars(a)
    summary["throughput_tok_s"] = result.metrics.get("throughput_tok_s") if result else None
    summary["accept_len_mean"] = result.metrics.get("accept_len_mean") if result else None
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
