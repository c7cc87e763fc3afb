"""DeepSeek-V3's multi-token-prediction layer as a drafter (workers/drafters/mtp.py), on CPU: the layer
is read from the checkpoint's layer `num_hidden_layers`, split like the model's layers at TP 2, and the
drafter's chains (its own cache, rolled back and fed as the verifier commits) equal a from-scratch
computation of the MTP math over the committed sequence at every step, through the host loop and the
device-only chain body a GPU captures (which reads nothing back to the host, and drafts in lockstep on
both ranks of TP 2). Losslessness through the
engine and at TP 2 is tests/e2e/test_families_cli.py's."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from tests.engine.test_deepseek import DS_LORA
from workers.drafters.mtp import MtpDrafter, MtpHead
from workers.model.args import CheckpointError, ModelConfigError
from workers.model.checkpoint import load_model, write_random_checkpoint
from workers.model.tp import TPPart, parts
from workers.model.transformer import rms_norm

MTP_CFG = {**DS_LORA, "num_nextn_predict_layers": 1}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("mtp"), MTP_CFG, seed=5)


def test_the_mtp_layer_is_the_checkpoints_layer_after_the_last(ckpt):
    model = load_model(ckpt, mtp=True)
    n = model.args.n_layers
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        for name in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight", "self_attn.kv_b_proj.weight"):
            assert torch.equal(model.mtp.get_parameter(name), f.get_tensor(f"model.layers.{n}.{name}")), name
        experts = f.get_tensor(f"model.layers.{n}.mlp.experts.2.up_proj.weight")
    assert torch.equal(model.mtp.mlp.experts.up_proj[2], experts)
    assert load_model(ckpt).mtp is None  # only the MTP drafter's verifier holds it
    # at TP 2 its block is split as the layers' are: its heads and every expert's intermediate dimension
    plan = parts(model.args, TPPart(1, 2), mtp=True)
    assert plan["mtp.self_attn.kv_b_proj.weight"] == plan["layers.1.self_attn.kv_b_proj.weight"]
    assert plan["mtp.mlp.experts.up_proj"] == plan["layers.1.mlp.experts.up_proj"]
    assert "mtp.eh_proj.weight" not in plan  # the join is replicated


def test_a_model_without_an_mtp_layer_is_refused_in_one_line(tmp_path):
    plain = write_random_checkpoint(tmp_path / "plain", {**DS_LORA, "num_nextn_predict_layers": 0}, seed=1)
    with pytest.raises(
        ModelConfigError, match=r"^drafter.kind mtp: .* has no multi-token-prediction layer \(num_nextn_predict_layers is 0\)$"
    ):
        load_model(plain, mtp=True)
    # transformers' own writer declares one MTP layer and stores none: the missing tensors are named
    declared = write_random_checkpoint(tmp_path / "declared", {**DS_LORA, "num_nextn_predict_layers": 0}, seed=1)
    (declared / "config.json").write_text(
        (declared / "config.json").read_text().replace('"num_nextn_predict_layers": 0', '"num_nextn_predict_layers": 1')
    )
    with pytest.raises(CheckpointError, match=r"lacks .* tensors, e\.g\. 'layers\.3\."):
        load_model(declared, mtp=True)


@torch.inference_mode()
def test_the_grouped_kernel_reaches_the_mtp_layers_experts(ckpt, kernel_device, monkeypatch):
    """Where the engine picks the grouped MoE kernel (on CUDA; here under Triton's CPU interpreter) the
    MTP layer's routed experts run it in the drafter's eager steps too, to the loop's numbers."""
    from workers.engine.steps import use_grouped_experts
    from workers.kernels import moe as moe_kernels
    from workers.spec.engine_config import EngineConfig

    loop, grouped = load_model(ckpt, mtp=True, device=kernel_device), load_model(ckpt, mtp=True, device=kernel_device)
    assert use_grouped_experts(grouped, EngineConfig(moe_kernel="triton")) == "grouped"
    calls, kernel = [], moe_kernels.grouped_experts
    monkeypatch.setattr(moe_kernels, "grouped_experts", lambda x, *a, **kw: calls.append(x.shape[0]) or kernel(x, *a, **kw))
    tokens = torch.tensor([5, 17, 42, 8], device=kernel_device)
    states = torch.randn(4, loop.args.dim, generator=torch.Generator().manual_seed(0)).to(kernel_device)
    want = MtpHead(loop).step(tokens, states, MtpHead(loop).new_cache())
    assert not calls  # the plain model's MTP layer loops over its experts
    got = MtpHead(grouped).step(tokens, states, MtpHead(grouped).new_cache())
    assert calls == [4]  # one grouped call, the MTP layer's four tokens
    tol = 1e-4 if kernel_device == "cpu" else 2e-2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)


