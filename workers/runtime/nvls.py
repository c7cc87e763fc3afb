"""NVLink multicast (NVLS) stays off in every process spectune starts, from the process's first instruction.

A program that uses NVLink multicast can put a host's shared GPUs out of service, and NCCL, torch's
symmetric memory and NVSHMEM read these variables when they initialise, so they must be in the
environment a process starts with, not set later inside it:

    nvls_off_here()   # before starting any process (spawned ranks, an embedded Ray): they inherit it

Ray actors also get NVLS_OFF_ENV through their runtime_env (orchestrator/execution/gang.py).
"""

from __future__ import annotations

import os
import sys

NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def nvls_off_here() -> None:
    """Put NVLS_OFF_ENV in this process's environment, which every process it starts from now on
    inherits; a different value inherited from the shell is overridden, with one line saying so."""
    for key, value in NVLS_OFF_ENV.items():
        old = os.environ.get(key)
        if old is not None and old != value:
            print(
                f"spectune: {key}={old} from the environment overridden to {value}: NVLink multicast stays off", file=sys.stderr, flush=True
            )
        os.environ[key] = value
