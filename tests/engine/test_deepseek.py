"""DeepSeek-V3 verifiers (Kimi-K2 is this family): transformers' own implementation is the reference
(logits at TP 1, sharded at TP 2 and 4 over gloo, greedy tokens of `generate`), every config field
that changes the math is honoured or refused by name, a rank reads only its slices, the random
presets have the published shapes, and the plain model's graphed body reads nothing back to the host.

Checkpoints here have settings of their own (not any public shape) and are written by
`write_random_checkpoint` in the layout transformers' `save_pretrained` writes, which it loads.

    .venv/bin/python -m pytest tests/engine/test_deepseek.py
"""

from __future__ import annotations

import importlib

import pytest
import torch

from workers.checks.parity import reference_logits, sharded_logits
from workers.model import transformer
from workers.model.args import ModelArgs, ModelConfigError, check_tp
from workers.model.checkpoint import CheckpointReader, load_model, tiny_config, write_random_checkpoint
from workers.model.locate import random_config
from workers.model.tp import TPPart


def deepseek_config(**overrides) -> dict:
    cfg = tiny_config(
        model_type="deepseek_v3",
        architectures=["DeepseekV3ForCausalLM"],
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=12,
        n_routed_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=20,
        first_k_dense_replace=1,
        rms_norm_eps=1e-6,
        max_position_embeddings=2048,
    )
    del cfg["head_dim"]  # transformers derives it (qk_rope_head_dim)
    cfg.update(overrides)
    return cfg


# a query bottleneck, 4 groups of 2 experts of which the best 2 are kept, two shared experts,
# interleaved rope pairs, yarn with mscale_all_dim (the softmax scale changes with it)
DS_LORA = deepseek_config(
    q_lora_rank=24,
    n_group=4,
    topk_group=2,
    n_shared_experts=2,
    norm_topk_prob=True,
    routed_scaling_factor=1.7,
    rope_scaling={
        "type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 256,
        "mscale": 1.0,
        "mscale_all_dim": 0.8,
        "beta_fast": 32,
        "beta_slow": 1,
    },
)
# no query bottleneck (q_proj), one group (Kimi-K2's routing), rotate-half rope, 6 heads (uneven at
# TP 4), two dense layers, no renormalisation
DS_PLAIN = deepseek_config(
    q_lora_rank=None,
    num_hidden_layers=4,
    first_k_dense_replace=2,
    num_attention_heads=6,
    num_key_value_heads=6,
    n_group=1,
    topk_group=1,
    n_shared_experts=1,
    norm_topk_prob=False,
    routed_scaling_factor=2.25,
    rope_interleave=False,
    rope_theta=30000.0,
)


