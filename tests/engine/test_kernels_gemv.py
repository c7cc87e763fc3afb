"""The skinny-GEMM Triton kernel (workers/kernels/gemv.py) against F.linear, one test per
configuration, shape and epilogue: ragged token rows (1-17) and weight shapes, a bias, the SwiGLU
epilogue on a merged gate/up weight, split K with its last-arrival reduction, each run twice (the
split-K counters must be back at zero).

    python -m pytest tests/engine/test_kernels_gemv.py     # CPU: Triton's interpreter (tests/conftest.py); GPU: bf16
"""

from __future__ import annotations

import pytest

from workers.kernels import gemv

CASES = [
    (shape, swiglu, config)
    for shape in gemv.SELFTEST_SHAPES
    for swiglu in (False, True)
    for config in gemv.CONFIGS
    if gemv.runs_config(config, swiglu)
]


@pytest.mark.parametrize(
    "shape, swiglu, config",
    CASES,
    ids=[f"T{s[0]}-N{s[1]}-K{s[2]}-{'swiglu' if g else 'bias'}-{'x'.join(map(str, c))}" for s, g, c in CASES],
)
def test_gemv_matches_f_linear(kernel_device, shape, swiglu, config):
    err = gemv.check_config(shape, swiglu, config, kernel_device, seed=gemv.SELFTEST_SHAPES.index(shape))
    assert err <= gemv.SELFTEST_TOL[kernel_device], f"relative error {err:.2e}"


def test_swiglu_runs_on_some_configurations_only():
    """The SwiGLU epilogue needs the whole K sum in one program and fits fewer weight tiles in shared
    memory: some configurations take it, others (split K) do not, and the tests above cover both."""
    takes = [c for c in gemv.CONFIGS if gemv.runs_config(c, True)]
    assert 0 < len(takes) < len(gemv.CONFIGS)
    assert all(c[2] == 1 for c in takes)
    assert any(c[2] > 1 for c in gemv.CONFIGS)
