"""Qwen3, Qwen3-MoE and DeepSeek-V3 checkpoints as a user runs them: `spectune decode --peer-baseline`
on held-out tiny checkpoints (settings of their own) matches transformers' greedy tokens and stays
lossless with each drafter, and a whole study on a Qwen3-MoE checkpoint with the embedded defaults (real Ray, Optuna
on SQLite, MLflow) completes with every trial lossless.

The commands run spectune's own `main` in the test's process (studyutil.spectune_here and run_here: its
flags, exit status, stdout and stderr; the ranks, Ray and its actors are processes either way): each CLI
decode paid ~8 CPU-s to start an interpreter, import torch and transformers and start its own forkserver,
for checks about the model families, not the process. tests/e2e/test_nvls_env.py and test_cli_decode.py
run the real command."""

from __future__ import annotations

import json

import pytest
from studyutil import mlflow_runs, optuna_study, run_here, spectune_here, summary, tiny_experiment

from workers.model.checkpoint import tiny_config, write_random_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HELD_OUT_MOE = tiny_config(
    model_type="qwen3_moe",
    architectures=["Qwen3MoeForCausalLM"],
    hidden_size=80,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=20,
    num_experts=10,
    num_experts_per_tok=3,
    moe_intermediate_size=36,
    norm_topk_prob=True,
    mlp_only_layers=[2],
    rope_theta=20000.0,
)
HELD_OUT_DENSE = tiny_config(
    model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=72, num_attention_heads=6, num_key_value_heads=3, head_dim=12
)
# DeepSeek-V3 (latent attention with a query bottleneck, grouped sigmoid routing, a shared expert):
# transformers' defaults fill what the config leaves out (rope_interleave, n_shared_experts)
HELD_OUT_DEEPSEEK = {
    key: value
    for key, value in tiny_config(
        model_type="deepseek_v3",
        architectures=["DeepseekV3ForCausalLM"],
        hidden_size=56,
        intermediate_size=88,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=20,
        kv_lora_rank=12,
        qk_nope_head_dim=10,
        qk_rope_head_dim=6,
        v_head_dim=14,
        n_routed_experts=12,
        num_experts_per_tok=4,
        n_group=3,
        topk_group=2,
        moe_intermediate_size=28,  # transformers' grouped expert GEMM wants rows of a multiple of 16 bytes
        first_k_dense_replace=1,
        routed_scaling_factor=1.9,
        rope_theta=25000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "mscale": 1.0, "mscale_all_dim": 1.0},
    ).items()
    if key != "head_dim"
}


@pytest.fixture
def decode(capsys):
    """`spectune decode ARGS --json` (in this process): its JSON object."""

    def run(*args: str) -> dict:
        r = spectune_here(capsys, "decode", *args, "--json")
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout)

    return run


@pytest.mark.parametrize("cfg", [HELD_OUT_MOE, HELD_OUT_DENSE, HELD_OUT_DEEPSEEK], ids=["qwen3_moe", "qwen3", "deepseek_v3"])
def test_decode_matches_transformers_at_tp2(tmp_path, cfg, decode):
    path = write_random_checkpoint(tmp_path / "ckpt", cfg, seed=21)
    common = ["--model", str(path), "--num-prompts", "3", "--max-new-tokens", "16"]
    out = decode(*common, "--tp", "2", "--drafter", "ngram", "-k", "3", "--peer-baseline")
    assert out["outputs_match_baseline"] == 1 and out["outputs_match_peer"] == 1
    assert out["prompts_matching_peer"] + out["prompts_near_tie_peer"] == 3
    assert out["hf_generate_tokens"] == 3 * 16
    # an MoE verifier's record: the distinct routed experts a pass of W output tokens reads, per layer (every
    # rank ran the census forward); one token reads its top-k, a wider pass the union, never more than exist
    widths = [out.get(f"moe_experts_w{w}") for w in range(1, 10)]
    if "num_experts" in cfg or "n_routed_experts" in cfg:
        experts, top_k = cfg.get("num_experts") or cfg["n_routed_experts"], cfg["num_experts_per_tok"]
        # (the mean over whole passes need not grow at every width: each width averages other token groups)
        assert widths[0] == top_k and widths[0] < widths[1] < widths[-1], widths
        assert all(w <= min(experts, top_k * (i + 1)) for i, w in enumerate(widths)) and widths[-1] > top_k, widths
    else:
        assert widths == [None] * 9  # a dense verifier reads no experts


