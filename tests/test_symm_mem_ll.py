"""symm_mem_ll's Triton kernels (workers/comm/symm_mem_ll.py) on simulated ranks in one process,
under Triton's CPU interpreter (which must be chosen before Triton compiles anything, hence the
subprocess): every call pushes all ranks, then reduces all ranks (`mode` PUSH, REDUCE), or runs the
one-kernel mode the GPU runs. Checks exact sums, -0.0 inputs, the slots back at the sentinel after
each call, the phase counter cycling, the fused add + norm and the all-gather between plain calls,
and a reader that gives up on a missing peer."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SCENARIOS = r'''
import sys, torch
from workers.comm.symm_mem_ll import (BOTH, NPHASE, PUSH, REDUCE, _SENTINEL_BITS, launch, launch_add_norm,
                                      launch_all_gather, sentinel_fill_)
from workers.kernels.support import interpreter_numpy_fix
from workers.model.transformer import rms_norm

interpreter_numpy_fix()
gen = torch.Generator().manual_seed(0)
SENT = _SENTINEL_BITS[torch.float32]
numel, max_numel = 1500, 2048


def ranks(world, slots=None):
    bufs = [sentinel_fill_(torch.empty(NPHASE * (slots or world) * max_numel)) for _ in range(world)]
    return bufs, torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64), [torch.zeros(3, dtype=torch.int32) for _ in range(world)]


def clean(bufs, states, call):
    for r, (b, st) in enumerate(zip(bufs, states)):
        assert int(st[0]) == (call + 1) % NPHASE and int(st[1]) == 0, (r, st)
        assert bool((b.view(torch.int32) == SENT).all()), f"rank {r}: slots not cleared after call {call}"


def sums(world, calls=7):
    bufs, ptrs, states = ranks(world)
    for call in range(calls):
        xs = [torch.randn(numel - 97 * call, generator=gen) for _ in range(world)]
        xs[0][:5] = -0.0  # a real negative zero must not read as "not arrived"
        want = torch.stack(xs).sum(0)
        for mode in (PUSH, REDUCE):
            for r in range(world):
                launch(xs[r], ptrs, states[r], max_numel, r, world, mode=mode)
        for r in range(world):
            torch.testing.assert_close(xs[r], want, rtol=1e-5, atol=1e-5)
        clean(bufs, states, call)


def one_kernel():  # the GPU's mode (push, then poll) on a world of one: nothing to wait for
    bufs, ptrs, states = ranks(1)
    for call in range(NPHASE + 1):
        x = torch.randn(numel, generator=gen)
        want = x.clone()
        launch(x, ptrs, states[0], max_numel, 0, 1, mode=BOTH)
        torch.testing.assert_close(x, want)
        clean(bufs, states, call)


def add_norm(world=2, hidden=96, rows=3):  # allreduce + residual add + RMS norm, between plain calls (shared phases)
    bufs, ptrs, states = ranks(world)
    weight, residual = torch.randn(hidden, generator=gen), torch.randn(rows, hidden, generator=gen)
    for call in range(2 * NPHASE):
        parts = [torch.randn(rows, hidden, generator=gen) for _ in range(world)]
        want_s = residual + torch.stack(parts).sum(0)
        fused = call % 2 == 0
        for mode in (PUSH, REDUCE):
            outs = [launch_add_norm(parts[r], residual, weight, 1e-5, ptrs, states[r], max_numel, r, world, mode=mode)
                    if fused else launch(parts[r], ptrs, states[r], max_numel, r, world, mode=mode) for r in range(world)]
        for r in range(world):
            if fused:
                torch.testing.assert_close(outs[r][0], want_s, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(outs[r][1], rms_norm(want_s, weight, 1e-5), rtol=1e-5, atol=1e-5)
            else:
                torch.testing.assert_close(parts[r], want_s - residual, rtol=1e-5, atol=1e-5)
        clean(bufs, states, call)


def all_gather(world=3, n=700):  # vocab-parallel logits, between plain calls: every rank's part in rank order
    bufs, ptrs, states = ranks(world)
    for call in range(2 * NPHASE):
        parts = [torch.randn(n, generator=gen) for _ in range(world)]
        gather = call % 2 == 0
        outs = [torch.empty(world * n) for _ in range(world)]
        for mode in (PUSH, REDUCE):
            for r in range(world):
                if gather:
                    launch_all_gather(parts[r], outs[r], ptrs, states[r], max_numel, r, world, mode=mode)
                else:
                    launch(parts[r], ptrs, states[r], max_numel, r, world, mode=mode)
        for r in range(world):
            assert not gather or torch.equal(outs[r], torch.cat(parts)), f"rank {r}: gathered parts differ"
        clean(bufs, states, call)


def missing_peer():  # a peer that never pushes: the reader gives up after max_spins polls and flags it
    bufs, ptrs, states = ranks(2)
    launch(torch.ones(numel), ptrs, states[0], max_numel, 0, 2, mode=BOTH, max_spins=3)
    assert int(states[0][2]) == 1, states[0]


for name in sys.argv[1:]:
    fn, _, arg = name.partition(":")
    globals()[fn](*([int(arg)] if arg else []))
    print("ok", name)
'''

CASES = ["sums:2", "sums:3", "sums:4", "one_kernel", "add_norm", "all_gather", "missing_peer"]


def test_low_latency_allreduce_protocol_under_the_interpreter():
    pytest.importorskip("triton")
    r = subprocess.run([sys.executable, "-c", _SCENARIOS, *CASES], env={**os.environ, "TRITON_INTERPRET": "1"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.split() == [w for case in CASES for w in ("ok", case)]
