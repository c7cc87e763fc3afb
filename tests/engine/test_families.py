"""Qwen3 and Qwen3-MoE verifiers: transformers' own implementation is the reference (logits at TP 1,
sharded at TP 2 and 4 over gloo), every config field that changes the math is honoured or refused,
the fused step and the grouped MoE kernel compute what the plain model computes.

Checkpoints here have settings of their own (not any public shape) and are written by
`write_random_checkpoint` in Hugging Face's layout (one tensor per expert), which transformers loads.
"""

from __future__ import annotations

import pytest
import torch

from workers.checks.parity import reference_logits, sharded_logits
from workers.engine.fused_step import FusedStep
from workers.model.args import ModelArgs, ModelConfigError
from workers.model.checkpoint import CheckpointReader, load_model, tiny_config, write_random_checkpoint
from workers.model.locate import random_config
from workers.model.moe import Experts, MoE, experts_by_expert, experts_dense
from workers.model.tp import TPPart
from workers.spec.engine_config import EngineConfig

QWEN3 = tiny_config(
    model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=12
)
# MoE on layers 1 and 3 (decoder_sparse_step 2), layer 3 made dense by mlp_only_layers: only layer 1 routes
QWEN3_MOE_SPARSE = tiny_config(
    model_type="qwen3_moe",
    architectures=["Qwen3MoeForCausalLM"],
    num_hidden_layers=4,
    num_experts=6,
    num_experts_per_tok=3,
    moe_intermediate_size=24,
    decoder_sparse_step=2,
    mlp_only_layers=[3],
    norm_topk_prob=False,
    rms_norm_eps=1e-6,
)
QWEN3_MOE = tiny_config(
    model_type="qwen3_moe",
    architectures=["Qwen3MoeForCausalLM"],
    num_hidden_layers=3,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=40,
    norm_topk_prob=True,
    rope_theta=50000.0,
)


def _tokens(vocab: int, seq: int = 20, batch: int = 2) -> list[list[int]]:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.mark.parametrize("cfg", [QWEN3, QWEN3_MOE, QWEN3_MOE_SPARSE], ids=["qwen3", "qwen3_moe", "qwen3_moe_sparse"])
def test_logits_match_transformers_at_tp_1_2_4(tmp_path, cfg):
    path = write_random_checkpoint(tmp_path, cfg, seed=11)
    tokens = _tokens(cfg["vocab_size"])
    mine, theirs = reference_logits(str(path), tokens)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    assert (mine.argmax(-1) == theirs.argmax(-1)).all()
    for tp in (2, 4) if cfg["num_attention_heads"] % 4 == 0 else (2,):
        torch.testing.assert_close(sharded_logits(str(path), tp, tokens), theirs, atol=1e-4, rtol=1e-4)


