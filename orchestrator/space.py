"""Search space: an Optuna trial -> `TrialConfig`. A pure function: no Ray, no storage access.

Parameters are suggested in dependency order (parallel.tp, comm.backend, spec.num_draft_tokens,
drafter.kind, then the rest as written in the YAML). A parameter is suggested only when active:
  nccl.*              only when comm.backend == nccl
  drafter.*           only when spec.num_draft_tokens > 0
  drafter.layers      only for layer_skip; drafter.ngram_max only for ngram; drafter.model_path only for draft_model
  `when: {p: v}`      only when parameter p took value v (or one of a list)
Inactive parameters are absent from the trial, so Optuna never learns from meaningless values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import CategoricalParam, ExperimentConfig, FloatParam, IntParam
from orchestrator.errors import UserError
from workers.spec import DrafterSpec

PRIORITY = ("parallel.tp", "comm.backend", "spec.num_draft_tokens", "drafter.kind")
DRAFTER_PARAM_KIND = {"drafter.layers": ("layer_skip",), "drafter.ngram_max": ("ngram",),
                      "drafter.model_path": ("draft_model", "eagle3"), "drafter.placement": ("eagle3",)}


@dataclass(frozen=True)
class TrialConfig:
    tp: int
    backend: str
    num_draft_tokens: int
    drafter: DrafterSpec
    nccl_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def params(self) -> dict[str, Any]:
        """Flattened, dotted names: the MLflow params of the contract."""
        p: dict[str, Any] = {
            "parallel.tp": self.tp,
            "comm.backend": self.backend,
            "spec.num_draft_tokens": self.num_draft_tokens,
            "drafter.kind": self.drafter.kind,
        }
        if self.drafter.kind == "layer_skip":
            p["drafter.layers"] = self.drafter.layers
        if self.drafter.kind == "ngram":
            p["drafter.ngram_max"] = self.drafter.ngram_max
        if self.drafter.kind in ("draft_model", "eagle3"):
            p["drafter.model_path"] = self.drafter.model_path
        if self.drafter.kind == "eagle3":
            p["drafter.placement"] = self.drafter.placement
        for k, v in self.nccl_env:
            p[f"nccl.{k}"] = v
        return p

    def describe(self) -> str:
        d = self.drafter.kind if self.num_draft_tokens else "-"
        extra = f" L={self.drafter.layers}" if self.drafter.kind == "layer_skip" else ""
        nccl = "".join(f" {k.removeprefix('NCCL_')}={v}" for k, v in self.nccl_env)
        return f"tp={self.tp} {self.backend}{nccl} k={self.num_draft_tokens} {d}{extra}"


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
    if name.startswith("nccl.") and values.get("comm.backend", cfg.parallel.backend) != "nccl":
        return False
    if name.startswith("drafter."):
        if values.get("spec.num_draft_tokens", cfg.drafter.num_draft_tokens) <= 0:
            return False
        need = DRAFTER_PARAM_KIND.get(name)
        if need and values.get("drafter.kind", cfg.drafter.kind) not in need:
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


def suggest(trial, cfg: ExperimentConfig) -> TrialConfig:
    """Ask `trial` (an optuna.Trial, or anything with suggest_*) for every active parameter."""
    values: dict[str, Any] = {}
    for name in ordered_names(cfg):
        p = cfg.search.space[name]
        if _active(name, p, values, cfg):
            values[name] = _suggest_one(trial, name, p)
    return resolve(values, cfg)


def resolve(values: dict[str, Any], cfg: ExperimentConfig) -> TrialConfig:
    """Searched values on top of the YAML defaults."""
    d = cfg.drafter
    k = int(values.get("spec.num_draft_tokens", d.num_draft_tokens))
    kind = values.get("drafter.kind", d.kind) if k > 0 else "none"
    if k > 0 and kind == "none":
        raise UserError("spec.num_draft_tokens > 0 needs a drafter: set drafter.kind or search it")
    drafter = DrafterSpec(
        kind=kind,
        model_path=values.get("drafter.model_path", d.model_path) if kind in ("draft_model", "eagle3") else None,
        placement=str(values.get("drafter.placement", d.placement)),
        layers=int(values.get("drafter.layers", d.layers or 0)) if kind == "layer_skip" else 0,
        ngram_max=int(values.get("drafter.ngram_max", d.ngram_max)),
    )
    backend = str(values.get("comm.backend", cfg.parallel.backend))
    env = dict(cfg.parallel.nccl_env) if backend == "nccl" else {}
    env.update({n.removeprefix("nccl."): str(v) for n, v in values.items() if n.startswith("nccl.")})
    return TrialConfig(
        tp=int(values.get("parallel.tp", cfg.parallel.tp)),
        backend=backend,
        num_draft_tokens=k,
        drafter=drafter,
        nccl_env=tuple(sorted(env.items())),
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
    defaults = {"parallel.tp": cfg.parallel.tp, "comm.backend": cfg.parallel.backend,
                "spec.num_draft_tokens": cfg.drafter.num_draft_tokens, "drafter.kind": cfg.drafter.kind,
                "drafter.layers": cfg.drafter.layers, "drafter.model_path": cfg.drafter.model_path,
                "drafter.placement": cfg.drafter.placement}
    return [defaults.get(name)]


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
