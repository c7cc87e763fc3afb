"""EAGLE-3 drafter: the public checkpoint format loads, a head that does not fit is refused in one
line, greedy output equals the baseline (k in 1, 2, 4; TP 1 and 2; both placements), sampling
keeps the verifier's distribution with the head's probabilities, and `train-drafter` writes a head
that decodes. The commands (train-drafter, its refusals, validate, decode) run spectune's `main` in the
test's process (studyutil.spectune_here: the same flags and output, no interpreter, torch and
transformers to start per command; train-drafter's one global setting, torch's threads, is 1 as here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from scipy.stats import chisquare
from studyutil import spectune_here

from workers.drafters.eagle3.checkpoint import load_head
from workers.drafters.eagle3.head import Eagle3Drafter, load_config
from workers.engine.verify import rejection_verify
from workers.model.checkpoint import load_args, load_model, tiny_config
from workers.runtime.local_gang import LocalGang
from workers.spec import DrafterSpec, GangSpec, Workload

ROOT = Path(__file__).resolve().parents[2]
DRAFT_VOCAB = 200


def public_tensors(
    hidden: int, target_hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, vocab: int, draft_vocab: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A random head under exactly the names and shapes SGLang / vLLM / SpecForge load."""
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "fc.weight": (hidden, 3 * target_hidden),
        "midlayer.self_attn.q_proj.weight": (heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "lm_head.weight": (draft_vocab, hidden),
    }
    t = {n: (torch.randn(s, generator=g) * s[1] ** -0.5).to(torch.bfloat16) for n, s in shapes.items()}
    for n in ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight", "norm.weight"):
        t[n] = torch.ones(hidden, dtype=torch.bfloat16)
    ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    t["d2t"] = ids - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    t["t2d"] = t2d
    return t


def write_head(path: Path, target_cfg: dict, draft_vocab: int = DRAFT_VOCAB, hidden: int | None = None, seed: int = 0) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    th = target_cfg["hidden_size"]
    h = hidden or th
    heads, kv, hd = target_cfg["num_attention_heads"], target_cfg["num_key_value_heads"], target_cfg["head_dim"]
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": h,
        "intermediate_size": target_cfg["intermediate_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "vocab_size": target_cfg["vocab_size"],
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": th,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(
        public_tensors(h, th, heads, kv, hd, target_cfg["intermediate_size"], target_cfg["vocab_size"], draft_vocab, seed),
        str(path / "model.safetensors"),
    )
    return path


@pytest.fixture(scope="module")
def tiny_head(tmp_path_factory):
    return write_head(tmp_path_factory.mktemp("head"), tiny_config())


def _prompts(n: int = 3, length: int = 20) -> tuple[tuple[int, ...], ...]:
    g = torch.Generator().manual_seed(3)
    return tuple(tuple(torch.randint(3, 512, (length,), generator=g).tolist()) for _ in range(n))


def test_public_head_loads_with_its_names_and_maps(tiny_ckpt, tiny_head):
    target = load_args(tiny_ckpt)
    model = load_model(tiny_ckpt)
    head = load_head(tiny_head, model.embed_tokens.weight, target)
    assert load_config(tiny_head).aux_layers is None  # no eagle_config: the defaults (2, L//2, L-3) clamp into 2 layers
    assert head.lm_head.weight.shape == (DRAFT_VOCAB, 64) and head.fc.weight.shape == (64, 192)
    assert head.midlayer.self_attn.q_proj.weight.shape == (64, 128)
    ids = head.to_target(torch.arange(DRAFT_VOCAB))
    assert bool(head.t2d[ids].all()) and int(head.t2d.sum()) == DRAFT_VOCAB
    assert torch.equal(head.embed_tokens.weight, model.embed_tokens.weight)  # the target's embedding
    d = Eagle3Drafter(head)
    prompt = list(range(5, 17))
    d.observe(torch.randn(len(prompt) - 1, 192))
    p = d.propose(prompt, 4)
    assert len(p.tokens) == 4 and all(bool(head.t2d[t]) for t in p.tokens)


