"""Search space: an Optuna trial -> `TrialConfig`. A pure function: no Ray, no storage access.

Parameters are suggested in dependency order (parallel.tp, comm.backend, spec.num_draft_tokens,
drafter.kind, then the rest as written in the YAML). A parameter is suggested only when active:
  nccl.*              only when comm.backend == nccl
  drafter.*           only when spec.num_draft_tokens > 0
  drafter.layers      only for layer_skip; drafter.ngram_max only for ngram; drafter.model_path only for draft_model
                      and eagle3; drafter.placement, drafter.lookup and drafter.tree_width only for eagle3
  `when: {p: v}`      only when parameter p took value v (or one of a list)
Inactive parameters are absent from the trial, so Optuna never learns from meaningless values.
Names, defaults and those conditions come from the parameter registry (orchestrator/config/registry.py).
"""

from __future__ import annotations

from typing import Any

from orchestrator.config import registry
from orchestrator.config.registry import TrialConfig
from orchestrator.config.schema import CategoricalParam, ExperimentConfig, FloatParam, IntParam
from orchestrator.errors import UserError
from orchestrator.record import BASELINE_TAG, flag
from workers.spec import NO_DRAFTER, DrafterSpec
from workers.spec.engine_config import EngineConfig

PRIORITY = ("parallel.tp", "comm.backend", "spec.num_draft_tokens", "drafter.kind")


def ordered_names(cfg: ExperimentConfig) -> list[str]:
    names = list(cfg.search.space)
    return [n for n in PRIORITY if n in names] + [n for n in names if n not in PRIORITY]


def check_conditions(cfg: ExperimentConfig) -> None:
    """Each `when` must refer to a parameter suggested before it."""
    order = ordered_names(cfg)
    for i, name in enumerate(order):
        for other in getattr(cfg.search.space[name], "when", None) or {}:
            if other not in order[:i]:
                raise UserError(f"search.space.{name}.when: {other!r} is decided after {name} (order: {', '.join(order)})")


def _active(name: str, p, values: dict[str, Any], cfg: ExperimentConfig) -> bool:
    if not registry.active(name, values, lambda other: registry.value(cfg, other)):
        return False
    for other, allowed in (getattr(p, "when", None) or {}).items():
        allowed = allowed if isinstance(allowed, list) else [allowed]
        if values.get(other) not in allowed:
            return False
    return True


def _suggest_one(trial, name: str, p) -> Any:
    if isinstance(p, CategoricalParam):
        return trial.suggest_categorical(name, p.choices)
    if isinstance(p, IntParam):
        return trial.suggest_int(name, p.low, p.high, step=p.step, log=p.log)
    if isinstance(p, FloatParam):
        return trial.suggest_float(name, p.low, p.high, log=p.log)
    return p  # a fixed value


def suggest(trial, cfg: ExperimentConfig, fixed: dict[str, Any] | None = None) -> TrialConfig:
    """Ask `trial` (an optuna.Trial, or anything with suggest_*) for every active parameter.
    `fixed` values (e.g. k = 0 for the baseline of a study that does not search k) are decided
    before the space and never suggested; parameters they deactivate are not suggested either."""
    values: dict[str, Any] = dict(fixed or {})
    for name in ordered_names(cfg):
        p = cfg.search.space[name]
        if name not in values and _active(name, p, values, cfg):
            values[name] = _suggest_one(trial, name, p)
    return resolve(values, cfg)