def test_layers_that_route_follow_sparse_step_and_mlp_only_layers(tmp_path):
    args = ModelArgs.from_hf_config(QWEN3_MOE_SPARSE)
    assert args.moe_layers == (1,) and args.qk_norm
    model = load_model(write_random_checkpoint(tmp_path, QWEN3_MOE_SPARSE))
    assert [isinstance(layer.mlp, MoE) for layer in model.layers] == [False, True, False, False]
    assert args.with_layers(1).moe_layers == ()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"use_sliding_window": True, "sliding_window": 64}, "use_sliding_window"),
        ({"attention_bias": True}, "attention_bias"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step"),
        ({"moe_intermediate_size": None}, "moe_intermediate_size"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_fields_that_change_the_math_are_refused_by_name(change, field):
    with pytest.raises(ModelConfigError, match=field):
        ModelArgs.from_hf_config({**QWEN3_MOE, **change})


def test_a_rank_reads_only_its_slice_of_every_expert(tmp_path):
    path = write_random_checkpoint(tmp_path, QWEN3_MOE)
    reader = CheckpointReader(path)
    model = load_model(path, tp=TPPart(1, 2), reader=reader)
    experts = model.layers[0].mlp.experts
    assert tuple(experts.gate_proj.shape) == (8, 20, 64) and tuple(experts.down_proj.shape) == (8, 64, 20)
    full = 40 * 64 * 4  # one expert's gate_proj in float32
    assert reader.bytes_read["layers.0.mlp.experts.5.gate_proj.weight"] == full // 2
    assert reader.bytes_read["layers.0.mlp.gate.weight"] == 8 * 64 * 4  # the router is replicated


def test_random_presets_and_the_layer_subset_label():
    cfg = random_config("random:qwen3-235b-a22b:layers=4")
    args = ModelArgs.from_hf_config(cfg)
    assert args.n_layers == 4 and args.moe_layers == (0, 1, 2, 3) and args.moe.n_experts == 128 and args.moe.top_k == 8
    assert args.layers_label == "4 of 94 layers"
    assert ModelArgs.from_hf_config(random_config("random:qwen3-8b")).layers_label == ""
    assert ModelArgs.from_hf_config(random_config("random:qwen3-30b-a3b")).moe.intermediate_size == 768


@torch.inference_mode()
def test_dense_experts_equal_the_loop_over_chosen_experts(tmp_path):
    model = load_model(write_random_checkpoint(tmp_path, QWEN3_MOE, seed=2))
    moe = model.layers[0].mlp
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(0))
    weights, ids = moe.gate(x)
    torch.testing.assert_close(
        experts_dense(x, weights, ids, moe.experts), experts_by_expert(x, weights, ids, moe.experts), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("moe_kernel", ["dense", "triton"])
@pytest.mark.parametrize("cfg", [QWEN3, QWEN3_MOE], ids=["qwen3", "qwen3_moe"])
@torch.inference_mode()
def test_fused_step_matches_the_plain_model(tmp_path, cfg, moe_kernel, kernel_device):
    """The graphed steps' body (merged QKV with Qwen3's q/k norms, the router and the routed experts
    by engine.moe_kernel; the Triton kernel under its CPU interpreter, or on the GPU) against the
    plain model."""
    path = write_random_checkpoint(tmp_path, cfg, seed=4)
    dev = kernel_device
    plain, fused_model = load_model(path, max_seq=64, device=dev), load_model(path, max_seq=64, device=dev)
    fast = FusedStep(fused_model, EngineConfig(compile=False, gemv="off", moe_kernel=moe_kernel))
    c1, c2 = plain.new_cache(2), fused_model.new_cache(2)
    prompt = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(0)).to(dev)
    plain(prompt, c1)
    fused_model(prompt, c2)
    step = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]], device=dev)
    pos = torch.arange(9, 13, device=dev)[None].expand(2, 4)
    want = plain(step, c1)
    got = fused_model.logits(fast.hidden_at(step, pos, c2, c2.max_seq))
    tol = 1e-4 if dev == "cpu" else 2e-2  # tensor cores take float32 as tf32 on the GPU
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@torch.inference_mode()
def test_compiled_fused_step_with_the_grouped_kernel(tmp_path, kernel_device):
    """engine.compile on (Inductor, also on CPU): the router and the MoE pairing run compiled beside the
    grouped kernel, at width 1 (one block per pair) and at a verify width (the sorted grouping)."""
    path = write_random_checkpoint(tmp_path, QWEN3_MOE, seed=4)
    dev = kernel_device
    plain, model = load_model(path, max_seq=64, device=dev), load_model(path, max_seq=64, device=dev)
    fast = FusedStep(model, EngineConfig(compile=True, gemv="off", moe_kernel="triton"))
    routed, route = [], fast.route_fn
    fast.route_fn = lambda gate, x: routed.append(x.shape[0]) or route(gate, x)  # the step routes through it
    c1, c2 = plain.new_cache(1), model.new_cache(1)
    prompt = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(1)).to(dev)
    plain(prompt, c1)
    model(prompt, c2)
    tol = 1e-4 if dev == "cpu" else 2e-2
    moes = [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)]
    for tokens, start in (([5], 9), ([6, 7, 8], 10)):
        step, pos = torch.tensor([tokens], device=dev), torch.arange(start, start + len(tokens), device=dev)[None]
        for m in moes:  # the compiled router still logs its choice (scripts/verify_widths.py counts experts so)
            m.census = []
        torch.testing.assert_close(model.logits(fast.hidden_at(step, pos, c2, c2.max_seq)), plain(step, c1), atol=tol, rtol=tol)
        assert all(len(m.census) == 1 and m.census[0].shape == (len(tokens), m.gate.top_k) for m in moes)
        assert routed == [len(tokens)] * len(moes)
        routed.clear()
        for m in moes:
            m.census = None


