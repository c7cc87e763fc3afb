"""The flags of `spectune decode`, as fields of the experiment schema (orchestrator/config/schema.py).

Each flag either sets one YAML field of an experiment (`--tp 2` is `parallel.tp: 2`, `-k 4` is
`drafter.num_draft_tokens: 4`) or is an option of the decode run itself (`DecodeRun`: the baseline,
the peer baseline, Ray, deadlines). A flag left out leaves its field to the schema's default, except
the few where one decode measures more than a study's trial (`DECODE_DEFAULTS`). Errors of the
study's checks are named by the flag that set the field (`flag_of`).

    cfg, run = parse(["--model", "smollm2-135m", "--tp", "2", "-k", "4"])   # ExperimentConfig, DecodeRun
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, fields

from orchestrator.config.registry import PARAMS, PARAMS_BY_YAML, Param
from orchestrator.config.schema import ExperimentConfig, validated
from orchestrator.errors import UserError
from orchestrator.prompts.loading import SPLITS
from workers.spec.allreduce_table import presets


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # e.g. ("--num-draft-tokens", "-k")
    field: str  # the YAML field it sets, dotted (workload.batch_sizes takes [B])
    kwargs: dict  # argparse's (type, action, choices, help)


def _floats(text: str) -> list[float] | str:
    """'0.8,0.6,0.4' -> [0.8, 0.6, 0.4]; anything else is a file to read them from (the schema does)."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return text


def _f(names: str | tuple[str, ...], field: str, help: str, **kwargs) -> Flag:
    return Flag((names,) if isinstance(names, str) else names, field, {"help": help, **kwargs})


def _param_flag(p: Param) -> Flag:
    """The flag of a registry parameter, from its declaration: --field (or its own names), its doc as help;
    a bool that defaults to true is a --no-... switch."""
    if p.kind is bool:
        help = f"{p.yaml_key}={str(not p.default).lower()}: {p.flag_doc or p.doc}"
        return _f(p.flags, p.yaml_key, help, action="store_false" if p.default else "store_true")
    return _f(p.flags, p.yaml_key, p.flag_doc or p.doc, **({"type": int} if p.kind is int else {}))


PARAM_FLAGS = tuple(_param_flag(p) for p in PARAMS.values())

YAML_FLAGS = (
    _f("--model", "model.path", "checkpoint directory or the alias smollm2-135m"),
    _f("--dtype", "model.dtype", "float32 | bfloat16 | float16 (default: bfloat16 on cuda, float32 on cpu)"),
    _f("--device", "parallel.device", "cpu or cuda (one GPU per TP rank)"),
    *PARAM_FLAGS,
    _f("--threads", "parallel.threads", "torch threads per worker process", type=int),
    _f("--vocab-parallel", "parallel.vocab_parallel", "shard lm_head by vocabulary (logits all-gathered)", action="store_true"),
    _f(
        "--emulate-tp",
        "parallel.emulate_tp",
        "run one rank of TP N in one process, each allreduce a wait as --allreduce-table says (figures marked emulated)",
        type=int,
    ),
    _f(
        "--allreduce-table",
        "parallel.allreduce_table",
        "with --emulate-tp: a preset (" + ", ".join(presets()) + ") or a bench-allreduce --json file",
    ),
    _f("--prompts", "workload.prompts", "Spec-Bench-style JSONL (default: the bundled 240 questions)"),
    _f("--num-prompts", "workload.num_prompts", "use the first N prompts (default 8)", type=int),
    _f("--category", "workload.categories", "keep prompts of this category (repeatable)", action="append"),
    _f("--per-category", "workload.per_category", "the first N prompts of each category", type=int),
    _f(
        "--split",
        "workload.split",
        "train: 3 of every 4 prompts per category; heldout: the 4th (score a trained drafter here)",
        choices=SPLITS,
    ),
    _f("--max-new-tokens", "workload.max_new_tokens", "tokens generated per prompt (default 64)", type=int),
    _f("--temperature", "workload.temperature", "0 = greedy; > 0 = sampling with rejection-sampling verification", type=float),
    _f("--seed", "workload.seed", "sampling seed", type=int),
    _f(
        "--simulate-accept-len",
        "workload.simulate_accept_len",
        "accept exactly tau - 1 drafts per step (engine speed apart from drafter quality)",
        type=float,
    ),
    _f(
        "--simulate-accept-profile",
        "workload.simulate_accept_profile",
        "P(accepted >= i) for i = 1, 2, ..., comma separated, or a decode --json file of a real run (its accept_rate_pos_i): a step of k drafts keeps sum_{i<=k} P_i",
        type=_floats,
    ),
    _f(
        "--batch-size",
        "workload.batch_sizes",
        "decode B sequences per verify pass (static batches); B > 1 also runs plain decoding at batch 1 and at B",
        type=int,
    ),
    _f(
        "--context-len",
        "workload.context_lengths",
        "decode each prompt drawn to exactly L tokens (the other prompts' text before it): a KV cache of L tokens, as long prompts make",
        type=int,
    ),
)

# where one decode measures more than a study's trial does by default
DECODE_DEFAULTS = {"workload.num_prompts": 8, "workload.max_new_tokens": 64}


