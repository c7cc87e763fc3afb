"""orchestrator/export/trtllm.py: `spectune export --to trtllm`, TensorRT-LLM LLM-API options as YAML.
Every output is parsed with yaml (header comments included) and its keys are checked against the
field names of TensorRT-LLM 1.4.0rc4, copied below from its sources; the draft_len_schedule is read
back with TensorRT-LLM's own rule for it, so every check is on what the engine would run.

    .venv/bin/python -m pytest -q tests/unit/test_export_trtllm.py
"""

from __future__ import annotations

import pytest
import yaml
from test_export_formats import schedule, winner

from orchestrator.export.formats import render, to_trtllm
from orchestrator.export.trtllm import SCHEDULE_END

# TensorRT-LLM 1.4.0rc4 field names, from tensorrt_llm/llmapi/llm_args.py as the LLM API reference pages of
# that version render them (llm-api/reference/TorchLlmArgs.html, Eagle3DecodingConfig.html,
# NGramDecodingConfig.html, MTPDecodingConfig.html) and DraftTargetDecodingConfig in llm_args.py
# (DecodingBaseConfig's fields only).
# TorchLlmArgs: a subset (the serving knobs around the ones the export writes)
TORCH_LLM_ARGS = {
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "context_parallel_size",
    "dtype",
    "allreduce_strategy",
    "speculative_config",
    "cuda_graph_config",
    "kv_cache_config",
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
    "enable_chunked_prefill",
    "disable_overlap_scheduler",
    "moe_expert_parallel_size",
    "enable_attention_dp",
}
# TorchLlmArgs.allreduce_strategy: Optional[Literal[...]] (llm_args.py; also tensorrt_llm/usage/llm_args_golden_manifest.json)
ALLREDUCE_STRATEGIES = {"AUTO", "NCCL", "UB", "MINLATENCY", "ONESHOT", "TWOSHOT", "LOWPRECISION", "MNNVL", "NCCL_SYMMETRIC"}
DECODING_BASE = {
    "max_draft_len",
    "max_total_draft_tokens",
    "speculative_model",
    "moe_backend",
    "moe_tactic",
    "max_concurrency",
    "draft_len_schedule",
    "load_format",
    "acceptance_rate_window_size",
    "acceptance_rate_threshold",
    "use_rejection_sampling",
    "allow_advanced_sampling",
    "advanced_sampling_mode",
    "enable_penalty",
    "spec_dec_variant",
    "decoding_type",
}
DECODING_CONFIGS = {
    "Eagle3": DECODING_BASE
    | {
        "use_dynamic_tree",
        "dynamic_tree_max_topK",
        "max_non_leaves_per_layer",
        "eagle3_layers_to_capture",
        "eagle3_model_arch",
        "sa_config",
    },
    "NGram": DECODING_BASE | {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"},
    "Draft_Target": DECODING_BASE,
    "MTP": DECODING_BASE
    | {
        "use_relaxed_acceptance_for_thinking",
        "relaxed_topk",
        "relaxed_delta",
        "use_mtp_vanilla",
        "use_dynamic_tree",
        "dynamic_tree_max_topK",
        "draft_lm_head_dtype",
        "draft_moe_dtype",
        "sa_config",
        "num_nextn_predict_layers",
        "begin_thinking_phase_token",
        "end_thinking_phase_token",
    },
}


def options(text: str) -> dict:
    """The YAML as TensorRT-LLM would load it, its keys checked against the version's fields."""
    opts = yaml.safe_load(text)
    assert set(opts) <= TORCH_LLM_ARGS, set(opts) - TORCH_LLM_ARGS
    assert opts["allreduce_strategy"] in ALLREDUCE_STRATEGIES
    spec = opts.get("speculative_config")
    if spec is not None:
        assert set(spec) <= DECODING_CONFIGS[spec["decoding_type"]], set(spec) - DECODING_CONFIGS[spec["decoding_type"]]
    return opts


def runtime_draft_len(spec: dict, batch_size: int) -> int:
    """TensorRT-LLM's reading of draft_len_schedule (llm_args.py DecodingBaseConfig, after PR 10860): each key
    is the last batch size of a range; above the largest key the draft length is 0. Its validator: the
    smallest key's value is max_draft_len and none exceeds it."""
    schedule = spec.get("draft_len_schedule")
    if schedule is None:
        return spec["max_draft_len"]
    keys = sorted(schedule)
    assert schedule[keys[0]] == spec["max_draft_len"] and max(schedule.values()) <= spec["max_draft_len"]
    return next((schedule[k] for k in keys if batch_size <= k), 0)


def test_eagle3_head():
    opts = options(to_trtllm(schedule(winner(k=5, drafter="eagle3", tp=4))))
    assert opts["tensor_parallel_size"] == 4 and opts["dtype"] == "bfloat16" and opts["allreduce_strategy"] == "NCCL"
    assert opts["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 5, "speculative_model": "/ckpt/eagle3-head"}


def test_ngram_and_draft_model():
    spec = options(to_trtllm(schedule(winner(k=3, drafter="ngram"))))["speculative_config"]
    assert spec == {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 3}  # ngram_max 3
    spec = options(to_trtllm(schedule(winner(k=2, drafter="draft_model"))))["speculative_config"]
    assert spec == {"decoding_type": "Draft_Target", "max_draft_len": 2, "speculative_model": "/ckpt/draft-135m"}


@pytest.mark.parametrize("k", [1, 3])
def test_mtp_is_decoding_type_mtp_with_k_in_max_draft_len(k):
    """An mtp winner (DeepSeek-V3's own MTP layer): decoding_type MTP, k in max_draft_len (num_nextn_predict_layers
    is the checkpoint's layer count since PR 12341, read by TensorRT-LLM itself) and no speculative_model."""
    text = to_trtllm(schedule(winner(k=k, drafter="mtp", tp=8), model="/models/deepseek-v3"))
    opts = options(text)
    assert opts["tensor_parallel_size"] == 8
    assert opts["speculative_config"] == {"decoding_type": "MTP", "max_draft_len": k}
    assert "# serve: trtllm-serve /models/deepseek-v3 " in text
    assert f"layer k={k} times per step (MTP-Eagle)" in text and "no speculative_model" in text
    assert "k is max_draft_len" in text and f"mtp k={k} (the model's own MTP layer" in text


@pytest.mark.parametrize("row", [winner(k=3, drafter="layer_skip"), winner(k=0, drafter="none")])
def test_no_speculative_config_without_an_equivalent_drafter(row):
    text = to_trtllm(schedule(row))
    opts = options(text)
    assert "speculative_config" not in opts and opts["tensor_parallel_size"] == 2
    assert ("layer_skip" if row["drafter"] == "layer_skip" else "plain decoding") in text


@pytest.mark.parametrize(("drafter", "floor"), [("eagle3", 1), ("mtp", 1), ("ngram", 0), ("draft_model", 0)])
def test_the_schedule_runs_each_measured_k_and_keeps_one_engine_drafters_drafting(drafter, floor):
    """Winners k 4 at 1, 2 at 4 and 8, plain decoding at 16: TensorRT-LLM runs 4 at 1-3, 2 at 4-15 and, at 16
    and above, 0 for the two-model drafters but 1 for Eagle3 and MTP, whose one-engine drafters lose their draft
    state at 0 (open bug, PR 16888); batch sizes past the largest measured keep its k, not TensorRT-LLM's implicit 0."""
    rows = [
        winner(1, k=4, drafter=drafter),
        winner(4, k=2, drafter=drafter),
        winner(8, k=2, drafter=drafter),
        winner(16, k=0, drafter="none"),
    ]
    text = to_trtllm(schedule(*rows))
    spec = options(text)["speculative_config"]
    assert spec["max_draft_len"] == 4
    got = {bs: runtime_draft_len(spec, bs) for bs in (1, 3, 4, 8, 15, 16, 500, SCHEDULE_END)}
    assert got == {1: 4, 3: 4, 4: 2, 8: 2, 15: 2, 16: floor, 500: floor, SCHEDULE_END: floor}
    assert ("PR 16888" in text) == (floor == 1)
    # plain decoding at 16 and k 1 at 1: one range for Eagle3 (floored to 1), no schedule, and the floor still said
    text = to_trtllm(schedule(winner(1, k=1, drafter=drafter), winner(16, k=0, drafter="none")))
    spec = options(text)["speculative_config"]
    assert [runtime_draft_len(spec, bs) for bs in (1, 16, 64)] == [1, floor, floor]
    assert ("# batch size 16 was won by plain decoding but drafts k=1 here" in text) == (floor == 1)


def test_the_schedule_keeps_the_last_measured_k_past_the_largest_batch_size_and_caps_at_batch_one():
    spec = options(to_trtllm(schedule(winner(1, k=2, drafter="eagle3"), winner(8, k=1, drafter="eagle3"))))["speculative_config"]
    assert [runtime_draft_len(spec, bs) for bs in (1, 7, 8, 64, 4096)] == [2, 2, 1, 1, 1]
    # a larger k measured later: TensorRT-LLM wants batch size 1's k to be max_draft_len, so it is capped there
    text = to_trtllm(schedule(winner(1, k=2, drafter="ngram"), winner(8, k=5, drafter="ngram")))
    spec = options(text)["speculative_config"]
    assert spec["max_draft_len"] == 2 and "draft_len_schedule" not in spec  # capped to 2: k never changes
    assert "# TensorRT-LLM needs batch size 1's k to be the largest (max_draft_len): batch size 8 was won with a larger k" in text
    spec = options(to_trtllm(schedule(winner(1, k=3), winner(4, k=6), winner(16, k=1))))["speculative_config"]
    assert [runtime_draft_len(spec, bs) for bs in (1, 4, 16)] == [3, 3, 1]


def test_same_k_everywhere_has_no_schedule_and_other_drafters_are_left_out():
    spec = options(to_trtllm(schedule(winner(1, k=4), winner(8, k=4))))["speculative_config"]
    assert "draft_len_schedule" not in spec
    rows = [winner(1, k=4, drafter="eagle3"), winner(8, k=1, drafter="draft_model"), winner(32, k=2, drafter="eagle3")]
    text = to_trtllm(schedule(*rows))
    spec = options(text)["speculative_config"]
    assert [runtime_draft_len(spec, bs) for bs in (1, 8, 31, 32)] == [4, 4, 4, 2]  # batch size 8 takes the k before it
    assert "takes one drafter" in text and "not in the schedule" in text


def test_the_nccl_environment_goes_into_comments_and_cuda_graphs_off_into_the_options():
    text = to_trtllm(schedule(winner(engine={"cuda_graphs": False})))
    assert "#   export NCCL_ALGO=Ring" in text and "#   export NCCL_NVLS_ENABLE=0" in text
    opts = options(text)
    assert "cuda_graph_config" in opts and opts["cuda_graph_config"] is None
    assert "cuda_graph_config" not in options(to_trtllm(schedule(winner())))


def test_study_warnings_come_first_and_the_yaml_still_parses():
    """An emulated study (parallel.emulate_tp) and one measured on a CPU: the `# EMULATED:` and CAUTION
    lines open the file as YAML comments; the options below them are unchanged."""
    s = {
        **schedule(winner(tp=8)),
        "emulated": "emulated TP 8 from table pcie-8x (sha256 0123456789ab)",
        "does_not_transfer": ["measured on CPU (engines serve on GPUs)"],
    }
    text = render(s, "trtllm")
    lines = text.splitlines()
    assert lines[0].startswith("# CAUTION:") and lines[1].startswith("# EMULATED: emulated TP 8")
    assert options(text) == options(to_trtllm(schedule(winner(tp=8))))
    assert options(text)["tensor_parallel_size"] == 8
