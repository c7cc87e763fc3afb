"""Tree drafting (drafter.tree_width): the tree pass scores every node as the plain pass scores its
path, the accepted path's K/V are made contiguous, the tree rules keep greedy output and the
sampling distribution, a tree crosses the draft link, and decoding with trees equals the baseline
with siblings accepted (an oracle puts the right token on a sibling) and the head fed the path's
states."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from tests.e2e.test_eagle3 import _prompts, tiny_head  # noqa: F401 - the fixture
from workers.drafters.eagle3.head import Eagle3Drafter
from workers.engine.verify import tree_path, tree_verify
from workers.model.checkpoint import load_model
from workers.spec import MAX_DRAFT_TOKENS, DrafterSpec, GangSpec, Workload

# [last, a, b, c, d, e]: a and d under the root, b and e under a, c under b
TREE_PARENTS = [-1, 0, 1, 2, 0, 1]


@torch.inference_mode()
def test_each_tree_node_scores_as_its_path_alone_and_the_kept_path_continues_the_cache(tiny_ckpt):
    model = load_model(tiny_ckpt)
    prefix, tree = list(range(10, 27)), [5, 6, 7, 8, 9, 11]
    cache = model.new_cache(1, 128)
    model(torch.tensor([prefix]), cache)
    logits = model.tree_logits(tree, TREE_PARENTS, cache)
    assert cache.lengths[0] == len(prefix) + len(tree)
    for i in range(len(tree)):
        path, j = [], i
        while j != -1:
            path.insert(0, tree[j])
            j = TREE_PARENTS[j]
        plain = model(torch.tensor([prefix + path]), model.new_cache(1, 128))[0, -1]
        torch.testing.assert_close(logits[i], plain, atol=1e-4, rtol=1e-4)
    # keep [last, a, e] (slots 0, 1, 5 of the tree): the cache then continues as the plain sequence's
    base = len(prefix)
    cache.keep_path(0, base + 1, [base + 1, base + 5])
    cache.rollback(0, base + 3)
    nxt = model(torch.tensor([[21]]), cache)[0, -1]
    plain = model(torch.tensor([prefix + [5, 6, 11, 21]]), model.new_cache(1, 128))[0, -1]
    torch.testing.assert_close(nxt, plain, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="parents"):
        model.tree_logits([1, 2], [-1, 1], cache)


def test_greedy_tree_walk_takes_the_agreeing_child_at_each_node():
    draft = [5, 6, 7, 8, 9]  # parents: 5 and 8 under the root, 6 and 9 under 5, 7 under 6
    parents = [-1, 0, 1, -1, 0]
    logits = torch.zeros(6, 20)
    logits[0, 5] = logits[1, 9] = logits[5, 3] = 1  # root -> 5, 5 -> 9 (a sibling), 9 -> 3 (the bonus)
    assert tree_verify(draft, parents, logits, 0.0, None) == ([0, 4], [5, 9, 3])
    assert tree_path(draft, parents, [5, 9]) == [0, 4]
    logits[0] = 0
    logits[0, 8] = 1  # the root's second child, a leaf: its row gives the bonus
    logits[4, 2] = 1
    assert tree_verify(draft, parents, logits, 0.0, None) == ([3], [8, 2])
    logits[0] = 0
    logits[0, 1] = 1  # no child agrees: the correction alone
    assert tree_verify(draft, parents, logits, 0.0, None) == ([], [1])


def test_sampled_tree_walk_emits_the_targets_distribution():
    """Deterministic children at the root (one token twice) and under its first child: the first and
    second emitted tokens are distributed as p (chi-square), the second given the first as that
    row's p."""
    g = torch.Generator().manual_seed(0)
    V = 12
    logits = torch.randn(5, V, generator=g)
    draft, parents = [3, 7, 5, 3], [-1, -1, 0, -1]  # 3, 7 and 3 again under the root, 5 under the first 3
    gen = torch.Generator().manual_seed(1)
    first, second = np.zeros(V), np.zeros(V)
    n = 6000
    for _ in range(n):
        path, tokens = tree_verify(draft, parents, logits, 1.0, gen)
        assert tokens[: len(path)] == [draft[i] for i in path]
        first[tokens[0]] += 1
        if tokens[0] == 3:
            second[tokens[1]] += 1
    p = torch.softmax(logits.double(), -1).numpy()
    assert chisquare(first, p[0] / p[0].sum() * n).pvalue > 1e-3
    assert chisquare(second, p[1] / p[1].sum() * second.sum()).pvalue > 1e-3  # row 1 scores what follows draft 0 (3)


