"""The bodies spectune captures as CUDA graphs read nothing back to the host (CPU tests).

A CUDA graph capture fails, and poisons the process, on any operation that waits for the device:
`.item()`, indexing by a 0-dim tensor (it becomes `.item()`), boolean masks (`nonzero`),
`torch.equal`... On CPU nothing fails, so a capture-breaking line passes every CPU test and
surfaces only on the GPU (as the EAGLE-3 chain's `d2t[argmax]` did). Here the EAGLE-3 chain's body
(also drafting each depth's top-W for a tree), the batched verify pass (plain layers, and the fused
step with SDPA) and the tree verify step (plain, fused with SDPA under the tree mask; the fused
step with the Triton attention reading ancestor bits runs under the interpreter, outside the check)
and the device loop's verify + acceptance and fed chain run on CPU under a dispatch mode that raises on the operators that sync a device. (A copy to the host, `.tolist()` or `.cpu()`,
is not an operator it sees on CPU.)
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workers.drafters.eagle3.checkpoint import head_config, random_head
from workers.drafters.eagle3.head import Eagle3Drafter
from workers.engine.batched import static_pass
from workers.engine.fused_step import FusedStep
from workers.model.checkpoint import load_args, load_model
from workers.spec.engine_config import EngineConfig

aten = torch.ops.aten
SYNCING = {
    aten.item.default,  # .item(), int(t), t[0-dim index] (under inference_mode)
    aten._local_scalar_dense.default,  # what item decomposes to elsewhere
    aten.nonzero.default,
    aten.masked_select.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}


class NoHostSync(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCING:
            raise AssertionError(f"{func} reads a device value on the host: a CUDA graph capture fails on it")
        if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
            for ix in args[1]:
                if ix is not None and ix.dtype == torch.bool:
                    raise AssertionError(f"{func} with a boolean mask runs nonzero: a CUDA graph capture fails on it")
        return func(*args, **(kwargs or {}))


def test_the_detector_catches_a_zero_dim_index():
    table, i = torch.arange(10), torch.tensor([3, 4]).argmax()
    with pytest.raises(AssertionError, match="item|_local_scalar_dense"), NoHostSync():
        table[i]
    with NoHostSync():
        table.index_select(0, i.reshape(-1))


@pytest.mark.parametrize("fast, width", [(False, 1), (True, 1), (True, 3)])
@torch.inference_mode()
def test_the_eagle3_chain_body_never_syncs(tiny_ckpt, fast, width):
    # a reduced draft vocabulary mapped to target ids 100..163: drafts go through d2t; fast: the
    # head steps through HeadFastStep (merged weights, the picker's GEMMs, SDPA)
    from workers.drafters.eagle3.chain import HeadFastStep

    head = random_head(head_config(load_args(tiny_ckpt), draft_vocab=64), d2t_from=list(range(100, 164)))
    step = HeadFastStep(head, EngineConfig(compile=False, gemv="cublas", attention="sdpa")) if fast else None
    chain = Eagle3Drafter(head, chain=True, fast=step).chain
    T, k = 3, 4
    chain._tok[:T] = torch.tensor([5, 6, 7])
    chain._pos[0, :T] = torch.arange(T)
    with NoHostSync():
        out = chain._run(T, k, width)  # width 3: each depth's top-3 (a tree)
    assert out.shape == ((k,) if width == 1 else (k, width)) and all(100 <= t < 164 for t in out.flatten().tolist())


@pytest.mark.parametrize("fused", [False, True])
@torch.inference_mode()
def test_the_batched_pass_never_syncs(tiny_ckpt, fused):
    model = load_model(tiny_ckpt, max_seq=64)
    fast = FusedStep(model, EngineConfig(compile=False, gemv="off")) if fused else None
    cache = model.new_cache(3)
    tokens = torch.randint(0, 512, (3, 4))
    pos = torch.tensor([5, 11, 8])[:, None] + torch.arange(4)
    with NoHostSync():
        logits = static_pass(model, tokens, pos, cache, fast)
    assert logits.shape[:2] == (3, 4)


@pytest.mark.parametrize("fused", [False, True, "triton"])
@torch.inference_mode()
def test_the_tree_step_body_never_syncs_and_scores_as_the_eager_tree(tiny_ckpt, fused, request):
    """The graphed tree step's body (static tokens, rotary positions, slots, ancestor bits and mask,
    staged as `_tree_replay` stages them; the plain layers, the fused step with SDPA under the tree
    mask, or the fused step with the split-KV kernel reading the bits) on CPU: no host sync, and
    the logits of `Transformer.tree_logits` on the same cache."""
    from workers.engine.steps import StepRunner

    model = load_model(tiny_ckpt, max_seq=64)
    cache = model.new_cache(1)
    model(torch.tensor([list(range(20, 31))]), cache)  # 11 cached positions
    runner = StepRunner(model, cache, 8, engine=EngineConfig(compile=False))
    if fused == "triton":  # under Triton's interpreter (copies to numpy: no sync check)
        if request.getfixturevalue("kernel_device") != "cpu":
            pytest.skip("the CPU model's tree step through Triton runs under the interpreter only")
        from workers.kernels.attention import decode_attend

        runner.fast = FusedStep(model, EngineConfig(compile=False, gemv="off"), attend_fn=decode_attend)
    elif fused:
        runner.fast = FusedStep(model, EngineConfig(compile=False, gemv="off"))
    tokens, parents = [4, 5, 6, 7, 8], [-1, 0, 1, 0, 1]
    runner._tree_buffers()
    runner._tree_mask.fill_(True)  # a previous, wider step's rows: the staging must clear what it uses
    runner._tree_in.fill_(-1)
    T = len(tokens)
    assert runner._tree_needs_mask() == (fused != "triton")
    runner._stage_tree(tokens, parents, cache.lengths[0], ids=True, mask=runner._tree_needs_mask())  # as _tree_replay does
    with NoHostSync() if fused != "triton" else contextlib.nullcontext():
        graphed = runner._run_tree(T)[0]
    eager = model.tree_logits(tokens, parents, cache)
    torch.testing.assert_close(graphed, eager, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fast, simulated", [(False, False), (True, True)])
@torch.inference_mode()
def test_the_device_loop_bodies_never_sync(tiny_ckpt, fast, simulated):
    """The device loop's two graphs (workers/engine/device_loop.py): verify + acceptance (greedy, or
    the planned n), then the head's chain fed from what acceptance left on the device."""
    from workers.drafters.eagle3.chain import HeadFastStep
    from workers.drafters.eagle3.head import default_aux_layers
    from workers.engine.device_loop import AcceptOnDevice
    from workers.engine.steps import StepRunner

    model = load_model(tiny_ckpt, max_seq=64)
    model.aux_layers = default_aux_layers(model.args.n_layers)
    k = 3
    steps = StepRunner(model, model.new_cache(1), max_width=k + 1, engine=EngineConfig(compile=False, cuda_graphs=False))
    steps.prefill([5, 6, 7, 8])
    loop = AcceptOnDevice(steps, k, max_steps=8)
    loop.plan[:1] = 2
    loop.stage(9, torch.tensor([10, 11, 12]), steps.cache.lengths[0])
    with NoHostSync():
        result = loop._body(simulated)
    loop.feed.aux = model.aux
    head = random_head(head_config(load_args(tiny_ckpt), draft_vocab=64), d2t_from=list(range(100, 164)))
    step = HeadFastStep(head, EngineConfig(compile=False, gemv="cublas", attention="sdpa")) if fast else None
    chain = Eagle3Drafter(head, chain=True, fast=step).chain
    with NoHostSync():
        chain._run_fed(loop.feed, k)
    assert result.shape == (2 * (k + 1),) and (result[0] == 2 or not simulated)
    assert all(100 <= t < 164 for t in steps._inputs[0, 1 : k + 1].tolist())  # the drafts, in the next pass's input


