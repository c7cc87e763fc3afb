"""A study's winners written in the form a serving engine takes: vLLM, SGLang, an env file, JSON.

`spectune export EXP.yaml --to vllm|sglang|env|json` builds a *schedule* (the winning trial at each
measured batch size, sorted by batch size) and calls `render(schedule, fmt)`; the text it returns
is printed or written to a file. A study whose measurements do not carry over to a GPU engine (CPU,
float32, gloo: the schedule's `does_not_transfer`) gets a first line saying so (`caveat_line`). Everything here is pure string building: no Ray, no Optuna, no
GPU, no network.

    {"model": ..., "dtype": ..., "study": ..., "schedule": [
        {"batch_size": 1, "tp": 2, "num_draft_tokens": 4, "drafter": "ngram",
         "drafter_options": {"ngram_max": 3, "ngram_min": 1}, "backend": "nccl",
         "nccl_env": {"NCCL_ALGO": "Ring"}, "engine": {"attention": "auto", "cuda_graphs": true},
         "throughput_tok_s": ..., "plain_throughput_tok_s": ..., "speedup_vs_plain": ...,
         "noise_band_tok_s": ..., "decode_tok_s": ..., "plain_decode_tok_s": ..., "decode_speedup_vs_plain": ...,
         "trial": 7}, ...], "ranked_by": "throughput_tok_s"}

Winners are ranked by throughput with the prefill (`ranked_by`); the decode rate (decode steps only)
is listed beside it in the header comments.

An engine serves one drafter at one tensor-parallel size, so the winner at the smallest batch size
sets the drafter, TP and NCCL environment; where the other batch sizes' winners differ the output
says so in `#` comment lines. vLLM takes a batch-size -> k table (dynamic speculative decoding),
SGLang takes one k. NVLink multicast stays off in every output (the three NVLS_OFF_ENV lines).

The engine flag names were checked against the engine versions in ENGINE_VERSIONS; each mapping
below names the file it was checked in.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from orchestrator.config.envpolicy import NVLS_OFF_ENV, refuse_nvls
from workers.spec import tree_size

# The engine versions whose documentation the flag names below were checked against.
#   vLLM: the 0.25.0 documentation (docs/features/speculative_decoding/{draft_model,
#     dynamic_speculative_decoding}.md) and, on the main branch, docs/features/speculative_decoding/
#     configuration.md and vllm/config/speculative.py (SpeculativeConfig fields, SpeculativeMethod).
#   SGLang: no release tag could be pinned; the main-branch documentation after the NGRAM flag
#     rework (sgl-project/sglang PR 21225, 2026-03: --speculative-ngram-{min,max}-match-window-size
#     removed, --speculative-ngram-branch-length renamed --speculative-ngram-max-trie-depth):
#     docs/advanced_features/{server_arguments,speculative_decoding}.md and
#     python/sglang/srt/speculative/spec_info.py.
ENGINE_VERSIONS = {"vllm": "0.25.0", "sglang": "main after PR 21225 (2026-03)"}

FORMATS = ("json", "vllm", "sglang", "env")
DRAFTERS = ("none", "ngram", "draft_model", "eagle3", "layer_skip")

# spectune's n-gram defaults (workers/spec.py DrafterSpec), for a schedule whose options omit them
NGRAM_MAX_DEFAULT = 3
NGRAM_MIN_DEFAULT = 1

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ---------------------------------------------------------------------------- the schedule


def _rows(schedule: dict) -> list[dict]:
    """The schedule's winners sorted by batch size; ValueError for an empty or malformed one."""
    rows = schedule.get("schedule") or []
    if not rows:
        raise ValueError("the study has no complete trial to export: its schedule is empty")
    rows = sorted(rows, key=lambda r: int(r["batch_size"]))
    for r in rows:
        if r.get("drafter", "none") not in DRAFTERS:
            raise ValueError(f"batch size {r['batch_size']}: unknown drafter {r.get('drafter')!r} (one of {', '.join(DRAFTERS)})")
        if _speculates(r) and r["drafter"] in ("draft_model", "eagle3") and not _opts(r).get("model_path"):
            raise ValueError(f"batch size {r['batch_size']}: drafter {r['drafter']} without drafter_options.model_path")
    return rows