# (lower, upper) NCCL variable pairs: a trial whose lower bound is above its upper bound is not run
NCCL_ORDERED = (("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"), ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS"))


def constraint_violation(tc: TrialConfig) -> str | None:
    """Why `tc` must not run (one line), or None. Rules: min <= max for each pair of NCCL_ORDERED, and an
    n-gram drafter's drafter.ngram_min <= drafter.ngram_max."""
    d = tc.drafter
    if d.kind == "ngram" and d.ngram_min > d.ngram_max:
        return f"constraint: drafter.ngram_min={d.ngram_min} is above drafter.ngram_max={d.ngram_max} (min must be <= max); not run"
    env = dict(tc.nccl_env)
    for lo, hi in NCCL_ORDERED:
        try:
            if lo in env and hi in env and int(env[lo]) > int(env[hi]):
                return f"constraint: {lo}={env[lo]} is above {hi}={env[hi]} (min must be <= max); not run"
        except ValueError:
            continue  # not integers: NCCL itself rejects them at start-up
    return None


def check_constraints(cfg: ExperimentConfig) -> None:
    """A space whose every trial would violate a constraint is bad input (the study would never finish)."""
    for lo, hi in NCCL_ORDERED:
        values = [
            [
                v
                for v in (candidates(cfg, f"nccl.{var}") if f"nccl.{var}" in cfg.search.space else [cfg.parallel.nccl_env.get(var)])
                if v is not None
            ]
            for var in (lo, hi)
        ]
        try:
            never = all(values) and min(int(v) for v in values[0]) > max(int(v) for v in values[1])
        except ValueError:
            continue  # not integers: NCCL itself rejects them at start-up
        if never:
            raise UserError(f"search.space.nccl.{lo}: every value is above every {hi} value (min must be <= max)")


def resolve(values: dict[str, Any], cfg: ExperimentConfig) -> TrialConfig:
    """Searched values on top of the YAML defaults (every name through the registry)."""

    def get(name: str) -> Any:
        return values[name] if name in values else registry.value(cfg, name)

    k = int(get("spec.num_draft_tokens"))
    kind = get("drafter.kind") if k > 0 else "none"
    if k > 0 and kind == "none":
        raise UserError("spec.num_draft_tokens > 0 needs a drafter: set drafter.kind or search it")
    # a drafter's own parameters from the YAML or the search where they apply to `kind`, else their defaults
    values = {**values, "drafter.kind": kind}
    default = lambda n: registry.lookup(n).default  # noqa: E731
    drafter = DrafterSpec(**registry.section_values("drafter", lambda n: get(n) if registry.active(n, values, get) else default(n)))
    if kind == "none":
        drafter = NO_DRAFTER
    backend = str(get("comm.backend"))
    env = dict(cfg.parallel.nccl_env) if backend == "nccl" else {}
    env.update({n.removeprefix("nccl."): str(v) for n, v in values.items() if n.startswith("nccl.")})
    try:
        engine = EngineConfig(**registry.section_values("engine", get))
    except ValueError as e:
        raise UserError(str(e)) from None
    return TrialConfig(
        tp=int(get("parallel.tp")),
        backend=backend,
        num_draft_tokens=k,
        drafter=drafter,
        nccl_env=tuple(sorted(env.items())),
        engine=engine,
    )


def candidates(cfg: ExperimentConfig, name: str) -> list[Any]:
    """Every value `name` can take (for validation): its choices, its range ends, or its default."""
    p = cfg.search.space.get(name)
    if isinstance(p, CategoricalParam):
        return list(p.choices)
    if isinstance(p, IntParam):
        return list(range(p.low, p.high + 1, p.step))
    if isinstance(p, FloatParam):
        return [p.low, p.high]
    if p is not None:
        return [p]
    return [registry.value(cfg, name)]


def baseline_params(cfg: ExperimentConfig) -> dict[str, Any]:
    """Params of the k = 0 trial enqueued first: no drafting, the first backend choice."""
    params: dict[str, Any] = {"spec.num_draft_tokens": 0}
    for name in ("parallel.tp", "comm.backend"):
        if isinstance(cfg.search.space.get(name), CategoricalParam):
            params[name] = cfg.search.space[name].choices[0]
    return params


def grid_space(cfg: ExperimentConfig) -> dict[str, list]:
    space = {}
    for name, p in cfg.search.space.items():
        if isinstance(p, FloatParam):
            raise UserError(f"search.space.{name}: the grid sampler needs choices or an int range, not a float range")
        if isinstance(p, (CategoricalParam, IntParam)):
            space[name] = candidates(cfg, name)
    return space


# a space larger than this is not enumerated: it counts as unbounded (never exhausted)
MAX_ENUMERATED = 20_000


def distinct_configs(cfg: ExperimentConfig) -> dict[str, dict[str, Any]] | None:
    """Every distinct configuration of the space, by identity (`config_identity`) -> the params that
    enqueue it; None when the space is not finite or too large to list (a float range, or more than
    MAX_ENUMERATED combinations). Values that resolve alike are one configuration (k = 0 with any
    drafter, tree widths 0 and 1); configurations that break a constraint are left out."""
    import itertools

    import optuna

    try:
        grid = grid_space(cfg)
    except UserError:
        return None
    size = 1
    for values in grid.values():
        size *= len(values)
    if size > MAX_ENUMERATED:
        return None
    names = list(grid)
    out: dict[str, dict[str, Any]] = {}
    for combo in itertools.product(*(grid[n] for n in names)):
        trial = optuna.trial.FixedTrial(dict(zip(names, combo)))
        try:
            tc = suggest(trial, cfg)
        except UserError:
            continue
        if constraint_violation(tc) is None:
            out.setdefault(config_identity(tc), dict(trial.params))
    return out


def config_identity(tc: TrialConfig) -> str:
    """One configuration's identity: its resolved parameters (two trials that resolve alike are one)."""
    import json

    return json.dumps({k: str(v) for k, v in sorted(tc.params().items())}, sort_keys=True)


def trial_config(trial, cfg: ExperimentConfig) -> TrialConfig:
    """The trial's configuration. An enqueued baseline of a study that does not search k is k = 0
    all the same (k is decided before the space, so no drafter parameter is suggested for it)."""
    baseline = flag(trial.user_attrs.get(BASELINE_TAG)) and "spec.num_draft_tokens" not in cfg.search.space
    return suggest(trial, cfg, {"spec.num_draft_tokens": 0} if baseline else None)


def identity_of(trial, cfg: ExperimentConfig) -> str | None:
    """The configuration a trial (asked, or finished: a FrozenTrial) runs, as one identity
    (`space.config_identity`); None where it does not resolve (run_trial then fails with the reason)."""
    try:
        return config_identity(trial_config(trial, cfg))
    except Exception:  # noqa: BLE001 - a space the trial cannot resolve: run_trial records why
        return None
