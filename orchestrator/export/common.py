"""What every engine export shares: reading a schedule's winners, the header comments, the NCCL
environment (NVLink multicast always off), and the notes for what one server cannot follow per batch
size (its TP size, its drafter, its draft shape, its k).

A schedule (orchestrator/export/schedule.py) lists the best configuration per batch size. An engine
serves one drafter at one TP size, so the winner at the smallest batch size sets them; the engine
modules (vllm.py, sglang.py, trtllm.py) build on the helpers here. Pure string building.

    from orchestrator.export.common import sorted_rows, header, environment
"""

from __future__ import annotations

import re
import shlex

from orchestrator.config.envpolicy import NVLS_OFF_ENV, refuse_nvls
from orchestrator.config.registry import PARAMS
from orchestrator.export.allreduce import header_lines
from orchestrator.export.versions import ENGINE_NAMES, ENGINE_VERSIONS
from workers.spec import DRAFTER_KINDS, tree_size

DRAFTERS = DRAFTER_KINDS  # what a schedule row may name: spectune's drafter kinds

# spectune's n-gram defaults (their declarations on DrafterSpec), for a schedule whose options omit them
NGRAM_MAX_DEFAULT = PARAMS["drafter.ngram_max"].default
NGRAM_MIN_DEFAULT = PARAMS["drafter.ngram_min"].default
# the drafters that name a checkpoint of their own (drafter.model_path's declaration): draft_model, eagle3;
# not mtp, whose layer ships inside the target checkpoint, which every engine's MTP mode reads it from
MODEL_PATH_DRAFTERS = PARAMS["drafter.model_path"].needs[1]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# the drafter options that make a drafter another one for an engine (an EAGLE-3 head's placement
# and lookup are how spectune ran it, which no engine takes; its tree_width is an engine option, like k)
_DRAFTER_IDENTITY = ("model_path", "ngram_max", "ngram_min", "layers")


def sorted_rows(schedule: dict) -> list[dict]:
    """The schedule's winners sorted by batch size; ValueError for an empty or malformed one."""
    rows = schedule.get("schedule") or []
    if not rows:
        raise ValueError("the study has no complete trial to export: its schedule is empty")
    rows = sorted(rows, key=lambda r: int(r["batch_size"]))
    for r in rows:
        if r.get("drafter", "none") not in DRAFTERS:
            raise ValueError(f"batch size {r['batch_size']}: unknown drafter {r.get('drafter')!r} (one of {', '.join(DRAFTERS)})")
        if speculates(r) and r["drafter"] in MODEL_PATH_DRAFTERS and not options(r).get("model_path"):
            raise ValueError(f"batch size {r['batch_size']}: drafter {r['drafter']} without drafter_options.model_path")
    return rows


def options(row: dict) -> dict:
    return row.get("drafter_options") or {}


def draft_len(row: dict) -> int:
    """k as the winner ran it (0 where plain decoding won)."""
    return int(row.get("num_draft_tokens") or 0) if speculates(row) else 0


def speculates(row: dict) -> bool:
    """False where plain decoding won (drafter none, or no draft tokens)."""
    return row.get("drafter", "none") != "none" and int(row.get("num_draft_tokens") or 0) > 0


def same_drafter(a: dict, b: dict) -> bool:
    return a.get("drafter") == b.get("drafter") and all(options(a).get(o) == options(b).get(o) for o in _DRAFTER_IDENTITY)


def tree_width(row: dict) -> int:
    """An eagle3 winner's tree width (drafter.tree_width); 0 where it drafted a chain (0 or 1)."""
    w = int(options(row).get("tree_width") or 0)
    return w if row.get("drafter") == "eagle3" and w >= 2 else 0


def ngram_window(row: dict) -> tuple[int, int]:
    o = options(row)
    return int(o.get("ngram_max", NGRAM_MAX_DEFAULT)), int(o.get("ngram_min", NGRAM_MIN_DEFAULT))