def _opts(row: dict) -> dict:
    return row.get("drafter_options") or {}


def _k(row: dict) -> int:
    return int(row.get("num_draft_tokens") or 0)


def _speculates(row: dict) -> bool:
    """False where plain decoding won (drafter none, or no draft tokens)."""
    return row.get("drafter", "none") != "none" and _k(row) > 0


# the drafter options that make a drafter another one for an engine (an EAGLE-3 head's placement
# and lookup are how spectune ran it, which no engine takes; its tree_width is an engine option, like k)
_DRAFTER_IDENTITY = ("model_path", "ngram_max", "ngram_min", "layers")


def _same_drafter(a: dict, b: dict) -> bool:
    return a.get("drafter") == b.get("drafter") and all(_opts(a).get(o) == _opts(b).get(o) for o in _DRAFTER_IDENTITY)


def _tree_width(row: dict) -> int:
    """An eagle3 winner's tree width (drafter.tree_width); 0 where it drafted a chain (0 or 1)."""
    w = int(_opts(row).get("tree_width") or 0)
    return w if row.get("drafter") == "eagle3" and w >= 2 else 0


def _ngram_window(row: dict) -> tuple[int, int]:
    o = _opts(row)
    return int(o.get("ngram_max", NGRAM_MAX_DEFAULT)), int(o.get("ngram_min", NGRAM_MIN_DEFAULT))


def _drafter_text(row: dict) -> str:
    if not _speculates(row):
        return "plain decoding"
    d, o = row["drafter"], _opts(row)
    if d == "ngram":
        hi, lo = _ngram_window(row)
        return f"ngram k={_k(row)} (ngram_max={hi}, ngram_min={lo})"
    if d == "layer_skip":
        return f"layer_skip k={_k(row)} (layers={o.get('layers')})"
    return f"{d} k={_k(row)}{f' tree={_tree_width(row)}' if _tree_width(row) else ''} ({o.get('model_path')})"


def _winner_text(row: dict) -> str:
    parts = [f"batch size {row['batch_size']}: {_drafter_text(row)}", f"tp {row.get('tp')}", f"backend {row.get('backend')}"]
    if row.get("throughput_tok_s") is not None:
        tput = f"{float(row['throughput_tok_s']):.1f} tok/s"
        if row.get("noise_band_tok_s") is not None:
            tput += f" +-{float(row['noise_band_tok_s']):.1f}"
        parts.append(tput)
    if row.get("speedup_vs_plain") is not None:
        parts.append(f"{float(row['speedup_vs_plain']):.2f}x plain")
    if row.get("decode_tok_s") is not None:  # decode steps only: what speculation does without the prefill
        dec = f"decode {float(row['decode_tok_s']):.1f} tok/s"
        if row.get("decode_speedup_vs_plain") is not None:
            dec += f" ({float(row['decode_speedup_vs_plain']):.2f}x plain)"
        parts.append(dec)
    if row.get("trial") is not None:
        parts.append(f"trial {row['trial']}")
    return ", ".join(parts)


def _env(row: dict) -> dict[str, str]:
    """The winner's NCCL environment followed by the NVLS-off lines, which always win.

    A schedule that would turn NVLink multicast on is refused (orchestrator/config/envpolicy.py): no trial
    can have run that way."""
    env: dict[str, str] = {}
    for key, value in (row.get("nccl_env") or {}).items():
        key, value = str(key), str(value)
        if not _ENV_NAME.fullmatch(key) or "\n" in value:
            raise ValueError(f"nccl_env: {key}={value!r} is no environment variable setting")
        if key in NVLS_OFF_ENV:
            if value != NVLS_OFF_ENV[key]:
                raise ValueError(f"nccl_env: {key}={value}: NVLS / NVLink multicast must stay off")
            continue
        refuse_nvls(key, value)
        env[key] = value
    return {**env, **NVLS_OFF_ENV}