@torch.inference_mode()
@pytest.mark.parametrize("tree, temperature", [(0, 0.0), (3, 0.0), (3, 1.0)])
def test_device_chain_drafts_what_the_eager_loop_drafts(tiny_ckpt, tiny_head, tree, temperature):
    """The chain body a CUDA graph captures (static positions, the whole cache under a position
    mask, argmax fed back on the device), run uncaptured on CPU: the same drafts as the eager
    loop over rounds of verifier states, rejected drafts rolled back, and a prompt wider than the
    graph's feed (fed eagerly but its last entry). A tree (each depth's top-3 from the chain's
    body; deterministic, so sampling runs it too): the same tokens and parents."""
    target = load_args(tiny_ckpt)
    model = load_model(tiny_ckpt)
    head = load_head(tiny_head, model.embed_tokens.weight, target)
    eager, chain = Eagle3Drafter(head, chain=False, tree_width=tree), Eagle3Drafter(head, chain=True, tree_width=tree)
    for d in (eager, chain):
        d.begin(temperature, 1)
    assert chain.use_chain and not chain.chain.capture  # CPU: the body runs directly
    g = torch.Generator().manual_seed(5)
    committed = list(range(5, 5 + chain.chain.max_width + 8))  # wider than one chain feed
    states = torch.randn(len(committed) - 1, 192, generator=g)
    for d in (eager, chain):
        d.prefill(committed)
        d.observe(states)
    for rnd, (k, accepted) in enumerate([(4, 1), (3, 0), (4, 4), (2, 2), (1, 1)]):
        pe, pc = eager.propose(committed, k), chain.propose(committed, k)
        assert pc.tokens == pe.tokens and len(pc.tokens) == k * max(tree, 1), f"round {rnd}"
        assert pc.parents == pe.parents and (pc.parents is None) == (tree == 0)
        assert chain.cache.lengths == eager.cache.lengths
        new = pe.tokens[:accepted] + [int(torch.randint(3, 512, (1,), generator=g))]  # accepted drafts + the verifier's token
        more = torch.randn(len(new), 192, generator=g)
        committed += new
        for d in (eager, chain):
            d.observe(more)


@pytest.mark.parametrize("chain", [False, True])
@torch.inference_mode()
def test_lookup_drafts_a_repeat_and_the_head_then_catches_up(tiny_ckpt, tiny_head, chain):
    """drafter.lookup = 2: where the last 2 committed tokens occurred before, the drafts are what
    followed them (host tokens, one-hot q) and the head does not run; at the next step without a
    repeat the head feeds every position it skipped, so its drafts and cache equal those of a head
    that ran at every step. A backlog wider than the chain's warmed feeds (k + 1 on a GPU) is fed
    eagerly but its last entry, never captured inside a timed run."""
    target = load_args(tiny_ckpt)
    model = load_model(tiny_ckpt)
    head = load_head(tiny_head, model.embed_tokens.weight, target)
    plain, hybrid = Eagle3Drafter(head, chain=False), Eagle3Drafter(head, chain=chain, lookup=2)
    hybrid.chain.ready_width = 5  # as after warm(4) on a GPU
    widths, real_draft = [], hybrid.chain.draft
    hybrid.chain.draft = lambda tokens, *a, **kw: widths.append(len(tokens)) or real_draft(tokens, *a, **kw)
    g = torch.Generator().manual_seed(7)
    committed = list(range(5, 17))
    states = torch.randn(len(committed) - 1, 192, generator=g)
    for d in (plain, hybrid):
        d.prefill(committed)
        d.observe(states)

    def commit(tokens):
        more = torch.randn(len(tokens), 192, generator=g)
        committed.extend(tokens)
        for d in (plain, hybrid):
            d.observe(more)

    assert hybrid.propose(committed, 4).tokens == plain.propose(committed, 4).tokens  # (15, 16) is new: the head
    commit([7, 8])  # (7, 8) began at index 2: the lookup drafts 9, 10, 11, 12
    before = list(hybrid.cache.lengths)
    p = hybrid.propose(committed, 4)
    assert p.tokens == [9, 10, 11, 12] and p.probs is None and p.device_tokens is None
    assert hybrid.cache.lengths == before  # the head did not run
    plain.propose(committed, 4)
    commit([9, 10, 11, 12, 13])  # all 4 accepted: (12, 13) began at index 7, a lookup again
    assert hybrid.propose(committed, 4).tokens == [14, 15, 16, 7] and hybrid.cache.lengths == before
    plain.propose(committed, 4)
    commit([14, 300])  # no earlier (14, 300): the head again, after feeding the 9 positions since
    assert hybrid.propose(committed, 4).tokens == plain.propose(committed, 4).tokens
    assert hybrid.cache.lengths == plain.cache.lengths and hybrid.ctx == plain.ctx == len(committed) - 1
    # the prompt's 11 entries and the 9-entry backlog: each fed eagerly but its last, which the chain takes
    assert widths == ([1, 1] if chain else [])