@torch.inference_mode()
def test_the_prefill_runs_the_grouped_kernel_in_chunks_where_the_engine_picks_it(tmp_path, kernel_device, monkeypatch):
    """With the grouped kernel picked for the graphs (use_grouped_experts), an eager pass (the prefill)
    runs it too, over at most PREFILL_TOKENS tokens a call: the logits of the loop over chosen experts."""
    from workers.engine.steps import use_grouped_experts
    from workers.kernels import moe as moe_kernels

    path = write_random_checkpoint(tmp_path, QWEN3_MOE, seed=5)
    dev = kernel_device
    plain, grouped = load_model(path, max_seq=64, device=dev), load_model(path, max_seq=64, device=dev)
    assert use_grouped_experts(grouped, EngineConfig(moe_kernel="triton")) == "grouped"
    assert use_grouped_experts(plain, EngineConfig(moe_kernel="dense")) == "dense"
    tokens_per_call, kernel = [], moe_kernels.grouped_experts
    monkeypatch.setattr(moe_kernels, "grouped_experts", lambda x, *a, **kw: tokens_per_call.append(x.shape[0]) or kernel(x, *a, **kw))
    monkeypatch.setattr(moe_kernels, "PREFILL_TOKENS", 8)
    prompt = torch.randint(0, 512, (2, 19), generator=torch.Generator().manual_seed(2)).to(dev)
    want = plain(prompt, plain.new_cache(2))
    got = grouped(prompt, grouped.new_cache(2))
    assert tokens_per_call == [8, 8, 8, 8, 6] * QWEN3_MOE["num_hidden_layers"]  # 38 tokens a layer, every layer routes
    tol = 1e-4 if dev == "cpu" else 2e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@torch.inference_mode()
def test_one_block_per_pair_equals_the_sorted_grouping(kernel_device):
    """A block per (token, expert) pair, its expert read in the kernels (one token's default, its pairs
    summed by the down kernel), gives the sorted grouping's numbers, for any routing, repeated experts
    included."""
    from workers.kernels.moe import grouped_experts
    from workers.kernels.support import counters_all_zero

    gen = torch.Generator().manual_seed(0)
    experts = Experts(8, 64, 40)
    for p in experts.parameters():
        p.data = torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5
    experts = experts.to(kernel_device)
    tol = 1e-5 if kernel_device == "cpu" else 2e-2  # tensor cores take float32 as tf32 on the GPU
    for T in (1, 6):
        x = torch.randn(T, 64, generator=gen).to(kernel_device)
        ids = torch.randint(0, 8, (T, 3), generator=gen) if T > 1 else torch.randperm(8, generator=gen)[:3][None]
        w = torch.softmax(torch.randn(T, 3, generator=gen), -1)
        ids, w = ids.to(kernel_device), w.to(kernel_device)
        sorted_ = grouped_experts(x, w, ids, experts, per_pair=False)
        per_pair = grouped_experts(x, w, ids, experts, per_pair=True)
        assert counters_all_zero()  # one token's pairs summed by the down kernel's last block: counters reset
        if T == 1:
            assert torch.equal(grouped_experts(x, w, ids, experts), per_pair)  # one token's default
        else:
            assert len(set(ids.flatten().tolist())) < ids.numel()  # some expert serves several pairs
        torch.testing.assert_close(per_pair, sorted_, atol=tol, rtol=tol)
        torch.testing.assert_close(sorted_, experts_by_expert(x, w, ids, experts), atol=tol, rtol=tol)


