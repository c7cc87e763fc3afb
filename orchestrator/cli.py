"""The `spectune` command line (also `python -m orchestrator`).

    spectune decode --model smollm2-135m --tp 2 --drafter ngram --num-draft-tokens 4 --json
    spectune run experiments/smoke-cpu.yaml [--set study.n_trials=8]
    spectune validate experiments/tp8-pcie.yaml
    spectune report experiments/smoke-cpu.yaml
    spectune export experiments/smoke-cpu.yaml --to vllm [--out FILE]   (--to all --out DIR: every format)
    spectune schema --out experiments/spectune.schema.json
    spectune bench-search EXP.yaml --storage URL --studies A,B --budget 6 [--json]

User errors (bad flags, files, model paths, TP sizes, backends) print one line
`spectune: error: ...` and exit 2; a failed gang exits 1 with one line naming the rank.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from orchestrator.errors import INPUT_ERRORS, UserError


def _add_decode(sub) -> None:
    from orchestrator.decode.flags import add_flags

    p = sub.add_parser("decode", help="run one configuration (baseline + speculative) and print its metrics")
    add_flags(p)  # each flag sets one YAML field of the experiment schema, or an option of the run (orchestrator/decode/flags.py)
    p.set_defaults(handler=_decode)


def _decode(ns: argparse.Namespace) -> int:
    from orchestrator.decode.flags import namespace_parts
    from orchestrator.decode.run import decode

    given, run = namespace_parts(ns)
    out = decode(given, run)
    if not run.json:
        for key in (
            "throughput_tok_s",
            "baseline_throughput_tok_s",
            "speedup_vs_baseline",
            "plain_batch_speedup",
            "accept_len_mean",
            "outputs_match_baseline",
            "step_ms_p50",
            "comm_fraction",
        ):
            if key in out:
                print(f"{key:>28}: {out[key]:.4g}" if isinstance(out[key], float) else f"{key:>28}: {out[key]}")
    print(json.dumps(out, indent=None if run.json else 1, sort_keys=False))
    return 0


def _add_bench(sub) -> None:
    p = sub.add_parser("bench-allreduce", help="allreduce latency table per backend and NCCL environment")
    p.add_argument(
        "--backend",
        nargs="+",
        default=None,
        help="gloo | nccl | symm_mem | symm_mem_ll (default: gloo on cpu, nccl symm_mem symm_mem_ll on cuda)",
    )
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--sizes", default=None, help="comma list (8K,64K,1M); default: verify-step sizes for --hidden + 4K..8M")
    p.add_argument("--hidden", type=int, default=4096, help="model width for the verify-step sizes")
    p.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    p.add_argument("--iters", type=int, default=None, help="timed iterations per size (default 200 cuda, 20 cpu)")
    p.add_argument("--nccl-env", action="append", default=[], help="one NCCL environment, e.g. NCCL_PROTO=LL,NCCL_ALGO=Ring (repeatable)")
    p.add_argument("--plot", default=None, help="write a latency-vs-size PNG here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_bench)


def _bench(ns: argparse.Namespace) -> int:
    from orchestrator.bench import bench, latency_plot, parse_env, parse_size, step_sizes, table

    dtype = ns.dtype or ("bfloat16" if ns.device == "cuda" else "float32")
    itemsize = 2 if dtype in ("bfloat16", "float16") else 4
    if ns.sizes:
        sizes = [parse_size(x) for x in ns.sizes.split(",")]
    else:
        sizes = sorted(set(step_sizes(ns.hidden, itemsize=itemsize)) | {1 << p for p in range(12, 24)})
    backends = ns.backend or (["nccl", "symm_mem", "symm_mem_ll"] if ns.device == "cuda" else ["gloo"])
    iters = ns.iters or (200 if ns.device == "cuda" else 20)
    rows, failures = bench(
        backends, ns.tp, ns.device, sizes, dtype, iters, parse_env(ns.nccl_env), log=lambda m: print(m, file=sys.stderr, flush=True)
    )
    if rows:
        if ns.plot:
            latency_plot(rows, ns.plot)
        print(json.dumps(rows) if ns.json else table(rows))
    if failures:  # the rows that did run are printed above
        raise UserError(f"{len(failures)} of the benchmarks failed; first: {failures[0]}")
    return 0


def _add_bench_search(sub) -> None:
    p = sub.add_parser("bench-search", help="replay finished studies as a tabular benchmark of search strategies")
    p.add_argument("experiment", help="experiment YAML: the search space the strategies search")
    p.add_argument("--set", action="append", default=[], metavar="dotted.key=value", help="override a YAML field (repeatable)")
    p.add_argument("--storage", default=None, help="Optuna storage URL of the record (default: the YAML's study.storage)")
    p.add_argument("--tracking", default=None, help="MLflow tracking URI of the record (metrics a trial's Optuna record lacks)")
    p.add_argument("--studies", required=True, help="comma list of finished studies of one model and workload, pooled into one landscape")
    p.add_argument("--budget", type=int, required=True, help="trials each strategy is offered, the baseline included")
    p.add_argument("--seeds", type=int, default=20, help="seeds per strategy (medians over them)")
    p.add_argument("--sampler", action="extend", nargs="+", default=None, help="strategies to compare (default: tpe random gp model)")
    p.add_argument("--json", action="store_true", help='print {"default": ..., "strategies": {...}} on stdout (the table on stderr)')
    p.set_defaults(handler=_bench_search)


def _bench_search(ns: argparse.Namespace) -> int:
    from orchestrator.config.schema import load_config
    from orchestrator.search.benchmark import STRATEGIES, bench, check_args, load_landscape, loo_lines, open_record, table

    cfg = load_config(ns.experiment, ns.set)
    strategies = list(dict.fromkeys(ns.sampler or STRATEGIES))
    check_args(ns.budget, ns.seeds, strategies)
    studies = [s.strip() for s in ns.studies.split(",") if s.strip()]
    land = load_landscape(cfg, open_record(cfg, ns.storage), studies, ns.tracking)
    result = bench(cfg, land, strategies, ns.budget, ns.seeds)
    text = table(result, ns.seeds)
    if ns.json:
        print(text, *loo_lines(result), sep="\n", file=sys.stderr)
        print(json.dumps(result.as_json()))
    else:
        print(text)
    return 0


def _add_train_drafter(sub) -> None:
    from orchestrator.prompts.loading import SPLITS
    from orchestrator.train_options import TrainOptions

    d = TrainOptions()
    p = sub.add_parser("train-drafter", help="train an EAGLE-3 head on the target's own responses (public checkpoint format)")
    p.add_argument("--model", default=d.model, help="the target: checkpoint directory or smollm2-135m")
    p.add_argument("--prompts", default=d.prompts, help="Spec-Bench-style JSONL (default: the bundled questions)")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (after --split)")
    p.add_argument("--split", choices=SPLITS, default=d.split, help="train: 3 of every 4 prompts per category; heldout: the 4th")
    p.add_argument(
        "--synthetic-prompts",
        type=int,
        default=d.synthetic_prompts,
        help="add N made-up instruction prompts (orchestrator/prompts/synthesis.py)",
    )
    p.add_argument(
        "--self-prompts",
        type=int,
        default=d.self_prompts,
        help="add N user prompts the target writes itself from its chat template (Magpie; a chat model)",
    )
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="response length per prompt")
    p.add_argument("--max-steps", type=int, default=d.max_steps, help="optimizer steps")
    p.add_argument("--ttt-steps", type=int, default=d.ttt_steps, help="draft steps unrolled in the training-time test")
    p.add_argument(
        "--no-prompt-labels",
        dest="prompt_labels",
        action="store_false",
        help="train on response positions only (default: prompt positions too, labelled with the target's argmax)",
    )
    p.add_argument("--draft-vocab", type=int, default=d.draft_vocab, help="reduced draft vocabulary (most frequent tokens)")
    p.add_argument("--batch", type=int, default=d.batch, help="responses per optimizer step")
    p.add_argument("--pack-tokens", type=int, default=d.pack_tokens, help="a batch runs packed in passes of at most N tokens")
    p.add_argument("--gen-batch", type=int, default=d.gen_batch, help="prompts the target answers together")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--device", default=d.device, help="cpu or cuda")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads")
    p.add_argument("--save-every", type=int, default=d.save_every, help="checkpoint (and resume point) every N steps")
    p.add_argument(
        "--max-time", type=float, default=d.max_time, help="stop training after S seconds, saved and summarised (0: --max-steps only)"
    )
    p.add_argument(
        "--val-every",
        type=int,
        default=d.val_every,
        help="keep every Nth response out of training; its accuracy picks the head saved (0: the last step)",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", required=True, help="output folder: config.json + model.safetensors (+ data.pt, train_state.pt)")
    p.set_defaults(handler=_train_drafter)


def _train_drafter(ns: argparse.Namespace) -> int:
    from dataclasses import fields

    from orchestrator.train_drafter import TrainOptions, train

    names = {f.name for f in fields(TrainOptions)}
    summary = train(TrainOptions(**{k: v for k, v in vars(ns).items() if k in names}))
    last = summary["history"][-1] if summary["history"] else {}
    print(json.dumps({"out": summary["out"], "steps": summary["steps"], "loss": last.get("loss"), "acc": last.get("acc")}))
    return 0


def _add_experiment_commands(sub) -> None:
    from orchestrator.export.formats import FORMATS as EXPORT_FORMATS

    for name, help_, handler in (
        ("run", "run (or resume) the study of an experiment YAML", _run),
        ("validate", "check an experiment YAML against the model, the prompts and the backends", _validate),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("experiment", help="experiment YAML (see experiments/)")
        p.add_argument("--set", action="append", default=[], metavar="dotted.key=value", help="override a YAML field (repeatable)")
        p.set_defaults(handler=handler)
    sub.choices["run"].add_argument(
        "--json", action="store_true", help="print the full JSON summary on stdout (it always goes to the file the run names)"
    )
    p = sub.add_parser("report", help="explain the winner: summary, performance model, breakeven, HTML report")
    p.add_argument("experiment")
    p.add_argument("--set", action="append", default=[], metavar="dotted.key=value")
    p.add_argument("--out", default=None, help="folder for report.html, best_config.yaml, summary.json")
    p.add_argument(
        "--bench",
        default=None,
        help="a `bench-allreduce --json` output: the performance model's allreduce term (rounds x latency) and what-if estimates over its setups",
    )
    p.set_defaults(handler=_report)
    p = sub.add_parser(
        "export", help="the per-batch-size schedule of a study, for a serving engine (json | vllm | sglang | trtllm | env | all)"
    )
    p.add_argument("experiment")
    p.add_argument("--set", action="append", default=[], metavar="dotted.key=value")
    p.add_argument(
        "--to",
        dest="fmt",
        choices=(*EXPORT_FORMATS, "all"),
        default="json",
        help="output format; all: every format into the folder --out names, with a README.md",
    )
    p.add_argument("--out", default=None, help="write to this file (default: print); with --to all, a folder")
    p.set_defaults(handler=_export)
    p = sub.add_parser("schema", help="print (or write) the JSON schema of experiment YAMLs")
    p.add_argument("--out", default=None)
    p.set_defaults(handler=_schema)


def _validate(ns: argparse.Namespace) -> int:
    from orchestrator.config.schema import load_config
    from orchestrator.execution.validate import check_experiment

    cfg = load_config(ns.experiment, ns.set)
    prepared = check_experiment(cfg)
    print(
        f"{ns.experiment}: ok: study {cfg.study_name!r}, {cfg.study.n_trials} trials, model {prepared.model_path}, "
        f"{len(prepared.prompts)} prompts, space: {', '.join(cfg.search.space)}"
    )
    for note in prepared.notes:
        print(f"spectune: note: {note}", file=sys.stderr)
    return 0


def _run(ns: argparse.Namespace) -> int:
    from orchestrator.config.schema import load_config, spectune_home
    from orchestrator.explain.report import after_run
    from orchestrator.study.loop import run_study

    cfg = load_config(ns.experiment, ns.set)
    # stdout carries the run's own short lines only: whatever Ray forwards from its processes (a lost
    # raylet's last log lines, an actor's prints) goes to stderr with the progress
    with contextlib.redirect_stdout(sys.stderr):
        summary = run_study(cfg)
        if summary.get("complete"):
            after_run(cfg)  # the report's page and charts on the parent MLflow run
    # the ranked table went to stderr with the progress lines; stdout ends with where the whole
    # summary is and the verdict, each one short line (the JSON itself with --json)
    path = spectune_home() / "summaries" / f"{cfg.study_name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, default=str, indent=1) + "\n")
    if ns.json:
        print(json.dumps(summary, default=str))
    else:
        print(f"spectune: summary: {path}")
        print(verdict_line(summary))
    return 0 if summary["complete"] >= summary["n_trials"] or summary.get("space_exhausted") else 1


def verdict_line(summary: dict) -> str:
    """The run's last line on stdout: trials complete, and why fewer than asked where the space ran out."""
    verdict = (summary.get("ranking") or {}).get("verdict") or "no COMPLETE trial"
    done = f"{summary['complete']}/{summary['n_trials']} trials complete"
    if summary.get("space_exhausted") and summary["complete"] < summary["n_trials"]:
        size = summary.get("space_size")
        done += f" (all {size} configurations of the search space were tried)" if size else " (every configuration of the space was tried)"
    return f"spectune: {done}; {verdict}"


