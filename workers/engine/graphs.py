"""Capturing a body of device ops as one CUDA graph (the drafters' batched passes, the EAGLE-3 chain).

graph, out, pool = capture_graph(lambda: body(), device, pool)   # then graph.replay(); out holds the result
"""

from __future__ import annotations

import torch


def capture_graph(run, device, pool=None):
    """(graph, its output, its pool) of `run` (device ops only: no host reads): warmed up twice on a
    side stream (lazy kernels, the allocator), then captured into `pool` (shared by one owner's
    graphs). The capture itself runs nothing: replay before reading the output."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out, graph.pool()
