"""Batched prefill (workers/model/transformer.py `prefill_packed`, workers/engine/batched.py): the
prompts of a batch packed into one pass give each prompt's own prefill (logits, K/V, EAGLE-3 states),
passes stay within their token budget, and batched decoding that prefills in several passes still
decodes every sequence's batch-1 tokens. CPU, the tiny random model, in-process (no gang).

    .venv/bin/pytest -q -n 0 tests/engine/test_batched_prefill.py
"""

from __future__ import annotations

import pytest
import torch

from workers.model.checkpoint import load_model
from workers.model.transformer import prefill_groups
from workers.spec import Workload


def _prompts(lengths, seed: int = 7) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        half = torch.randint(3, 512, ((n + 1) // 2,), generator=g).tolist()
        out.append((half + half)[:n])  # repeats: something for the n-gram drafter
    return out


@torch.inference_mode()
def test_a_packed_prefill_is_each_prompts_prefill_alone(tiny_ckpt):
    """Ragged prompts (one token to 37) in one packed pass: each row's last logits, its K/V and its
    captured states are those of its prompt prefilled alone; the rows' lengths are set."""
    model = load_model(tiny_ckpt, max_seq=64)
    model.aux_layers = (0, 1)
    prompts = _prompts([9, 1, 37, 20])
    alone, cache_alone, states = [], model.new_cache(len(prompts)), []
    for b, p in enumerate(prompts):
        row = cache_alone.view(b, 1)
        alone.append(model(torch.tensor([p]), row)[0, -1])
        cache_alone.lengths[b] = row.lengths[0]
        states.append(torch.cat([a[0] for a in model.aux], dim=-1))
    cache = model.new_cache(len(prompts) + 1)  # one row more, left alone
    got = model.prefill_packed(prompts, cache)
    assert cache.lengths == [len(p) for p in prompts] + [0]
    torch.testing.assert_close(got, torch.stack(alone), rtol=1e-5, atol=1e-5)
    assert got.argmax(-1).tolist() == torch.stack(alone).argmax(-1).tolist()
    for b, p in enumerate(prompts):
        for mine, want in zip(cache.k + cache.v, cache_alone.k + cache_alone.v):
            torch.testing.assert_close(mine[b, :, : len(p)], want[b, :, : len(p)], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.packed_rows([len(p) for p in prompts], b), states[b], rtol=1e-5, atol=1e-6)
    assert not cache.k[0][len(prompts)].any()  # the row past the batch is not written


def test_prefill_passes_keep_to_their_token_budget():
    assert prefill_groups([5, 5, 5], 100) == [range(0, 3)]
    assert prefill_groups([5, 5, 5], 10) == [range(0, 2), range(2, 3)]
    assert prefill_groups([30, 4, 4, 50, 1], 10) == [range(0, 1), range(1, 3), range(3, 4), range(4, 5)]  # longer than the budget: alone
    for lengths in ([7, 3, 9, 1, 12, 2], [1] * 9, [40]):
        groups = prefill_groups(lengths, 12)
        assert [b for g in groups for b in g] == list(range(len(lengths)))  # every row once, in order
        assert all(sum(lengths[b] for b in g) <= 12 or len(g) == 1 for g in groups)
    assert prefill_groups([], 8) == []


def _verifier(model, batch: int, prefill_tokens: int, drafter=None):
    """A one-rank verifier on the CPU whose batched passes prefill at most `prefill_tokens` tokens at once."""
    from workers.comm.base import AllReduce
    from workers.engine.batched import BatchSteps
    from workers.engine.link import DraftLink
    from workers.engine.verifier import Verifier
    from workers.spec.engine_config import EngineConfig

    v = Verifier(model, AllReduce(None, 1), DraftLink(None, 0, None, 4, model.args.vocab_size), 0, EngineConfig(cuda_graphs=False), drafter)
    v._batch_steps = BatchSteps(
        model, model.new_cache(batch, model.max_seq), use_graphs=False, allreduce=v.allreduce, prefill_tokens=prefill_tokens
    )
    return v


@pytest.mark.parametrize("k", [0, 3])
@torch.inference_mode()
def test_batched_decoding_prefilled_in_several_passes_decodes_batch_ones_tokens(tiny_ckpt, k, monkeypatch):
    """Batches of 3 prefilled in passes of at most 40 tokens (a 45-token prompt alone): every
    sequence's tokens, steps and acceptance are batch 1's, plain and with n-gram drafting (a copy
    per row, each indexing its own prompt); each row's first token comes after its own pass."""
    from workers.drafters.ngram import NgramDrafter
    from workers.model.transformer import Transformer

    model = load_model(tiny_ckpt, max_seq=128)
    prompts = tuple(tuple(p) for p in _prompts([12, 45, 20, 9, 30, 16, 3]))  # batches of 3, 3 and 1
    w = Workload(prompts=prompts, max_new_tokens=20, num_draft_tokens=k)
    one = _verifier(model, 1, 40, NgramDrafter() if k else None).run(w)
    passes = []
    real = Transformer.prefill_packed
    monkeypatch.setattr(Transformer, "prefill_packed", lambda self, ps, cache: passes.append([len(p) for p in ps]) or real(self, ps, cache))
    many = _verifier(model, 3, 40, NgramDrafter() if k else None).run(
        Workload(prompts=prompts, max_new_tokens=20, num_draft_tokens=k, batch_size=3)
    )
    assert passes == [[12], [45], [20], [9, 30], [16], [3]]  # consecutive rows, at most 40 tokens a pass
    assert [p.tokens for p in many.prompts] == [p.tokens for p in one.prompts]
    assert [(p.steps, p.accepted) for p in many.prompts] == [(p.steps, p.accepted) for p in one.prompts]
    if k:
        assert sum(p.accepted for p in one.prompts) > 0  # the n-gram copies drafted from their own prompts
    first = [p.prefill_s for p in many.prompts[:3]]
    assert first == sorted(first) and all(0 < p.prefill_s <= p.seconds for p in many.prompts)


@torch.inference_mode()
def test_a_draft_models_batched_proposals_start_with_a_packed_prefill(tiny_ckpt, tiny_draft_ckpt):
    """A drafter process's first proposals of a batch (every row from position 0, packed) and the
    next ones (padded rows at their own lengths) are each row's proposals drafted alone."""
    from workers.drafters.model_drafter import ModelDrafter

    draft = load_model(tiny_draft_ckpt, max_seq=128)
    rows = ModelDrafter(draft)
    rows.begin_rows(3)
    committed = _prompts([14, 5, 27], seed=3)
    alone = [ModelDrafter(draft) for _ in committed]
    for d, c in zip(alone, committed):
        d.prefill(c)
    for step in range(3):
        got = rows.propose_rows(committed, [0, 1, 2], 4)
        for i, (d, c) in enumerate(zip(alone, committed)):
            want = d.propose(c, 4).tokens
            assert got[i].tokens == want, (step, i)
            c.extend(want[: 1 + (i + step) % 3] + [7])  # some drafts kept, then a token of the verifier's
