"""Where the time of one decode / verify step goes on a GPU: replay times and a kernel table.

    python -m scripts.profile_step --model random:llama-3-8b --widths 1 5 --max-seq 512 [--json OUT.json]
    python -m scripts.profile_step --model random:llama-3-8b --tp 2 --backend nccl symm_mem symm_mem_ll
    python -m scripts.profile_step --model random:llama-3-8b --rows 32 --context 294 --max-seq 400 [--json OUT.json]

TP 1 runs in this process (no Ray, no gang). With --tp N each rank is a process built as a gang's
verifier rank (workers.runtime.worker.Worker, vocab-parallel head), per backend: the ranks replay the same
graphs in lockstep (their collectives pair up), time them with the allreduce and as compute-only
graphs (the no-op ablation), and rank 0 reports its kernel table. For each step width it times CUDA-graph replays of the
step (CUDA events, median of many) for the compiled fused path with each attention core
(`--attention triton sdpa`), optionally the plain model (`--plain`), and the full
`StepRunner.step` call (host work included); then it profiles the compiled step's kernels with
torch.profiler and prints the top kernels by total time, with their count per step. The weight
bytes over the measured copy bandwidth give the roofline each time is compared with.

With --rows B (TP 1) it profiles batched decoding's pass instead (workers/engine/batched.py `BatchSteps`):
B rows at --context positions each, width 1, as the batched decode replays it: the graph replay, the
pass as the decode loop calls it (staging, replay, the argmax crossing to the host), the kernel table,
and each GEMM of the step alone through cuBLAS at B rows; the roofline adds the KV bytes the rows read.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def copy_bandwidth(device) -> float:
    """Bytes per second of a device-to-device copy (read + write counted), 2 GiB buffers."""
    x = torch.empty(1 << 31, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize(device)
    bw = 2 * x.numel() * 10 / (time.perf_counter() - t0)
    del x, y
    torch.cuda.empty_cache()
    return bw


def streamed_bytes(model) -> int:
    """Bytes a step reads from weights: every parameter but the embedding table (one row is read),
    unless the head shares it."""
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if p.data_ptr() in seen or (name == "embed_tokens.weight" and not model.args.tie_embeddings):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def replay_ms(graph, device, iters: int = 200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def step_call_ms(runner, width: int, iters: int = 200) -> float:
    """The whole `StepRunner.step` (token staging, graph replay, argmax sync), as the engine calls it."""
    times = []
    for _ in range(iters):
        runner.cache.lengths[0] = 0
        t0 = time.perf_counter()
        int(runner.step([1] * width)[-1].argmax())
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def kernel_rows(run, reps: int = 5, unit: str = "step") -> list[dict]:
    """The CUDA kernels of `run()` (replayed `reps` times under torch.profiler), by total time:
    {"kernel", "us_per_<unit>", "count_per_<unit>"} per kernel name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages():
        t = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        if t > 0:
            rows.append({"kernel": evt.key[:90], f"us_per_{unit}": t / reps, f"count_per_{unit}": evt.count / reps})
    rows.sort(key=lambda r: -r[f"us_per_{unit}"])
    return rows


def kernel_table(runner, width: int, top: int) -> tuple[list[dict], float, float]:
    rows = kernel_rows(lambda: runner._run_static(width))
    return rows[:top], sum(r["us_per_step"] for r in rows), sum(r["count_per_step"] for r in rows)


def _tp_rank(rank: int, tp: int, init_file: str, spec_kwargs: dict, widths: list[int], top: int, queue) -> None:
    """One verifier rank of a TP profile (spawned): graph replays with and without the allreduce."""
    try:
        from workers.engine.steps import StepGraph
        from workers.runtime.worker import Rendezvous, Worker
        from workers.spec import GangSpec

        worker = Worker(rank, GangSpec(**spec_kwargs))
        info = worker.setup(Rendezvous(file=init_file))
        runner = worker.verifier.steps
        device = runner.device
        out = {"attention": info.get("attention"), "widths": {}}
        runner.warm(widths)
        runner.allreduce.enabled = False
        runner.warm(widths)  # the compute-only graphs (allreduce replaced by a no-op)
        runner.allreduce.enabled = True
        for w in widths:
            r = {
                "replay_ms": replay_ms(runner.graphs[StepGraph(w, True)][0], device),
                "compute_only_ms": replay_ms(runner.graphs[StepGraph(w, False)][0], device),
            }
            r["comm_ms"] = r["replay_ms"] - r["compute_only_ms"]
            rows, total_us, kernels = kernel_table(runner, w, top)  # every rank runs it: collectives pair up
            r.update(kernel_us_sum=total_us, kernels_per_step=kernels, top=rows)
            out["widths"][str(w)] = r
        worker.shutdown()
        queue.put((rank, out, None))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        import traceback

        queue.put((rank, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"))


def profile_tp(model: str, tp: int, backend: str, widths: list[int], max_seq: int, top: int) -> dict:
    import multiprocessing as mp
    import tempfile

    from workers.runtime.nvls import nvls_off_here

    nvls_off_here()  # the ranks start with it: NCCL and symmetric memory read it when they initialise
    spec = dict(model_path=model, tp=tp, backend=backend, dtype="bfloat16", device="cuda", max_seq=max_seq, vocab_parallel=True)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_tp_rank, args=(r, tp, f"{tmp}/init", spec, widths, top, queue)) for r in range(tp)]
        for p in procs:
            p.start()
        results = dict((rank, (res, err)) for rank, res, err in (queue.get(timeout=900) for _ in procs))
        for p in procs:
            p.join(timeout=60)
    errors = [err for _, err in results.values() if err]
    if errors:
        raise RuntimeError(errors[0])
    return results[0][0]