def test_a_tree_proposal_crosses_the_link(tmp_path):
    import torch.distributed as dist

    from workers.engine.link import DraftLink, Proposal

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        link = DraftLink(dist.group.WORLD, 0, 0, MAX_DRAFT_TOKENS, 100)
        tree = Proposal(tokens=list(range(1, 17)), parents=[-1, 0, 1, 2, *[-1] * 6, *[0] * 6], draft_s=0.5)
        got = link._exchange_proposal(tree)
        assert (got.tokens, got.parents, got.draft_s) == (tree.tokens, tree.parents, 0.5)
        got = link._exchange_proposal(Proposal(tokens=[4, 5]))
        assert (got.tokens, got.parents) == ([4, 5], None)
    finally:
        dist.destroy_process_group()


@torch.inference_mode()
def test_the_head_drafts_its_chain_first_then_each_depths_alternatives(tiny_ckpt, tiny_head):  # noqa: F811
    from workers.drafters.eagle3.checkpoint import load_head
    from workers.model.checkpoint import load_args

    model = load_model(tiny_ckpt)
    head = load_head(tiny_head, model.embed_tokens.weight, load_args(tiny_ckpt))
    prompt = list(range(5, 17))
    states = torch.randn(len(prompt) - 1, 192, generator=torch.Generator().manual_seed(0))
    chain, tree = Eagle3Drafter(head, chain=False), Eagle3Drafter(head, chain=False, tree_width=3)
    for d in (chain, tree):
        d.prefill(prompt)
        d.observe(states)
    c, t = chain.propose(prompt, 4), tree.propose(prompt, 4)
    assert t.tokens[:4] == c.tokens and c.parents is None
    assert t.parents == [-1, 0, 1, 2, -1, -1, 0, 0, 1, 1, 2, 2]
    for depth in range(4):  # siblings differ from their chain node
        sibs = [t.tokens[i] for i in range(4, 12) if t.parents[i] == depth - 1]
        assert len(sibs) == 2 and t.tokens[depth] not in sibs
    # k = MAX_DRAFT_TOKENS leaves no room for a sibling: a chain, and a lookup hit replaces the head
    looked = Eagle3Drafter(head, chain=False, tree_width=3, lookup=2)
    repeat = prompt + prompt[:2]
    looked.prefill(repeat)
    looked.observe(torch.randn(len(repeat) - 1, 192, generator=torch.Generator().manual_seed(1)))
    p = looked.propose(repeat, MAX_DRAFT_TOKENS)
    assert p.parents is None and p.tokens == prompt[2:] + prompt[:2]
    wide = Eagle3Drafter(head, chain=False, tree_width=8)
    wide.prefill(prompt)
    wide.observe(states)
    w = wide.propose(prompt, 4)
    assert len(w.tokens) == MAX_DRAFT_TOKENS and w.parents[4:11] == [-1] * 7 and w.parents[11:] == [0] * 5


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_decoding_equals_the_baseline_with_siblings_accepted(tiny_ckpt, tiny_head, tmp_path, temperature):  # noqa: F811
    """A verifier rank with the head inside (rank0) in this process. Greedy: an oracle replaces each
    tree's chain with the baseline's next token then a wrong one, and puts the right second token on
    a depth-2 sibling, so every full step keeps a path that leaves the chain (its K/V moved): output
    equals the baseline, 3 tokens a step. The head is fed the states of exactly the committed
    positions (those of a plain pass over the final sequence). Sampling: trees run, every rank alike."""
    from workers.runtime.worker import Rendezvous, Worker

    spec = GangSpec(
        model_path=str(tiny_ckpt),
        max_seq=256,
        drafter=DrafterSpec(kind="eagle3", model_path=str(tiny_head), placement="rank0", tree_width=3),
    )
    worker = Worker(0, spec)
    worker.setup(Rendezvous(file=str(tmp_path / "store")))
    try:
        drafter, model = worker.verifier.drafter, worker.verifier.model
        prompts = _prompts(2)
        if temperature > 0:
            r = worker.run(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=4, temperature=1.0, seed=3))
            assert all(0 < len(p.tokens) <= 24 for p in r.prompts) and r.metrics["drafted_mean"] == 12
            return
        base = worker.run(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=0))
        full = [list(p) + b.tokens for p, b in zip(prompts, base.prompts)]
        real_propose, real_observe = drafter.propose, drafter.observe
        seen: list[torch.Tensor] = []

        def oracle(committed, k):
            p = real_propose(committed, k)
            right = next(f for f in full if f[: len(committed)] == committed)[len(committed) :]
            if len(right) >= 2 and p.parents is not None:
                sib = next(i for i in range(k, len(p.tokens)) if p.parents[i] == (0 if k > 1 else -1))
                if k > 1:  # chain: right, wrong; the right second token on a sibling under the first
                    p.tokens[0], p.tokens[1], p.tokens[sib] = right[0], (right[1] + 1) % 512, right[1]
                else:  # one depth: the chain's token wrong, the right one a sibling under the root
                    p.tokens[0], p.tokens[sib] = (right[0] + 1) % 512, right[0]
            return p

        drafter.propose = drafter.propose_on_device = oracle
        drafter.observe = lambda h: (seen.append(h.clone()), real_observe(h))
        real_prefill = drafter.prefill
        drafter.prefill = lambda prompt: (seen.clear(), real_prefill(prompt))  # keep one prompt's states
        for k in (1, 2, 4):
            r = worker.run(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=k))
            assert [p.tokens for p in r.prompts] == [p.tokens for p in base.prompts], f"k={k}"
            assert r.metrics["accept_len_mean"] > (1.8 if k == 1 else 2.6), (k, r.metrics["accept_len_mean"])
        # the last prompt: every committed position's states, as a plain pass computes them (the
        # last step may send more: tokens past max_new_tokens are cut after the pass)
        n2 = len(prompts[1]) + len(base.prompts[1].tokens) - 1
        fed = torch.cat(seen)[:n2]
        model.hidden(torch.tensor([full[1][:n2]]), model.new_cache(1, 256))
        torch.testing.assert_close(fed, torch.cat([a[0] for a in model.aux], -1), atol=1e-4, rtol=1e-4)
    finally:
        torch.distributed.destroy_process_group()