def _report(ns: argparse.Namespace) -> int:
    from orchestrator.config.schema import load_config
    from orchestrator.explain.report import report

    report(load_config(ns.experiment, ns.set), ns.out, bench=ns.bench)
    return 0


def _export(ns: argparse.Namespace) -> int:
    from orchestrator.config.schema import load_config
    from orchestrator.explain.perfcheck import open_study
    from orchestrator.export.formats import render
    from orchestrator.export.schedule import build_schedule
    from workers.model.locate import resolve_model_path

    if ns.fmt == "all" and not ns.out:
        raise UserError("--to all: needs --out DIR, the folder for every format")
    if ns.fmt == "all" and Path(ns.out).exists() and not Path(ns.out).is_dir():
        raise UserError(f"--out {ns.out}: is a file; --to all writes a folder of files")
    cfg = load_config(ns.experiment, ns.set)
    study = open_study(cfg)
    schedule = build_schedule(study, model=str(resolve_model_path(cfg.model.path)), dtype=cfg.model.dtype, device=cfg.parallel.device)
    if not schedule["schedule"]:
        raise UserError(f"study {cfg.study_name!r} has no COMPLETE trial to export: run `spectune run` first")
    if ns.fmt == "all":
        from orchestrator.export.bundle import write_bundle

        try:
            paths = write_bundle(schedule, Path(ns.out))
        except OSError as e:
            raise UserError(f"--out {ns.out}: {e.strerror or e}") from None
        names = ", ".join(p.name for p in paths)
        print(f"spectune: every format of {len(schedule['schedule'])} batch size(s) written to {ns.out}: {names}", file=sys.stderr)
        return 0
    text = render(schedule, ns.fmt)
    if ns.out:
        try:
            with open(ns.out, "w") as f:
                f.write(text if text.endswith("\n") else text + "\n")
        except OSError as e:
            raise UserError(f"--out {ns.out}: {e.strerror or e}") from None
        print(f"spectune: {ns.fmt} schedule of {len(schedule['schedule'])} batch size(s) written to {ns.out}", file=sys.stderr)
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


def _schema(ns: argparse.Namespace) -> int:
    from orchestrator.config.schema import json_schema

    text = json.dumps(json_schema(), indent=1) + "\n"
    if ns.out:
        open(ns.out, "w").write(text)
    else:
        print(text, end="")
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other user error
        self.exit(2, f"spectune: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spectune", description="Tune speculative decoding for tensor-parallel LLMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_decode(sub)
    _add_experiment_commands(sub)
    _add_bench(sub)
    _add_bench_search(sub)
    _add_train_drafter(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    from orchestrator.execution.cluster import embedded_auth_env

    embedded_auth_env()  # an embedded Ray asks for a token too; Ray reads the mode when first imported
    try:
        return ns.handler(ns)
    except INPUT_ERRORS as e:
        print(f"spectune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # one line; `run` says how to resume
        print(e.args[0] if e.args else "spectune: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a failed gang or worker: one line, details only on request
        from workers.errors import GangError

        if isinstance(e, GangError):
            print(f"spectune: error: gang failed: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