def profile_rows(model, rows: int, context: int, top: int, attention: str, bw: float, nbytes: int, gemv: str = "auto") -> dict:
    """Batched decoding's width-1 pass over `rows` rows of `context` positions: replay, call, kernels."""
    import torch.nn.functional as F

    from workers.engine.batched import BatchSteps
    from workers.engine.steps import StepRunner
    from workers.kernels.gemv import _graph_us
    from workers.spec.engine_config import EngineConfig

    a = model.args
    runner = StepRunner(model, model.new_cache(1), max_width=1, engine=EngineConfig(attention=attention, gemv=gemv))
    passes = BatchSteps(model, model.new_cache(rows), use_graphs=True, fast=runner.fast)
    passes.warm({rows}, range(1, 2))
    cache = passes.full
    feed = [[1] for _ in range(rows)]

    def call() -> None:  # as decode_batches' step: staged inputs, replay, every row's argmax to the host
        cache.lengths = [context] * rows
        passes.run(feed, cache).argmax(dim=-1).tolist()

    call()  # stages positions = context into the graph's inputs: replays below attend to context + 1 slots
    graph = passes.graphs[(rows, 1)][0]
    kv_bytes = rows * (context + 1) * a.n_layers * 2 * a.n_kv_heads * a.head_dim * 2
    roof_ms = (nbytes + kv_bytes) / bw * 1e3
    r = {"rows": rows, "context": context, "attention": runner.attention, "roofline_ms": roof_ms, "kv_gb": kv_bytes / 1e9}
    r["replay_ms"] = replay_ms(graph, runner.device)
    times = []
    for _ in range(100):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    r["call_ms"] = sorted(times)[50]
    r["roofline_fraction_replay"] = roof_ms / r["replay_ms"]
    r["roofline_fraction_call"] = roof_ms / r["call_ms"]
    rows_k = kernel_rows(graph.replay)
    r.update(
        kernel_us_sum=sum(x["us_per_step"] for x in rows_k), kernels_per_step=sum(x["count_per_step"] for x in rows_k), top=rows_k[:top]
    )
    # each GEMM of the step alone through cuBLAS at `rows` rows, cycling 3 layers' weights (L2 cannot hold them)
    fast, gemms = runner.fast, {}
    roles = {
        "qkv": [w for w, _, _ in fast.merged],
        "o": [layer.self_attn.o_proj.weight for layer in model.layers],
        "gate_up": [w for _, _, w in fast.merged],
        "down": [layer.mlp.down_proj.weight for layer in model.layers],
        "lm_head": [model.lm_head.weight] if hasattr(model, "lm_head") else [],
    }
    for role, ws in roles.items():
        if not ws:
            continue
        ws = ws[:3]
        x = torch.randn(rows, ws[0].shape[1], device=ws[0].device, dtype=ws[0].dtype)
        us = _graph_us(lambda i, ws=ws, x=x: F.linear(x, ws[i % len(ws)]), calls=8 * len(ws))
        wbytes = ws[0].numel() * ws[0].element_size()
        gemms[role] = {"shape": list(ws[0].shape), "cublas_us": us, "of_bandwidth": wbytes / bw / (us * 1e-6)}
    r["cublas_gemms"] = gemms
    return r


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:llama-3-8b")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--attention", nargs="+", default=["triton", "sdpa"], choices=["triton", "sdpa"])
    ap.add_argument("--plain", action="store_true", help="also time the plain (uncompiled) graphed step")
    ap.add_argument("--tp", type=int, default=1, help="> 1: one process per rank on as many GPUs")
    ap.add_argument("--backend", nargs="+", default=["nccl"], help="with --tp: the allreduce backends to profile")
    ap.add_argument("--rows", type=int, default=0, help="> 0: profile batched decoding's pass of this many rows (TP 1)")
    ap.add_argument(
        "--gemv", nargs="+", default=["auto"], choices=["auto", "cublas", "triton", "off"], help="with --rows: EngineConfig.gemv"
    )
    ap.add_argument("--context", type=int, default=294, help="with --rows: positions each row attends to")
    ap.add_argument("--mla", choices=["absorbed", "expanded"], default="absorbed", help="latent attention's cache (engine.mla)")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args(argv)
    if a.tp > 1 and a.mla != "absorbed":
        ap.error("--mla expanded is for TP 1: a TP profile's ranks take the engine's default cache (absorbed)")
    if a.tp > 1:
        from workers.model.checkpoint import resolve_model_path

        out = {}
        for backend in a.backend:
            res = out[backend] = profile_tp(str(resolve_model_path(a.model)), a.tp, backend, a.widths, a.max_seq, a.top)
            for w, r in res["widths"].items():
                print(
                    f"\n[tp={a.tp} {backend}, attention {res['attention']}] width {w}: replay {r['replay_ms']:.3f} ms, "
                    f"compute-only {r['compute_only_ms']:.3f} ms, comm {r['comm_ms']:.3f} ms; "
                    f"{r['kernels_per_step']:.0f} kernels, {r['kernel_us_sum'] / 1e3:.3f} ms of kernel time (rank 0)"
                )
                for row in r["top"]:
                    print(f"  {row['us_per_step']:9.1f} us  x{row['count_per_step']:6.1f}  {row['kernel']}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        return

    from workers.engine.steps import StepGraph, StepRunner, no_cudnn_attention
    from workers.model.checkpoint import load_model, resolve_model_path
    from workers.spec.engine_config import EngineConfig

    device = torch.device("cuda")
    no_cudnn_attention()  # as the workers do
    bw = copy_bandwidth(device)
    model = load_model(resolve_model_path(a.model), dtype=torch.bfloat16, device=device, max_seq=a.max_seq)
    if model.args.mla is not None:
        model.absorb_latent_attention(a.mla == "absorbed")
    nbytes = streamed_bytes(model)
    roof_ms = nbytes / bw * 1e3
    if model.args.moe_layers:  # a step reads its routed experts only: every expert's bytes are no roofline
        roof_ms = None
        print(
            f"copy bandwidth {bw / 1e12:.2f} TB/s; an MoE step reads only the experts it routes to: its roofline is scripts/verify_widths.py's"
        )
    else:
        print(f"copy bandwidth {bw / 1e12:.2f} TB/s; weights streamed per step {nbytes / 1e9:.2f} GB; roofline {roof_ms:.3f} ms")
    out = {"copy_bw_tb_s": bw / 1e12, "weight_gb": nbytes / 1e9, "roofline_ms": roof_ms, "widths": {}}
    if a.rows:
        for attention, gemv in [(att, g) for att in a.attention for g in a.gemv]:
            r = out.setdefault("rows", {})[f"{attention}+{gemv}"] = profile_rows(
                model, a.rows, a.context, a.top, attention, bw, nbytes, gemv
            )
            print(
                f"\n[rows {a.rows} x context {a.context}, attention {r['attention']}, gemv {gemv}] replay {r['replay_ms']:.3f} ms "
                f"({r['roofline_fraction_replay']:.0%} of {r['roofline_ms']:.3f} ms roofline, KV {r['kv_gb']:.2f} GB), "
                f"call {r['call_ms']:.3f} ms ({r['roofline_fraction_call']:.0%}); {r['kernels_per_step']:.0f} kernels, "
                f"{r['kernel_us_sum'] / 1e3:.3f} ms of kernel time"
            )
            for row in r["top"]:
                print(f"  {row['us_per_step']:9.1f} us  x{row['count_per_step']:6.1f}  {row['kernel']}")
            for role, g in r["cublas_gemms"].items():
                print(
                    f"  cuBLAS {role} {g['shape']} at {a.rows} rows: {g['cublas_us']:.1f} us, {g['of_bandwidth']:.0%} of the copy bandwidth"
                )
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        return
    variants = [(f"fused+{att}", True, att) for att in a.attention] + ([("plain", False, "sdpa")] if a.plain else [])
    for name, fused, attention in variants:
        cache = model.new_cache(1, a.max_seq)
        runner = StepRunner(model, cache, max_width=max(a.widths), engine=EngineConfig(compile=fused, attention=attention))
        runner.warm(a.widths)
        for w in a.widths:
            graph = runner.graphs[StepGraph(w, True)][0]
            r = {"replay_ms": replay_ms(graph, device), "step_call_ms": step_call_ms(runner, w)}
            r["roofline_fraction"] = roof_ms / r["replay_ms"] if roof_ms else None
            rows, total_us, kernels = kernel_table(runner, w, a.top)
            r.update(kernel_us_sum=total_us, kernels_per_step=kernels, top=rows)
            out["widths"].setdefault(str(w), {})[name] = r
            of_roof = f" ({r['roofline_fraction']:.0%} of roofline)" if roof_ms else ""
            print(f"\n[{name}] width {w}: replay {r['replay_ms']:.3f} ms{of_roof}, step call {r['step_call_ms']:.3f} ms")
            print(f"  kernels: {kernels:.0f} per step, {total_us / 1e3:.3f} ms of kernel time")
            for row in rows:
                print(f"  {row['us_per_step']:9.1f} us  x{row['count_per_step']:6.1f}  {row['kernel']}")
        del runner, cache
        torch._dynamo.reset()  # the next variant compiles its own bodies
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