def _tokens(vocab: int, seq: int = 20, batch: int = 2) -> list[list[int]]:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.mark.parametrize("cfg", [DS_LORA, DS_PLAIN], ids=["q_lora_grouped_yarn", "q_proj_one_group"])
def test_logits_match_transformers_at_tp_1_2_4(tmp_path, cfg, monkeypatch):
    path = write_random_checkpoint(tmp_path, cfg, seed=11)
    tokens = _tokens(cfg["vocab_size"])
    mine, theirs = reference_logits(str(path), tokens)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    assert (mine.argmax(-1) == theirs.argmax(-1)).all()
    for tp in (2, 4):
        torch.testing.assert_close(sharded_logits(str(path), tp, tokens), theirs, atol=1e-4, rtol=1e-4)
    # on the compressed cache with absorbed projections (engine.mla absorbed), over a prefill and a
    # verify-shaped chunk that reads it: unsharded, and at TP 4 (DS_PLAIN's 6 heads: 2, 2, 1, 1 a rank)
    model = load_model(path)
    model.absorb_latent_attention()
    x = torch.tensor(tokens)
    with torch.inference_mode():
        cache = model.new_cache(x.shape[0])
        absorbed = torch.cat([model(x[:, :10], cache), model(x[:, 10:], cache)], dim=1)
    m = model.args.mla
    assert cache.k[0].shape[1:] == (1, model.max_seq, m.kv_lora_rank + m.qk_rope_head_dim)  # one entry a token
    assert cache.v[0].data_ptr() == cache.k[0].data_ptr()  # V is K's first kv_lora_rank dims
    torch.testing.assert_close(absorbed, theirs, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sharded_logits(str(path), 4, tokens, absorbed=True), theirs, atol=1e-4, rtol=1e-4)
    # a long prefill's queries go in chunks of positions (here one position a chunk): the same logits
    monkeypatch.setattr(transformer, "SHARED_ENTRY_SCORE_BYTES", 1)
    with torch.inference_mode():
        cache = model.new_cache(x.shape[0])
        chunked = torch.cat([model(x[:, :10], cache), model(x[:, 10:], cache)], dim=1)
    torch.testing.assert_close(chunked, theirs, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_greedy_decode_equals_transformers_generate(tmp_path):
    """Token by token on our KV cache (one position a step) against transformers' `generate`."""
    from transformers import AutoModelForCausalLM

    path = write_random_checkpoint(tmp_path, DS_LORA, seed=5)
    prompt = _tokens(DS_LORA["vocab_size"], seq=7, batch=1)[0]
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    x = torch.tensor([prompt])
    theirs = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    model = load_model(path)
    for absorbed in (False, True):  # each head's K/V, then the compressed cache (engine.mla)
        model.absorb_latent_attention(absorbed)
        cache = model.new_cache(1)
        out, nxt = [], int(model(x, cache)[0, -1].argmax())
        for _ in range(12):
            out.append(nxt)
            nxt = int(model(torch.tensor([[nxt]]), cache)[0, -1].argmax())
        assert out == theirs[0, len(prompt) :].tolist(), absorbed


@torch.inference_mode()
def test_router_matches_transformers_router():
    """Grouped sigmoid routing with a large score correction (it moves the choice, never a weight)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from workers.model.moe import GroupedSigmoidRouter

    args = ModelArgs.from_hf_config({**DS_LORA, "n_routed_experts": 16, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4})
    hf_cfg = DeepseekV3Config(
        hidden_size=64, n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4, norm_topk_prob=True, routed_scaling_factor=1.7
    )
    theirs = DeepseekV3TopkRouter(hf_cfg)
    ours = GroupedSigmoidRouter(64, args.moe)
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(16, 64, generator=gen) / 8, torch.randn(16, generator=gen) * 0.5
    theirs.weight.copy_(weight)
    theirs.e_score_correction_bias.copy_(bias)
    ours.weight, ours.e_score_correction_bias = torch.nn.Parameter(weight), torch.nn.Parameter(bias)
    x = torch.randn(33, 64, generator=gen)
    _, hf_w, hf_ids = theirs(x)
    w, ids = ours(x)
    order_hf, order = hf_ids.argsort(-1), ids.argsort(-1)
    assert torch.equal(hf_ids.gather(1, order_hf), ids.gather(1, order))
    torch.testing.assert_close(w.gather(1, order), hf_w.gather(1, order_hf), atol=0, rtol=0)
    chosen_by_bias = (bias.topk(4)[1][:, None] == ids.flatten()).any(-1)
    assert chosen_by_bias.any()  # the correction does steer the choice here


def test_missing_fields_take_transformers_defaults():
    """A config.json that leaves DeepSeek-V3 fields out means transformers' DeepseekV3Config defaults;
    the full-default config is the DeepSeek-V3 shape (`random:deepseek-v3` but its rope)."""
    from transformers import DeepseekV3Config

    bare = ModelArgs.from_hf_config({"model_type": "deepseek_v3"})
    hf = ModelArgs.from_hf_config(DeepseekV3Config().to_dict())
    assert bare == hf
    preset = ModelArgs.from_hf_config(random_config("random:deepseek-v3"))
    assert (bare.mla, bare.moe, bare.moe_layers, bare.dim, bare.n_heads) == (
        preset.mla,
        preset.moe,
        preset.moe_layers,
        preset.dim,
        preset.n_heads,
    )
    assert bare.mla.q_lora_rank == 1536 and bare.mla.rope_interleave and bare.moe.n_shared_experts == 1


@pytest.mark.parametrize("preset", ["deepseek-v3", "kimi-k2"])
def test_presets_rope_and_softmax_scale_equal_transformers(preset):
    """The presets' yarn tables (over qk_rope_head_dim) and softmax scale (mscale_all_dim) are
    transformers' for the same config."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # the reference is the transformers this project pins (pyproject); an older one (the GPU image's) lacks it
    yarn_apply_mscale = getattr(importlib.import_module("transformers.modeling_rope_utils"), "yarn_apply_mscale", None)
    if yarn_apply_mscale is None:
        pytest.skip("this transformers has no yarn_apply_mscale (the reference is the pinned version's)")

    from workers.model.rope import inv_freq_and_scale, mla_softmax_scale

    cfg = dict(random_config(f"random:{preset}"))
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    args = ModelArgs.from_hf_config(random_config(f"random:{preset}"))
    inv, attn = inv_freq_and_scale(args)
    hf_inv, hf_attn = ROPE_INIT_FUNCTIONS["yarn"](hf)
    assert torch.equal(inv, hf_inv) and attn == hf_attn
    assert mla_softmax_scale(args) == yarn_apply_mscale(hf.rope_parameters, hf.qk_head_dim ** (-0.5)) > 192**-0.5


