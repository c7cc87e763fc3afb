"""`symm_mem`: one-shot allreduce through torch symmetric memory (every rank reads every peer's
buffer over NVLink/P2P and sums locally: one hop, no ring, no NCCL protocol choice). GPU only.

`setup` allocates one symmetric buffer for the largest message and exchanges its handles with the
TP group (a collective); each call copies the partial sum in and reduces into the same tensor in
one kernel (`one_shot_all_reduce_copy_out`), which CUDA graphs capture. A message larger than the
buffer falls back to NCCL on the same group. The capability check (workers/comm/capability.py) runs anywhere, so CPU gangs
get a clear refusal.
"""

from __future__ import annotations

import torch

from workers.comm.base import AllReduce


class SymmMemAllReduce(AllReduce):
    name = "symm_mem"
    cuda_group = "nccl"
    timed = False

    def setup(self, device: torch.device, dtype: torch.dtype, max_numel: int) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.buf = symm_mem.empty(max_numel, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buf, self.group)  # collective over the TP group
        self.group_name = self.group.group_name
        ops = torch.ops.symm_mem
        self._copy_out = getattr(ops, "one_shot_all_reduce_copy_out", None)
        self._out = ops.one_shot_all_reduce_out

    def _all_reduce(self, x: torch.Tensor) -> None:
        n = x.numel()
        flat = x.view(-1)
        if n > self.buf.numel() or x.dtype != self.buf.dtype or (n * x.element_size()) % 16:
            # too big for the buffer, another dtype, or a size the one-shot kernel's vector loads
            # cannot take: NCCL on the same group
            import torch.distributed as dist

            dist.all_reduce(x, group=self.group)
            return
        sym = self.buf[:n]
        if self._copy_out is not None:
            self._copy_out(sym, flat, "sum", self.group_name, flat)
        else:
            sym.copy_(flat)
            self._out(sym, "sum", self.group_name, flat)
