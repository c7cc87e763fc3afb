"""Backends on torch.distributed process groups: `gloo` (CPU tensors) and `nccl` (CUDA tensors).

NCCL reads its NCCL_* environment when the communicator is created; the orchestrator starts each
trial's gang with the trial's variables, so the backend itself has nothing to configure.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from workers.comm.base import AllReduce, GangInfo


class GlooAllReduce(AllReduce):
    name = "gloo"

    @classmethod
    def capability(cls, gang: GangInfo) -> str | None:
        if gang.device_type != "cpu":
            return "gloo allreduce runs on CPU tensors only (use nccl or symm_mem on GPUs)"
        return None

    def _all_reduce(self, x: torch.Tensor) -> None:
        dist.all_reduce(x, group=self.group)


class NcclAllReduce(AllReduce):
    name = "nccl"
    cuda_group = "nccl"
    timed = False  # asynchronous on a CUDA stream; per-step comm time comes from the no-op ablation

    @classmethod
    def capability(cls, gang: GangInfo) -> str | None:
        if gang.device_type != "cuda":
            return "nccl needs CUDA devices; this gang runs on CPU (use gloo)"
        if len(set(gang.devices)) != len(gang.devices):
            return "nccl refuses two ranks of one communicator on the same GPU"
        if not dist.is_nccl_available():
            return "this torch build has no NCCL"
        return None

    def _all_reduce(self, x: torch.Tensor) -> None:
        dist.all_reduce(x, group=self.group)
