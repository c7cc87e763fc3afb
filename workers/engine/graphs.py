"""Capturing a body of device ops as one CUDA graph (the drafters' batched passes, the EAGLE-3 chain),
and the integer inputs such a graph reads for a batch's rows.

graph, out, pool = capture_graph(lambda: body(), device, pool)   # then graph.replay(); out holds the result
inputs = RowInputs(rows, width, device); tok, pos, at = inputs.views(n, W)   # what a body reads
inputs.send(tokens, positions, at)                                # each step: one host-to-device copy
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


class RowInputs:
    """A batched body's integer inputs for n rows of W entries: token ids [n, W], positions [n, W] and
    each row's last real entry `at` [n], packed in one device buffer so that a step sends all three in
    one contiguous host-to-device copy (a strided slice of a [rows, width] buffer costs a copy and a
    scatter kernel per tensor, host time while the GPU waits for the step's first kernel). The views of
    one (n, W) sit at fixed offsets: a graph captured on them reads them at each replay."""

    def __init__(self, rows: int, width: int, device: torch.device):
        self.rows, self.width = rows, width
        size = 2 * rows * width + rows
        self.buf = torch.zeros(size, dtype=torch.long, device=device)
        pin = torch.device(device).type == "cuda"
        # two staging buffers, used in turn: a send queued behind work the host has not waited for (a
        # look-ahead's, behind the step before) must not overwrite what the previous copy has yet to read
        self._staging = [torch.zeros(size, dtype=torch.long).pin_memory() if pin else torch.zeros(size, dtype=torch.long) for _ in range(2)]
        self._sent = [torch.cuda.Event(), torch.cuda.Event()] if pin else None  # each buffer's last copy, done
        self._turn = 0

    def views(self, n: int, W: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not (1 <= n <= self.rows and 1 <= W <= self.width):
            raise ValueError(f"{n} rows of {W} entries on inputs of {self.rows} x {self.width}")
        b = self.buf
        return b[: n * W].view(n, W), b[n * W : 2 * n * W].view(n, W), b[2 * n * W : 2 * n * W + n]

    def send(self, tokens: list[int], positions: list[int], at: list[int]) -> None:
        """n rows' tokens and positions (row-major, n x W each) and their `at` (n) into `views(n, W)`.
        Asynchronous on CUDA: a staging buffer is rewritten two sends later, once its copy has run (an
        event; almost always long done, but a send may run ahead of the host's wait for the step)."""
        m = len(tokens) + len(positions) + len(at)
        turn, self._turn = self._turn, self._turn ^ 1
        staging = self._staging[turn]
        if self._sent is not None:
            self._sent[turn].synchronize()
        staging[:m] = torch.tensor(tokens + positions + at)
        self.buf[:m].copy_(staging[:m], non_blocking=True)
        if self._sent is not None:
            self._sent[turn].record()

    def zero(self) -> None:
        self.buf.zero_()


def to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """A small integer list on `device` without a host sync: through pinned memory, non-blocking, on
    CUDA (a copy from pageable memory waits for the stream's queued work first)."""
    t = torch.tensor(values, dtype=torch.long)
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