def _header(schedule: dict, rows: list[dict], engine: str | None) -> list[str]:
    lines = [f"# spectune export: study {schedule.get('study')}, model {schedule.get('model')}, dtype {schedule.get('dtype')}"]
    if engine:
        lines.append(f"# flag names checked against the {engine} documentation of {ENGINE_VERSIONS[engine.lower()]}")
    lines.append("# winners by batch size (ranked by throughput with the prefill; decode: the decode steps alone):")
    lines += [f"#   {_winner_text(r)}" for r in rows]
    return lines


def _other_drafters(rows: list[dict]) -> list[dict]:
    """The batch sizes whose winner speculates with another drafter than the smallest batch size's
    (plain-decoding winners are not in it: the k tables say where speculation is off)."""
    return [r for r in rows[1:] if _speculates(r) and not _same_drafter(r, rows[0])]


def _one_engine_notes(rows: list[dict], engine: str) -> list[str]:
    """Comments for what one server cannot follow per batch size: its TP size and its drafter."""
    first, notes = rows[0], []
    if any(r.get("tp") != first.get("tp") for r in rows[1:]):
        notes.append(
            f"# {engine} runs one tensor-parallel size: the batch-size-{first['batch_size']} winner's tp {first.get('tp')} is used"
        )
    others = _other_drafters(rows)
    if others:
        notes.append(
            f"# {engine} takes one drafter: the batch-size-{first['batch_size']} winner ({_drafter_text(first)}) is used; "
            + "; ".join(f"batch size {r['batch_size']} was won by {_drafter_text(r)}" for r in others)
        )
    trees = [r for r in rows[1:] if _speculates(r) and r.get("drafter") == "eagle3" and _tree_width(r) != _tree_width(first)]
    if _speculates(first) and first.get("drafter") == "eagle3" and trees:  # trees run at batch size 1, larger sizes chains
        shape = {id(r): f"a tree of width {_tree_width(r)}" if _tree_width(r) else "a chain" for r in [first, *trees]}
        notes.append(
            f"# {engine} takes one draft shape: the batch-size-{first['batch_size']} winner's ({shape[id(first)]}) is used; "
            + "; ".join(f"batch size {r['batch_size']} drafted {shape[id(r)]}" for r in trees)
        )
    return notes


def _k_comment_table(rows: list[dict], engine: str) -> list[str]:
    """A `#` table batch size -> k, for an engine that takes one k; nothing if k never changes."""
    if len({_k(r) if _speculates(r) else 0 for r in rows}) <= 1:
        return []
    first = rows[0]
    lines = [f"# {engine} takes one k (num draft tokens) for all batch sizes; the batch-size-{first['batch_size']} winner's is used:"]
    lines.append("#   batch size -> k")
    lines += [f"#   {r['batch_size']} -> {_k(r) if _speculates(r) else 0}" + ("" if _speculates(r) else " (plain decoding)") for r in rows]
    return lines


def _exports(row: dict) -> list[str]:
    return [f"export {k}={shlex.quote(v)}" for k, v in _env(row).items()]


def _command(parts: list[str]) -> str:
    return " \\\n    ".join(parts)


def _cuda_graphs(row: dict) -> bool:
    value = (row.get("engine") or {}).get("cuda_graphs", True)
    return str(value).strip().lower() not in ("false", "0", "no", "off")


# ---------------------------------------------------------------------------- vLLM