def test_random_presets_have_the_published_shapes():
    v3 = ModelArgs.from_hf_config(random_config("random:deepseek-v3:layers=5"))
    assert v3.layers_label == "5 of 61 layers" and v3.moe_layers == (3, 4)
    assert (v3.n_heads, v3.head_dim, v3.v_head_dim, v3.rope_dim, v3.vocab_size) == (128, 192, 128, 64, 129280)
    assert (v3.moe.n_experts, v3.moe.top_k, v3.moe.n_group, v3.moe.topk_group, v3.moe.routed_scaling_factor) == (256, 8, 8, 4, 2.5)
    assert v3.eos_token_ids == ()  # random weights: no EOS
    k2 = ModelArgs.from_hf_config(random_config("random:kimi-k2:layers=2"))
    assert k2.layers_label == "2 of 61 layers" and k2.moe_layers == (1,)
    assert (k2.n_heads, k2.moe.n_experts, k2.moe.n_group, k2.moe.routed_scaling_factor, k2.rope_theta) == (64, 384, 1, 2.827, 50000.0)
    assert k2.rope_scaling["factor"] == 32.0 and k2.rope_scaling["original_max_position_embeddings"] == 4096
    # the whole shapes: 671B parameters (37B active) and 1.03T (33B active), as published
    for ref, total, active in (("random:deepseek-v3", 671.0e9, 37.6e9), ("random:kimi-k2", 1026.4e9, 32.9e9)):
        args = ModelArgs.from_hf_config(random_config(ref))
        with torch.device("meta"):
            from workers.model.transformer import Transformer

            model = Transformer(args, max_seq=8)
        n = sum(p.numel() for p in model.parameters())
        experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
        assert abs(n - total) < 0.1e9 and abs(n - experts + experts * args.moe.top_k / args.moe.n_experts - active) < 0.1e9, ref


