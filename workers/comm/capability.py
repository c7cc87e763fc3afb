"""Which allreduce backend can run on which gang, without importing torch at module level: the CLI
and the driver check a YAML's backend (`refusal`) before any worker starts, and a worker checks it
again where it runs (the backends' `capability` is this rule). Checks of the torch build itself
(NCCL compiled in, symmetric memory, Triton) import torch only for CUDA gangs.

    refusal("nccl", GangInfo(world_size=2, device_type="cpu"))   # -> one line why not, or None
"""

from __future__ import annotations

from dataclasses import dataclass

BACKEND_NAMES = ("gloo", "nccl", "noop", "symm_mem", "symm_mem_ll")
# one rank of TP N waiting as an allreduce table says (workers/comm/emulated.py): never a comm.backend
# choice itself; parallel.emulate_tp builds it, for the comm.backend whose rows it waits
EMULATED = "emulated"
SYMM_MAX_WORLD = 8
SYMM_MAX_MESSAGE_BYTES = 8 << 20  # one-shot pays world x message reads; past a few MB a ring wins


@dataclass(frozen=True)
class GangInfo:
    """What a backend needs to know to decide whether it can run."""

    world_size: int
    device_type: str  # "cpu" or "cuda"
    devices: tuple[int, ...] = ()  # CUDA device index of each rank
    p2p_ok: bool = False  # every pair of ranks can reach each other's memory
    max_message_bytes: int = 0  # the largest allreduce the trial will issue


def refusal(name: str, gang: GangInfo) -> str | None:
    """None when backend `name` can run on `gang`, else one line saying why not."""
    if name == EMULATED:
        return (
            "emulated is no comm.backend choice: parallel.emulate_tp and parallel.allreduce_table wait the table's rows of the comm.backend"
        )
    if name not in BACKEND_NAMES:
        return f"unknown allreduce backend {name!r} (known: {', '.join(BACKEND_NAMES)})"
    if name == "noop":
        return None
    if name == "gloo":
        return None if gang.device_type == "cpu" else "gloo allreduce runs on CPU tensors only (use nccl or symm_mem on GPUs)"
    if name == "nccl":
        if gang.device_type != "cuda":
            return "nccl needs CUDA devices; this gang runs on CPU (use gloo)"
        if len(set(gang.devices)) != len(gang.devices):
            return "nccl refuses two ranks of one communicator on the same GPU"
        import torch.distributed as dist

        return None if dist.is_nccl_available() else "this torch build has no NCCL"
    return _symm_mem_refusal(gang, name)


def emulation_refusal(table, backend: str, world_size: int) -> str | None:
    """None when an emulated rank of TP `world_size` can wait `backend`'s rows of `table` (an
    AllreduceTable, workers/spec/allreduce_table.py), else one line why not. It runs on any device: the
    backend it stands for need not run here."""
    if world_size < 1:
        return f"emulated TP {world_size} must be at least 1"
    if world_size == 1:  # nothing to wait: a TP 1 rank issues no collective
        return None
    if not table.backends(world_size):
        return f"table {table.name!r} has no rows at TP {world_size} (it has TP {', '.join(map(str, table.tps()))})"
    if backend not in table.backends(world_size):
        listed = ", ".join(table.backends(world_size))
        return (
            f"table {table.name!r} does not time {backend} at TP {world_size}; it times {listed}, the backends an emulated study may choose"
        )
    return None


def _symm_mem_refusal(gang: GangInfo, name: str) -> str | None:
    if gang.device_type != "cuda":
        return f"{name} needs CUDA devices with peer-to-peer access; this gang runs on CPU (use gloo)"
    if gang.world_size > SYMM_MAX_WORLD:
        return f"{name} one-shot allreduce supports at most {SYMM_MAX_WORLD} ranks, not {gang.world_size}"
    if not gang.p2p_ok:
        return f"{name} needs peer-to-peer access between every pair of GPUs, which this gang lacks"
    if gang.max_message_bytes > SYMM_MAX_MESSAGE_BYTES:
        return f"{name} one-shot is limited to {SYMM_MAX_MESSAGE_BYTES >> 20} MiB messages, the trial needs {gang.max_message_bytes}"
    import torch

    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no symmetric memory"
    if name == "symm_mem_ll":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "symm_mem_ll needs Triton, which this torch install lacks"
    return None
