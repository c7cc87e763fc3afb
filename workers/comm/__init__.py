"""Allreduce backends for the tensor-parallel verifier; `BACKENDS` maps a name to its class.

from workers.comm import make_allreduce, refusal
reason = refusal("nccl", gang)          # None if it can run, else one line why not
ar = make_allreduce("gloo", group, world_size)
ar = make_emulated(load_table("seeds-tp8-pcie"), "nccl", 8, mode="graph", device_type="cuda")  # one rank of TP 8, waiting

`GangInfo`, `refusal`, `emulation_refusal`, the tables and `BackendError` import no torch (the CLI checks a YAML with them); the
backends, `BACKENDS` and the checks that run collectives load torch on first use (PEP 562).
"""

from __future__ import annotations

import functools

from workers.comm.capability import BACKEND_NAMES, EMULATED, GangInfo, emulation_refusal, refusal
from workers.errors import BackendError
from workers.spec.allreduce_table import AllreduceTable, TableError, load_table, presets

_LAZY = {"AllReduce", "NoOpAllReduce", "validate", "validate_add_norm"}


def __getattr__(name: str):
    if name in _LAZY:
        from workers.comm import base

        return getattr(base, name)
    if name == "BACKENDS":
        return backends()
    raise AttributeError(f"module 'workers.comm' has no attribute {name!r}")


# each backend's class, by module: a process imports only the one it runs (symm_mem_ll imports Triton)
_CLASSES = {
    "gloo": ("workers.comm.torch_dist", "GlooAllReduce"),
    "nccl": ("workers.comm.torch_dist", "NcclAllReduce"),
    "symm_mem": ("workers.comm.symm_mem", "SymmMemAllReduce"),
    "symm_mem_ll": ("workers.comm.symm_mem_ll", "SymmMemLLAllReduce"),
    "noop": ("workers.comm.base", "NoOpAllReduce"),
}


def backend_class(name: str):
    """The class of backend `name` (None for an unknown name), importing its module alone."""
    import importlib

    if name not in _CLASSES:
        return None
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(module), cls)


@functools.cache
def backends() -> dict:
    """Each backend's name -> its class (imports every backend's module; one table for the process)."""
    table = {name: backend_class(name) for name in _CLASSES}
    assert set(table) == set(BACKEND_NAMES) and all(cls.name == name for name, cls in table.items()), "capability.py names every backend"
    return table


def make_emulated(table: AllreduceTable, backend: str, world_size: int, mode: str, device_type: str):
    """The emulated allreduce of one rank of TP `world_size`: waits `backend`'s rows of `table`."""
    if why := emulation_refusal(table, backend, world_size):
        raise BackendError(why)
    from workers.comm.emulated import EmulatedAllReduce

    return EmulatedAllReduce(table, backend, world_size, mode, device_type)


def make_allreduce(name: str, group, world_size: int, gang: GangInfo | None = None):
    if gang is not None and (why := refusal(name, gang)):
        raise BackendError(why)
    if name not in BACKEND_NAMES:
        raise BackendError(f"unknown allreduce backend {name!r} (known: {', '.join(BACKEND_NAMES)})")
    return backend_class(name)(group, world_size)


__all__ = [
    "AllReduce",
    "AllreduceTable",
    "BACKENDS",
    "BACKEND_NAMES",
    "BackendError",
    "backend_class",
    "EMULATED",
    "GangInfo",
    "TableError",
    "emulation_refusal",
    "load_table",
    "make_allreduce",
    "make_emulated",
    "presets",
    "refusal",
    "validate",
    "validate_add_norm",
]
