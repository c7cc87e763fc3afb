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

import json
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "engine", "e2e")
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # `from studyutil import ...` from every tier's folder

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def pytest_configure(config):
    """Where tests run (an xdist worker, or a run without xdist), before any test module is imported. The
    xdist controller runs none: it does not import torch (~2.4 CPU-s)."""
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no":
        return
    import torch

    # the suite runs on three xdist workers over two cores: one intra-op thread each (tiny tensors pay for
    # thread hand-offs, and more threads than cores only queue); processes the tests start choose their own
    torch.set_num_threads(1)
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


# Seconds each test took in a recorded run of the whole suite (`--record-durations tests/durations.json`).
# The suite runs longest first: with `--dist load --maxschedchunk 1` (infra/test.sh) xdist hands each
# worker two tests at the start and then one more whenever it is down to one queued, in this order, so
# the long end-to-end studies start early, spread over the workers, instead of one of them ending last.
# The price: tests of one module no longer run back to back, so a module-scoped fixture may be set up
# once per run of its tests (so tests/e2e/test_ray_placement.py's checks on one fake-GPU Ray are one test).
DURATIONS = TESTS / "durations.json"


def pytest_addoption(parser):
    parser.addoption("--record-durations", metavar="PATH", help="write each test's seconds (setup + call + teardown) as JSON to PATH")


def pytest_collection_modifyitems(config, items):
    """Mark each test by its tier's folder (tests/unit -> unit, tests/engine -> engine, tests/e2e -> e2e),
    and order the tests longest first by the recorded durations (a test not recorded yet counts as
    the median: new tests neither jump the queue nor wait for the end)."""
    for item in items:
        path = Path(item.path).resolve()
        tier = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else None
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    known = sorted(seconds.values())
    middle = known[len(known) // 2] if known else 0.0
    items.sort(key=lambda item: -seconds.get(item.nodeid, middle))  # stable: equal times keep file order


_recorded: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _recorded[report.nodeid] = _recorded.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    """--record-durations: the tests that ran update their entries in PATH; the others keep theirs (a `-k`
    or a failed run never shrinks the file). Only the xdist controller (or a plain run) writes it."""
    path = session.config.getoption("--record-durations")
    if path and not hasattr(session.config, "workerinput"):
        try:
            seconds = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            seconds = {}
        seconds.update({k: round(v, 2) for k, v in _recorded.items()})
        Path(path).write_text(json.dumps(dict(sorted(seconds.items())), indent=0) + "\n")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """Tiny Llama with GQA (4 query heads, 2 KV heads), random weights, no tokenizer."""
    from workers.model.checkpoint import tiny_config, write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("tiny"), tiny_config(), seed=0)


@pytest.fixture(scope="session")
def tiny_draft_ckpt(tmp_path_factory):
    """A different tiny random model with the same vocabulary: a weak but valid draft model."""
    from workers.model.checkpoint import tiny_config, write_random_checkpoint

    cfg = tiny_config(num_hidden_layers=1, hidden_size=32, intermediate_size=64, head_dim=8)
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny_draft"), cfg, seed=1)


@pytest.fixture(scope="session")
def smollm2():
    from workers.model.checkpoint import resolve_model_path

    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def kernel_device() -> str:
    """ "cpu" where the Triton kernels run under the interpreter (float32 there), "cuda" where they
    are built for the GPU (bf16 there); skips where Triton is missing or neither can run."""
    pytest.importorskip("triton")
    import torch

    from workers.kernels import attention
    from workers.kernels.support import interpreted, interpreter_numpy_fix

    if interpreted(attention._partial):
        interpreter_numpy_fix()
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("the Triton kernels need a CUDA device or TRITON_INTERPRET=1 (set before they are imported)")
    return "cuda"