@pytest.mark.parametrize("body", ["fused_sdpa", "fused_triton"])
@torch.inference_mode()
def test_the_fast_head_step_drafts_what_the_eager_loop_drafts(tiny_ckpt, tiny_head, body, request):
    """The chain through `HeadFastStep` (merged weights, the GEMV picker's layout, and SDPA under a
    mask or the split-KV Triton attention under its interpreter, which writes the cache and reads
    each query's slots up to its position): the eager loop's drafts and pre-norm states, over rounds
    with rejected drafts rolled back."""
    from workers.drafters.eagle3.chain import HeadFastStep
    from workers.spec.engine_config import EngineConfig

    target = load_args(tiny_ckpt)
    model = load_model(tiny_ckpt)
    eager_head = load_head(tiny_head, model.embed_tokens.weight, target)
    attend_fn = None
    if body == "fused_triton":
        if request.getfixturevalue("kernel_device") != "cpu":
            pytest.skip("CPU test of the Triton attention under its interpreter")
        from workers.kernels.attention import decode_attend as attend_fn
    fast_head = load_head(tiny_head, model.embed_tokens.weight, target)  # the fast step merges its weights in place
    engine = EngineConfig(compile=False, gemv="triton" if body == "fused_triton" else "cublas", attention="sdpa")
    fast = HeadFastStep(fast_head, engine, attend_fn)
    assert fast.fused.gemv is not None and "lm_head" in fast.fused.gemv.weights
    eager, chain = Eagle3Drafter(eager_head, chain=False), Eagle3Drafter(fast_head, chain=True, fast=fast)
    assert chain.chain.fast is fast
    g = torch.Generator().manual_seed(6)
    committed = list(range(5, 5 + 12))
    states = torch.randn(len(committed) - 1, 192, generator=g)
    for d in (eager, chain):
        d.prefill(committed)
        d.observe(states)
    # rounds: some drafts kept, none, all; under the interpreter (about a second a head step) the
    # same three with fewer steps
    rounds = [(4, 1), (3, 0), (4, 4), (2, 2)] if body == "fused_sdpa" else [(3, 1), (2, 0), (2, 2)]
    for rnd, (k, accepted) in enumerate(rounds):
        pe, pc = eager.propose(committed, k), chain.propose(committed, k)
        assert pc.tokens == pe.tokens and len(pc.tokens) == k, f"round {rnd}"
        n = chain.cache.lengths[0]
        assert n == eager.cache.lengths[0]
        torch.testing.assert_close(chain.cache.k[0][:, :, :n], eager.cache.k[0][:, :, :n], atol=1e-4, rtol=1e-4)
        new = pe.tokens[:accepted] + [int(torch.randint(3, 512, (1,), generator=g))]
        more = torch.randn(len(new), 192, generator=g)
        committed += new
        for d in (eager, chain):
            d.observe(more)