def _ragged_inputs(n: int, k: int) -> tuple[list[int], list[int], list[int]]:
    """Three rows of k + 1 entries at their own positions (from 7, 0 and 19), last real entries 4, 0, 2."""
    tokens = torch.randint(0, 512, (n * (k + 1),)).tolist()
    return tokens, [s + j for s in (7, 0, 19)[:n] for j in range(k + 1)], [4, 0, 2][:n]


@pytest.mark.parametrize("fast", [False, True])
@torch.inference_mode()
def test_the_batched_eagle3_head_pass_never_syncs(tiny_ckpt, fast):
    """The depth passes of every row's chain (workers/drafters/eagle3/rows.py), what one CUDA graph
    per (rows, k) captures: ragged rows (their own positions and last entries), over the whole
    static head cache."""
    from workers.drafters.eagle3.chain import HeadFastStep
    from workers.drafters.eagle3.rows import Eagle3Rows

    head = random_head(head_config(load_args(tiny_ckpt), draft_vocab=64), d2t_from=list(range(100, 164)))
    step = HeadFastStep(head, EngineConfig(compile=False, gemv="cublas", attention="sdpa")) if fast else None
    rows = Eagle3Rows(head, 3, fast=step, capture=False)
    n, k = 3, 4
    rows._in.send(*_ragged_inputs(n, k))
    with NoHostSync():
        out = rows._run(n, k)
    assert out.shape == (n, k) and all(100 <= t < 164 for t in out.flatten().tolist())


@torch.inference_mode()
def test_the_batched_draft_model_pass_never_syncs(tiny_ckpt):
    """A drafter process's greedy batched drafts (workers/drafters/model_drafter.py `_rows_run`): the
    body one CUDA graph per (rows, k) captures, over ragged rows."""
    from workers.drafters.model_drafter import ModelDrafter

    drafter = ModelDrafter(load_model(tiny_ckpt, max_seq=64))
    drafter.begin_rows(3)
    n, k = 3, 4
    drafter._rows_in.send(*_ragged_inputs(n, k))
    with NoHostSync():
        out = drafter._rows_run(n, k)
    assert out.shape == (n, k)
