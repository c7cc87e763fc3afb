"""Environment every GPU process gets, and what no search space or flag may turn on.

NVLink multicast (NVLS) must stay off on the machines spectune runs on: a program that uses it
can put a host's shared GPUs out of service. Every process spectune starts begins with
NVLS_OFF_ENV (the one list lives in workers/runtime/nvls.py, which the workers use too): the
driver puts it in its own environment before it spawns ranks or starts an embedded Ray
(`nvls_off_here`), actors get it in their runtime_env, benchmark processes in theirs. Any NVLS
value in a space, an NCCL env or a flag is refused.
"""

from __future__ import annotations

import os
from typing import Any

from workers.runtime.nvls import NVLS_OFF_ENV, nvls_off_here  # noqa: F401 - re-exported: the driver's names


def refuse_nvls(var: str, value: Any) -> None:
    """Raise ValueError (one line) if `var=value` would turn NVLS / NVLink multicast on."""
    if "NVLS" in var.upper():
        raise ValueError(f"{var}: NVLS / NVLink multicast must stay off and is refused in any space")
    if "NVLS" in str(value).upper():
        raise ValueError(f"{var}={value}: NVLS / NVLink multicast must stay off and is refused in any space")


# NCCL_* variables that are no NCCL setting: NVIDIA's container images set NCCL_VERSION to name the
# NCCL they ship; NCCL never reads it
NOT_NCCL_SETTINGS = frozenset({"NCCL_VERSION"})


def inherited_nccl_env(environ=None) -> dict[str, str]:
    """The NCCL_* settings of the driver's own environment (its shell), NVLS ones aside: Ray actors
    get them too (orchestrator/execution/gang.py), so a trial's params record them as `nccl.*`."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_") and k not in NVLS_OFF_ENV and k not in NOT_NCCL_SETTINGS}
