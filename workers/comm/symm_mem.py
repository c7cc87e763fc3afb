"""`symm_mem`: one-shot allreduce through torch symmetric memory (every rank reads every peer's
buffer over NVLink/P2P and sums locally: one hop, no ring). GPU only; its CUDA path lands with the
GPU issue. The capability check is complete and runs anywhere, so CPU gangs get a clear refusal.
"""
from __future__ import annotations

import torch

from workers.comm.base import AllReduce, GangInfo

MAX_WORLD = 8
MAX_MESSAGE_BYTES = 8 << 20  # one-shot pays world x message reads; past a few MB a ring wins


class SymmMemAllReduce(AllReduce):
    name = "symm_mem"
    timed = False

    @classmethod
    def capability(cls, gang: GangInfo) -> str | None:
        if gang.device_type != "cuda":
            return "symm_mem needs CUDA devices with peer-to-peer access; this gang runs on CPU (use gloo)"
        if gang.world_size > MAX_WORLD:
            return f"symm_mem one-shot allreduce supports at most {MAX_WORLD} ranks, not {gang.world_size}"
        if not gang.p2p_ok:
            return "symm_mem needs peer-to-peer access between every pair of GPUs, which this gang lacks"
        if gang.max_message_bytes > MAX_MESSAGE_BYTES:
            return f"symm_mem one-shot is limited to {MAX_MESSAGE_BYTES >> 20} MiB messages, the trial needs {gang.max_message_bytes}"
        try:
            import torch.distributed._symmetric_memory  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no symmetric memory"
        return None

    def _all_reduce(self, x: torch.Tensor) -> None:
        raise NotImplementedError("symm_mem allreduce runs on CUDA gangs only")