def _vllm_k_table(rows: list[dict]) -> list[list[int]] | None:
    """vLLM's `num_speculative_tokens_per_batch_size`: [[start, end, k], ...], inclusive ranges.

    Checked in vLLM's docs/features/speculative_decoding/dynamic_speculative_decoding.md (0.25.0
    documentation) and vllm/v1/spec_decode/dynamic/utils.py: a list of [start_bs, end_bs, K]; the
    first range starts at 1; ranges sorted and non-overlapping; K >= 0 (0: no drafting at that
    batch size); a gap or the tail after the last range takes the K of the range before it; every
    K is capped at num_speculative_tokens. Rows won by another drafter are left out (their batch
    sizes take the K before them); rows where plain decoding won get K 0. None where k never changes.
    """
    first = rows[0]
    points = [(int(r["batch_size"]), _k(r) if _speculates(r) else 0) for r in rows if not _speculates(r) or _same_drafter(r, first)]
    ranges: list[list[int]] = []
    for i, (bs, k) in enumerate(points):
        start = 1 if i == 0 else bs
        end = points[i + 1][0] - 1 if i + 1 < len(points) else bs
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
    return ranges if len(ranges) > 1 else None


def _vllm_speculative_config(rows: list[dict]) -> tuple[dict | None, list[str]]:
    """vLLM's --speculative-config for the smallest batch size's winner, and comment lines.

    Keys checked in vLLM's docs/features/speculative_decoding/configuration.md and
    vllm/config/speculative.py (SpeculativeConfig): method "ngram" with num_speculative_tokens,
    prompt_lookup_max, prompt_lookup_min; method "draft_model" (docs .../draft_model.md, 0.25.0) and
    "eagle3" (docs .../eagle.md) with model = the draft checkpoint / EAGLE-3 head.
    """
    first = rows[0]
    if not _speculates(first):
        return None, [f"# plain decoding (no speculation) won at batch size {first['batch_size']}: no --speculative-config"]
    drafter, o, k = first["drafter"], _opts(first), _k(first)
    if drafter == "layer_skip":
        return None, [
            f"# the winner at batch size {first['batch_size']} drafts with layer_skip (the verifier's first {o.get('layers')} layers), "
            "which vLLM has no method for: no --speculative-config is emitted"
        ]
    if drafter == "ngram":
        hi, lo = _ngram_window(first)
        spec: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": hi, "prompt_lookup_min": lo}
    else:  # draft_model | eagle3
        spec = {"method": drafter, "model": str(o["model_path"]), "num_speculative_tokens": k}
    notes: list[str] = _lookup_notes(o, "vLLM") + _tree_notes(first, "vLLM")
    table = _vllm_k_table(rows)
    if table:
        spec["num_speculative_tokens"] = max(kk for _, _, kk in table)
        spec["num_speculative_tokens_per_batch_size"] = table
        notes += [
            "# k differs between batch sizes: vLLM's dynamic speculative decoding takes a table of [first batch size, last batch size, k]",
            f"#   num_speculative_tokens_per_batch_size = {json.dumps(table)}; num_speculative_tokens is its largest k (the buffer size)",
            "#   vLLM documents it as tested with eagle/eagle3 and off with data parallelism; for another method check it,",
            f"#   or delete the key to run the batch-size-{first['batch_size']} winner's k={k} everywhere",
        ]
        left_out = _other_drafters(rows)
        if left_out:
            notes.append(
                "#   batch sizes won by another drafter are not in the table and take the k before them: "
                + ", ".join(str(r["batch_size"]) for r in left_out)
            )
    return spec, notes


def _launch(schedule: dict, first: dict, command: str, tp_flag: str, eager_flag: str) -> list[str]:
    """An engine's launch command up to its speculative flags: model, dtype, TP size, and the flag that
    turns CUDA graphs off where the winner ran without them."""
    parts = [f"{command} {shlex.quote(str(schedule.get('model')))}"]
    if schedule.get("dtype"):
        parts.append(f"--dtype {shlex.quote(str(schedule['dtype']))}")
    parts.append(f"{tp_flag} {int(first['tp'])}")
    if not _cuda_graphs(first):
        parts.append(eager_flag)
    return parts


