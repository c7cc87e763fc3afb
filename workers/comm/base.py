"""The AllReduce interface every tensor-parallel backend implements, and the checks around it.

A backend sums a tensor across the TP group in place (`__call__`), all-gathers vocab-parallel
logits (`all_gather_last`) and keeps a call counter and, where timing is cheap (CPU), the seconds
spent; whether it can run on a gang is workers/comm/capability.py's `refusal`.
`validate(allreduce, rank, world)` checks a backend against a reference sum before a trial is
measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class CommCounters:
    calls: int = 0
    seconds: float = 0.0
    bytes: int = 0

    def reset(self) -> None:
        self.calls, self.seconds, self.bytes = 0, 0.0, 0


class AllReduce:
    """Sum over the TP group. Subclasses implement `_all_reduce` (in place); whether one can run on a gang is
    workers/comm/capability.py's rule for its `name`."""

    name = "base"
    timed = True  # wall-clock timing per call (only meaningful where calls are synchronous)
    cuda_group = "gloo"  # torch.distributed backend of the TP group on GPUs (nccl where the backend
    # issues NCCL calls or needs an NCCL group for its rendezvous / fallback)
    # add_norm is one kernel (a capability of the class, never changed on an instance: whether the
    # engine uses it is the engine's decision, workers/engine/fused_step.py)
    fuses_add_norm = False

    def __init__(self, group: dist.ProcessGroup | None, world_size: int):
        self.group = group
        self.world_size = world_size
        self.counters = CommCounters()
        self.enabled = True  # False: the compute-only ablation (partial sums pass through, results are thrown away)

    def setup(self, device: torch.device, dtype: torch.dtype, max_numel: int) -> None:
        """Allocate what the backend needs for messages up to `max_numel` (collective where it must be)."""

    def _all_reduce(self, x: torch.Tensor) -> None:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1 or not self.enabled:
            return x
        self.counters.calls += 1
        self.counters.bytes += x.numel() * x.element_size()
        if self.timed:
            t0 = time.perf_counter()
            self._all_reduce(x)
            self.counters.seconds += time.perf_counter() - t0
        else:
            self._all_reduce(x)
        return x

    def add_norm(
        self, partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """s = residual + allreduce(partial) and rms_norm(s): a row-parallel output joining the
        residual stream and the next norm reading it. Backends that can do it in one kernel
        override this (and set `fuses_add_norm`); it counts as one allreduce call either way."""
        from workers.model.transformer import rms_norm

        s = residual + self(partial)
        return s, rms_norm(s, weight, eps)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `x` along the last dimension (vocab-parallel logits)."""
        if not self.enabled:  # the compute-only ablation: right shape, no communication
            return x.repeat(*([1] * (x.dim() - 1)), self.world_size)
        # one collective into [world, ..., n] (a list all_gather adds a copy per rank, then a cat);
        # rank-major to last-dim-major is a view when the leading dims are all 1 (a decode step)
        out = torch.empty((self.world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        # ranks stacked along dim 0 (torch 2.13 renamed all_gather_into_tensor; 2.11 has only that)
        gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        gather(out, x.contiguous(), group=self.group)
        out = out.view(self.world_size, *x.shape)
        return out.movedim(0, -2).reshape(*x.shape[:-1], self.world_size * x.shape[-1])


class NoOpAllReduce(AllReduce):
    """Leaves partial sums as they are: the compute-only ablation (results are thrown away)."""

    name = "noop"

    def _all_reduce(self, x: torch.Tensor) -> None:
        pass


def validate(allreduce: AllReduce, rank: int, dtype=torch.float32, device="cpu", numel: int = 4104) -> str | None:
    """Sum a known pattern through `allreduce`; None if every element is right, else what went wrong.

    Rank r contributes (r + 1) * base, so the exact sum is world * (world + 1) / 2 * base.
    """
    world = allreduce.world_size
    base = torch.arange(numel, dtype=torch.float32, device=device).remainder(17) - 8
    x = ((rank + 1) * base).to(dtype)
    expected = (world * (world + 1) / 2 * base).to(dtype)
    calls = allreduce.counters.calls
    out = allreduce(x.clone())
    allreduce.counters.calls = calls  # validation is not part of the measured workload
    err = (out.float() - expected.float()).abs().max().item()
    if err > 1e-3 * max(1.0, expected.abs().max().item()):
        return f"allreduce backend {allreduce.name!r} returned wrong sums (max error {err:.3g} on rank {rank})"
    # the vocab-parallel gather (some backends have their own): rank r's part is (r + 1) * base
    part = base[: min(numel, 257)]
    got = allreduce.all_gather_last(((rank + 1) * part).to(dtype).view(1, 1, -1))
    want = torch.cat([(r + 1) * part for r in range(world)]).view(1, 1, -1)
    if got.shape != want.shape or not torch.equal(got.float(), want):
        return f"allreduce backend {allreduce.name!r}: its all-gather returned wrong parts (rank {rank})"
    return None


def validate_add_norm(allreduce: AllReduce, rank: int, hidden: int, dtype=torch.float32, device="cpu", rows: int = 2) -> str | None:
    """A backend's fused `add_norm` against the plain allreduce followed by torch's add and norm
    (the base class's `add_norm`); None if they agree to the dtype's rounding, else what differs.
    The caller agrees with the other ranks whether the engine uses it (workers/runtime/worker.py)."""
    if not allreduce.fuses_add_norm or allreduce.world_size == 1:
        return None
    gen = torch.Generator().manual_seed(11)  # the same residual and weight on every rank
    residual = torch.randn(rows, hidden, generator=gen).to(device=device, dtype=dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)
    partial = ((rank + 1) * torch.randn(rows, hidden, generator=gen)).to(device=device, dtype=dtype)
    calls = allreduce.counters.calls
    want_s, want_n = AllReduce.add_norm(allreduce, partial.clone(), residual, weight, 1e-5)
    tol = 1e-4 if dtype == torch.float32 else 2**-6  # relative; bf16 keeps 8 bits

    def wrong(got_s, got_n) -> str | None:
        for name, got, want in (("residual", got_s, want_s), ("norm", got_n, want_n)):
            err = ((got.float() - want.float()).abs() / want.float().abs().clamp(min=1.0)).max().item()
            if err > tol:
                return f"{name}, relative error {err:.3g} on rank {rank}"
        return None

    why = wrong(*allreduce.add_norm(partial.clone(), residual, weight, 1e-5))
    allreduce.counters.calls = calls
    if why is not None:
        return f"allreduce backend {allreduce.name!r}: its fused add + norm differs from allreduce + add + norm ({why})"
    return None
