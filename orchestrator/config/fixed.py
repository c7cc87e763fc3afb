"""The fixed part of a study's configuration: everything that decides what a trial measures, apart
from the searched parameters. It is stored in the Optuna study (user attr `spectune.fixed`) when the
study is created; a later `spectune run` of the same `study.name` must have the same fixed part, or
it would add trials measured under other conditions (another TP size, model, workload ...) to the
old study and rank them together. What may change on resume: the trial budget and the sampler
(study.n_trials, seed, sampler, pruner, baseline, bench_allreduce, max_failed_trials, baseline_repeats,
race_trials) and how trials are placed (max_concurrent_trials, isolation),
limits, tracking and the experiment's name.

A searched parameter's YAML default is not fixed (the space decides it); its definition in
`search.space` is (a resumed study keeps its space).

    from orchestrator.config.fixed import check_resume, record
    check_resume(storage, cfg)   # before anything starts: UserError (exit 2) naming the differing fields
    record(study, cfg)           # once the study exists
"""

from __future__ import annotations

import json

from orchestrator.config.registry import PARAMS
from orchestrator.config.schema import ExperimentConfig
from orchestrator.errors import UserError
from orchestrator.record import FIXED_ATTR

CHANGEABLE = (
    "name",
    "study.name",
    "study.n_trials",
    "study.storage",
    "study.sampler",
    "study.seed",
    "study.pruner",
    "study.baseline",
    "study.bench_allreduce",
    "study.max_failed_trials",
    "study.baseline_repeats",
    "study.max_concurrent_trials",
    "study.isolation",
    # the file a profile was read from: its values are compared (the same run's JSON by another path resumes)
    "workload.simulate_accept_profile_from",
    "workload.simulate_accept_profile_from.",
    "study.race_trials",
    "limits.",
    "tracking.",
)
# a searched name -> its YAML field, where the two differ (spec.num_draft_tokens, comm.backend): from the declarations
SEARCHED_FIELD = {n: p.yaml_key for n, p in PARAMS.items() if n != p.yaml_key}


def _flatten(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _field(param: str) -> str:
    if param.startswith("nccl."):
        return "parallel.nccl_env." + param.removeprefix("nccl.")
    return SEARCHED_FIELD.get(param, param)


def fixed_part(cfg: ExperimentConfig) -> dict:
    """Dotted field -> its value (JSON types, stored as they are: no JSON inside JSON), for every
    field that must not change on resume."""
    flat = _flatten(cfg.model_dump(mode="json", exclude={"search"}))
    searched = {_field(name) for name in cfg.search.space}
    keep = {
        k: v for k, v in flat.items() if k not in searched and not any(k == c or (c.endswith(".") and k.startswith(c)) for c in CHANGEABLE)
    }
    for name, p in cfg.search.space.items():
        keep[f"search.space.{name}"] = p.model_dump(mode="json", exclude_none=True) if hasattr(p, "model_dump") else p
    return dict(sorted(keep.items()))


def _as_json(part: dict) -> dict[str, str]:
    """Dotted field -> JSON text of its value, whichever way the part was stored: as plain values
    (today's), or as JSON text per value (studies created before; every value a string that
    parses). A plain part always holds numbers or booleans too (trial budgets, token counts), so
    the two forms are told apart by the whole record, never per value."""

    def parses(v) -> bool:
        try:
            json.loads(v)
        except (TypeError, ValueError):
            return False
        return True

    if part and all(isinstance(v, str) and parses(v) for v in part.values()):
        return dict(part)
    return {k: json.dumps(v, sort_keys=True) for k, v in part.items()}


def _default(dotted: str) -> str | None:
    """JSON of a config field's default (None if the path is not a field with a default)."""
    model, parts = ExperimentConfig, dotted.split(".")
    for i, name in enumerate(parts):
        field = getattr(model, "model_fields", {}).get(name)
        if field is None:
            return None
        if i == len(parts) - 1:
            if field.is_required():
                return None
            value = field.get_default(call_default_factory=True)
            return json.dumps(value.model_dump(mode="json") if hasattr(value, "model_dump") else value, sort_keys=True)
        model = field.annotation
    return None


def differences(stored: dict, now: dict) -> list[tuple[str, str | None, str | None]]:
    """Fields whose values differ. A field the stored part lacks (added to spectune after the study
    was created) matches when it holds its default: what the old study measured under."""
    out = []
    stored, now = _as_json(stored), _as_json(now)
    for k in sorted(stored.keys() | now.keys()):
        a, b = stored.get(k), now.get(k)
        if a is None and b is not None and b == _default(k):
            continue
        if a != b:
            out.append((k, a, b))
    return out


def _param(field: str) -> str:
    """The searchable parameter a YAML field holds the default of (`_field` backwards)."""
    if field.startswith("parallel.nccl_env."):
        return "nccl." + field.removeprefix("parallel.nccl_env.")
    return {v: k for k, v in SEARCHED_FIELD.items()}.get(field, field)


def _said(part: dict[str, str], key: str, value: str | None) -> str:
    """What a fixed part holds for `key`, in words: its value; for a field it leaves out, why (the space
    searched it, or the part was recorded before spectune had the field: its default then)."""
    if value is not None:
        return value
    if key.startswith("search.space."):
        return "not searched"
    if (space := part.get(f"search.space.{_param(key)}")) is not None:
        return f"searched (search.space.{_param(key)}: {space})"
    default = _default(key)
    return "not set" if default is None else f"{default} (the default)"


def check_resume(storage, cfg: ExperimentConfig) -> None:
    """An existing study of this name must have been run with the same fixed part."""
    try:
        study_id = storage.get_study_id_from_name(cfg.study_name)
    except KeyError:
        return  # a new study
    stored = storage.get_study_user_attrs(study_id).get(FIXED_ATTR)
    if stored is None:
        return  # created before the fixed part was recorded: adopted by `record`
    now = fixed_part(cfg)
    diff = differences(stored, now)
    if diff:
        old, new = _as_json(stored), _as_json(now)
        shown = "; ".join(f"{k} was {_said(old, k, a)}, now {_said(new, k, b)}" for k, a, b in diff[:4])
        more = f" and {len(diff) - 4} more" if len(diff) > 4 else ""
        raise UserError(
            f"{', '.join(k for k, _, _ in diff)}: differ from the study {cfg.study_name!r} being resumed "
            f"({shown}{more}); run it with its settings, or start a new study with --set study.name=NEW_NAME"
        )


def record(study, cfg: ExperimentConfig) -> None:
    if FIXED_ATTR not in study.user_attrs:
        study.set_user_attr(FIXED_ATTR, fixed_part(cfg))
