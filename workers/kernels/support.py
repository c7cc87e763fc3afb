"""Shared pieces of the Triton kernels (workers/kernels/attention.py, workers/kernels/gemv.py,
workers/comm/symm_mem_ll.py): the arrival counters of "the last program to finish reduces"
kernels, and a fix that lets Triton's CPU interpreter run them in the tests.

    cnt = arrival_counters(n, device)     # n zeroed int32 counters, each kernel leaves them at zero
    interpreter_numpy_fix()               # before running kernels with TRITON_INTERPRET=1 on CPU
    selftest_main(argv, __doc__, selftest, "cuda", tolerances, what)   # a kernel module's `--selftest` command line
    interpreted(kernel)                   # does this @triton.jit kernel run under the CPU interpreter?
"""

from __future__ import annotations

import argparse
import sys

import torch

_COUNTERS: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []  # outgrown counters stay allocated: graphs captured earlier still use them


def arrival_counters(n: int, device: torch.device) -> torch.Tensor:
    """At least n zeroed int32 counters on `device`, shared by every kernel there that counts
    arrivals (kernels on one stream run one after another, and each resets what it used). Grown
    outside CUDA graph capture only: the first call of each shape runs eagerly (StepRunner and the
    GEMV picker warm up before capturing)."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{n} arrival counters first needed inside a CUDA graph capture; run the step once eagerly first")
        if have is not None:
            _RETIRED.append(have)
        have = _COUNTERS[device] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return have


def counters_all_zero() -> bool:
    """Every kernel left its counters at zero (the selftests check this after each call)."""
    return not any(bool(c.any()) for c in _COUNTERS.values())


def interpreter_numpy_fix() -> None:
    """Triton 3.6's CPU interpreter turns loop bounds into ints with int(array) on one-element
    arrays, which NumPy >= 2.4 refuses; read the element instead (interpreter only)."""
    import triton.runtime.interpreter as interp

    original = interp._patch_lang_tensor
    if getattr(original, "numpy_fix", False):  # applied already (each test module asks for it)
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.numpy_fix = True
    interp._patch_lang_tensor = patched


def interpreted(kernel) -> bool:
    """Whether a @triton.jit kernel runs under Triton's CPU interpreter. Triton reads TRITON_INTERPRET
    when the kernel's module is imported (at decoration), so this, not the variable now, decides."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def selftest_main(argv, doc: str, selftest, default_device: str, tol: dict[str, float], what: str) -> None:
    """`python -m <kernel module> --selftest [--device cpu|cuda]`: run `selftest(device)` (on CPU
    under Triton's interpreter) and exit 1 if its worst error is over tol[device]."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--device", default=default_device)
    a = ap.parse_args(argv)
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.exit(f"{what}: Triton is not installed")
    if a.selftest:
        if a.device == "cpu":
            interpreter_numpy_fix()
        worst = selftest(a.device)
        print(f"worst {what} error {worst:.2e} (tolerance {tol[a.device]:g})")
        sys.exit(0 if worst <= tol[a.device] else 1)
