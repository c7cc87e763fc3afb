"""Shared fixtures: tiny random checkpoints, the real demo model (fetched once per machine), and
the device the Triton kernel tests (tests/test_kernels_*.py) run on.

Triton reads TRITON_INTERPRET when a kernel is decorated, that is when its module is imported, so
it is set here, before any test module imports one: on a machine without CUDA every kernel runs
under Triton's CPU interpreter; on a GPU machine the kernels are built for the GPU (unless the
variable is set to 1 already: then the interpreter runs them there too).

The tests sit in tiers, one folder each: tests/unit (pure logic, fast), tests/engine (the workers'
engine, kernels, model and drafters, decoding through local gangs), tests/e2e (Ray, `spectune`
subprocesses, studies, fault injection). Every test is marked by its folder, so `pytest -m unit`
runs the fast tier. tests/ itself is put on sys.path so the tiers import `studyutil` from here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "engine", "e2e")
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # `from studyutil import ...` from every tier's folder

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# the suite runs on three xdist workers over two cores: one intra-op thread each (tiny tensors pay for
# thread hand-offs, and more threads than cores only queue); processes the tests start choose their own
torch.set_num_threads(1)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from workers.model.checkpoint import resolve_model_path, tiny_config, write_random_checkpoint  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Mark each test by its tier's folder (tests/unit -> unit, tests/engine -> engine, tests/e2e -> e2e)."""
    for item in items:
        path = Path(item.path).resolve()
        tier = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else None
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """Tiny Llama with GQA (4 query heads, 2 KV heads), random weights, no tokenizer."""
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny"), tiny_config(), seed=0)


@pytest.fixture(scope="session")
def tiny_draft_ckpt(tmp_path_factory):
    """A different tiny random model with the same vocabulary: a weak but valid draft model."""
    cfg = tiny_config(num_hidden_layers=1, hidden_size=32, intermediate_size=64, head_dim=8)
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny_draft"), cfg, seed=1)


@pytest.fixture(scope="session")
def smollm2():
    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def kernel_device() -> str:
    """ "cpu" where the Triton kernels run under the interpreter (float32 there), "cuda" where they
    are built for the GPU (bf16 there); skips where Triton is missing or neither can run."""
    pytest.importorskip("triton")
    from workers.kernels import attention
    from workers.kernels.support import interpreted, interpreter_numpy_fix

    if interpreted(attention._partial):
        interpreter_numpy_fix()
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("the Triton kernels need a CUDA device or TRITON_INTERPRET=1 (set before they are imported)")
    return "cuda"