def drafter_text(row: dict) -> str:
    if not speculates(row):
        return "plain decoding"
    d, o, k = row["drafter"], options(row), draft_len(row)
    if d == "ngram":
        hi, lo = ngram_window(row)
        return f"ngram k={k} (ngram_max={hi}, ngram_min={lo})"
    if d == "layer_skip":
        return f"layer_skip k={k} (layers={o.get('layers')})"
    if d == "mtp":  # no drafter option: the layer is the checkpoint's own (workers/drafters/mtp.py)
        return f"mtp k={k} (the model's own MTP layer, reused for each draft)"
    return f"{d} k={k}{f' tree={tree_width(row)}' if tree_width(row) else ''} ({o.get('model_path')})"


def winner_text(row: dict) -> str:
    parts = [f"batch size {row['batch_size']}: {drafter_text(row)}", f"tp {row.get('tp')}", f"backend {row.get('backend')}"]
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


def environment(row: dict) -> dict[str, str]:
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


def export_lines(env: dict[str, str]) -> list[str]:
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


def header(schedule: dict, rows: list[dict], engine: str | None) -> list[str]:
    """The comment lines every engine export opens with: study, model, the engine version the names were
    checked against (`engine`: a key of ENGINE_VERSIONS), the winners by batch size, and the engine's
    setting for the winner's allreduce (orchestrator/export/allreduce.py)."""
    lines = [f"# spectune export: study {schedule.get('study')}, model {schedule.get('model')}, dtype {schedule.get('dtype')}"]
    if engine:
        lines.append(f"# flag names checked against the {ENGINE_NAMES[engine]} documentation of {ENGINE_VERSIONS[engine]}")
    lines.append("# winners by batch size (ranked by throughput with the prefill; decode: the decode steps alone):")
    lines += [f"#   {winner_text(r)}" for r in rows]
    lines += context_lines(schedule, engine)
    if engine:
        lines += header_lines(rows, engine)
    return lines


def context_lines(schedule: dict, engine: str | None) -> list[str]:
    """The winners per context bucket (workload.context_lengths), as comments: no engine version named in
    ENGINE_VERSIONS takes speculation settings by context length, so the settings below are those measured
    at the prompts' own lengths; schedule.json carries every bucket."""
    rows = schedule.get("by_context") or []
    if not rows:
        return []
    who = ENGINE_NAMES[engine] if engine else "a serving engine"
    lines = [
        f"# winners by context length (prompts drawn to that many tokens); {who} takes no context axis: "
        "the settings below are the ones measured at the prompts' own lengths"
    ]
    lines += [f"#   context {r['context_len']}: {winner_text(r)}" for r in sorted(rows, key=lambda r: (r["context_len"], r["batch_size"]))]
    return lines


def other_drafters(rows: list[dict]) -> list[dict]:
    """The batch sizes whose winner speculates with another drafter than the smallest batch size's
    (plain-decoding winners are not in it: the k tables say where speculation is off)."""
    return [r for r in rows[1:] if speculates(r) and not same_drafter(r, rows[0])]


def one_engine_notes(rows: list[dict], engine: str) -> list[str]:
    """Comments for what one server cannot follow per batch size: its TP size, its drafter, its draft shape."""
    first, notes, name = rows[0], [], ENGINE_NAMES[engine]
    if any(r.get("tp") != first.get("tp") for r in rows[1:]):
        notes.append(f"# {name} runs one tensor-parallel size: the batch-size-{first['batch_size']} winner's tp {first.get('tp')} is used")
    others = other_drafters(rows)
    if others:
        notes.append(
            f"# {name} takes one drafter: the batch-size-{first['batch_size']} winner ({drafter_text(first)}) is used; "
            + "; ".join(f"batch size {r['batch_size']} was won by {drafter_text(r)}" for r in others)
        )
    trees = [r for r in rows[1:] if speculates(r) and r.get("drafter") == "eagle3" and tree_width(r) != tree_width(first)]
    if speculates(first) and first.get("drafter") == "eagle3" and trees:  # trees run at batch size 1, larger sizes chains
        shape = {id(r): f"a tree of width {tree_width(r)}" if tree_width(r) else "a chain" for r in [first, *trees]}
        notes.append(
            f"# {name} takes one draft shape: the batch-size-{first['batch_size']} winner's ({shape[id(first)]}) is used; "
            + "; ".join(f"batch size {r['batch_size']} drafted {shape[id(r)]}" for r in trees)
        )
    return notes