@pytest.mark.parametrize("what, change", [("target_hidden_size", {"hidden_size": 32}), ("vocab_size", {"vocab_size": 1000})])
def test_head_that_does_not_fit_exits_2_with_one_line(tmp_path, tiny_ckpt, what, change, capsys):
    head = write_head(tmp_path / "bad", tiny_config(**change))
    r = spectune_here(
        capsys,
        "decode",
        "--model",
        str(tiny_ckpt),
        "--drafter",
        "eagle3",
        "--draft-model",
        str(head),
        "--num-prompts",
        "1",
        "--max-new-tokens",
        "4",
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spectune: error: --draft-model") and what in lines[0], r.stderr


# Every placement at TP 1 and 2: the plain chain at (1, rank0) and (2, actor) (drafted_mean exactly k);
# at (1, actor) and (2, rank0) with lookup, which drafts through the same head and link on every step
# without a repeat (lookup 2 finds one at about 5 of these prompts' 96 positions, lookup 1 at about 11),
# so those cases test the plain head there too, and lookup's steps besides.
@pytest.mark.parametrize(
    "tp, placement, lookup, tree",
    [(1, "rank0", 0, 0), (2, "actor", 0, 0), (2, "rank0", 1, 0), (1, "actor", 2, 0)]
    + [(2, "actor", 0, 3), (2, "rank0", 1, 2)],  # trees: over the link, and mixed with lookup's chains
)
def test_greedy_output_equals_baseline(tiny_ckpt, tiny_head, tp, placement, lookup, tree):
    prompts = _prompts()
    drafter = DrafterSpec(kind="eagle3", model_path=str(tiny_head), placement=placement, lookup=lookup, tree_width=tree)
    spec = GangSpec(model_path=str(tiny_ckpt), tp=tp, max_seq=256, drafter=drafter)
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        base = gang.run(Workload(prompts=prompts, max_new_tokens=32, num_draft_tokens=0))
        for k in (1, 2, 4):
            r = gang.run(Workload(prompts=prompts, max_new_tokens=32, num_draft_tokens=k))
            assert [p.tokens for p in r.prompts] == [p.tokens for p in base.prompts], f"k={k} tp={tp} {placement} lookup={lookup}"
            if tree:  # a tree step drafts k x tree_width nodes, a lookup step a chain of at most k
                assert r.metrics["drafted_mean"] == k * tree if not lookup else 0 < r.metrics["drafted_mean"] <= k * tree
                continue
            # a lookup's continuation may end at the sequence's end: fewer than k drafts that step
            assert r.metrics["drafted_mean"] == k if not lookup else 0 < r.metrics["drafted_mean"] <= k
        if tree:
            s = gang.run(Workload(prompts=prompts, max_new_tokens=32, num_draft_tokens=4, temperature=1.0, seed=1))
            assert all(0 < len(p.tokens) <= 32 for p in s.prompts) and s.metrics["drafted_mean"] > 4
        elif lookup:
            # lookup steps ran: at k = 4 some continuation ended early (deterministic for these prompts
            # and weights); sampling mixes one-hot lookup steps with the head's q, every rank alike
            assert r.metrics["drafted_mean"] < 4
            s = gang.run(Workload(prompts=prompts, max_new_tokens=32, num_draft_tokens=4, temperature=1.0, seed=1))
            assert all(0 < len(p.tokens) <= 32 for p in s.prompts) and 0 < s.metrics["drafted_mean"] <= 4


@pytest.mark.parametrize("overlap", [True, False])
def test_drafts_left_on_the_device_verify_to_the_same_tokens(tiny_ckpt, tiny_head, tmp_path, overlap):
    """engine.overlap with an in-rank greedy chain: a prompt's first drafts go to the verify pass as
    a device tensor (StepRunner.step's tail), and the device loop (workers/engine/device_loop.py)
    runs the rest: acceptance on the device, the next chain fed there. The verifier rank runs in
    this process (bodies uncaptured on CPU); an oracle overwrites the drafts with the baseline's
    tokens, the last one wrong every other step, so acceptance is real: outputs equal the baseline
    for k in {1, 2, 4}, every prompt took the device path (and none with overlap off), each pass
    started where the host rolled back to, and simulated acceptance (the head's own drafts kept)
    goes through the device loop at its rate, to the host path's tokens, steps and kept drafts."""

    from workers.runtime.worker import Rendezvous, Worker
    from workers.spec.engine_config import EngineConfig

    spec = GangSpec(
        model_path=str(tiny_ckpt),
        max_seq=256,
        drafter=DrafterSpec(kind="eagle3", model_path=str(tiny_head), placement="rank0"),
        engine=EngineConfig(overlap=overlap),
    )
    worker = Worker(0, spec)
    worker.setup(Rendezvous(file=str(tmp_path / "store")))
    try:
        _check_device_drafts(worker, overlap)
    finally:
        torch.distributed.destroy_process_group()


def _check_device_drafts(worker, overlap: bool) -> None:
    from dataclasses import replace

    drafter = worker.verifier.drafter
    drafter.use_chain = True  # the device chain's body, uncaptured on CPU
    prompts = _prompts()
    base = worker.run(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=0))
    # the random head rarely drafts right: after its chain ran, an oracle puts the baseline's next
    # tokens in the device drafts, with the last one wrong every other step, so acceptance is real
    full = [list(p) + b.tokens for p, b in zip(prompts, base.prompts)]
    on_device, fed, now = [], [], {}
    real, real_fed = drafter.propose_on_device, drafter.draft_fed

    def right(seq, at, k):  # the baseline's k tokens after position `at`, the last one wrong every other step
        r = seq[at + 1 : at + 1 + k]
        r += [0] * (k - len(r))
        r[-1] += (len(on_device) + len(fed)) % 2
        return r

    def oracle(committed, k):  # a prompt's first step (the host-staged chain)
        p = real(committed, k)
        on_device.append(p.device_tokens is not None)
        now["seq"] = next(f for f in full if f[: len(committed)] == committed)
        if p.device_tokens is not None:
            p.device_tokens = torch.tensor(right(now["seq"], len(committed) - 1, k))
        return p

    def oracle_fed(feed, k, span=None):  # every later step: the device loop's chain
        real_fed(feed, k, span)
        if "seq" not in now:  # the loop's warm-up, before any prompt
            return
        fed.append(k)
        # the pass just launched starts where the host rolled the cache back to after the last step
        assert int(feed.positions[0, 0]) == worker.verifier.cache.lengths[0] - (k + 1)
        if now.get("real"):
            return
        feed.drafts.copy_(torch.tensor(right(now["seq"], int(feed.positions[0, 0] + feed.at) + 1, k)))

    drafter.propose_on_device, drafter.draft_fed = oracle, oracle_fed
    for k in (1, 2, 4):
        r = worker.run(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=k))
        assert [p.tokens for p in r.prompts] == [p.tokens for p in base.prompts], f"k={k}"
        assert r.metrics["drafted_mean"] == k
        if overlap:
            assert 1.0 + (k - 1) * 0.5 <= r.metrics["accept_len_mean"] < k + 1, r.metrics["accept_len_mean"]
    # with overlap every prompt's first step drafts on the device and the device loop runs the rest
    assert (len(on_device) == 9 and all(on_device) and len(fed) > 9) if overlap else not on_device and not fed
    drafter.propose_on_device = real
    now["real"] = True  # the head's own drafts from here
    sim_w = replace(Workload(prompts=prompts, max_new_tokens=24, num_draft_tokens=4), simulate_accept_len=2.3)
    loops, sim = len(fed), worker.run(sim_w)
    # tau - 1 drafts kept a step on average; a prompt's last step keeps fewer (its token budget ends)
    assert sim.metrics["drafted_mean"] == 4 and 2.0 < sim.metrics["accept_len_mean"] <= 2.3
    if overlap:  # through the device loop, and exactly as the host path: the kept drafts are the head's own
        assert len(fed) > loops
        engine = worker.verifier.steps.engine
        worker.verifier.steps.engine = replace(engine, overlap=False)
        try:
            host = worker.run(sim_w)
        finally:
            worker.verifier.steps.engine = engine
        assert [p.tokens for p in sim.prompts] == [p.tokens for p in host.prompts]
        assert [(p.steps, p.accepted) for p in sim.prompts] == [(p.steps, p.accepted) for p in host.prompts]