class _OneGang:
    """decode()'s gang factory for several decodes of one GangSpec: the first call starts a LocalGang
    and sets it up, every decode runs on it (a decode's `with` leaves it open), the caller closes it."""

    def __init__(self, timeout_s: float):
        self.timeout_s, self.spec, self.gang, self.ready = timeout_s, None, None, None

    def __call__(self, spec: GangSpec):
        from workers.runtime.local_gang import LocalGang

        if self.gang is None:
            self.spec, self.gang = spec, LocalGang(spec, timeout_s=self.timeout_s)
        assert spec == self.spec, "the decodes share one gang: they must ask for the same GangSpec"
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.close()

    def setup(self) -> list[dict]:
        if self.ready is None:
            self.ready = self.gang.setup()
        return self.ready

    def run(self, *args, **kwargs):
        return self.gang.run(*args, **kwargs)

    def peak_rss_mb(self) -> list[float]:
        return self.gang.peak_rss_mb()

    def close(self) -> None:
        if self.gang is not None:
            self.gang.close()


@pytest.mark.slow  # the demo model and its shipped head
@pytest.mark.timeout(1800)
def test_a_tree_over_the_link_at_tp2_with_the_demo_head_keeps_the_baseline():
    """The shipped head (a real draft, so siblings and long paths are accepted) as its own process
    at TP 2: each rank moves the accepted path's K/V in its shard, the head gets the path's states
    over the link; greedy output equals the baseline's and the tree accepts more than one token a
    step. Sampling runs the same gang (one gang of processes serves both decodes): rank 1 learns
    each path from rank 0's result. (`spectune decode` as a process, flags to JSON, is
    tests/e2e/test_cli_decode.py's and test_eagle3.py's train-drafter test's.)"""
    from orchestrator.decode.flags import parse
    from orchestrator.decode.run import decode

    base = ["--model", "smollm2-135m", "--tp", "2", "--drafter", "eagle3", "--draft-model", "smollm2-135m-eagle3"]
    base += ["-k", "4", "--tree-width", "3", "--split", "heldout", "--timeout", "900"]
    gang = _OneGang(timeout_s=900)
    try:
        out = decode(*parse([*base, "--num-prompts", "2", "--max-new-tokens", "24"]), gang_factory=gang)
        assert out["drafted_mean"] == 12 and out["accept_len_mean"] > 1.3, out["accept_len_mean"]
        assert out["outputs_match_baseline"] == 1 and out["prompts_matching_baseline"] == 2
        # sampling: no baseline run (nothing judges sampled tokens), the comm/compute split timed above
        sampled = [*base, "--num-prompts", "1", "--max-new-tokens", "24", "--temperature", "0.7", "--no-baseline", "--ablation-iters", "0"]
        out = decode(*parse(sampled), gang_factory=gang)
        assert out["drafted_mean"] == 12 and out["accept_len_mean"] > 1.3, out["accept_len_mean"]
    finally:
        gang.close()


