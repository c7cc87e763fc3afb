"""`spectune export EXP.yaml --to trtllm`: the schedule as TensorRT-LLM LLM-API options, the YAML file
`trtllm-serve MODEL --extra_llm_api_options FILE` takes: tensor_parallel_size, dtype,
allreduce_strategy, and speculative_config (decoding_type Eagle3, NGram, Draft_Target or MTP;
max_draft_len; draft_len_schedule where the best k changes with the batch size). The NCCL environment
(NVLink multicast off) cannot go into the YAML: the header lists it as `export` lines to run first.

    from orchestrator.export.trtllm import to_trtllm; print(to_trtllm(schedule))

Keys: TensorRT-LLM 1.4.0rc4 (orchestrator/export/versions.py): TorchLlmArgs and the DecodingBaseConfig
subclasses of tensorrt_llm/llmapi/llm_args.py; each function names what it was checked against.
An mtp winner (DeepSeek-V3's own MTP layer, workers/drafters/mtp.py) is decoding_type MTP with k in
max_draft_len and no speculative_model: the layer ships inside the target checkpoint.
"""

from __future__ import annotations

import yaml

from orchestrator.export import allreduce
from orchestrator.export.common import (
    cuda_graphs_on,
    draft_len,
    environment,
    export_lines,
    header,
    lookup_notes,
    ngram_window,
    one_engine_notes,
    options,
    other_drafters,
    same_drafter,
    sorted_rows,
    speculates,
    tree_notes,
)

# spectune drafter -> TensorRT-LLM decoding_type (the Literal of Eagle3DecodingConfig, NGramDecodingConfig,
# DraftTargetDecodingConfig, MTPDecodingConfig in llm_args.py)
DECODING_TYPES = {"eagle3": "Eagle3", "ngram": "NGram", "draft_model": "Draft_Target", "mtp": "MTP"}

# The drafters that run inside the target's engine ("one-model"): they keep drafter state across steps
# (the draft KV cache) that only a draft forward refreshes. A draft length of 0 skips that forward, and
# once drafting resumes the drafter reads rows nothing wrote: acceptance collapses for the rest of the
# request, silently. Open bug, fixed by NVIDIA/TensorRT-LLM PR 16888 ("Keep drafting alive when dynamic
# draft length hits its floor", open; it floors schedule draft lengths at min_runtime_draft_len, 1 for
# one-engine algorithms). Until it ships, this export floors those drafters' schedule at 1 itself. MTP is
# one of them: its layer runs inside the target's engine (MTP-Eagle one-model for DeepSeek-V3's single
# layer, llm_args.py MTPDecodingConfig.spec_dec_mode), and PR 16888 names MTP's hidden-state and token
# pools among the state that goes stale.
ONE_ENGINE_TYPES = ("Eagle3", "MTP")
ONE_ENGINE_FLOOR = 1

# draft_len_schedule's keys are the last batch size of each range and every batch size above the largest
# key drafts 0 (llm_args.py DecodingBaseConfig.draft_len_schedule: {4: 4, 8: 2, 32: 1} -> 1-4: 4, 5-8: 2,
# 9-32: 1, 33+: 0). The last measured k covers every batch size above the largest measured one (as the vLLM
# export's table does), so the last key is larger than any batch a server schedules.
SCHEDULE_END = 65536


def _sizes(sizes: list[int]) -> str:
    """The batch sizes as a subject: batch size 16 was / batch sizes 4, 16 were."""
    return f"batch size {sizes[0]} was" if len(sizes) == 1 else f"batch sizes {', '.join(map(str, sizes))} were"


def draft_len_schedule(rows: list[dict], decoding_type: str) -> tuple[dict[int, int] | None, list[str]]:
    """TensorRT-LLM's draft_len_schedule {last batch size of a range: k} for the schedule, and notes.

    Validated by llm_args.py DecodingBaseConfig.validate_draft_len_schedule_and_sort: keys >= 1, values
    >= 0 and <= max_draft_len, and the smallest key's value == max_draft_len (here the batch-size-1
    winner's k, so a larger k measured later is capped at it). Rows won by another drafter are left out
    (their batch sizes take the k before them); rows where plain decoding won get 0, or the floor for a
    one-engine drafter. None where k never changes. MTP takes the schedule since NVIDIA/TensorRT-LLM
    PR 12262 ("Expand dynamic speculation to all spec decode algorithms": SpeculativeDecodingMode.
    support_dynamic_draft_len covers MTP and MTP-Eagle one-model; before it, Eagle3 one-model only)."""
    first = rows[0]
    max_k = draft_len(first)
    floor = ONE_ENGINE_FLOOR if decoding_type in ONE_ENGINE_TYPES else 0
    points = [(int(r["batch_size"]), draft_len(r)) for r in rows if not speculates(r) or same_drafter(r, first)]
    schedule: dict[int, int] = {}
    notes: list[str] = []
    capped = [bs for bs, k in points if k > max_k]
    floored = [bs for bs, k in points if k < floor]
    for i, (bs, k) in enumerate(points):
        last = points[i + 1][0] - 1 if i + 1 < len(points) else SCHEDULE_END
        value = max(floor, min(k, max_k))
        if schedule and list(schedule.values())[-1] == value:
            schedule.pop(list(schedule)[-1])  # the same k as the range before: one range
        schedule[last] = value
    if len(schedule) > 1:
        notes.append(
            "# k differs between batch sizes: draft_len_schedule maps the last batch size of each range to its k "
            f"(batch sizes above the largest measured one keep its k: the last key, {SCHEDULE_END}, is above any batch)"
        )
    more = "#   " if notes else "# "  # under the schedule's line, or standing alone where k never changes here
    if capped:
        notes.append(
            f"{more}TensorRT-LLM needs batch size 1's k to be the largest (max_draft_len): {_sizes(capped)} won with a larger k, "
            f"capped at {max_k} here"
        )
    if floored:
        notes.append(
            f"{more}{_sizes(floored)} won by plain decoding but drafts k={floor} here: a one-engine {decoding_type} drafter "
            "at 0 loses its draft state and acceptance collapses once drafting resumes"
        )
        notes.append(f"{more}(open bug: NVIDIA/TensorRT-LLM PR 16888, 'Keep drafting alive when dynamic draft length hits its floor')")
    left_out = other_drafters(rows)
    if left_out:
        notes.append(
            f"{more}batch sizes won by another drafter are not in the schedule and take the k before them: "
            + ", ".join(str(r["batch_size"]) for r in left_out)
        )
    return (schedule if len(schedule) > 1 else None), notes