@pytest.mark.parametrize(
    "change, field",
    [
        ({"topk_method": "greedy"}, "topk_method"),
        ({"scoring_func": "softmax"}, "scoring_func"),
        ({"moe_layer_freq": 2}, "moe_layer_freq"),
        ({"attention_bias": True}, "attention_bias"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"q_lora_rank": 0}, "q_lora_rank"),
        ({"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
        ({"n_group": 3}, "n_group"),
        ({"topk_group": 5}, "topk_group"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),  # 2 groups of 2 experts kept: at most 4
        ({"n_routed_experts": None}, "n_routed_experts"),
        ({"routed_scaling_factor": 0}, "routed_scaling_factor"),
        ({"first_k_dense_replace": -1}, "first_k_dense_replace"),
        ({"rope_interleave": "yes"}, "rope_interleave"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
        (
            {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "partial_rotary_factor": 0.5}},
            "partial_rotary_factor",
        ),
    ],
)
def test_fields_that_change_the_math_are_refused_by_name(change, field):
    with pytest.raises(ModelConfigError, match=field):
        ModelArgs.from_hf_config({**DS_LORA, **change})


def test_tp_must_divide_every_expert_and_leave_each_rank_a_head():
    args = ModelArgs.from_hf_config({**DS_LORA, "moe_intermediate_size": 30})
    with pytest.raises(ModelConfigError, match="moe_intermediate_size=30"):
        check_tp(args, 4)
    check_tp(args, 2)
    with pytest.raises(ModelConfigError, match="attention heads"):
        check_tp(ModelArgs.from_hf_config(DS_LORA), 8)


@pytest.mark.parametrize("cfg", [DS_LORA, DS_PLAIN], ids=["q_lora", "q_proj"])
def test_a_rank_reads_only_its_slices(tmp_path, cfg):
    """TP 2, rank 1: half of each per-head up-projection, of o_proj, of every expert and of the shared
    experts; the latent down-projections, their norms and the router (float32, as transformers keeps
    it) whole."""
    path = write_random_checkpoint(tmp_path, cfg)
    reader = CheckpointReader(path)
    model = load_model(path, tp=TPPart(1, 2), reader=reader, dtype=torch.bfloat16)
    a, L = cfg["num_attention_heads"], cfg["first_k_dense_replace"]
    qk, kv = 8 + 8, 8 + 12
    att, moe = f"layers.{L}.self_attn.", f"layers.{L}.mlp."
    read = reader.bytes_read
    q_name = "q_proj.weight" if cfg["q_lora_rank"] is None else "q_b_proj.weight"
    q_in = 64 if cfg["q_lora_rank"] is None else cfg["q_lora_rank"]
    assert read[att + q_name] == (a // 2) * qk * q_in * 4
    assert read[att + "kv_b_proj.weight"] == (a // 2) * kv * 16 * 4
    assert read[att + "o_proj.weight"] == 64 * (a // 2) * 12 * 4
    assert read[att + "kv_a_proj_with_mqa.weight"] == (16 + 8) * 64 * 4 and read[att + "kv_a_layernorm.weight"] == 16 * 4
    if cfg["q_lora_rank"] is not None:
        assert read[att + "q_a_proj.weight"] == 24 * 64 * 4 and read[att + "q_a_layernorm.weight"] == 24 * 4
    assert read[moe + "experts.5.gate_proj.weight"] == 20 * 64 * 4 // 2
    shared = cfg["n_shared_experts"] * 20
    assert read[moe + "shared_experts.down_proj.weight"] == 64 * shared * 4 // 2
    assert read[moe + "gate.weight"] == 8 * 64 * 4 and read[moe + "gate.e_score_correction_bias"] == 8 * 4
    layer = model.layers[L]
    assert layer.self_attn.n_heads == a // 2 and layer.mlp.shared_experts.down_proj.weight.shape == (64, shared // 2)
    assert layer.mlp.gate.weight.dtype == layer.mlp.gate.e_score_correction_bias.dtype == torch.float32
    assert layer.mlp.experts.gate_proj.dtype == torch.bfloat16
    cache = model.new_cache(1, max_seq=32)
    assert cache.k[0].shape == (1, a // 2, 32, qk) and cache.v[0].shape == (1, a // 2, 32, 12)


@torch.inference_mode()
@pytest.mark.parametrize("absorbed", [False, True], ids=["expanded", "absorbed"])
def test_batched_prefill_and_tree_steps_equal_the_plain_passes(tmp_path, absorbed):
    """The engine's other entry points on latent attention, either cache: packed prefill of several
    prompts (its own attention call, with the family's softmax scale) and a token tree (its entries
    moved behind the last token where kept: `KVCache.keep_path`, V inside K on the compressed cache)."""
    model = load_model(write_random_checkpoint(tmp_path, DS_LORA, seed=2), max_seq=64)
    model.absorb_latent_attention(absorbed)
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    cache = model.new_cache(2)
    packed = model.prefill_packed(prompts, cache)
    for i, p in enumerate(prompts):
        alone = model(torch.tensor([p]), model.new_cache(1))[0, -1]
        torch.testing.assert_close(packed[i], alone, atol=1e-5, rtol=1e-5)
    solo = model.new_cache(1)
    model(torch.tensor([prompts[0]]), solo)
    tree = model.tree_logits([20, 21, 22, 23], [-1, 0, 0, 1], solo)
    path = model.new_cache(1)
    model(torch.tensor([prompts[0]]), path)
    chain = model(torch.tensor([[20, 21, 23]]), path)[0]
    torch.testing.assert_close(tree[[0, 1, 3]], chain, atol=1e-5, rtol=1e-5)
    # the tree's kept path [20, 21, 23] made contiguous: the next token reads it as the chain's cache does
    solo.keep_path(0, len(prompts[0]), [len(prompts[0]) + i for i in (0, 1, 3)])
    solo.rollback(0, len(prompts[0]) + 3)
    after_tree, after_chain = model(torch.tensor([[30]]), solo)[0, -1], model(torch.tensor([[30]]), path)[0, -1]
    torch.testing.assert_close(after_tree, after_chain, atol=1e-5, rtol=1e-5)


def test_no_fused_step_the_plain_model_serves(tmp_path, capsys):
    from workers.engine.fused_step import try_fused
    from workers.spec.engine_config import EngineConfig

    model = load_model(write_random_checkpoint(tmp_path, DS_PLAIN))
    assert try_fused(model, EngineConfig(compile=False, gemv="off")) is None
    assert "latent attention" in capsys.readouterr().err


@torch.inference_mode()
def test_the_graphed_body_never_syncs(tmp_path, monkeypatch):
    """The plain model's verify pass over the static cache (what a CUDA graph captures when there is
    no fused step), with the routed experts a capture runs (`MoE.graph_experts`, the graph-safe
    dense loop), reads nothing back to the host and gives the eager pass's logits."""
    from test_graph_safety import NoHostSync

    from workers.engine.batched import static_pass
    from workers.model import moe

    model = load_model(write_random_checkpoint(tmp_path, DS_LORA, seed=4), max_seq=32)
    prompt = torch.tensor([[3, 4, 5, 6, 7, 8]])
    eager_cache, graph_cache = model.new_cache(1), model.new_cache(1)
    model(prompt, eager_cache)
    model(prompt, graph_cache)
    step = torch.tensor([[9, 10, 11, 12]])
    want = model(step, eager_cache)
    for layer in model.layers:  # what MoE.routed runs under a capture
        if isinstance(layer.mlp, moe.MoE):
            monkeypatch.setattr(layer.mlp, "eager_experts", layer.mlp.graph_experts)
    with NoHostSync():
        got = static_pass(model, step, torch.arange(6, 10)[None], graph_cache)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_roofline_counts_each_cache_as_it_is_held(tmp_path):
    """scripts/verify_widths.py's bytes of one cached position: K and V of every KV head for a dense
    family; for latent attention the expanded cache's K (nope + rope) and V of every head, or the
    absorbed cache's one latent and rope key (its V a view of them, counted once)."""
    from scripts.verify_widths import cache_bytes_per_position

    llama = load_model(write_random_checkpoint(tmp_path / "llama", tiny_config(), seed=0))
    a = llama.args
    assert cache_bytes_per_position(llama.new_cache(1)) == a.n_layers * 2 * a.n_kv_heads * a.head_dim * 4
    ds = load_model(write_random_checkpoint(tmp_path / "ds", DS_LORA, seed=0))
    c, layers = DS_LORA, DS_LORA["num_hidden_layers"]
    ds.absorb_latent_attention(False)
    heads_k = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    assert cache_bytes_per_position(ds.new_cache(1)) == layers * c["num_attention_heads"] * (heads_k + c["v_head_dim"]) * 4
    ds.absorb_latent_attention(True)
    assert cache_bytes_per_position(ds.new_cache(1)) == layers * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 4


def test_the_step_names_the_attention_each_cache_runs(tmp_path):
    """The attention a step reports (the gang's setup line, the records' `attention`): the absorbed cache's
    steps run the shared-entry GEMM, not SDPA; the expanded cache's run SDPA."""
    from workers.engine.steps import StepRunner

    model = load_model(write_random_checkpoint(tmp_path, DS_LORA, seed=4), max_seq=32)
    for absorbed, name in ((True, "shared-entry GEMM (absorbed latent cache)"), (False, "sdpa")):
        model.absorb_latent_attention(absorbed)
        assert StepRunner(model, model.new_cache(1), max_width=4).attention == name