def _reference_chain(model, tokens: list[int], k: int) -> list[int]:
    """The MTP math from scratch: the verifier's final states over `tokens`, the layer over every
    (state, next token) pair at once, then k greedy drafts, each reading the layer's own last output."""
    m = model.mtp
    with torch.no_grad():
        h = model.hidden(torch.tensor([tokens]), model.new_cache())[0]  # final normed states [L, dim]
        states, nxt = list(h[:-1]), list(tokens[1:])
        drafts = []
        for _ in range(k):
            cache = MtpHead(model).new_cache()
            ids = torch.tensor([nxt])
            emb = model.embed_tokens(ids)
            emb[:, 0] = 0.0  # position 0's embedding is zeroed, as vLLM does
            x = m.eh_proj(
                torch.cat(
                    [rms_norm(emb, m.enorm.weight, m.enorm.eps), rms_norm(torch.stack(states)[None], m.hnorm.weight, m.hnorm.eps)], -1
                )
            )
            pos = torch.arange(len(nxt))[None]
            cos, sin, mask = model.rope_and_mask(pos, len(nxt))
            out = m(x, cos, sin, mask, cache.k[0], cache.v[0], pos)[0]
            tok = int(model.logits(m.shared_head.norm(out[-1]))[...].argmax())
            drafts.append(tok)
            states.append(out[-1])
            nxt.append(tok)
    return drafts


@pytest.mark.parametrize("chain", [False, True], ids=["host-loop", "device-chain"])
@pytest.mark.parametrize("absorbed", [False, True], ids=["expanded", "absorbed"])
def test_the_drafters_chains_equal_the_mtp_math_from_scratch_as_the_verifier_commits(ckpt, absorbed, chain):
    """A greedy decode where the verifier keeps 0, 1, all or some of the drafts in turn: each proposal
    equals the from-scratch chain over the committed tokens (the drafter's cache rolled back and fed
    with the states of exactly the positions committed since), on either latent-attention cache,
    through the host loop and through the device-only chain body a GPU captures as one CUDA graph
    (its steps over the whole static cache under a position mask)."""
    model = load_model(ckpt, mtp=True)
    model.absorb_latent_attention(absorbed)
    model.aux_layers = (model.args.n_layers,)
    k, prompt = 3, [5, 17, 42, 8, 99, 3]
    drafter = MtpDrafter(MtpHead(model), chain=chain)
    assert drafter.use_chain is chain
    drafter.chain.ready_width = k + 1  # as `warm` leaves it on a GPU: a wider feed (the prompt's) goes eagerly first
    drafter.begin(0.0, 0)
    drafter.prefill(prompt)

    def verifier(tokens):  # the verifier from scratch: its final states (model.aux) and logits
        return model(torch.tensor([tokens]), model.new_cache())[0]

    with torch.no_grad():
        committed = [*prompt, int(verifier(prompt)[-1].argmax())]
        drafter.observe(model.aux[0][0, : len(prompt)])  # the prompt's states: every committed position but the last
        for step, keep in enumerate((0, 1, k, 2, 0, k)):
            proposal = drafter.propose(committed, k)
            assert proposal.tokens == _reference_chain(model, committed, k), step
            L = len(committed)
            logits = verifier([*committed, *proposal.tokens])  # the verify pass: positions L - 1 .. L - 1 + k
            kept = proposal.tokens[:keep]  # the drafts this step keeps, then the verifier's own next token
            committed = [*committed, *kept, int(logits[L - 1 + keep].argmax())]
            drafter.observe(model.aux[0][0, L - 1 : L + keep])  # the states of the positions it committed
    other = drafter.fork()  # another sequence's drafter: the same layer, a cache of its own
    assert other.cache is not drafter.cache and other.head is drafter.head