@dataclass(frozen=True)
class DecodeRun:
    """What `spectune decode` does with the configuration: not part of an experiment."""

    baseline: bool = True  # also run plain decoding (k = 0) on the same prompts and gang
    ngram_actor: bool = False  # the n-gram drafter as its own process on the draft link
    timeout_s: float = 1800.0  # seconds before a silent gang is torn down
    ablation_iters: int | None = None  # comm/compute split; default: a study trial's (orchestrator/execution/workload.py ABLATION_ITERS)
    peer_baseline: bool = False  # also time transformers' generate (and assisted generation with --draft-model)
    ray: bool = False  # the gang as Ray actors (RAY_ADDRESS or an embedded local Ray) instead of local processes
    json: bool = False  # print only the JSON object


RUN_FLAGS = (
    _f(
        "--ngram-actor",
        "ngram_actor",
        "run the n-gram drafter as its own process on the draft link (default: inside every verifier rank)",
        action="store_true",
    ),
    _f("--no-baseline", "baseline", "skip the k=0 baseline run", action="store_false"),
    _f("--timeout", "timeout_s", "seconds before a silent gang is torn down", type=float),
    _f("--ablation-iters", "ablation_iters", "steps timed with and without the allreduce (comm_fraction)", type=int),
    _f("--peer-baseline", "peer_baseline", "also time transformers' generate (and assisted generation)", action="store_true"),
    _f(
        "--ray",
        "ray",
        "run the gang as Ray actors (the cluster in RAY_ADDRESS, else an embedded local Ray) instead of local processes",
        action="store_true",
    ),
    _f("--json", "json", "print only the JSON object", action="store_true"),
)


def _dest(flag: Flag) -> str:
    return flag.field.replace(".", "__")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag, with no argparse default: a flag left out is absent from the namespace."""
    for flag in YAML_FLAGS + RUN_FLAGS:
        kwargs = dict(flag.kwargs)
        if flag in YAML_FLAGS:
            kwargs["help"] += f" [{flag.field}]"  # the YAML field it sets
        if kwargs.get("action") not in ("store_true", "store_false"):
            kwargs.setdefault("metavar", flag.field.split(".")[-1].upper())
        parser.add_argument(*flag.names, dest=_dest(flag), default=argparse.SUPPRESS, **kwargs)


def flag_of(field: str) -> str | None:
    """The flag that sets `field`, a YAML field or the search-space entry of one (None: no flag does)."""
    if field.startswith("search.space."):
        from orchestrator.config.registry import lookup

        try:
            field = lookup(field.removeprefix("search.space.")).yaml_key
        except (KeyError, ValueError):
            return None
    return next((f.names[0] for f in YAML_FLAGS if f.field == field), None)


_FIELD = re.compile(r"(?<![\w.-])(?:search\.space\.)?[a-z_]+\.[a-z_]+(?![\w.])")  # a dotted YAML field in a message


def flag_message(msg: str) -> str:
    """A study check's error, named by the flags the user typed: `search.space.spec.num_draft_tokens: ...`
    or `drafter.model_path: ...` becomes `--num-draft-tokens: ...` / `--draft-model: ...`, and so do the
    fields the message names."""
    field, sep, why = msg.partition(": ")
    flag = flag_of(field) if sep else None
    if not flag:
        return msg

    def named(m: re.Match) -> str:
        return flag_of(m.group(0)) or m.group(0)

    return f"{flag}: {_FIELD.sub(named, why)}"


def _registry_problem(given: dict) -> str | None:
    """The first given value a registry parameter refuses, in the registry's words (as validate's)."""
    for field, v in given.items():
        p = PARAMS_BY_YAML.get(field)
        if p is not None and (why := p.problem(v)):
            return f"{flag_of(field)} {why}"
    return None


def experiment(given: dict) -> ExperimentConfig:
    """The experiment of one decode from the YAML fields the flags set (dotted name -> value)."""
    if why := _registry_problem(given):
        raise UserError(why)
    values = {**DECODE_DEFAULTS, **given}
    if "workload.per_category" in given and "workload.num_prompts" not in given:
        values["workload.num_prompts"] = None  # every category's first N, however many that makes
    if "model.dtype" not in values:
        values["model.dtype"] = "bfloat16" if values.get("parallel.device") == "cuda" else "float32"
    for one_of_a_list in ("workload.batch_sizes", "workload.context_lengths"):
        if one_of_a_list in values:
            values[one_of_a_list] = [values[one_of_a_list]]
    # one trial: a space of one point (k, fixed), no baseline trial of its own
    k = values.get("drafter.num_draft_tokens", PARAMS["spec.num_draft_tokens"].default)
    raw: dict = {"name": "decode", "search": {"space": {"spec.num_draft_tokens": k}}, "study": {"n_trials": 1, "baseline": False}}
    for dotted, v in values.items():
        section, key = dotted.split(".")
        raw.setdefault(section, {})[key] = v
    return validated(raw)


def namespace_parts(ns: argparse.Namespace) -> tuple[dict, DecodeRun]:
    """Split a parsed namespace into the YAML fields given and the run's options."""
    given = {f.field: getattr(ns, _dest(f)) for f in YAML_FLAGS if hasattr(ns, _dest(f))}
    run = DecodeRun(**{f.field: getattr(ns, _dest(f)) for f in RUN_FLAGS if hasattr(ns, _dest(f))})
    return given, run


def parse(argv: list[str]) -> tuple[dict, DecodeRun]:
    """The YAML fields and run options of decode flags (tests, scripts): `decode(*parse([...]))`."""
    parser = argparse.ArgumentParser(prog="spectune decode")
    add_flags(parser)
    return namespace_parts(parser.parse_args(argv))


assert {f.name for f in fields(DecodeRun)} == {f.field for f in RUN_FLAGS}, "every run option has its flag"
