"""Allreduce latency of one backend on one gang (one process per rank), eager and inside a CUDA
graph: the per-rank half of `spectune bench-allreduce` (orchestrator/bench.py drives it).

Each timed iteration restores the input from a source tensor before reducing it (a running sum
would overflow), and the same loop without the allreduce is timed too and subtracted, so the
figure is the allreduce alone. Rank 0 reports; ranks enter each size together (barrier).
"""

from __future__ import annotations

import os
import statistics
import time
import traceback

import torch
import torch.distributed as dist

from workers.comm import GangInfo, make_allreduce, validate

GRAPH_OPS = 20  # allreduces captured per graph; replay time / GRAPH_OPS = one op


def _time_loop(fn, iters: int, device: torch.device, chunks: int = 10) -> float:
    """Seconds per call of `fn`: the median over `chunks` timed runs of iters / chunks calls each. The
    median, not the mean: one descheduled rank on a shared machine stalls every rank of a collective for
    a whole time slice, and a mean over all calls would carry that into every size's figure."""
    for _ in range(3):
        fn()
    chunks = max(1, min(chunks, iters // 8))  # at least 8 calls a chunk: one sync per chunk stays small beside them
    per = max(1, iters // chunks)
    times = []
    for _ in range(chunks):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) / per)
    return statistics.median(times)


def _graph_of(fn, n_ops: int, device: torch.device):
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n_ops):
            fn()
    return graph


def bench_rank(
    rank: int,
    world: int,
    init_file: str,
    backend: str,
    device_type: str,
    sizes: list[int],
    dtype_name: str,
    iters: int,
    env: dict[str, str],
    queue,
) -> None:
    try:
        os.environ.update(env)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        device = torch.device("cpu")
        if device_type == "cuda":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        group = dist.new_group(list(range(world)), backend="nccl" if device_type == "cuda" else "gloo")
        dtype = getattr(torch, dtype_name)
        max_numel = max(sizes) // dtype.itemsize
        p2p = device_type == "cuda" and all(torch.cuda.can_device_access_peer(i, j) for i in range(world) for j in range(world) if i != j)
        gang = GangInfo(world_size=world, device_type=device_type, devices=tuple(range(world)), p2p_ok=p2p, max_message_bytes=max(sizes))
        ar = make_allreduce(backend, group, world, gang)
        ar.setup(device, dtype, max_numel)
        if err := validate(ar, rank, dtype=dtype, device=device):
            raise RuntimeError(err)
        rows = []
        for size in sizes:
            numel = max(1, size // dtype.itemsize)
            src = torch.randn(numel, device=device).to(dtype)
            x = src.clone()

            def copy_only():
                x.copy_(src)

            def reduce_once():
                x.copy_(src)
                ar(x)

            modes = [("eager", lambda f: _time_loop(f, iters, device))]
            if device_type == "cuda":

                def graphed(f):
                    g = _graph_of(f, GRAPH_OPS, device)
                    return _time_loop(g.replay, max(3, iters // GRAPH_OPS), device) / GRAPH_OPS

                modes.append(("graph", graphed))
            for mode, timer in modes:
                dist.barrier()
                t = timer(reduce_once) - timer(copy_only)
                t = max(t, 1e-9)
                algbw = size / t / 1e9
                rows.append(
                    {
                        "backend": backend,
                        "mode": mode,
                        "size_bytes": size,
                        "time_us": t * 1e6,
                        "algbw_GBps": algbw,
                        "busbw_GBps": algbw * 2 * (world - 1) / world,
                    }
                )
        queue.put((rank, rows if rank == 0 else None, None))
    except Exception as e:  # noqa: BLE001 - reported to the parent in one line
        queue.put((rank, None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
        if os.environ.get("SPECTUNE_DEBUG"):
            traceback.print_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
