"""Batch > 1 (workers/engine/batched.py) through a real gang of processes: every sequence of a
batch decodes exactly its batch-1 tokens, plain and with n-gram drafting, at TP 1 and 2, with
sequences of different lengths that finish at different steps (EOS); the per-sequence acceptance
statistics stay per sequence; what cannot run batched says so."""

from __future__ import annotations

import pytest
import torch

from workers.errors import GangError
from workers.runtime.local_gang import LocalGang
from workers.spec import DrafterSpec, GangSpec, Workload
from workers.spec.run_stats import RunStats, StepRecord


def _prompts(n: int) -> tuple[tuple[int, ...], ...]:
    """Different lengths (ragged rows) with repeated spans (something for the n-gram drafter)."""
    g = torch.Generator().manual_seed(11)
    out = []
    for i in range(n):
        half = torch.randint(3, 512, (6 + 3 * i,), generator=g).tolist()
        out.append(tuple(half + half))
    return tuple(out)


@pytest.mark.parametrize("tp", [1, 2])
def test_every_sequence_of_a_batch_decodes_its_batch_one_tokens(tiny_ckpt, tp):
    prompts = _prompts(5)  # batches of 2: the last one holds a single sequence
    spec = GangSpec(model_path=str(tiny_ckpt), tp=tp, drafter=DrafterSpec(kind="ngram"), max_seq=256)
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        free = gang.run(Workload(prompts=prompts, max_new_tokens=30))
        eos = free.prompts[1].tokens[12]  # a token the model emits: sequences end at different steps
        for k in (0, 3):
            one = gang.run(Workload(prompts=prompts, max_new_tokens=30, num_draft_tokens=k, eos_ids=(eos,)))
            for batch in (2, 4):
                many = gang.run(Workload(prompts=prompts, max_new_tokens=30, num_draft_tokens=k, eos_ids=(eos,), batch_size=batch))
                assert [p.tokens for p in many.prompts] == [p.tokens for p in one.prompts], f"k={k} B={batch} tp={tp}"
                # acceptance is the drafter's and the sequence's, not the batch's
                assert [(p.steps, p.accepted) for p in many.prompts] == [(p.steps, p.accepted) for p in one.prompts]
                assert many.metrics["accept_len_mean"] == pytest.approx(one.metrics["accept_len_mean"])
                assert many.metrics["tokens_generated"] == one.metrics["tokens_generated"]
                # fewer passes than batch 1 (several sequences per pass), at least the longest sequence's
                assert max(p.steps for p in one.prompts) <= many.metrics["num_steps"] < one.metrics["num_steps"]
        lengths = [len(p.tokens) for p in one.prompts]
        assert min(lengths) < max(lengths), "the EOS should end some sequences early"


def test_simulated_acceptance_runs_batched(tiny_ckpt):
    spec = GangSpec(model_path=str(tiny_ckpt), tp=1, drafter=DrafterSpec(kind="ngram"), max_seq=256)
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        r = gang.run(Workload(prompts=_prompts(4), max_new_tokens=40, num_draft_tokens=4, simulate_accept_len=3.0, batch_size=4))
    assert r.metrics["drafted_mean"] == 4.0
    assert r.metrics["accept_len_mean"] == pytest.approx(3.0, abs=0.1)


@pytest.mark.parametrize("kind", ["layer_skip", "draft_model", "self", "ngram_actor"])
def test_a_drafter_process_drafts_every_sequence_of_a_batch(tiny_ckpt, tiny_draft_ckpt, kind):
    """A drafter process (layer-skip, a draft model: every row in one pass; the n-gram actor: a copy
    per row) proposes for each live sequence: the tokens, steps and acceptance of batch 1. The
    verifier drafting for itself ("self") must keep every draft, so any row fed wrongly shows."""
    drafter = {
        "self": DrafterSpec(kind="draft_model", model_path=str(tiny_ckpt)),
        "layer_skip": DrafterSpec(kind="layer_skip", layers=1),
        "draft_model": DrafterSpec(kind="draft_model", model_path=str(tiny_draft_ckpt)),
        "ngram_actor": DrafterSpec(kind="ngram", ngram_actor=True),
    }[kind]
    spec = GangSpec(model_path=str(tiny_ckpt), tp=2, drafter=drafter, max_seq=256, max_batch=3)
    assert spec.has_drafter
    prompts = _prompts(5)
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        free = gang.run(Workload(prompts=prompts, max_new_tokens=24))
        eos = free.prompts[2].tokens[9]
        for k in (0, 3):  # k = 0: the drafter process only listens, batched as well
            one = gang.run(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=k, eos_ids=(eos,)))
            many = gang.run(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=k, eos_ids=(eos,), batch_size=3))
            assert [p.tokens for p in many.prompts] == [p.tokens for p in one.prompts], (kind, k)
            assert [(p.steps, p.accepted) for p in many.prompts] == [(p.steps, p.accepted) for p in one.prompts]
        assert many.metrics["drafted_mean"] > 0
        if kind == "self":
            assert many.metrics["accept_len_mean"] > 3.5  # k + 1 = 4, less only where EOS / max_new_tokens cut a step
        # sampling needs rank 0 to verify alone with the drafter's q: not batched, and said so
        with pytest.raises(GangError, match="need greedy decoding"):
            gang.run(Workload(prompts=prompts, max_new_tokens=8, num_draft_tokens=2, temperature=0.7, batch_size=2))


