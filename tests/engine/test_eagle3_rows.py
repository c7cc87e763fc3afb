"""One EAGLE-3 head pass per depth for every row of a batch (workers/drafters/eagle3/rows.py), on CPU
in float32: each row's greedy drafts are those of its own `Eagle3Drafter` (the eager loop, the chain's
body, and both through `HeadFastStep`), over ragged rows (prompts longer and shorter than a step's
feed, different acceptance per row, a row that finishes early), with one head pass per depth for all
rows; a batched run decodes, drafts and accepts as batch 1 does.

    .venv/bin/python -m pytest -q -n 0 tests/engine/test_eagle3_rows.py
"""

from __future__ import annotations

import pytest
import torch

from workers.drafters.eagle3.checkpoint import head_config, random_head
from workers.drafters.eagle3.head import Eagle3Drafter
from workers.drafters.eagle3.rows import Eagle3Rows
from workers.model.checkpoint import load_args
from workers.spec.engine_config import EngineConfig


def _head(tiny_ckpt, max_seq: int = 96):
    """A random head with a reduced draft vocabulary mapped to target ids 100..163 (drafts go through
    d2t) and a cache of max_seq positions (the split-KV attention's interpreter runs a program per
    slice of them)."""
    from workers.drafters.eagle3.head import Eagle3Head

    weights = random_head(head_config(load_args(tiny_ckpt), draft_vocab=64), seed=2, d2t_from=list(range(100, 164)))
    head = Eagle3Head(weights.cfg, max_seq=max_seq)
    head.load_state_dict(weights.state_dict())
    return head


def _rows_against_alone(head, fast, chain: bool, capture: bool, steps: int = 6, k: int = 4) -> None:
    """Ragged rows (prompts of 14, 3, 27, 6 tokens: two longer than a step's feed), 0 .. k drafts
    kept per row and step, row 1 finishing after two steps: the group's drafts are each row's own
    drafter's, one head pass per depth for all rows, and the row past the batch is left alone (two
    rows' prompt entries packed after the prefill, `feed_prompts`, one at its first proposal). From
    the second step the group gets its states as references into one batched pass's aux outputs
    (`observe_rows`, staged in one copy per aux layer) and, every other step, leaves its drafts on
    the device."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (14, 3, 27, 6)]
    group = Eagle3Rows(head, 5, fast=fast, capture=capture)  # a row more than the batch: left alone
    group.warm(k, {len(prompts)})
    group.begin(len(prompts))
    alone = [Eagle3Drafter(head, chain=chain, fast=fast) for _ in prompts]
    committed = []
    width = 3 * head.cfg.target_hidden
    for i, p in enumerate(prompts):
        states = torch.randn(len(p), width, generator=g)
        group.rows[i].prefill(p)
        group.rows[i].observe(states)
        alone[i].prefill(p)
        alone[i].observe(states)
        committed.append(p + [int(torch.randint(0, 512, (1,), generator=g))])  # the verifier's first token
    # rows 0 and 2: their prompt entries packed after the prefill; row 3's (longer than a step's feed
    # too) at its first proposal
    group.feed_prompts({0: committed[0], 2: committed[2]}, k)
    assert group.cache.lengths[:4] == [13, 0, 26, 0]
    live = [0, 1, 2, 3]
    for step in range(steps):
        if step == 2:
            live.remove(1)  # finished: its row gets a scratch entry, the others must not notice
        passes = group.passes
        on_device = step % 2 == 1
        got = group.propose({i: committed[i] for i in live}, k, on_device=on_device)
        assert group.passes - passes == k  # one head pass per depth, all rows at once
        assert sorted(got) == live
        # a batched verify pass's aux outputs: three layers [rows, k + 1, width / 3]
        aux = [torch.randn(len(prompts), k + 1, width // 3, generator=g) for _ in range(3)]
        for i in live:
            want = alone[i].propose(committed[i], k).tokens
            assert (got[i].device_tokens.tolist() if on_device else got[i].tokens) == want, (step, i)
            assert all(100 <= t < 164 for t in want)
            kept = (i + step) % (k + 1)  # 0 .. k drafts kept, then one of the verifier's
            committed[i].extend(want[:kept] + [int(torch.randint(0, 512, (1,), generator=g))])
            # [last, kept drafts]: row i's first 1 + kept positions of the pass
            alone[i].observe(torch.cat([a[i, : 1 + kept] for a in aux], dim=-1))
            group.rows[i].observe_rows(aux, i, 1 + kept)
    assert len({tuple(alone[i].propose(committed[i], k).tokens) for i in live}) > 1  # rows draft from their own states
    assert group.cache.lengths[4] == 0 and not group.cache.k[0][4].any()  # the row past the batch
    if capture:
        assert list(group.graphs) == [(len(prompts), k)]  # captured by warm, replayed every step


@pytest.mark.parametrize("reference", ["eager_loop", "chain", "fast_chain", "fast_triton_chain"])
@torch.inference_mode()
def test_one_pass_per_depth_drafts_each_rows_own_chain(tiny_ckpt, reference, request):
    """fast_triton_chain: both through HeadFastStep with the split-KV Triton attention (rope, cache
    write, each row read up to its own positions) under Triton's interpreter."""
    head = _head(tiny_ckpt)
    fast = attend_fn = None
    if reference.startswith("fast"):
        from workers.drafters.eagle3.chain import HeadFastStep

        if reference == "fast_triton_chain":
            if request.getfixturevalue("kernel_device") != "cpu":
                pytest.skip("CPU test of the Triton kernels under their interpreter")
            from workers.kernels.attention import decode_attend as attend_fn
        fast = HeadFastStep(head, EngineConfig(compile=False, gemv="cublas", attention="sdpa"), attend_fn)
    steps = 3 if attend_fn is not None else 6  # the interpreter is slow: fewer steps
    _rows_against_alone(head, fast, chain=reference != "eager_loop", capture=False, steps=steps)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