def _host_drafts(model, tokens: list[int], states: torch.Tensor, k: int) -> list[int]:
    """k greedy drafts of the MTP layer's host loop after feeding `tokens` with `states`, from a fresh cache."""
    head = MtpHead(model)
    cache = head.new_cache()
    h, logits = head.step(torch.tensor(tokens), states, cache)
    drafts = [int(logits.argmax())]
    for _ in range(k - 1):
        h, logits = head.step(torch.tensor(drafts[-1:]), h[-1:], cache)
        drafts.append(int(logits.argmax()))
    return drafts


@torch.inference_mode()
def test_the_chain_body_never_syncs(ckpt, monkeypatch):
    """The MTP chain's device-only body (a feed of 3 entries and 3 drafts over the whole static cache,
    what a GPU captures as one CUDA graph), with the routed experts a capture runs (the graph-safe
    loop), reads nothing back to the host and drafts what the host loop drafts."""
    from test_graph_safety import NoHostSync

    model = load_model(ckpt, mtp=True, max_seq=64)
    model.absorb_latent_attention(True)
    monkeypatch.setattr(model.mtp.mlp, "eager_experts", model.mtp.mlp.graph_experts)
    tokens, states = [5, 17, 42], torch.randn(3, model.args.dim, generator=torch.Generator().manual_seed(2))
    want = _host_drafts(model, tokens, states, 3)
    chain = MtpDrafter(MtpHead(model), chain=True).chain
    with NoHostSync():
        drafts = chain.draft(tokens, states, 3, on_device=True)
    assert drafts.tolist() == want and chain.cache.lengths[0] == 3 + 3 - 1  # the last draft is not fed


def _rank_drafts(rank: int, init: str, path: str, tokens: list[int], states, queue) -> None:
    """One gloo rank of a TP 2 MTP layer (vocabulary split too): the drafts of its host loop and of its
    device-only chain body, each from a fresh cache."""
    import torch.distributed as dist

    from workers.comm import make_allreduce
    from workers.model.tp import hook

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
        part = TPPart(rank, 2, True)
        model = hook(load_model(path, tp=part, mtp=True, max_seq=64), part, make_allreduce("gloo", dist.group.WORLD, 2))
        model.absorb_latent_attention(True)
        with torch.inference_mode():
            by_host = _host_drafts(model, tokens, states, 3)
            by_chain = MtpDrafter(MtpHead(model), chain=True).chain.draft(tokens, states, 3)
        queue.put((rank, by_host, by_chain, None))
    except Exception as e:  # noqa: BLE001 - reported to the test
        queue.put((rank, None, None, f"{type(e).__name__}: {e}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_chain_body_drafts_in_lockstep_at_tp_2(ckpt, tmp_path):
    """At TP 2 over gloo (the layer's heads and experts split, the vocabulary too, its allreduces and
    the logits' gather inside the body a GPU captures), both ranks' chains draft what the host loop and
    the unsharded layer draft."""
    import os

    from workers.runtime.procs import rank_context, with_env

    tokens, states = [5, 17, 42], torch.randn(3, load_model(ckpt).args.dim, generator=torch.Generator().manual_seed(3))
    model = load_model(ckpt, mtp=True, max_seq=64)
    model.absorb_latent_attention(True)
    with torch.inference_mode():
        want = _host_drafts(model, tokens, states, 3)
    ctx = rank_context("cpu")
    queue = ctx.Queue()
    init = f"file://{tmp_path / 'rdv'}"
    procs = [
        ctx.Process(target=with_env, args=(dict(os.environ), _rank_drafts, r, init, str(ckpt), tokens, states, queue)) for r in range(2)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert [err for *_, err in results] == [None, None]
    for rank, by_host, by_chain, _ in results:
        assert by_chain == by_host == want, rank
