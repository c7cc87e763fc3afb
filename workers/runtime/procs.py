"""How spectune starts the processes of a gang on this machine (LocalGang's ranks, the allreduce
benchmark's and the parity check's processes):

    ctx = rank_context("cpu")            # a multiprocessing context
    ctx.Process(target=with_env, args=(os.environ.copy(), serve, rank, ...)).start()

Rules:
- A CUDA gang's processes are spawned: a fresh interpreter, no inherited CUDA state or threads.
- A CPU gang's processes are forked from a forkserver that imported the worker code (torch, the
  engine, the drafters, torch._dynamo) once, so a rank starts in milliseconds instead of re-importing
  them (about 2.5 + 1.8 s of CPU a process). The forkserver itself ran nothing, so no thread or device state is forked.
- A forked process starts with the forkserver's environment, taken when it started; `with_env` gives
  it this process's environment of the moment instead, before the target runs. Variables that a
  library reads only when imported keep the forkserver's value: NVLink multicast is off in it from
  its start (`nvls_off_here` runs first), and CPU gangs initialise no NCCL, symmetric memory or NVSHMEM;
  TRITON_INTERPRET (read when a kernel is decorated, at import) is the forkserver's: set it before the
  first CPU gang of a process starts (tests/conftest.py does). The ranks' stdout and stderr are the
  ones the forkserver inherited.
"""

from __future__ import annotations

import multiprocessing as mp
import os

from workers.runtime.nvls import nvls_off_here

# torch._dynamo too: building a model on the meta device runs torch's Python reference ops, which import
# it (~1.8 s of CPU) the first time, in every process that loads a model
PRELOAD = ["workers.runtime.worker", "workers.runtime.local_gang", "torch._dynamo"]


def rank_context(device: str):
    """The multiprocessing context for a gang's processes on `device` ("cpu", "cuda", "cuda:N")."""
    nvls_off_here()  # before any process starts: the forkserver and spawned processes inherit it
    if device != "cpu":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # no effect once this process's forkserver runs
    return ctx


def with_env(env: dict[str, str], target, *args) -> None:
    """Run `target(*args)` in this process's environment replaced by `env` (the starter's)."""
    os.environ.clear()
    os.environ.update(env)
    target(*args)
