"""Environment every GPU process gets, and what no search space or flag may turn on.

NVLink multicast (NVLS) must stay off on the machines spectune runs on: a program that uses it
can put a host's shared GPUs out of service. Every actor and benchmark process runs with
NVLS_OFF_ENV, and any NVLS value in a space, an NCCL env or a flag is refused.
"""
from __future__ import annotations

from typing import Any

NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def refuse_nvls(var: str, value: Any) -> None:
    """Raise ValueError (one line) if `var=value` would turn NVLS / NVLink multicast on."""
    if "NVLS" in var.upper():
        raise ValueError(f"{var}: NVLS / NVLink multicast must stay off and is refused in any space")
    if "NVLS" in str(value).upper():
        raise ValueError(f"{var}={value}: NVLS / NVLink multicast must stay off and is refused in any space")