@CUDA
@pytest.mark.parametrize("fast", [False, True])
@torch.inference_mode()
def test_on_a_gpu_the_captured_pass_drafts_each_rows_own_captured_chain(tiny_ckpt, fast):
    """On CUDA: the graph per (rows, k), through the eager head step or `HeadFastStep` (the GEMV
    picker, the split-KV Triton attention), drafts what each row's own captured chain drafts."""
    from workers.drafters.eagle3.chain import HeadFastStep

    head = _head(tiny_ckpt).cuda()
    step = HeadFastStep(head, EngineConfig(compile=False)) if fast else None
    _rows_against_alone(head, step, chain=True, capture=True)


@torch.inference_mode()
def test_a_row_without_room_drafts_nothing_and_keeps_its_entries(tiny_ckpt):
    """A row whose head cache cannot take k more entries gets no drafts (as Eagle3Drafter), and its
    entries stay; the other rows draft as before."""
    head = _head(tiny_ckpt, max_seq=24)  # 24 positions
    small = Eagle3Rows(head, 2, capture=False)
    g = torch.Generator().manual_seed(4)
    width = 3 * head.cfg.target_hidden
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (22, 5)]
    small.begin(2)
    committed = []
    for i, p in enumerate(prompts):
        small.rows[i].prefill(p)
        small.rows[i].observe(torch.randn(len(p), width, generator=g))
        committed.append(p + [9])
    got = small.propose({0: committed[0], 1: committed[1]}, 4)  # row 0: 22 + 4 > 24
    assert got[0].tokens == [] and len(got[1].tokens) == 4
    assert small.cache.lengths == [0, 5 + 4 - 1]  # row 0 fed nothing (its states wait), row 1 its prompt and 3 drafts
    # the next batched pass's states: by reference; row 0 (no room) dropped its own, so a second
    # pass's reference is no stale read for it, while row 1's unfed reference would be
    aux = [torch.randn(2, 5, width // 3, generator=g) for _ in range(3)]
    for i in (0, 1):
        small.rows[i].observe_rows(aux, i, 2)
    small.propose({0: committed[0] + [1, 2], 1: committed[1] + [1, 2]}, 4)  # feeds row 1's reference, drops row 0's
    small.rows[1].observe_rows(aux, 1, 1)
    with pytest.raises(RuntimeError, match="row 1: states of an earlier batched pass were never fed"):
        small.rows[1].observe_rows(aux, 1, 1)  # no proposal between two passes


@torch.inference_mode()
def test_a_batched_run_drafts_and_accepts_as_batch_one(tiny_ckpt):
    """EAGLE-3 in the rank (greedy), batches of 3 over 7 prompts (the last batch of 1): every
    sequence's tokens, steps, accepted drafts and each of its proposals are batch 1's (where each
    proposal came from the drafter alone), and every batched step drafted all its rows in k passes,
    most of them queued behind the step before's verify pass (the look-ahead)."""
    from test_batched_prefill import _prompts, _verifier

    from workers.drafters.eagle3.head import default_aux_layers
    from workers.model.checkpoint import load_model
    from workers.spec import Workload

    model = load_model(tiny_ckpt, max_seq=128)
    model.aux_layers = default_aux_layers(model.args.n_layers)
    head = random_head(head_config(model.args, draft_vocab=model.args.vocab_size), seed=5)
    prompts = tuple(tuple(p) for p in _prompts([12, 4, 20, 9, 30, 16, 3]))
    k = 3

    def which(committed):
        return next(i for i, p in enumerate(prompts) if tuple(committed[: len(p)]) == p)

    seen: dict[str, dict[int, list]] = {"one": {}, "many": {}}
    real_one, real_many = Eagle3Drafter._propose, Eagle3Rows.propose

    # the Proposal objects: drafts left on the device are read into `tokens` by the step that verifies them
    def spy_one(self, committed, kk, on_device):
        p = real_one(self, committed, kk, on_device)
        seen["one"].setdefault(which(committed), []).append(p)
        return p

    def spy_many(self, committed, kk, on_device=False):
        got = real_many(self, committed, kk, on_device)
        for row, c in committed.items():
            seen["many"].setdefault(which(c), []).append(got[row])
        return got

    mp = pytest.MonkeyPatch()
    mp.setattr(Eagle3Drafter, "_propose", spy_one)
    mp.setattr(Eagle3Rows, "propose", spy_many)
    try:
        engine = EngineConfig(cuda_graphs=False)
        one = _verifier(model, 1, 4096, Eagle3Drafter(head, engine=engine)).run(
            Workload(prompts=prompts, max_new_tokens=16, num_draft_tokens=k)
        )
        drafter = Eagle3Drafter(head, engine=engine)
        many = _verifier(model, 3, 4096, drafter).run(Workload(prompts=prompts, max_new_tokens=16, num_draft_tokens=k, batch_size=3))
    finally:
        mp.undo()
    assert [p.tokens for p in many.prompts] == [p.tokens for p in one.prompts]
    assert [(p.steps, p.accepted) for p in many.prompts] == [(p.steps, p.accepted) for p in one.prompts]
    drafts = {mode: {i: [p.tokens for p in ps] for i, ps in got.items()} for mode, got in seen.items()}
    assert drafts["many"] == drafts["one"] and len(drafts["one"]) == len(prompts)
    assert sum(len(t) for ts in drafts["many"].values() for t in ts) > 0
    # greedy under engine.overlap: the batched rows' drafts stayed on the device until the verify pass read them
    assert all(p.device_tokens is not None for ps in seen["many"].values() for p in ps if p.tokens)
    rows = drafter._batch_rows[3]
    assert rows.passes == k * many.metrics["num_steps"]  # every batched step: k passes for all its rows
    # after most steps' verify pass the head drafted the next step before the host read the verdict
    # (`launch_ahead`; not before a batch's first step, nor where every row is within k + 1 tokens of
    # its end), and those drafts were the ones proposed: no step drafted twice
    assert rows.ahead_used >= many.metrics["num_steps"] // 2


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("simulated", [None, 3.0])
@torch.inference_mode()
def test_the_look_ahead_drafts_what_a_fresh_proposal_would(tiny_ckpt, simulated, device):
    """A batched run (EAGLE-3 in the rank, batches of 3, under engine.overlap) with the head's
    look-ahead and with it switched off: the same tokens, steps and accepted drafts, greedy and under
    simulated acceptance (where each row's kept drafts come from the strategy's plan, not the
    argmaxes); with it on, most steps take the look-ahead's drafts. On CUDA through the captured
    verify and head passes, the verdict read behind an event while the look-ahead runs. (The random
    head keeps no draft greedily; kept drafts: the simulated runs and the test below.)"""
    from test_batched_prefill import _prompts

    from workers.comm.base import AllReduce
    from workers.drafters.eagle3.head import default_aux_layers
    from workers.engine.batched import BatchSteps
    from workers.engine.link import DraftLink
    from workers.engine.verifier import Verifier
    from workers.model.checkpoint import load_model
    from workers.spec import Workload

    model = load_model(tiny_ckpt, max_seq=128, device=device)
    model.aux_layers = default_aux_layers(model.args.n_layers)
    head = random_head(head_config(model.args, draft_vocab=model.args.vocab_size), seed=5).to(device)
    prompts = tuple(tuple(p) for p in _prompts([12, 4, 20, 9, 30, 16, 3]))
    w = Workload(prompts=prompts, max_new_tokens=16, num_draft_tokens=3, batch_size=3, simulate_accept_len=simulated)
    engine = EngineConfig(cuda_graphs=device == "cuda", compile=False)
    runs, used = [], []
    for ahead in (True, False):
        mp = pytest.MonkeyPatch()
        if not ahead:
            mp.setattr(Eagle3Rows, "launch_ahead", lambda self, *a, **kw: False)
        try:
            drafter = Eagle3Drafter(head, engine=engine)
            v = Verifier(model, AllReduce(None, 1), DraftLink(None, 0, None, 4, model.args.vocab_size), 0, engine, drafter)
            v._batch_steps = BatchSteps(model, model.new_cache(3, model.max_seq), use_graphs=device == "cuda", allreduce=v.allreduce)
            runs.append(v.run(w))
        finally:
            mp.undo()
        used.append(drafter._batch_rows[3].ahead_used)
    on, off = runs
    assert [p.tokens for p in on.prompts] == [p.tokens for p in off.prompts]
    assert [(p.steps, p.accepted) for p in on.prompts] == [(p.steps, p.accepted) for p in off.prompts]
    assert used[0] >= on.metrics["num_steps"] // 2
    if simulated:
        assert on.metrics["accept_len_mean"] == pytest.approx(simulated, abs=0.15)


@torch.inference_mode()
def test_the_look_ahead_takes_each_rows_kept_drafts_and_bonus(tiny_ckpt):
    """Greedy look-ahead at the head's level, rows keeping 0 .. k drafts: the device's count of each
    row's kept drafts (`greedy_keep`, the drafts equal to the argmaxes) is the verdict's, and the drafts
    the next proposal takes from the look-ahead are those a group drafting afresh proposes."""
    head = _head(tiny_ckpt)
    ahead, fresh = Eagle3Rows(head, 3, capture=False), Eagle3Rows(head, 3, capture=False)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (9, 4, 15)]
    width, k, rows = 3 * head.cfg.target_hidden, 4, [0, 1, 2]
    committed = []
    for group in (ahead, fresh):
        group.begin(3)
    for i, p in enumerate(prompts):
        states = torch.randn(len(p), width, generator=g)
        for group in (ahead, fresh):
            group.rows[i].prefill(p)
            group.rows[i].observe(states)
        committed.append(p + [int(torch.randint(0, 512, (1,), generator=g))])
    steps = 5
    for step in range(steps):
        got = ahead.propose({i: committed[i] for i in rows}, k, on_device=True)
        want = fresh.propose({i: committed[i] for i in rows}, k, on_device=True)
        assert [got[i].device_tokens.tolist() for i in rows] == [want[i].device_tokens.tolist() for i in rows], step
        drafts = torch.stack([got[i].device_tokens for i in rows])
        kept = [(i + step) % (k + 1) for i in rows]  # 0 .. k per row
        targets = torch.randint(200, 300, (3, k + 1), generator=g)  # never a draft (drafts are 100 .. 163)
        for i, a in enumerate(kept):
            targets[i, :a] = drafts[i, :a]
        keep = ahead.greedy_keep(rows, drafts, targets)
        assert keep.tolist() == kept
        aux = [torch.randn(3, k + 1, width // 3, generator=g) for _ in range(3)]
        assert ahead.launch_ahead(rows, drafts, targets, keep, aux, k)
        for i, a in enumerate(kept):  # the verdict: kept drafts, then the argmax after them
            committed[i] += drafts[i, :a].tolist() + [int(targets[i, a])]
            for group in (ahead, fresh):
                group.rows[i].observe_rows(aux, i, 1 + a)
    assert ahead.ahead_used == steps - 1 and fresh.ahead_used == 0  # every proposal after the first
