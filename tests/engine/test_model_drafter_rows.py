"""A drafter process's batched greedy drafts through the body one CUDA graph per (rows, k) captures
(workers/drafters/model_drafter.py `_rows_run`), run uncaptured on CPU: every row's drafts are its
own drafter's alone, over ragged rows (their own lengths, feeds and last tokens), and the body runs
once per step after a batch's packed first proposal.

    .venv/bin/python -m pytest -q -n 0 tests/engine/test_model_drafter_rows.py
"""

from __future__ import annotations

import pytest
import torch

from workers.drafters.model_drafter import ModelDrafter
from workers.model.checkpoint import load_model


@pytest.mark.parametrize("body", ["plain", "plain_prefilled", "fused_triton"])
@torch.inference_mode()
def test_batched_drafts_through_the_static_body_are_each_rows_own(tiny_draft_ckpt, body, request):
    """fused_triton: the body through the drafter's fused step (merged weights, the Triton GEMVs and
    the split-KV Triton attention reading each row up to its own positions) under Triton's interpreter.
    plain_prefilled: the prompts taken by `prefill_rows` as the batch starts (a drafter process, while
    the verifier prefills), so the first proposal runs the body too."""
    draft = load_model(tiny_draft_ckpt, max_seq=128)
    rows = ModelDrafter(draft)
    rows.rows_static = True  # the graphs' body, uncaptured (CPU)
    if body == "fused_triton":
        if request.getfixturevalue("kernel_device") != "cpu":
            pytest.skip("CPU test of the Triton kernels under their interpreter")
        from workers.engine.fused_step import FusedStep
        from workers.kernels.attention import decode_attend
        from workers.spec.engine_config import EngineConfig

        rows.steps.fast = FusedStep(draft, EngineConfig(compile=False, gemv="triton"), None, decode_attend)
    runs = []
    real = rows._rows_run
    rows._rows_run = lambda n, k: runs.append((n, k)) or real(n, k)
    rows.begin_rows(3)
    g = torch.Generator().manual_seed(8)
    committed = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (14, 5, 27)]
    alone = [ModelDrafter(draft) for _ in committed]
    for d, c in zip(alone, committed):
        d.prefill(c)
    if body == "plain_prefilled":
        rows.prefill_rows([c[:-1] for c in committed])  # the prompts, before the verifier's first tokens
    k, steps = 4, 3 if body == "fused_triton" else 5  # the interpreter is slow: fewer steps
    for step in range(steps):
        got = rows.propose_rows(committed, [0, 1, 2], k)
        for i, (d, c) in enumerate(zip(alone, committed)):
            want = d.propose(c, k).tokens
            assert got[i].tokens == want, (step, i)
            c.extend(want[: (i + step) % (k + 1)] + [7])  # 0 .. k drafts kept, then a token of the verifier's
    # the first proposal prefills packed (eager) unless `prefill_rows` did; every later one: the body once
    assert runs == [(3, k)] * (steps if body == "plain_prefilled" else steps - 1)


@torch.inference_mode()
def test_rows_near_the_cache_end_take_the_eager_passes(tiny_draft_ckpt):
    """Where the padded body would need positions past the cache, the eager passes draft (the same drafts)."""
    draft = load_model(tiny_draft_ckpt, max_seq=40)
    rows, plain = ModelDrafter(draft), ModelDrafter(draft)
    rows.rows_static = True
    runs = []
    real = rows._rows_run
    rows._rows_run = lambda n, k: runs.append((n, k)) or real(n, k)
    for d in (rows, plain):
        d.begin_rows(2)
    committed = [list(range(3, 36)), list(range(5, 12))]  # row 0: 33 tokens, at 34 next: 34 + 2 x 4 > 40
    for step in range(2):
        got = rows.propose_rows(committed, [0, 1], 4)
        want = plain.propose_rows(committed, [0, 1], 4)
        assert [got[i].tokens for i in (0, 1)] == [want[i].tokens for i in (0, 1)]
        for i, c in enumerate(committed):
            c.extend(want[i].tokens[:1] + [9])
    assert runs == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("prefilled", [False, True])
@torch.inference_mode()
def test_on_a_gpu_the_captured_batched_drafts_are_each_rows_own(tiny_draft_ckpt, prefilled):
    """On CUDA: `warm_rows` captures the (rows, k) graph, and its replays draft what each row's own
    drafter drafts (batch 1's captured chains); prefilled: the prompts packed by `prefill_rows` on the
    GPU first, so the first proposal replays the graph too."""
    from workers.spec.engine_config import EngineConfig

    draft = load_model(tiny_draft_ckpt, max_seq=128, device="cuda")
    engine = EngineConfig(compile=False)
    rows = ModelDrafter(draft, engine=engine)
    rows.begin(0.0, 0)
    k = 4
    rows.warm_rows(k, {3})
    assert rows._rows_graphs.get((3, k)) is not None
    rows.begin_rows(3)
    g = torch.Generator().manual_seed(8)
    committed = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (14, 5, 27)]
    alone = [ModelDrafter(draft, engine=engine) for _ in committed]
    for d, c in zip(alone, committed):
        d.prefill(c)
    if prefilled:
        rows.prefill_rows([c[:-1] for c in committed])
    replays = []  # steps drafted through the captured graph (not the eager passes)
    real = rows._rows_static_drafts
    rows._rows_static_drafts = lambda *a: (out := real(*a)) is not None and replays.append(1) or out
    for step in range(5):
        got = rows.propose_rows(committed, [0, 1, 2], k)
        for i, (d, c) in enumerate(zip(alone, committed)):
            want = d.propose(c, k).tokens
            assert got[i].tokens == want, (step, i)
            c.extend(want[: (i + step) % (k + 1)] + [7])
    assert list(rows._rows_graphs) == [(3, k)]
    assert len(replays) == (5 if prefilled else 4)  # the body (its graph) every step after the prompts