def test_batched_steps_count_acceptance_per_sequence():
    """Two sequences in one pass: one kept 3 of 4 drafts, the other none."""
    both = StepRecord(
        drafted=8, accepted=3, emitted=5, step_s=1.0, verify_s=1.0, draft_s=0, comm_calls=0, comm_s=0, rows=2, row_drafts=((4, 3), (4, 0))
    )
    m = RunStats(steps=[both], tokens=5, seconds=1.0).metrics(4)
    assert m["accept_len_mean"] == 2.5
    assert m["drafted_mean"] == 4.0
    assert [m[f"accept_rate_pos_{i}"] for i in (1, 2, 3, 4)] == [0.5, 0.5, 0.5, 0.0]
    assert m["decode_tok_s"] == 5.0


def _ragged_caches(model, n_caches: int):
    """Caches of 3 rows at lengths 5, 11, 8 (row 1 rolled back to 9: stale K/V at 9, 10)."""
    caches = [model.new_cache(3) for _ in range(n_caches)]
    for cache in caches:
        for row, length in enumerate((5, 11, 8)):
            view = cache.view(row, 1)
            model(torch.randint(0, 512, (1, length), generator=torch.Generator().manual_seed(row)), view)
            cache.lengths[row] = view.lengths[0]
        cache.rollback(1, 9)  # masked by position, then overwritten
    return caches


@pytest.mark.parametrize("body", ["plain", "fused_sdpa", "fused_triton"])
@torch.inference_mode()
def test_the_static_pass_a_cuda_graph_captures_equals_the_eager_pass(tmp_path, body, request):
    """What BatchSteps captures per (rows, width) on CUDA, run uncaptured: ragged rows (different
    lengths, stale entries past a rolled-back row) over the whole static cache give the eager pass's
    logits and K/V, through the plain layers and through the fused step (merged weights; SDPA, or
    the split-KV Triton attention under its interpreter, each row read up to its own positions)."""
    from workers.engine.batched import BatchSteps, static_pass
    from workers.engine.fused_step import FusedStep
    from workers.model.checkpoint import load_model, tiny_config, write_random_checkpoint
    from workers.spec.engine_config import EngineConfig

    model = load_model(write_random_checkpoint(tmp_path, tiny_config(), seed=3), max_seq=64)
    fast = None
    if body != "plain":
        attend_fn = None
        if body == "fused_triton":
            if request.getfixturevalue("kernel_device") != "cpu":
                pytest.skip("CPU test of the Triton attention under its interpreter")
            from workers.kernels.attention import decode_attend as attend_fn
        fast = FusedStep(model, EngineConfig(compile=False, gemv="off"), None, attend_fn)
    eager_cache, static_cache = _ragged_caches(model, 2)
    feed = torch.randint(0, 512, (3, 4), generator=torch.Generator().manual_seed(1))
    starts = list(static_cache.lengths)
    want = BatchSteps(model, eager_cache, use_graphs=False).run(feed.tolist(), eager_cache)
    pos = torch.tensor(starts)[:, None] + torch.arange(4)
    got = static_pass(model, feed, pos, static_cache, fast)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for row, start in enumerate(starts):
        torch.testing.assert_close(static_cache.k[0][row, :, : start + 4], eager_cache.k[0][row, :, : start + 4])
    assert eager_cache.lengths == [s + 4 for s in starts]


@pytest.mark.slow  # the demo model and its shipped head
@pytest.mark.timeout(900)
def test_eagle3_in_the_rank_reads_each_rows_own_hidden_states(smollm2):
    """The shipped EAGLE-3 head at placement rank0, batch 3: each row's head is fed that row's
    verifier states, so every sequence drafts, and is accepted, exactly as at batch 1 (a head fed
    another row's states would draft other tokens and keep a different number of them)."""
    from orchestrator.prompts.loading import BUNDLED_PROMPTS, Tokenizer, load_prompts
    from workers.model.checkpoint import resolve_model_path

    tok = Tokenizer(smollm2)
    prompts = tuple(tuple(tok.encode_prompt(p.text)) for p in load_prompts(BUNDLED_PROMPTS, 3, ["writing"], None))
    head = DrafterSpec(kind="eagle3", model_path=str(resolve_model_path("smollm2-135m-eagle3")), placement="rank0")
    spec = GangSpec(model_path=str(smollm2), tp=1, drafter=head, max_seq=1024, max_batch=3)
    with LocalGang(spec, timeout_s=600) as gang:
        gang.setup()
        one = gang.run(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=3))
        many = gang.run(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=3, batch_size=3))
    assert [p.tokens for p in many.prompts] == [p.tokens for p in one.prompts]
    assert [(p.steps, p.accepted) for p in many.prompts] == [(p.steps, p.accepted) for p in one.prompts]
    assert sum(p.accepted for p in one.prompts) > 3  # the trained head keeps drafts: the comparison has teeth


def test_greedy_decisions_from_host_argmaxes_equal_the_logits_rule():
    """A batched step decides greedy rows from one transfer of every row's argmax: the same drafts
    kept and the same next token as the rule on the logits, whatever the drafts."""
    from types import SimpleNamespace

    from workers.engine.link import Proposal
    from workers.engine.strategies import StepStrategy
    from workers.engine.verify import greedy_verify

    g = torch.Generator().manual_seed(5)
    rank = SimpleNamespace(w=Workload(prompts=((1,),), num_draft_tokens=4))
    strategy = StepStrategy(rank)
    for trial in range(50):
        logits = torch.randn(5, 40, generator=g)
        logits[:, 7] = logits.max() if trial % 5 == 0 else logits[:, 7]  # ties now and then: the first index wins in both
        target = logits.argmax(dim=-1).tolist()
        keep = trial % 5
        draft = target[:keep] + [(target[keep] + 1) % 40] * (4 - keep) if keep < 4 else target[:4]
        want = greedy_verify(draft, logits)
        assert strategy.decide_greedy(None, Proposal(tokens=draft), target) == want
        assert want[0] == keep
