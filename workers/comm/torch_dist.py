"""Backends on torch.distributed process groups: `gloo` (CPU tensors) and `nccl` (CUDA tensors).

NCCL reads its NCCL_* environment when the communicator is created; the orchestrator starts each
trial's gang with the trial's variables, so the backend itself has nothing to configure.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from workers.comm.base import AllReduce


class GlooAllReduce(AllReduce):
    name = "gloo"

    def _all_reduce(self, x: torch.Tensor) -> None:
        dist.all_reduce(x, group=self.group)


class NcclAllReduce(AllReduce):
    name = "nccl"
    cuda_group = "nccl"
    timed = False  # asynchronous on a CUDA stream; per-step comm time comes from the no-op ablation

    def _all_reduce(self, x: torch.Tensor) -> None:
        dist.all_reduce(x, group=self.group)