def test_the_grouping_of_pairs_has_no_host_sync():
    """The grouped kernel's pairing runs inside CUDA graphs: one graph for torch.compile (a data-dependent
    shape or a host read would break it, as bincount's does), and the same numbers as eager."""
    from workers.kernels.moe import group_pairs
    from workers.model.moe import softmax_top_k

    ids = torch.randint(0, 16, (5, 4), generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(group_pairs, dynamic=False, fullgraph=True)
    for got, want in zip(compiled(ids, 16), group_pairs(ids, 16)):
        assert torch.equal(got, want)
    # the router, compiled as the fused step runs it: the same choice and weights
    x, w = torch.randn(3, 32, generator=torch.Generator().manual_seed(1)), torch.randn(16, 32, generator=torch.Generator().manual_seed(2))
    for norm in (True, False):
        got, want = torch.compile(softmax_top_k, dynamic=False, fullgraph=True)(x, w, 4, norm), softmax_top_k(x, w, 4, norm)
        assert torch.equal(got[1], want[1]) and torch.allclose(got[0], want[0])


def test_the_grouped_kernels_self_test_passes(kernel_device):
    """workers/kernels/moe.py's own self-test: every grouping (sorted, one block per pair) and block size
    (decode's, a prefill's) against the loop over chosen experts, on routings from one token to all
    tokens on one expert."""
    from workers.kernels.moe import selftest

    assert selftest(kernel_device) < (1e-5 if kernel_device == "cpu" else 2e-2)


def test_warming_the_chunked_experts_compiles_every_block_size_a_prefill_takes(kernel_device, monkeypatch):
    """`warm_chunked` (run when the engine picks the grouped kernel on CUDA) calls the chunked experts with
    few and many tokens (BLOCK_M and PREFILL_BLOCK_M blocks) and a pair count on each side of Triton's
    multiple-of-16 specialisation, each call the eager experts' numbers: no timed prefill compiles."""
    from workers.kernels import moe as moe_kernels
    from workers.model.moe import Experts, experts_by_expert

    experts = Experts(8, 32, 16).to(kernel_device)
    for p in experts.parameters():
        torch.nn.init.normal_(p, generator=torch.Generator(device=kernel_device).manual_seed(0))
    seen, chunked = [], moe_kernels.grouped_experts_chunked

    def spy(x, w, ids, ex):
        out = chunked(x, w, ids, ex)
        torch.testing.assert_close(out, experts_by_expert(x, w, ids, ex), atol=1e-3, rtol=1e-3)
        seen.append((ids.numel() >= 4 * moe_kernels.PREFILL_BLOCK_M, ids.numel() % 16 == 0))
        return out

    monkeypatch.setattr(moe_kernels, "grouped_experts_chunked", spy)
    moe_kernels.warm_chunked(experts, 4, experts.gate_proj.dtype)
    assert sorted(seen) == [(False, False), (False, True), (True, False), (True, True)]


def test_the_router_kernel_chooses_and_weighs_as_the_softmax_router(kernel_device):
    """workers/kernels/moe.py `softmax_top_k` (the fused step's router where the grouped kernels run): the
    same experts and weights as Qwen3-MoE's softmax router over one token, a verify width and a batch,
    with and without renormalisation; among equal probabilities the lowest expert id goes first."""
    from workers.kernels import moe as moe_kernels
    from workers.model.moe import softmax_top_k

    gen = torch.Generator().manual_seed(3)
    for T, E, top_k in ((1, 128, 8), (5, 16, 4), (9, 6, 3)):
        x, w = torch.randn(T, 64, generator=gen).to(kernel_device), torch.randn(E, 64, generator=gen).to(kernel_device)
        for norm in (True, False):
            (got_w, got_ids), (want_w, want_ids) = moe_kernels.softmax_top_k(x, w, top_k, norm), softmax_top_k(x, w, top_k, norm)
            assert torch.equal(got_ids, want_ids) and got_w.dtype == want_w.dtype
            torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-5)
    x, w = torch.ones(1, 4, device=kernel_device), torch.zeros(8, 4, device=kernel_device)
    w[[3, 5, 6]] = 1.0  # three experts tie for first
    weights, ids = moe_kernels.softmax_top_k(x, w, 2, True)
    assert ids.tolist() == [[3, 5]] and weights.tolist() == [[0.5, 0.5]]
