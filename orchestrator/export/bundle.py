"""`spectune export EXP.yaml --to all --out DIR`: every export format at once, one file each, and a
README.md saying what each file is and how to use it.

    schedule.json   --to json     the per-batch-size schedule
    vllm.sh         --to vllm     `bash vllm.sh` starts vLLM
    sglang.sh       --to sglang   `bash sglang.sh` starts SGLang
    trtllm.yaml     --to trtllm   `trtllm-serve MODEL --extra_llm_api_options trtllm.yaml`
    nccl.env        --to env      the NCCL environment (NVLink multicast off), for any engine

`write_bundle(schedule, folder)` renders everything before writing anything (a schedule an engine
format refuses leaves no half-written folder) and returns the paths it wrote. Files of other names in
the folder are left alone.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.export.formats import FORMATS, render, warning_lines
from orchestrator.export.versions import ENGINE_VERSIONS

# format -> (file name, what it is, how to use it); README.md lists them in this order
FILES = {
    "json": (
        "schedule.json",
        "the per-batch-size schedule: the best configuration measured at each batch size",
        "read it, or feed it to your own tooling",
    ),
    "vllm": (
        "vllm.sh",
        f"a `vllm serve` command (vLLM {ENGINE_VERSIONS['vllm']}) with the NCCL and allreduce environment exported first",
        "`bash vllm.sh`",
    ),
    "sglang": (
        "sglang.sh",
        f"a `python -m sglang.launch_server` command (SGLang {ENGINE_VERSIONS['sglang']}) with the NCCL environment exported first",
        "`bash sglang.sh`",
    ),
    "trtllm": (
        "trtllm.yaml",
        f"TensorRT-LLM {ENGINE_VERSIONS['trtllm']} LLM-API options: TP size, allreduce strategy, speculative_config",
        "`set -a; . ./nccl.env; set +a` then `trtllm-serve MODEL --extra_llm_api_options trtllm.yaml`",
    ),
    "env": (
        "nccl.env",
        "the winner's NCCL environment, NVLink multicast off (KEY=value lines)",
        "`set -a; . ./nccl.env; set +a` in a shell, or `docker run --env-file nccl.env`",
    ),
}
assert set(FILES) == set(FORMATS), "every export format has its file in --to all"


def readme(schedule: dict) -> str:
    """README.md for the folder: the study, the warnings that apply to every file, and one line per file."""
    sizes = ", ".join(str(r["batch_size"]) for r in sorted(schedule["schedule"], key=lambda r: int(r["batch_size"])))
    lines = [
        f"# spectune export of study {schedule.get('study')}",
        "",
        f"Model {schedule.get('model')}, dtype {schedule.get('dtype')}; the best configuration measured at each batch size ({sizes}).",
        "Each engine file opens with `#` comments: the winners, what the engine cannot follow, the allreduce it runs and what a",
        "missing one costs. An engine serves one drafter at one TP size: the smallest batch size's winner sets them.",
        "",
    ]
    if warnings := warning_lines(schedule):
        lines += ["Read first:", "", "```", *warnings, "```", ""]
    lines += ["| file | what it is | how to use it |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {what} | {how} |" for name, what, how in FILES.values()]
    lines += [
        "",
        "Regenerate one of them with `spectune export EXP.yaml --to FORMAT --out FILE` (FORMAT: json, vllm, sglang, trtllm, env).",
    ]
    return "\n".join(lines) + "\n"


def write_bundle(schedule: dict, folder: Path) -> list[Path]:
    """Every format and README.md into `folder` (made if missing); the paths written, README.md last.
    ValueError where the schedule is refused; OSError where the folder cannot be written."""
    texts = {name: render(schedule, fmt) for fmt, (name, _, _) in FILES.items()}
    texts["README.md"] = readme(schedule)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in texts.items():
        path = folder / name
        path.write_text(text)
        paths.append(path)
    return paths
