"""A study's winners written in the form a serving engine takes: vLLM, SGLang, TensorRT-LLM, an env
file, JSON; `render(schedule, fmt)` dispatches and puts the study-wide warnings first.

`spectune export EXP.yaml --to json|vllm|sglang|trtllm|env` builds a *schedule* (the winning trial at
each measured batch size, sorted by batch size; orchestrator/export/schedule.py) and calls
`render(schedule, fmt)`; `--to all --out DIR` writes every format at once (bundle.py). The engine
formats live one module per engine (vllm.py, sglang.py, trtllm.py; what they share: common.py; the
allreduce choice per engine and what a missing one costs: allreduce.py; the engine versions every
name was checked against: versions.py). Everything here is pure string building: no Ray, no Optuna,
no GPU, no network.

    {"model": ..., "dtype": ..., "study": ..., "schedule": [
        {"batch_size": 1, "tp": 2, "num_draft_tokens": 4, "drafter": "ngram",
         "drafter_options": {"ngram_max": 3, "ngram_min": 1}, "backend": "nccl",
         "nccl_env": {"NCCL_ALGO": "Ring"}, "engine": {"attention": "auto", "cuda_graphs": true},
         "throughput_tok_s": ..., "plain_throughput_tok_s": ..., "speedup_vs_plain": ...,
         "noise_band_tok_s": ..., "decode_tok_s": ..., "plain_decode_tok_s": ..., "decode_speedup_vs_plain": ...,
         "draft_ms_p50": ..., "verify_ms_p50": ..., "best_by_backend": {"nccl": {...}, ...},
         "trial": 7}, ...], "ranked_by": "throughput_tok_s"}

Winners are ranked by throughput with the prefill (`ranked_by`); the decode rate (decode steps only)
is listed beside it in the header comments. First lines, in this order, where they apply: why the
measurements do not transfer to a GPU server (CPU, float32, gloo: `caveat_line`), that the figures are
emulated (parallel.emulate_tp: `# EMULATED:`), NCCL variables inherited from the driver's shell, and
imposed acceptance. NVLink multicast stays off in every output (the three NVLS_OFF_ENV lines).
"""

from __future__ import annotations

import json

from orchestrator.export.common import environment, sorted_rows, winner_text
from orchestrator.export.sglang import to_sglang
from orchestrator.export.trtllm import to_trtllm
from orchestrator.export.versions import ENGINE_VERSIONS
from orchestrator.export.vllm import to_vllm

FORMATS = ("json", "vllm", "sglang", "trtllm", "env")

__all__ = ["ENGINE_VERSIONS", "FORMATS", "caveat_line", "render", "to_env", "to_json", "to_sglang", "to_trtllm", "to_vllm"]


def to_env(schedule: dict) -> str:
    """An env file (KEY=value lines) of the smallest batch size's winner's NCCL environment, NVLS off."""
    rows = sorted_rows(schedule)
    first = rows[0]
    lines = [
        f"# spectune export: study {schedule.get('study')}, model {schedule.get('model')}",
        f"# NCCL environment of the winner at {winner_text(first)}",
        "# NVLink multicast (NVLS) stays off: the last three lines are always set",
    ]
    lines += [f"{k}={v}" for k, v in environment(first).items()]
    return "\n".join(lines) + "\n"


def to_json(schedule: dict) -> str:
    """The schedule as JSON (indent 2)."""
    sorted_rows(schedule)
    return json.dumps(schedule, indent=2) + "\n"


_RENDERERS = {"json": to_json, "vllm": to_vllm, "sglang": to_sglang, "trtllm": to_trtllm, "env": to_env}


def caveat_line(why: list[str]) -> str:
    """The first line of an export whose measurements do not carry over to the engine it is for
    (schedule.does_not_transfer): the flags below are the winner's, its figures are not the engine's."""
    return (
        f"# CAUTION: these measurements do not transfer to a GPU server: {'; '.join(why)}. The settings below are this "
        "study's winner; re-run the study on the serving hardware (parallel.device cuda, its dtype and backend) before trusting them there"
    )


def warning_lines(schedule: dict) -> list[str]:
    """The study-wide `#` lines every format but JSON opens with (JSON carries the same facts as keys),
    first line first: does not transfer, emulated, inherited NCCL variables, imposed acceptance."""
    lines: list[str] = []
    if why := schedule.get("does_not_transfer"):
        lines.append(caveat_line(why))
    if emulated := schedule.get("emulated"):  # figures of a deployment no process ran whole
        lines += [f"# EMULATED: {emulated}", "#   the TP size below is the emulated deployment's; confirm on it before serving"]
    inherited = {k: v for row in schedule.get("schedule", []) for k, v in (row.get("inherited_nccl_env") or {}).items()}
    if inherited:  # the study machine's environment, not a choice of the study
        pairs = ", ".join(f"{k}={v}" for k, v in sorted(inherited.items()))
        lines.append(f"# left out: NCCL variables the study's driver inherited from its shell ({pairs})")
    tau, profile = schedule.get("simulated_accept_len"), schedule.get("simulated_accept_profile")
    if tau or profile:  # a study that imposed acceptance: its drafters' real acceptance is unmeasured
        imposed = (
            f"an accepted length of {tau} (workload.simulate_accept_len)"
            if tau
            else f"P(accepted >= i) = {profile} (workload.simulate_accept_profile)"
        )
        lines += [
            f"# WARNING: this study imposed {imposed}: the k and drafter",
            "#   below are ranked on engine speed alone; measure the drafter on real prompts before deploying them",
        ]
    return lines


def render(schedule: dict, fmt: str) -> str:
    """The schedule in format `fmt`: json | vllm | sglang | trtllm | env."""
    try:
        renderer = _RENDERERS[fmt]
    except KeyError:
        raise ValueError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}") from None
    text = renderer(schedule)
    if fmt == "json":
        return text
    return "".join(line + "\n" for line in warning_lines(schedule)) + text