def test_the_tree_shape_shares_the_chain_then_gives_the_ngram_branch_the_deepest_siblings_places():
    from workers.drafters.eagle3.tree import shape_tree
    from workers.spec import tree_size

    chain, alts = [1, 2, 3, 4], [[5, 6], [7, 8], [9, 10], [11, 12]]  # k = 4, W = 3
    assert tree_size(4, 3) == 12 and tree_size(4, 0) == 4 and tree_size(8, 4) == MAX_DRAFT_TOKENS
    assert shape_tree(chain, alts) == (chain + [5, 6, 7, 8, 9, 10, 11, 12], [-1, 0, 1, 2, -1, -1, 0, 0, 1, 1, 2, 2])
    assert shape_tree(chain, alts, [[1, 2, 3, 4]]) == shape_tree(chain, alts)  # all shared: nothing added
    # shares 1, 2; 9 (also depth 3's first runner-up, not drafted twice) and 13 follow under 2
    tokens, parents = shape_tree(chain, alts, [[1, 2, 9, 13]])
    assert tokens == [1, 2, 3, 4, 9, 13, 5, 6, 7, 8, 10, 11]
    assert parents == [-1, 0, 1, 2, 1, 4, -1, -1, 0, 0, 1, 2]
    # a second continuation under the root: 5 is also depth 1's first runner-up, kept once
    tokens, parents = shape_tree(chain, alts, [[1, 2, 9, 13], [5, 14]])
    assert tokens == [1, 2, 3, 4, 9, 13, 5, 14, 6, 7, 8, 10]
    assert parents == [-1, 0, 1, 2, 1, 4, -1, 6, -1, 0, 0, 1]
    long_chain = list(range(MAX_DRAFT_TOKENS))
    assert shape_tree(long_chain, [[100]] * MAX_DRAFT_TOKENS, [[7]]) == (long_chain, None)  # no room: a chain


@pytest.mark.parametrize("seed", range(40))
def test_every_tree_shape_holds_its_size_a_trie_and_the_branch(seed):
    """Random chains, runners-up and n-gram branches: always tree_size(k, W) drafts, each parent
    before its child, no token twice under one parent, and the branch's longest fitted prefix is a
    path of the tree."""
    from workers.drafters.eagle3.tree import shape_tree
    from workers.spec import tree_size

    g = np.random.default_rng(seed)
    k, width = int(g.integers(1, 14)), int(g.integers(2, 6))
    vocab = 6  # small: the branch often shares tokens with the chain and the runners-up
    chain = [int(t) for t in g.integers(0, vocab, k)]
    alts = [[int(t) for t in g.choice([v for v in range(vocab + width) if v != c], width - 1, replace=False)] for c in chain]
    branch = [int(t) for t in g.integers(0, vocab, int(g.integers(0, k + 1)))]
    tokens, parents = shape_tree(chain, alts, [branch])
    assert len(tokens) == tree_size(k, width) and tokens[:k] == chain
    assert all(-1 <= p < i for i, p in enumerate(parents))
    assert len({(p, t) for p, t in zip(parents, tokens)}) == len(tokens)
    node, walked = -1, 0
    for t in branch:
        children = [i for i, p in enumerate(parents) if p == node and tokens[i] == t]
        if not children:
            break
        node, walked = children[0], walked + 1
    if walked < len(branch):  # cut short only where its own nodes took every place beside the chain
        assert node == len(tokens) - 1 and all(parents[i] == i - 1 for i in range(k + 1, len(tokens)))


def test_lookup_joins_the_tree_as_a_branch_and_keeps_the_baseline(tiny_ckpt, tiny_head, tmp_path):  # noqa: F811
    """drafter.lookup with a tree: the head drafts every step, the n-gram continuations are more
    branches of the same fixed-size tree; greedy output equals the baseline and branches are used."""
    from workers.runtime.worker import Rendezvous, Worker

    spec = GangSpec(
        model_path=str(tiny_ckpt),
        max_seq=256,
        drafter=DrafterSpec(kind="eagle3", model_path=str(tiny_head), placement="rank0", tree_width=3, lookup=2),
    )
    worker = Worker(0, spec)
    worker.setup(Rendezvous(file=str(tmp_path / "store")))
    try:
        drafter = worker.verifier.drafter
        prompts = tuple(p * 3 for p in _prompts(2, 8))  # repeats: the n-gram index finds continuations
        base = worker.run(Workload(prompts=prompts, max_new_tokens=32, num_draft_tokens=0))
        real_propose = drafter.propose
        trees = []
        drafter.propose = drafter.propose_on_device = lambda committed, k: (trees.append(p := real_propose(committed, k)), p)[1]
        r = worker.run(Workload(prompts=prompts, max_new_tokens=32, num_draft_tokens=4))
        assert [p.tokens for p in r.prompts] == [p.tokens for p in base.prompts]
        assert r.metrics["drafted_mean"] == 12
        # a branch's second node hangs under its first, beyond the chain (siblings are leaves under it)
        assert sum(1 for t in trees if any(p >= 4 for p in t.parents)) >= 3
    finally:
        torch.distributed.destroy_process_group()