def k_comment_table(rows: list[dict], engine: str) -> list[str]:
    """A `#` table batch size -> k, for an engine that takes one k; nothing if k never changes."""
    if len({draft_len(r) for r in rows}) <= 1:
        return []
    first = rows[0]
    lines = [
        f"# {ENGINE_NAMES[engine]} takes one k (num draft tokens) for all batch sizes; the batch-size-{first['batch_size']} winner's is used:"
    ]
    lines.append("#   batch size -> k")
    lines += [f"#   {r['batch_size']} -> {draft_len(r)}" + ("" if speculates(r) else " (plain decoding)") for r in rows]
    return lines


def shell_command(parts: list[str]) -> str:
    return " \\\n    ".join(parts)


def cuda_graphs_on(row: dict) -> bool:
    value = (row.get("engine") or {}).get("cuda_graphs", True)
    return str(value).strip().lower() not in ("false", "0", "no", "off")


def launch(schedule: dict, first: dict, command: str, tp_flag: str, eager_flag: str) -> list[str]:
    """An engine's launch command up to its speculative flags: model, dtype, TP size, and the flag that
    turns CUDA graphs off where the winner ran without them."""
    parts = [f"{command} {shlex.quote(str(schedule.get('model')))}"]
    if schedule.get("dtype"):
        parts.append(f"--dtype {shlex.quote(str(schedule['dtype']))}")
    parts.append(f"{tp_flag} {int(first['tp'])}")
    if not cuda_graphs_on(first):
        parts.append(eager_flag)
    return parts


def lookup_notes(o: dict, engine: str) -> list[str]:
    """An EAGLE-3 winner that drafted by n-gram lookup where the context repeated (drafter.lookup)."""
    if not int(o.get("lookup") or 0):
        return []
    return [
        f"# the winner drafted by n-gram lookup where its last {o['lookup']} tokens repeated, and with the head elsewhere",
        f"#   (drafter.lookup); {ENGINE_NAMES[engine]} has no such mix: this runs the head alone, which accepts less on copy-heavy prompts",
    ]


def tree_notes(row: dict, engine: str) -> list[str]:
    """An eagle3 winner that drafted a tree (drafter.tree_width). vLLM 0.25.0 drafts chains only: its
    speculative_token_tree went with tree attention (vllm-project/vllm PR 42121, merged 2026-05-08);
    TensorRT-LLM 1.4.0rc4's Eagle3DecodingConfig has a dynamic tree (use_dynamic_tree) but no static one
    that takes a width per depth, so both get the head's chain."""
    if not (w := tree_width(row)):
        return []
    k, n = draft_len(row), tree_size(draft_len(row), w)
    head = f"# the winner drafted a tree (drafter.tree_width {w}): the head's top-{w} at each of k={k} depths, the chain first, {n} drafts;"
    if engine == "vllm":
        return [head, f"#   vLLM {ENGINE_VERSIONS['vllm']} has no trees (PR 42121): this runs the head's chain of k={k}, accepting less"]
    if engine == "trtllm":
        return [
            head,
            f"#   TensorRT-LLM {ENGINE_VERSIONS['trtllm']} takes no tree of this shape: this runs the head's chain of k={k}, accepting less",
        ]
    sglang = f"#   SGLang expands the top-{w} of every node it keeps and verifies the {n} best-scored (+1: the root): its tree's shape can differ;"
    return [head, sglang, "#   top-k > 1 runs SGLang's spec v1 (no overlap scheduler) and, with --page-size > 1, needs flashinfer or fa3"]
