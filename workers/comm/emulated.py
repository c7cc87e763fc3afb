"""`emulated`: the allreduce of one rank of TP N that communicates nothing and waits instead, as long
as an allreduce table (workers/spec/allreduce_table.py) says one allreduce of that size, rank count and
backend takes. With it one process runs exactly one rank's shard of TP N (`TPPart(0, N)`) and the
step has the deployment's structure and timing without the other N - 1 GPUs.

    ar = EmulatedAllReduce(load_table("pcie-8x-rtx-pro-6000"), "nccl", world_size=8, mode="graph", device_type="cuda")
    ar.setup(device, dtype, max_numel)        # CUDA: calibrates the GPU clock once
    ar(x)                                     # x unchanged (a partial sum: no peer adds to it), after the wait

The wait: on CPU a busy loop on time.perf_counter (the core stays busy, as a CPU collective keeps
it); on CUDA a device-side spin, `torch.cuda._sleep(cycles)`, one kernel on the stream, so CUDA
graphs capture it where the collective's kernel would be, and the host never waits. The cycles of a
wait come from the GPU clock rate timed once at setup (a long _sleep between CUDA events). A
message outside the table's measured sizes raises TableError naming its size (at capture for a
graphed step, whose sizes are fixed). Partial sums stay partial, so the tokens are not the model's:
an emulated run takes its acceptance from a profile (workload.simulate_accept_len or simulate_accept_profile).
"""

from __future__ import annotations

import time

import torch

from workers.comm.base import AllReduce
from workers.spec.allreduce_table import AllreduceTable

CALIBRATION_CYCLES = 50_000_000  # tens of ms at GPU clock rates: the launch's microseconds vanish in it


def spin_cpu(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def gpu_cycles_per_us(device: torch.device, cycles: int = CALIBRATION_CYCLES, repeats: int = 3) -> float:
    """Clock cycles `torch.cuda._sleep` spins per microsecond on `device` (median of `repeats`)."""
    with torch.cuda.device(device):
        torch.cuda._sleep(cycles // 10)  # the first launch loads the kernel
        rates = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / (start.elapsed_time(end) * 1e3))
    return sorted(rates)[len(rates) // 2]


class EmulatedAllReduce(AllReduce):
    name = "emulated"

    def __init__(self, table: AllreduceTable, backend: str, world_size: int, mode: str, device_type: str = "cpu"):
        """`backend`: whose rows of `table` to wait (the trial's comm.backend); `mode`: "graph" where
        the steps replay as CUDA graphs, else "eager" (workers/spec/allreduce_table.py picks the rows)."""
        super().__init__(None, world_size)  # no process group: nothing is exchanged
        self.table, self.backend, self.mode = table, backend, mode
        # a CUDA wait is a kernel on the stream: wall-clock timing of a call would time its launch
        self.timed = device_type != "cuda"
        self.cycles_per_us = 0.0  # CUDA: the calibrated clock (setup)
        self._us: dict[int, float] = {}  # message bytes -> table latency

    def setup(self, device: torch.device, dtype: torch.dtype, max_numel: int) -> None:
        if device.type == "cuda":
            self.cycles_per_us = gpu_cycles_per_us(device)

    def latency_us(self, size_bytes: int) -> float:
        """The table's latency of one allreduce of `size_bytes` (TableError outside its sizes)."""
        us = self._us.get(size_bytes)
        if us is None:
            us = self._us[size_bytes] = self.table.latency_us(self.backend, self.world_size, size_bytes, self.mode)
        return us

    def wait(self, x: torch.Tensor) -> None:
        us = self.latency_us(x.numel() * x.element_size())
        if x.device.type == "cuda":
            cycles = int(round(us * self.cycles_per_us))
            if cycles > 0:
                torch.cuda._sleep(cycles)
        elif us > 0:
            spin_cpu(us * 1e-6)

    def _all_reduce(self, x: torch.Tensor) -> None:
        self.wait(x)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """The right shape ([..., world x n], this rank's part repeated) after a wait of the table's
        allreduce latency at the size of the part each rank contributes: the table has no all-gather
        rows, and at vocab-slice sizes both collectives are latency-bound alike."""
        if self.enabled:
            self.wait(x)
        return x.repeat(*([1] * (x.dim() - 1)), self.world_size)