def to_vllm(schedule: dict) -> str:
    """`vllm serve` for the schedule: env exports, --tensor-parallel-size, --speculative-config."""
    rows = _rows(schedule)
    first = rows[0]
    lines = _header(schedule, rows, "vLLM")
    spec, notes = _vllm_speculative_config(rows)
    lines += notes
    lines += _one_engine_notes(rows, "vLLM")
    lines += _exports(first)
    parts = _launch(schedule, first, "vllm serve", "--tensor-parallel-size", "--enforce-eager")
    if spec is not None:
        parts.append(f"--speculative-config {shlex.quote(json.dumps(spec))}")
    lines.append(_command(parts))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- SGLang


def _sglang_speculative_flags(first: dict) -> tuple[list[str], list[str]]:
    """SGLang's --speculative-* flags for the smallest batch size's winner, and comment lines.

    Checked in SGLang's docs/advanced_features/server_arguments.md and speculative_decoding.md:
    --speculative-algorithm EAGLE3 (EAGLE-3 head) / STANDALONE (a small draft model) / NGRAM, with
    --speculative-draft-model-path. For chain drafting (top-k 1) SGLang verifies num_steps + 1 tokens
    (the last accepted one plus k drafts) and resets num-draft-tokens to that (spec_info.py,
    _handle_eagle_family): k -> --speculative-num-steps k --speculative-eagle-topk 1
    --speculative-num-draft-tokens k+1. An eagle3 tree of width w (drafter.tree_width): top-k w and num-draft-tokens = its
    drafts + 1, the root counted (organize_draft_results keeps the num_draft_tokens - 1 best-scored nodes).
    """
    if not _speculates(first):
        return [], [f"# plain decoding (no speculation) won at batch size {first['batch_size']}: no --speculative-* flags"]
    drafter, o, k = first["drafter"], _opts(first), _k(first)
    if drafter == "layer_skip":
        return [], [
            f"# the winner at batch size {first['batch_size']} drafts with layer_skip (the verifier's first {o.get('layers')} layers), "
            "which SGLang has no algorithm for: no --speculative-* flags are emitted"
        ]
    if drafter == "ngram":
        hi, lo = _ngram_window(first)
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
    algorithm = "EAGLE3" if drafter == "eagle3" else "STANDALONE"
    w = _tree_width(first)  # 0: a chain
    flags = [
        f"--speculative-algorithm {algorithm}",
        f"--speculative-draft-model-path {shlex.quote(str(o['model_path']))}",
        f"--speculative-num-steps {k}",
        f"--speculative-eagle-topk {w or 1}",
        f"--speculative-num-draft-tokens {tree_size(k, w) + 1}",
    ]
    return flags, _lookup_notes(o, "SGLang") + _tree_notes(first, "SGLang")


def _lookup_notes(o: dict, engine: str) -> list[str]:
    """An EAGLE-3 winner that drafted by n-gram lookup where the context repeated (drafter.lookup)."""
    if not int(o.get("lookup") or 0):
        return []
    return [
        f"# the winner drafted by n-gram lookup where its last {o['lookup']} tokens repeated, and with the head elsewhere",
        f"#   (drafter.lookup); {engine} has no such mix: this runs the head alone, which accepts less on copy-heavy prompts",
    ]


def _tree_notes(row: dict, engine: str) -> list[str]:
    """An eagle3 winner that drafted a tree (drafter.tree_width). vLLM 0.25.0 drafts chains only: its
    speculative_token_tree went with tree attention (vllm-project/vllm PR 42121, merged 2026-05-08)."""
    if not (w := _tree_width(row)):
        return []
    k, n = _k(row), tree_size(_k(row), w)
    head = f"# the winner drafted a tree (drafter.tree_width {w}): the head's top-{w} at each of k={k} depths, the chain first, {n} drafts;"
    if engine == "vLLM":
        return [head, f"#   vLLM {ENGINE_VERSIONS['vllm']} has no trees (PR 42121): this runs the head's chain of k={k}, accepting less"]
    sglang = f"#   SGLang expands the top-{w} of every node it keeps and verifies the {n} best-scored (+1: the root): its tree's shape can differ;"
    return [head, sglang, "#   top-k > 1 runs SGLang's spec v1 (no overlap scheduler) and, with --page-size > 1, needs flashinfer or fa3"]