def test_sampling_with_the_heads_probabilities_keeps_the_target_distribution(tiny_ckpt, tiny_head):
    """The head's q (zero outside its draft vocabulary) in rejection sampling: the first emitted token
    is distributed as the verifier's p (chi-square), at temperature 1."""
    target = load_args(tiny_ckpt)
    model = load_model(tiny_ckpt)
    head = load_head(tiny_head, model.embed_tokens.weight, target)
    d = Eagle3Drafter(head)
    g = torch.Generator().manual_seed(0)
    prompt = list(range(5, 17))
    states = torch.randn(len(prompt) - 1, 192, generator=g)
    logits = torch.randn(3, 512, generator=g) * 0.5
    logits[:, : 512 // 2] += 2.0  # p puts mass inside and outside the draft vocabulary
    d.begin(1.0, 1)
    gen = torch.Generator().manual_seed(2)
    counts = np.zeros(512)
    n = 4000
    for _ in range(n):
        d.prefill(prompt)
        d.observe(states)
        p = d.propose(prompt, 2)
        _, tokens = rejection_verify(p.tokens, p.probs, logits, 1.0, gen)
        counts[tokens[0]] += 1
    expected = torch.softmax(logits[0].double(), -1).numpy() * n
    # pool the many tiny cells into 16 bins so every expected count is large
    order = np.argsort(expected)
    bins = np.array_split(order, 16)
    assert chisquare([counts[b].sum() for b in bins], [expected[b].sum() for b in bins]).pvalue > 1e-3


@pytest.mark.slow  # trains on, and decodes with, the demo model
@pytest.mark.timeout(1800)
def test_train_drafter_small_budget_then_decode_equals_baseline(tmp_path, capsys):
    from orchestrator.cli import main

    def refused(*argv: str) -> str:
        """The CLI's exit status 2 and last stderr line, in this process (no interpreter to start)."""
        capsys.readouterr()
        assert main(list(argv)) == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    out = tmp_path / "head"
    prompts = "train-drafter --model smollm2-135m --num-prompts 2 --synthetic-prompts 1 --self-prompts 2".split()
    same = [*prompts, *"--max-new-tokens 16 --draft-vocab 512 --val-every 2".split()]
    r = spectune_here(capsys, *same, *"--gen-batch 2 --pack-tokens 40 --max-steps 4 --save-every 2 --out".split(), str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "loss" in r.stderr and "acc" in r.stderr and "val acc" in r.stderr  # the progress line
    assert json.loads(r.stdout.strip().splitlines()[-1])["steps"] == 4
    training = json.loads((out / "training.json").read_text())
    # 2 bundled + 1 synthetic prompt + 2 the target wrote itself, every 2nd of those 5 responses kept
    # for validation (the 2nd and the 4th); the head saved is the step whose validation accepted
    # length was best
    written = torch.load(out / "data.pt", weights_only=False)["self_prompts"]
    assert training["options"]["synthetic_prompts"] == 1 and len(written) == 2 and all(w.strip() for w in written)
    assert training["responses"] == 3 and training["validation_responses"] == 2
    assert [h["step"] for h in training["history"]] == [2, 4] and all(len(h["val_acc"]) == 3 for h in training["history"])
    assert all(1.0 <= h["val_accept_len"] <= 4.0 for h in training["history"])
    assert training["best_step"] in (2, 4)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 512
    # resumable: a longer run with the same folder reuses the responses and starts at step 4, also
    # from data made while --self-documents existed, which recorded it (none made)
    data = torch.load(out / "data.pt", weights_only=False)
    data["made_by"]["self_documents"] = [0, None]
    torch.save(data, out / "data.pt")
    r = spectune_here(capsys, *same, "--max-steps", "5", "--out", str(out))
    assert r.returncode == 0 and "resuming at step 4" in r.stderr and "responses from" in r.stderr, r.stderr[-2000:]
    # responses made for other prompts are refused, not silently trained on
    assert "--self-prompts" in (line := refused(*prompts, "--out", str(out))), line
    line = refused("train-drafter", "--model", "smollm2-135m", "--self-prompts", "-1", "--out", str(tmp_path / "other"))
    assert line.startswith("spectune: error: --max-time"), line
    r = spectune_here(
        capsys,
        "decode",
        "--model",
        "smollm2-135m",
        "--drafter",
        "eagle3",
        "--draft-model",
        str(out),
        "-k",
        "4",
        "--num-prompts",
        "1",
        "--max-new-tokens",
        "24",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert res["outputs_match_baseline"] == 1 and res["accept_len_mean"] >= 1.0


@pytest.mark.slow  # validating fetches the demo model (its config and tokenizer) and reads the shipped head
@pytest.mark.timeout(900)
def test_validate_smoke_experiment_with_the_demo_head(capsys):
    smoke, eagle3 = ROOT / "experiments" / "smoke-cpu.yaml", ROOT / "experiments" / "eagle3-cpu.yaml"
    r = spectune_here(capsys, "validate", str(smoke), "--set", "drafter.kind=eagle3", "--set", "drafter.model_path=smollm2-135m-eagle3")
    assert r.returncode == 0, r.stderr
    r = spectune_here(capsys, "validate", str(eagle3))
    assert r.returncode == 0, r.stderr


@torch.inference_mode()
def test_training_labels_are_the_targets_own_argmax_at_every_position(tiny_ckpt):
    """generate() records the target's argmax after every position: in the response it is the next
    token itself (greedy), in the prompt what the target would have said there, which a teacher-
    forced pass over prompt + response predicts too. ttt_loss with prompt_labels scores those
    prompt positions as well."""
    from workers.drafters.eagle3.training import draft_vocabulary, generate, training_labels, ttt_loss, warm_start

    model = load_model(tiny_ckpt)
    model.aux_layers = (0, 1, 1)
    prompts = [list(range(5, 17)), list(range(40, 49))]
    samples = generate(model, prompts, max_new=6, eos=set())
    # prompts prefilled together (padded) or one pass each: the same responses, argmaxes and states
    for a, b in zip(samples, generate(model, prompts, max_new=6, eos=set(), prefill_tokens=1)):
        assert a.tokens.tolist() == b.tokens.tolist() and a.argmax.tolist() == b.argmax.tolist()
        torch.testing.assert_close(a.aux.float(), b.aux.float(), atol=1e-2, rtol=1e-2)
    for p, s in zip(prompts, samples):
        n = len(s.tokens)
        assert s.argmax.shape == (n - 1,) and s.tokens[: len(p)].tolist() == p
        assert s.argmax[len(p) - 1 :].tolist() == s.tokens[len(p) :].tolist()  # the response is the argmax
        forced = model(s.tokens[None], model.new_cache(1))[0].argmax(-1)[: n - 1]  # teacher forcing
        assert s.argmax.tolist() == forced.tolist()
    s = samples[0]
    labels, first = training_labels(s, prompt_labels=True)
    assert first == 1 and labels[1:].tolist() == s.argmax.tolist()  # label m: what the target said after m - 1
    labels, first = training_labels(s, prompt_labels=False)
    assert first == len(prompts[0]) and labels.tolist() == s.tokens.tolist()
    head = warm_start(model, model.aux_layers, draft_vocabulary(samples, 512, 512))
    _, resp_only, _ = ttt_loss(head, samples[0], 2)
    _, with_prompt, _ = ttt_loss(head, samples[0], 2, prompt_labels=True)
    # step j's entries predict positions 2 + j ..: the prompt adds positions 2 + j .. prompt_len - 1
    assert [b - a for a, b in zip(resp_only, with_prompt)] == [len(prompts[0]) - 2 - j for j in range(2)]


@torch.no_grad()
def test_validation_accepted_length_counts_only_chains_whose_every_draft_is_scored(tiny_ckpt):
    """validation_accuracy's accepted length: over the entries whose `steps` drafts are all response
    positions (not the ones near the prompt's end whose first drafts are prompt positions), 1 + the
    drafts before the first wrong one."""
    from workers.drafters.eagle3.training import draft_vocabulary, generate, ttt_loss, validation_accuracy, warm_start

    model = load_model(tiny_ckpt)
    model.aux_layers = (0, 1, 1)
    samples = generate(model, [list(range(5, 17)), list(range(40, 49))], max_new=12, eos=set())
    head = warm_start(model, model.aux_layers, draft_vocabulary(samples, 512, 512))
    steps, chains, accepted = 3, 0, 0
    for x in samples:
        hits: list = []
        ttt_loss(head, x, steps, hits=hits)
        for i in range(len(x.tokens) - 1):
            if all(mask[i] for mask, _ in hits):  # every draft of the chain from entry i is scored
                assert x.prompt_len <= i + 2 and i + 1 + steps < len(x.tokens)
                chains += 1
                run = 0
                while run < steps and hits[run][1][i]:
                    run += 1
                accepted += run
    assert chains == sum(len(x.tokens) - x.prompt_len - steps + 1 for x in samples)  # entries P - 2 .. N - 2 - steps
    _, mean = validation_accuracy(head, samples, steps)
    assert mean == pytest.approx(1 + accepted / chains)


def test_a_packed_batch_scores_each_sample_as_it_alone_would(tiny_ckpt):
    """ttt_loss over several samples in one pass (attention kept inside each sample, rotary positions
    restarting per sample) counts and gets right exactly what the samples do one by one, and its
    loss is their cross entropies weighted by scored positions (one step, the full vocabulary)."""
    from workers.drafters.eagle3.training import draft_vocabulary, generate, pack_by_tokens, ttt_loss, warm_start

    model = load_model(tiny_ckpt)
    model.aux_layers = (0, 1, 1)
    samples = generate(model, [list(range(5, 17)), list(range(40, 49)), list(range(60, 80))], max_new=6, eos=set())
    head = warm_start(model, model.aux_layers, draft_vocabulary(samples, 512, 512))
    for labels in (False, True):
        alone = [ttt_loss(head, x, 3, labels) for x in samples]
        loss, counts, correct = ttt_loss(head, samples, 3, labels)
        assert counts == [sum(a[1][j] for a in alone) for j in range(3)]
        assert correct == [sum(a[2][j] for a in alone) for j in range(3)]
        one = [ttt_loss(head, x, 1, labels) for x in samples]
        packed, n, _ = ttt_loss(head, samples, 1, labels)
        want = sum(a[0] * a[1][0] for a in one) / n[0]
        torch.testing.assert_close(packed, want, atol=1e-5, rtol=1e-5)
    sizes = [len(x.tokens) for x in samples]  # 18, 15, 26 tokens
    packs = pack_by_tokens(samples, 33)
    assert [[len(x.tokens) for x in p] for p in packs] == [sizes[:2], sizes[2:]]
    assert [len(p) for p in pack_by_tokens(samples, 10)] == [1, 1, 1]  # a sample longer than the budget goes alone


def test_synthetic_prompts_are_many_distinct_and_repeatable():
    from orchestrator.prompts.synthesis import synthetic_prompts

    a, b = synthetic_prompts(600, seed=1), synthetic_prompts(600, seed=1)
    assert [p.text for p in a] == [p.text for p in b] and len({p.text for p in a}) == 600
    kinds = {p.category for p in a}
    assert {
        "synthetic-math",
        "synthetic-coding",
        "synthetic-summarization",
        "synthetic-translation",
        "synthetic-summarization-long",
    } <= kinds
    assert max(len(p.text.split()) for p in a if p.category == "synthetic-summarization-long") > 300  # long positions, copying far back
    assert [p.text for p in synthetic_prompts(600, seed=2)] != [p.text for p in a]
    bundled = {p.text for p in load_prompts_all()}
    assert not bundled & {p.text for p in a}  # nothing of the scored file


@torch.inference_mode()
def test_prompts_the_target_writes_itself_are_its_samples_distinct_and_repeatable(tiny_ckpt):
    """self_prompts (Magpie): rows sampled after the prefix until a stop token, the stop token
    dropped, repeats and rows that never stop discarded; one seed gives the same prompts. Near zero
    temperature every row is the greedy continuation, so exactly that one prompt remains."""
    from workers.drafters.eagle3.training import self_prompts

    model = load_model(tiny_ckpt)
    prefix = [3, 1, 4, 1, 5]
    stop = set(range(100, 140))  # 40 of 512 tokens: most rows stop well within max_len
    a = self_prompts(model, prefix, stop, n=12, seed=1, max_len=64, batch=8)
    assert a == self_prompts(model, prefix, stop, n=12, seed=1, max_len=64, batch=8)
    assert a != self_prompts(model, prefix, stop, n=12, seed=2, max_len=64, batch=8)
    assert 6 <= len(a) <= 12 and len({tuple(r) for r in a}) == len(a)
    assert all(r and not stop & set(r) and len(r) < 64 for r in a)
    cache = model.new_cache(1)
    greedy, logits = [], model(torch.tensor([prefix]), cache)[0, -1]
    for _ in range(8):
        greedy.append(int(logits.argmax()))
        logits = model(torch.tensor([[greedy[-1]]]), cache)[0, -1]
    stop_at = next(i for i in range(1, 8) if greedy[i] not in greedy[:i])  # a token first seen at step i
    got = self_prompts(model, prefix, {greedy[stop_at]}, n=5, seed=0, max_len=16, temperature=1e-4, batch=4)
    assert got == [greedy[:stop_at]]


def load_prompts_all():
    from orchestrator.prompts.loading import BUNDLED_PROMPTS, load_prompts

    return load_prompts(BUNDLED_PROMPTS)


@torch.inference_mode()
def test_generation_through_the_fused_batched_step_equals_the_plain_one(tiny_ckpt, kernel_device):
    """train-drafter's responses on a GPU come from the engine's fused step with the split-KV Triton
    attention (each row read up to its own position, no mask); here under the interpreter on CPU:
    the same tokens, target argmaxes and aux states as the plain masked path, for ragged prompts."""
    if kernel_device != "cpu":
        pytest.skip("CPU test of the Triton attention under its interpreter")
    from workers.drafters.eagle3.training import generate
    from workers.engine.fused_step import FusedStep
    from workers.kernels.attention import decode_attend
    from workers.spec.engine_config import EngineConfig

    prompts = [list(range(5, 17)), list(range(40, 45)), list(range(60, 80))]
    plain_model, fused_model = load_model(tiny_ckpt), load_model(tiny_ckpt)
    for m in (plain_model, fused_model):
        m.aux_layers = (0, 1, 1)
    want = generate(plain_model, prompts, max_new=8, eos=set())
    fast = FusedStep(fused_model, EngineConfig(compile=False, gemv="off"), None, decode_attend)
    got = generate(fused_model, prompts, max_new=8, eos=set(), fast=fast)
    for w, g in zip(want, got):
        assert g.tokens.tolist() == w.tokens.tolist() and g.argmax.tolist() == w.argmax.tolist()
        torch.testing.assert_close(g.aux.float(), w.aux.float(), atol=2e-2, rtol=2e-2)
