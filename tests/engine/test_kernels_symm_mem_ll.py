"""The `symm_mem_ll` allreduce's Triton protocol (workers/comm/symm_mem_ll.py) on simulated ranks in
one process: every rank's buffer is a CPU tensor whose address the others write to, and each call
runs the push half of every rank, then the reduce half of every rank. Checked: exact sums for 1-4
ranks over several calls, a real -0.0 not read as "not arrived", each phase's slots back to the
sentinel after its reduce, the phase counter cycling, the fused add + RMS norm and the all-gather
between plain calls (they share the phases), and a reader that gives up on a missing peer.

    python -m pytest tests/engine/test_kernels_symm_mem_ll.py    # CPU, Triton's interpreter (tests/conftest.py)
"""

from __future__ import annotations

import pytest
import torch

from workers.comm.symm_mem_ll import SymmMemLLAllReduce

MAX_NUMEL = 2048


@pytest.fixture
def ll(kernel_device):
    """The module, where its kernels run under the interpreter (simulated ranks share one process)."""
    from workers.comm import symm_mem_ll

    if kernel_device != "cpu":
        pytest.skip("simulated ranks need Triton's CPU interpreter (on GPUs the gang validates the backend at setup)")
    return symm_mem_ll


def _ranks(ll, world: int):
    """Per rank: its symmetric buffer (NPHASE phases x world slots, all sentinel) and its state; and
    the pointer table every rank reads its peers' buffers through."""
    bufs = [ll.sentinel_fill_(torch.empty(ll.NPHASE * world * MAX_NUMEL)) for _ in range(world)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    return bufs, ptrs, [torch.zeros(3, dtype=torch.int32) for _ in range(world)]


def _after_call(ll, call: int, bufs, states) -> None:
    sentinel = ll._SENTINEL_BITS[torch.float32]
    for r, (buf, state) in enumerate(zip(bufs, states)):
        assert int(state[0]) == (call + 1) % ll.NPHASE and int(state[1]) == 0, f"rank {r}, call {call}: state {state.tolist()}"
        assert bool((buf.view(torch.int32) == sentinel).all()), f"rank {r}: slots not cleared after call {call}"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_allreduce_sums_exactly_and_clears_its_slots(ll, world):
    gen = torch.Generator().manual_seed(world)
    bufs, ptrs, states = _ranks(ll, world)
    for call in range(7):  # more calls than phases, each a different size
        n = 1500 - 97 * call
        xs = [torch.randn(n, generator=gen) for _ in range(world)]
        xs[0][:5] = -0.0  # a real negative zero must not read as "not arrived"
        want = torch.stack(xs).sum(0)
        for mode in (ll.PUSH, ll.REDUCE):
            for r in range(world):
                ll.launch(xs[r], ptrs, states[r], MAX_NUMEL, r, world, mode=mode)
        for r in range(world):
            torch.testing.assert_close(xs[r], want, rtol=1e-5, atol=1e-5)
        _after_call(ll, call, bufs, states)


def test_one_kernel_push_and_reduce_on_a_world_of_one(ll):
    """The mode the GPU runs (push, then poll, in one kernel), with nothing to wait for."""
    gen = torch.Generator().manual_seed(1)
    bufs, ptrs, states = _ranks(ll, 1)
    for call in range(ll.NPHASE + 1):
        x = torch.randn(1500, generator=gen)
        want = x.clone()
        ll.launch(x, ptrs, states[0], MAX_NUMEL, 0, 1, mode=ll.BOTH)
        torch.testing.assert_close(x, want)
        _after_call(ll, call, bufs, states)


def test_allreduce_add_norm_between_plain_calls(ll):
    """allreduce + residual add + RMS norm in one kernel, alternating with plain allreduces."""
    from workers.model.transformer import rms_norm

    gen = torch.Generator().manual_seed(2)
    world, hidden, rows = 2, 96, 3
    bufs, ptrs, states = _ranks(ll, world)
    weight, residual = torch.randn(hidden, generator=gen), torch.randn(rows, hidden, generator=gen)
    for call in range(2 * ll.NPHASE):
        parts = [torch.randn(rows, hidden, generator=gen) for _ in range(world)]
        want_sum = residual + torch.stack(parts).sum(0)
        fused = call % 2 == 0
        for mode in (ll.PUSH, ll.REDUCE):
            outs = [
                ll.launch_add_norm(parts[r], residual, weight, 1e-5, ptrs, states[r], MAX_NUMEL, r, world, mode=mode)
                if fused
                else ll.launch(parts[r], ptrs, states[r], MAX_NUMEL, r, world, mode=mode)
                for r in range(world)
            ]
        for r in range(world):
            if fused:
                torch.testing.assert_close(outs[r][0], want_sum, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(outs[r][1], rms_norm(want_sum, weight, 1e-5), rtol=1e-5, atol=1e-5)
            else:
                torch.testing.assert_close(parts[r], want_sum - residual, rtol=1e-5, atol=1e-5)
        _after_call(ll, call, bufs, states)


def test_all_gather_between_plain_calls(ll):
    """Vocab-parallel logits: every rank's part at its offset, in rank order, alternating with allreduces."""
    gen = torch.Generator().manual_seed(3)
    world, n = 3, 700
    bufs, ptrs, states = _ranks(ll, world)
    for call in range(2 * ll.NPHASE):
        parts = [torch.randn(n, generator=gen) for _ in range(world)]
        gather = call % 2 == 0
        outs = [torch.empty(world * n) for _ in range(world)]
        for mode in (ll.PUSH, ll.REDUCE):
            for r in range(world):
                if gather:
                    ll.launch_all_gather(parts[r], outs[r], ptrs, states[r], MAX_NUMEL, r, world, mode=mode)
                else:
                    ll.launch(parts[r], ptrs, states[r], MAX_NUMEL, r, world, mode=mode)
        for r in range(world):
            if gather:
                assert torch.equal(outs[r], torch.cat(parts)), f"rank {r}: gathered parts differ"
        _after_call(ll, call, bufs, states)


def test_reader_gives_up_on_a_missing_peer(ll):
    """A peer that never pushes: the reader stops after max_spins polls and sets the timeout flag
    instead of hanging."""
    _, ptrs, states = _ranks(ll, 2)
    ll.launch(torch.ones(1500), ptrs, states[0], MAX_NUMEL, 0, 2, mode=ll.BOTH, max_spins=3)
    assert int(states[0][2]) == 1, states[0]


def test_symm_mem_ll_says_when_a_reader_gave_up():
    """The flag above, read after the warm-up steps (StepRunner.warm): a rank that fell behind fails
    the trial with one line instead of leaving wrong sums."""
    ar = SymmMemLLAllReduce(None, 2)
    ar.rank, ar.state = 1, torch.zeros(3, dtype=torch.int32)
    ar.raise_if_timed_out()  # nothing happened
    ar.state[2] = 1
    with pytest.raises(RuntimeError, match="symm_mem_ll: rank 1 waited more than .* polls for a peer's partial sums"):
        ar.raise_if_timed_out()
