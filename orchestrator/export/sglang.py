"""`spectune export EXP.yaml --to sglang`: the schedule as a `python -m sglang.launch_server` command:
the NCCL environment (NVLink multicast off) as exports, --tp-size, the allreduce flag and the
--speculative-* flags of the smallest batch size's winner. SGLang takes one k: where the best k changes
with the batch size, a comment table says so. Header comments say what a missing allreduce costs.

    from orchestrator.export.sglang import to_sglang; print(to_sglang(schedule))

Flag names: SGLang's main branch after PR 21225 (orchestrator/export/versions.py); each function
names its source.
"""

from __future__ import annotations

import shlex

from orchestrator.export import allreduce
from orchestrator.export.common import (
    draft_len,
    environment,
    export_lines,
    header,
    k_comment_table,
    launch,
    lookup_notes,
    ngram_window,
    one_engine_notes,
    options,
    shell_command,
    sorted_rows,
    speculates,
    tree_notes,
    tree_width,
)
from workers.spec import tree_size


def speculative_flags(first: dict) -> tuple[list[str], list[str]]:
    """SGLang's --speculative-* flags for the smallest batch size's winner, and comment lines.

    Checked in SGLang's docs/advanced_features/server_arguments.md and speculative_decoding.md:
    --speculative-algorithm EAGLE3 (EAGLE-3 head) / STANDALONE (a small draft model) / NGRAM, with
    --speculative-draft-model-path. For chain drafting (top-k 1) SGLang verifies num_steps + 1 tokens
    (the last accepted one plus k drafts) and resets num-draft-tokens to that (spec_info.py,
    _handle_eagle_family): k -> --speculative-num-steps k --speculative-eagle-topk 1
    --speculative-num-draft-tokens k+1. An eagle3 tree of width w (drafter.tree_width): top-k w and num-draft-tokens = its
    drafts + 1, the root counted (organize_draft_results keeps the num_draft_tokens - 1 best-scored nodes).
    mtp: DeepSeek-V3's MTP layer runs as --speculative-algorithm EAGLE (docs/basic_usage/deepseek_v3.md,
    "Multi-token Prediction"; NEXTN is an alias the server rewrites to EAGLE), chained as above, and with
    no --speculative-draft-model-path: for DeepseekV3ForCausalLM _handle_eagle_family sets it to the
    model path itself and warns when one is given ("DeepSeek MTP does not require setting
    speculative_draft_model_path").
    """
    if not speculates(first):
        return [], [f"# plain decoding (no speculation) won at batch size {first['batch_size']}: no --speculative-* flags"]
    drafter, o, k = first["drafter"], options(first), draft_len(first)
    if drafter == "layer_skip":
        return [], [
            f"# the winner at batch size {first['batch_size']} drafts with layer_skip (the verifier's first {o.get('layers')} layers), "
            "which SGLang has no algorithm for: no --speculative-* flags are emitted"
        ]
    if drafter == "ngram":
        hi, lo = ngram_window(first)
        # NGRAM (spec_info.py _handle_ngram; cpp_ngram/param.h, result.cpp): the draft tree's first
        # token is the last accepted one, so k drafts -> --speculative-num-draft-tokens k+1; top-k is
        # set from --speculative-ngram-max-bfs-breadth (1 and 1: a chain) and num-steps from them.
        # The trie stores and matches suffixes up to --speculative-ngram-max-trie-depth tokens, and a
        # match of n tokens leaves depth - n for the draft: depth = ngram_max + k.
        flags = [
            "--speculative-algorithm NGRAM",
            f"--speculative-num-draft-tokens {k + 1}",
            "--speculative-ngram-min-bfs-breadth 1",
            "--speculative-ngram-max-bfs-breadth 1",
            f"--speculative-ngram-max-trie-depth {hi + k}",
        ]
        notes = [
            f"# SGLang's NGRAM matches every suffix up to the trie depth and has no minimum match length (ngram_min={lo} is not mapped);",
            "#   its n-gram cache is built from recent tokens and shared across requests, so its acceptance can differ from spectune's lookup",
        ]
        return flags, notes
    if drafter == "mtp":
        flags = [
            "--speculative-algorithm EAGLE",
            f"--speculative-num-steps {k}",
            "--speculative-eagle-topk 1",
            f"--speculative-num-draft-tokens {k + 1}",
        ]
        return flags, [
            f"# mtp: SGLang's EAGLE worker runs the checkpoint's MTP layer k={k} times per step, as the winner did; "
            "the target checkpoint carries the layer: no --speculative-draft-model-path"
        ]
    algorithm = "EAGLE3" if drafter == "eagle3" else "STANDALONE"
    w = tree_width(first)  # 0: a chain
    flags = [
        f"--speculative-algorithm {algorithm}",
        f"--speculative-draft-model-path {shlex.quote(str(o['model_path']))}",
        f"--speculative-num-steps {k}",
        f"--speculative-eagle-topk {w or 1}",
        f"--speculative-num-draft-tokens {tree_size(k, w) + 1}",
    ]
    return flags, lookup_notes(o, "sglang") + tree_notes(first, "sglang")


def to_sglang(schedule: dict) -> str:
    """`python -m sglang.launch_server` for the schedule: env exports, --tp-size, allreduce flags, --speculative-*."""
    rows = sorted_rows(schedule)
    first = rows[0]
    choice = allreduce.engine_allreduce("sglang", str(first.get("backend")))
    lines = header(schedule, rows, "sglang")
    flags, notes = speculative_flags(first)
    lines += notes
    # SGLang's adaptive mode (docs/advanced_features/adaptive_speculative_decoding.md) follows the
    # acceptance length, not the batch size: there is no batch-size -> k table to emit
    lines += k_comment_table(rows, "sglang")
    lines += one_engine_notes(rows, "sglang")
    lines += export_lines({**environment(first), **dict(choice.env)})
    parts = launch(schedule, first, "python -m sglang.launch_server --model-path", "--tp-size", "--disable-cuda-graph")
    lines.append(shell_command(parts + list(choice.flags) + flags))
    return "\n".join(lines) + "\n"
