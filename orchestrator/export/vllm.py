"""`spectune export EXP.yaml --to vllm`: the schedule as a `vllm serve` command: the NCCL environment
(NVLink multicast off) and the allreduce setting as exports, --tensor-parallel-size, the allreduce flag,
and --speculative-config with vLLM's per-batch-size k table (dynamic speculative decoding) where k
changes with the batch size. Header comments say what vLLM cannot follow, what a missing allreduce
costs, and that vLLM has no adaptive speculation (with the draft-to-target time ratio the study measured).

    from orchestrator.export.vllm import to_vllm; print(to_vllm(schedule))

Flag and key names: vLLM 0.25.0 (orchestrator/export/versions.py); each function names its source.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from orchestrator.export import allreduce
from orchestrator.export.common import (
    draft_len,
    environment,
    export_lines,
    header,
    launch,
    lookup_notes,
    ngram_window,
    one_engine_notes,
    options,
    other_drafters,
    same_drafter,
    shell_command,
    sorted_rows,
    speculates,
    tree_notes,
)
from orchestrator.export.versions import ENGINE_VERSIONS


def k_table(rows: list[dict]) -> list[list[int]] | None:
    """vLLM's `num_speculative_tokens_per_batch_size`: [[start, end, k], ...], inclusive ranges.

    Checked in vLLM's docs/features/speculative_decoding/dynamic_speculative_decoding.md (0.25.0
    documentation) and vllm/v1/spec_decode/dynamic/utils.py: a list of [start_bs, end_bs, K]; the
    first range starts at 1; ranges sorted and non-overlapping; K >= 0 (0: no drafting at that
    batch size); a gap or the tail after the last range takes the K of the range before it; every
    K is capped at num_speculative_tokens. Rows won by another drafter are left out (their batch
    sizes take the K before them); rows where plain decoding won get K 0. None where k never changes.
    """
    first = rows[0]
    points = [(int(r["batch_size"]), draft_len(r)) for r in rows if not speculates(r) or same_drafter(r, first)]
    ranges: list[list[int]] = []
    for i, (bs, k) in enumerate(points):
        start = 1 if i == 0 else bs
        end = points[i + 1][0] - 1 if i + 1 < len(points) else bs
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
    return ranges if len(ranges) > 1 else None


def speculative_config(rows: list[dict]) -> tuple[dict | None, list[str]]:
    """vLLM's --speculative-config for the smallest batch size's winner, and comment lines.

    Keys checked in vLLM's docs/features/speculative_decoding/configuration.md and
    vllm/config/speculative.py (SpeculativeConfig): method "ngram" with num_speculative_tokens,
    prompt_lookup_max, prompt_lookup_min; method "draft_model" (docs .../draft_model.md, 0.25.0) and
    "eagle3" (docs .../eagle.md) with model = the draft checkpoint / EAGLE-3 head; method "mtp" (docs
    .../mtp.md, the same in the 0.19.1 and 0.26.0 documentation either side of 0.25.0) with no model:
    SpeculativeConfig.__post_init__ takes the draft from the target checkpoint when method is "mtp" and
    model is unset, hf_config_override turns deepseek_v3 into DeepSeekMTPModel, and the per-model names
    ("deepseek_mtp", MTPModelTypes) are deprecated and rewritten to "mtp" with a warning.
    """
    first = rows[0]
    if not speculates(first):
        return None, [f"# plain decoding (no speculation) won at batch size {first['batch_size']}: no --speculative-config"]
    drafter, o, k = first["drafter"], options(first), draft_len(first)
    if drafter == "layer_skip":
        return None, [
            f"# the winner at batch size {first['batch_size']} drafts with layer_skip (the verifier's first {o.get('layers')} layers), "
            "which vLLM has no method for: no --speculative-config is emitted"
        ]
    notes: list[str] = []
    if drafter == "ngram":
        hi, lo = ngram_window(first)
        spec: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": hi, "prompt_lookup_min": lo}
    elif drafter == "mtp":
        spec = {"method": "mtp", "num_speculative_tokens": k}
        notes.append(
            f"# mtp: vLLM runs the checkpoint's one MTP layer k={k} times per step, as the winner did"
            + (" (vLLM warns that k > 1 may accept less)" if k > 1 else "")
            + "; the target checkpoint carries the layer: no model key"
        )
    else:  # draft_model | eagle3
        spec = {"method": drafter, "model": str(o["model_path"]), "num_speculative_tokens": k}
    notes += lookup_notes(o, "vllm") + tree_notes(first, "vllm")
    table = k_table(rows)
    if table:
        spec["num_speculative_tokens"] = max(kk for _, _, kk in table)
        spec["num_speculative_tokens_per_batch_size"] = table
        notes += [
            "# k differs between batch sizes: vLLM's dynamic speculative decoding takes a table of [first batch size, last batch size, k]",
            f"#   num_speculative_tokens_per_batch_size = {json.dumps(table)}; num_speculative_tokens is its largest k (the buffer size)",
            "#   vLLM documents it as tested with eagle/eagle3 and off with data parallelism; for another method check it,",
            f"#   or delete the key to run the batch-size-{first['batch_size']} winner's k={k} everywhere",
        ]
        left_out = other_drafters(rows)
        if left_out:
            notes.append(
                "#   batch sizes won by another drafter are not in the table and take the k before them: "
                + ", ".join(str(r["batch_size"]) for r in left_out)
            )
    return spec, notes


def draft_ratio(row: dict) -> float | None:
    """The draft-to-target time ratio of one draft token: the winner's draft time per step over k, over
    its verify pass (`draft_ms_p50 / (k x verify_ms_p50)`, batch 1). The adaptive-k proposal for vLLM
    (PR 47111's docs/features/speculative_decoding/adaptive_k.md) models a step as 1 + K x c_draft
    target forwards, c_draft being this ratio. None where the study did not record both times."""
    draft, verify, k = row.get("draft_ms_p50"), row.get("verify_ms_p50"), draft_len(row)
    if draft is None or not verify or k <= 0:
        return None
    return float(draft) / (k * float(verify))


def adaptive_lines(rows: list[dict]) -> list[str]:
    """What the study says about adaptive speculation for vLLM: there is none in the pinned version
    (vllm/config/speculative.py's SpeculativeConfig has no adaptive-k field; enable_adaptive_k /
    adaptive_k_c_draft are vllm-project/vllm PR 47111, open, after PR 44336 was closed unmerged), so
    nothing of it is emitted; the line says which schedule the study's measurements support and gives
    the measured ratio such a controller would be profiled with."""
    first = rows[0]
    if not speculates(first):
        return []
    sizes = ", ".join(str(r["batch_size"]) for r in rows)
    lines = [
        f"# adaptive speculation: vLLM {ENGINE_VERSIONS['vllm']} has none (no adaptive-k field in SpeculativeConfig; enable_adaptive_k /",
        "#   adaptive_k_c_draft are vllm-project/vllm PR 47111, open, after PR 44336 closed unmerged): nothing of it is emitted.",
    ]
    if k_table(rows):
        lines.append(f"#   The study's measurements support the static per-batch-size table below (k measured at batch sizes {sizes}).")
    else:
        lines.append(f"#   The study's measurements support one static k (the best k at every batch size measured: {sizes}).")
    if (c := draft_ratio(first)) is not None:
        lines.append(
            f"#   Measured draft-to-target time ratio (batch size {first['batch_size']}, trial {first.get('trial')}): "
            f"{float(first['draft_ms_p50']):.3f} ms of drafting for k={draft_len(first)} over a {float(first['verify_ms_p50']):.3f} ms "
            f"verify pass = {c:.4f} per draft token, the c_draft an adaptive-k controller is profiled with"
        )
    return lines


def to_vllm(schedule: dict) -> str:
    """`vllm serve` for the schedule: env exports, --tensor-parallel-size, allreduce flags, --speculative-config."""
    rows = sorted_rows(schedule)
    first = rows[0]
    choice = allreduce.engine_allreduce("vllm", str(first.get("backend")))
    lines = header(schedule, rows, "vllm")
    spec, notes = speculative_config(rows)
    lines += notes
    lines += adaptive_lines(rows)
    lines += one_engine_notes(rows, "vllm")
    lines += export_lines({**environment(first), **dict(choice.env)})
    parts = launch(schedule, first, "vllm serve", "--tensor-parallel-size", "--enforce-eager") + list(choice.flags)
    if spec is not None:
        parts.append(f"--speculative-config {shlex.quote(json.dumps(spec))}")
    lines.append(shell_command(parts))
    return "\n".join(lines) + "\n"