def to_sglang(schedule: dict) -> str:
    """`python -m sglang.launch_server` for the schedule: env exports, --tp-size, --speculative-*."""
    rows = _rows(schedule)
    first = rows[0]
    lines = _header(schedule, rows, "SGLang")
    flags, notes = _sglang_speculative_flags(first)
    lines += notes
    # SGLang's adaptive mode (docs/advanced_features/adaptive_speculative_decoding.md) follows the
    # acceptance length, not the batch size: there is no batch-size -> k table to emit
    lines += _k_comment_table(rows, "SGLang")
    lines += _one_engine_notes(rows, "SGLang")
    lines += _exports(first)
    parts = _launch(schedule, first, "python -m sglang.launch_server --model-path", "--tp-size", "--disable-cuda-graph") + flags
    lines.append(_command(parts))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- env, json, dispatch


def to_env(schedule: dict) -> str:
    """An env file (KEY=value lines) of the smallest batch size's winner's NCCL environment, NVLS off."""
    rows = _rows(schedule)
    first = rows[0]
    lines = [
        f"# spectune export: study {schedule.get('study')}, model {schedule.get('model')}",
        f"# NCCL environment of the winner at {_winner_text(first)}",
        "# NVLink multicast (NVLS) stays off: the last three lines are always set",
    ]
    lines += [f"{k}={v}" for k, v in _env(first).items()]
    return "\n".join(lines) + "\n"


def to_json(schedule: dict) -> str:
    """The schedule as JSON (indent 2)."""
    _rows(schedule)
    return json.dumps(schedule, indent=2) + "\n"


_RENDERERS = {"json": to_json, "vllm": to_vllm, "sglang": to_sglang, "env": to_env}


def caveat_line(why: list[str]) -> str:
    """The first line of an export whose measurements do not carry over to the engine it is for
    (schedule.does_not_transfer): the flags below are the winner's, its figures are not the engine's."""
    return (
        f"# CAUTION: these measurements do not transfer to a GPU server: {'; '.join(why)}. The settings below are this "
        "study's winner; re-run the study on the serving hardware (parallel.device cuda, its dtype and backend) before trusting them there"
    )


def render(schedule: dict, fmt: str) -> str:
    """The schedule in format `fmt`: json | vllm | sglang | env."""
    try:
        renderer = _RENDERERS[fmt]
    except KeyError:
        raise ValueError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}") from None
    text = renderer(schedule)
    tau, profile = schedule.get("simulated_accept_len"), schedule.get("simulated_accept_profile")
    if (tau or profile) and fmt != "json":  # a study that imposed acceptance: its drafters' real acceptance is unmeasured
        imposed = (
            f"an accepted length of {tau} (workload.simulate_accept_len)"
            if tau
            else f"P(accepted >= i) = {profile} (workload.simulate_accept_profile)"
        )
        warn = f"# WARNING: this study imposed {imposed}: the k and drafter\n"
        warn += "#   below are ranked on engine speed alone; measure the drafter on real prompts before deploying them\n"
        text = warn + text
    inherited = {k: v for row in schedule.get("schedule", []) for k, v in (row.get("inherited_nccl_env") or {}).items()}
    if inherited and fmt != "json":  # the study machine's environment, not a choice of the study
        pairs = ", ".join(f"{k}={v}" for k, v in sorted(inherited.items()))
        text = f"# left out: NCCL variables the study's driver inherited from its shell ({pairs})\n" + text
    if (emulated := schedule.get("emulated")) and fmt != "json":  # figures of a deployment no process ran whole
        text = f"# EMULATED: {emulated}\n#   the TP size below is the emulated deployment's; confirm on it before serving\n" + text
    if (why := schedule.get("does_not_transfer")) and fmt != "json":  # first of all; JSON carries the list itself
        text = caveat_line(why) + "\n" + text
    return text