def speculative_config(rows: list[dict]) -> tuple[dict | None, list[str]]:
    """speculative_config for the smallest batch size's winner, and comment lines.

    Keys: decoding_type, max_draft_len, speculative_model, draft_len_schedule (DecodingBaseConfig) and,
    for NGram, max_matching_ngram_size (the longest n-gram matched: spectune's ngram_max; NGram has no
    minimum match length). Checked in the 1.4.0rc4 reference pages Eagle3DecodingConfig and
    NGramDecodingConfig and in llm_args.py DraftTargetDecodingConfig (speculative_model required).
    MTP: the 1.4.0rc4 reference page MTPDecodingConfig and llm_args.py after NVIDIA/TensorRT-LLM PR
    12341 ("decouple MTP num_nextn_predict_layers from max_draft_len"): max_draft_len is k;
    num_nextn_predict_layers, the user's k before that PR, is now the checkpoint's MTP layer count,
    filled in from the model, so it is not written; speculative_model unset reads the target's own MTP
    weights; with one layer and use_mtp_vanilla false (its default) TensorRT-LLM runs MTP-Eagle, the
    layer reused k times."""
    first = rows[0]
    if not speculates(first):
        return None, [f"# plain decoding (no speculation) won at batch size {first['batch_size']}: no speculative_config"]
    drafter, o, k = first["drafter"], options(first), draft_len(first)
    if drafter not in DECODING_TYPES:
        return None, [
            f"# the winner at batch size {first['batch_size']} drafts with layer_skip (the verifier's first {o.get('layers')} layers), "
            "which TensorRT-LLM has no decoding type for: no speculative_config is emitted"
        ]
    decoding_type = DECODING_TYPES[drafter]
    spec: dict = {"decoding_type": decoding_type, "max_draft_len": k}
    notes = lookup_notes(o, "trtllm") + tree_notes(first, "trtllm")
    if drafter == "ngram":
        hi, lo = ngram_window(first)
        spec["max_matching_ngram_size"] = hi
        notes.append(f"# TensorRT-LLM's NGram has no minimum match length (ngram_min={lo} is not mapped)")
    elif drafter == "mtp":
        notes.append(
            f"# mtp: TensorRT-LLM runs the checkpoint's one MTP layer k={k} times per step (MTP-Eagle), as the winner did; "
            "the target checkpoint carries the layer: no speculative_model"
        )
        notes.append("#   k is max_draft_len: num_nextn_predict_layers is the checkpoint's layer count, which TensorRT-LLM reads itself")
    else:
        spec["speculative_model"] = str(o["model_path"])
    schedule, schedule_notes = draft_len_schedule(rows, decoding_type)
    if schedule:
        spec["draft_len_schedule"] = schedule
    return spec, notes + schedule_notes


def options_dict(schedule: dict, rows: list[dict]) -> tuple[dict, list[str]]:
    """The LLM-API options (TorchLlmArgs keys: tensor_parallel_size, dtype, allreduce_strategy,
    cuda_graph_config, speculative_config) and the comment lines that explain them."""
    first = rows[0]
    choice = allreduce.engine_allreduce("trtllm", str(first.get("backend")))
    opts: dict = {"tensor_parallel_size": int(first["tp"])}
    if schedule.get("dtype"):
        opts["dtype"] = str(schedule["dtype"])
    opts["allreduce_strategy"] = choice.strategy
    notes: list[str] = []
    if not cuda_graphs_on(first):
        opts["cuda_graph_config"] = None  # Optional[CudaGraphConfig]: None runs without CUDA graphs
        notes.append("# the winner ran without CUDA graphs (engine.cuda_graphs false): cuda_graph_config null")
    spec, spec_notes = speculative_config(rows)
    if spec is not None:
        opts["speculative_config"] = spec
    return opts, notes + spec_notes


def to_trtllm(schedule: dict) -> str:
    """The LLM-API YAML for the schedule, its header comments first (valid YAML comments)."""
    rows = sorted_rows(schedule)
    first = rows[0]
    opts, notes = options_dict(schedule, rows)
    lines = header(schedule, rows, "trtllm")
    lines.append(f"# serve: trtllm-serve {schedule.get('model')} --extra_llm_api_options THIS_FILE (tensor_parallel_size below)")
    lines += notes
    lines += one_engine_notes(rows, "trtllm")
    lines.append("# the NCCL environment the winner ran with (NVLink multicast off), to export before trtllm-serve:")
    lines += [f"#   {line}" for line in export_lines(environment(first))]
    body = yaml.safe_dump(opts, sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + "\n" + body