def test_the_mtp_drafter_is_lossless_at_tp2(tmp_path, decode, capsys):
    """Issue 45's check: a held-out DeepSeek-V3 checkpoint with its multi-token-prediction layer drafts
    with it at TP 2 (the layer split across both ranks, drafting in lockstep), and the greedy outputs
    equal the plain decode's and transformers' own."""
    path = write_random_checkpoint(tmp_path / "ckpt", {**HELD_OUT_DEEPSEEK, "num_nextn_predict_layers": 1}, seed=21)
    out = decode(
        "--model", str(path), "--num-prompts", "3", "--max-new-tokens", "16", "--tp", "2", "--drafter", "mtp", "-k", "3", "--peer-baseline"
    )
    assert out["outputs_match_baseline"] == 1 and out["outputs_match_peer"] == 1
    assert out["params"]["drafter.kind"] == "mtp" and out["params"]["spec.num_draft_tokens"] == 3
    # a checkpoint without one, and one that declares it but stores none (as transformers saves them): one
    # line naming the field, exit 2, before anything launches
    plain = write_random_checkpoint(tmp_path / "plain", {**HELD_OUT_DEEPSEEK, "num_nextn_predict_layers": 0}, seed=21)
    declared = write_random_checkpoint(tmp_path / "declared", {**HELD_OUT_DEEPSEEK, "num_nextn_predict_layers": 0}, seed=21)
    config = json.loads((declared / "config.json").read_text())
    (declared / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    for ckpt, why in (
        (plain, "(num_nextn_predict_layers is 0)"),
        (declared, "stores no layers.3.* weights (transformers does not save them)"),
    ):
        r = spectune_here(capsys, "decode", "--model", str(ckpt), "--drafter", "mtp", "-k", "2", "--num-prompts", "1")
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
        assert "--drafter: mtp needs the model's own multi-token-prediction layer" in r.stderr and why in r.stderr, r.stderr


def test_the_expert_census_under_imposed_acceptance_is_the_models(tmp_path, decode):
    """Kept drafts under an imposed acceptance profile are not the model's tokens: decode reports the
    census of its plain reference run, the same as a plain decode's."""
    path = write_random_checkpoint(tmp_path / "moe", HELD_OUT_MOE, seed=3)
    common = ["--model", str(path), "--tp", "1", "--num-prompts", "2", "--max-new-tokens", "12"]
    plain = decode(*common, "--drafter", "none", "-k", "0")
    imposed = decode(*common, "--drafter", "ngram", "-k", "3", "--simulate-accept-profile", "0.9,0.8,0.7")
    assert imposed["accept_len_mean"] > 2.0  # the profile was imposed
    widths = [f"moe_experts_w{w}" for w in range(1, 10)]
    assert [imposed[w] for w in widths] == [plain[w] for w in widths]


def test_drafters_on_a_moe_verifier_are_lossless(tmp_path, decode):
    """layer-skip, a smaller Qwen3 draft model and an EAGLE-3 head (public format) on a Qwen3-MoE verifier."""
    from workers.drafters.eagle3.checkpoint import head_config, random_head, save_head
    from workers.model.locate import load_args

    verifier = write_random_checkpoint(tmp_path / "moe", HELD_OUT_MOE, seed=3)
    draft = write_random_checkpoint(tmp_path / "draft", {**HELD_OUT_DENSE, "hidden_size": 48, "num_hidden_layers": 1}, seed=4)
    head = save_head(random_head(head_config(load_args(verifier), 200), seed=5), tmp_path / "head")
    common = ["--model", str(verifier), "--tp", "1", "--num-prompts", "2", "--max-new-tokens", "12", "-k", "3"]
    for drafter in (
        ["layer_skip", "--draft-layers", "1"],
        ["draft_model", "--draft-model", str(draft)],
        ["eagle3", "--draft-model", str(head)],
    ):
        out = decode(*common, "--drafter", *drafter)
        assert out["outputs_match_baseline"] == 1, drafter
        assert out["params"]["drafter.kind"] == drafter[0]


def test_study_on_a_moe_checkpoint(tmp_path, capsys):
    ckpt = write_random_checkpoint(tmp_path / "ckpt", HELD_OUT_MOE, seed=8)
    exp = tiny_experiment(
        tmp_path,
        ckpt,
        search={"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4]}, "drafter.kind": {"choices": ["ngram", "layer_skip"]}}},
        study={"n_trials": 3, "sampler": "random", "seed": 2, "pruner": "none", "baseline_repeats": 2},
        # one verifier rank: TP 2 on these checkpoints is test_decode_matches_transformers_at_tp2's; the study is about the family
        parallel={"tp": 1, "cpus_per_worker": 0.1},
    )
    home = tmp_path / "home"
    out = summary(run_here(capsys, ["run", str(exp)], home))
    assert out["complete"] == 3
    study = optuna_study(f"sqlite:///{home / 'optuna.db'}", "tiny-study")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    _, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    by_id = {r.info.run_id: r for r in runs}
    for t in complete:
        metrics = by_id[t.user_attrs["mlflow_run_id"]].data.metrics
        if t.user_attrs["spectune.params"]["spec.num_draft_tokens"] > 0:
            assert metrics["outputs_match_baseline"] == 1, t.number
        assert by_id[t.user_attrs["mlflow_run_id"]].data.params["engine.moe_kernel"] == "auto"
        # on CPU no step is a CUDA graph: the routed experts ran eagerly, and the record says so
        assert t.user_attrs["spectune.moe_experts"] == "eager"
        assert by_id[t.user_attrs["mlflow_run_id"]].data.tags["spectune.moe_experts"] == "eager"
        # the distinct experts a pass reads, per width: top_k (3) for one token, at most 10 (all of them)
        assert metrics["moe_experts_w1"] == 3 and 3 < metrics["moe_experts_w9"] <= 10, metrics
