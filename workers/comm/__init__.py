"""Allreduce backends for the tensor-parallel verifier; `BACKENDS` maps a name to its class.

from workers.comm import make_allreduce, refusal
reason = refusal("nccl", gang)          # None if it can run, else one line why not
ar = make_allreduce("gloo", group, world_size)
"""

from __future__ import annotations

from workers.comm.base import AllReduce, GangInfo, NoOpAllReduce, validate, validate_add_norm
from workers.comm.symm_mem import SymmMemAllReduce
from workers.comm.symm_mem_ll import SymmMemLLAllReduce
from workers.comm.torch_dist import GlooAllReduce, NcclAllReduce

BACKENDS: dict[str, type[AllReduce]] = {
    cls.name: cls for cls in (GlooAllReduce, NcclAllReduce, SymmMemAllReduce, SymmMemLLAllReduce, NoOpAllReduce)
}


class BackendError(ValueError):
    """A backend that does not exist or cannot run on the gang (one line)."""


def refusal(name: str, gang: GangInfo) -> str | None:
    if name not in BACKENDS:
        return f"unknown allreduce backend {name!r} (known: {', '.join(sorted(BACKENDS))})"
    return BACKENDS[name].capability(gang)


def make_allreduce(name: str, group, world_size: int, gang: GangInfo | None = None) -> AllReduce:
    if gang is not None and (why := refusal(name, gang)):
        raise BackendError(why)
    if name not in BACKENDS:
        raise BackendError(f"unknown allreduce backend {name!r} (known: {', '.join(sorted(BACKENDS))})")
    return BACKENDS[name](group, world_size)


__all__ = ["AllReduce", "BACKENDS", "BackendError", "GangInfo", "make_allreduce", "refusal", "validate", "validate_add_norm"]
