"""The parameter registry: one table of every parameter a trial resolves, by its dotted name.

Each row says where the parameter lives in the experiment YAML, its default and its limits. The
YAML sections take their defaults and bounds from here (orchestrator/config/schema.py), the search space
accepts exactly these names (plus `nccl.NCCL_*`), validation names a bad value by its YAML path or
its `search.space` entry (orchestrator/execution/validate.py), a trial's MLflow params are these names
(orchestrator/config/space.py `TrialConfig.params`), and the report writes the winner back into the YAML
through `set_yaml` (orchestrator/explain/report/core.py).

    p = lookup("spec.num_draft_tokens")   # Param(path=("drafter", "num_draft_tokens"), low=0, high=16, ...)
    p.problem(17)                         # "17 must be an integer between 0 and 16"
    value(cfg, "engine.gemv")             # the YAML's value (its default when left out)
    set_yaml(raw, "comm.backend", "nccl") # raw["parallel"]["backend"] = "nccl"

Implicit conditions (`active`): nccl.* only when comm.backend is nccl; drafter.* only when
spec.num_draft_tokens > 0; a row with `needs` only when that other parameter has one of its values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from workers.spec import DRAFTER_KINDS as KINDS
from workers.spec import DRAFTER_PLACEMENTS as PLACEMENTS
from workers.spec import MAX_DRAFT_TOKENS
from workers.spec.engine_config import ENGINE_FIELDS, EngineConfig

NCCL_VAR = re.compile(r"^NCCL_[A-Z0-9_]+$")


@dataclass(frozen=True)
class Param:
    name: str  # dotted: what the search space, Optuna and MLflow call it
    path: tuple[str, ...]  # where the experiment YAML holds its default
    default: Any
    kind: type  # int, str or bool
    doc: str
    choices: tuple | None = None
    low: int | None = None
    high: int | None = None
    needs: tuple[str, tuple] | None = None  # active only when that parameter has one of these values

    @property
    def yaml_key(self) -> str:
        return ".".join(self.path)

    def coerce(self, value):
        """YAML 1.1 reads `off` / `on` as booleans: a choice spelled so is taken back as its word."""
        if self.kind is str and isinstance(value, bool) and self.choices and (word := "on" if value else "off") in self.choices:
            return word
        return value

    def problem(self, value) -> str | None:
        """None if `value` is one this parameter takes, else what is wrong with it (no field name)."""
        if value is None and self.default is None:
            return None
        if self.kind is bool:
            return None if isinstance(value, bool) else f"{value!r} is not true or false"
        if self.kind is int:
            if not isinstance(value, int) or isinstance(value, bool):
                return f"{value!r} is not an integer"
            if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
                if self.high is None:
                    return f"{value!r} must be an integer of at least {self.low}"
                return f"{value!r} must be an integer between {self.low} and {self.high}"
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not one of {', '.join(map(str, self.choices))}"
        return None


_ENGINE_DEFAULTS = EngineConfig()

PARAMS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("parallel.tp", ("parallel", "tp"), 1, int, "tensor-parallel verifier ranks", low=1, high=64),
        Param("comm.backend", ("parallel", "backend"), "gloo", str, "allreduce backend: gloo, nccl, symm_mem, symm_mem_ll"),
        Param(
            "spec.num_draft_tokens",
            ("drafter", "num_draft_tokens"),
            4,
            int,
            "k, tokens drafted per step (0: plain decoding)",
            low=0,
            high=MAX_DRAFT_TOKENS,
        ),
        Param("drafter.kind", ("drafter", "kind"), "ngram", str, "drafter: " + ", ".join(KINDS), choices=KINDS),
        Param(
            "drafter.layers",
            ("drafter", "layers"),
            None,
            int,
            "layer_skip: the verifier's first layers that draft",
            low=1,
            needs=("drafter.kind", ("layer_skip",)),
        ),
        Param(
            "drafter.ngram_max",
            ("drafter", "ngram_max"),
            3,
            int,
            "ngram: the longest n-gram matched",
            low=1,
            high=8,
            needs=("drafter.kind", ("ngram",)),
        ),
        Param(
            "drafter.model_path",
            ("drafter", "model_path"),
            None,
            str,
            "draft_model: a checkpoint with the model's tokenizer; eagle3: an EAGLE-3 head",
            needs=("drafter.kind", ("draft_model", "eagle3")),
        ),
        Param(
            "drafter.placement",
            ("drafter", "placement"),
            "actor",
            str,
            "eagle3: the head as its own process (actor) or inside the verifier ranks (rank0)",
            choices=PLACEMENTS,
            needs=("drafter.kind", ("eagle3",)),
        ),
        Param(
            "drafter.lookup",
            ("drafter", "lookup"),
            0,
            int,
            "eagle3: n-gram lookup of the last N tokens: a chain drafts what followed their earlier occurrence instead of the head; a tree adds the continuations of the two longest matches (N down to 1 token) as branches; 0: the head alone",
            low=0,
            high=8,
            needs=("drafter.kind", ("eagle3",)),
        ),
        Param(
            "drafter.tree_width",
            ("drafter", "tree_width"),
            0,
            int,
            "eagle3: 0/1 drafts a chain; w >= 2 a tree: the head's top-w tokens at each depth, verified in one pass under a tree mask",
            low=0,
            high=8,
            needs=("drafter.kind", ("eagle3",)),
        ),
        *(
            Param(
                f"engine.{f.name}",
                ("engine", f.name),
                getattr(_ENGINE_DEFAULTS, f.name),
                type(getattr(_ENGINE_DEFAULTS, f.name)),
                ENGINE_FIELDS[f.name][1],
                choices=ENGINE_FIELDS[f.name][0],
            )
            for f in fields(EngineConfig)
        ),
    )
}
ENGINE_PARAMS = tuple(n for n in PARAMS if n.startswith("engine."))


def lookup(name: str) -> Param:
    """The row of `name`; `nccl.NCCL_*` rows are made on demand (the YAML's parallel.nccl_env)."""
    if name in PARAMS:
        return PARAMS[name]
    var = name.removeprefix("nccl.")
    if name.startswith("nccl.") and NCCL_VAR.match(var):
        return Param(name, ("parallel", "nccl_env", var), None, str, "an NCCL environment variable of every rank")
    if name.startswith("nccl."):
        raise ValueError(f"{var!r} is not an NCCL_* variable")
    raise ValueError(f"unknown parameter (searchable: {', '.join(PARAMS)}, nccl.NCCL_*)")


def value(cfg, name: str) -> Any:
    """`name`'s value in the experiment `cfg` (an ExperimentConfig): the YAML's, or its default."""
    node = cfg
    for part in lookup(name).path:
        node = node.get(part) if isinstance(node, dict) else getattr(node, part)
    return node


def where(cfg, name: str) -> str:
    """How an error names `name`: its search-space entry where the study searches it, else its YAML path."""
    return f"search.space.{name}" if name in cfg.search.space else lookup(name).yaml_key


def set_yaml(raw: dict, name: str, v: Any) -> None:
    """Write `name` = v into an experiment YAML's dict (the report's best configuration)."""
    p = lookup(name)
    node = raw
    for part in p.path[:-1]:
        node = node.setdefault(part, {})
    node[p.path[-1]] = str(v) if name.startswith("nccl.") else v


def active(name: str, values: dict[str, Any], defaults) -> bool:
    """Whether `name` means anything given the other parameters' `values` (falling back to
    `defaults(name)` for those not among them): the implicit conditions of the module docstring."""
    get = lambda other: values[other] if other in values else defaults(other)  # noqa: E731
    if name.startswith("nccl."):
        return get("comm.backend") == "nccl"
    if name.startswith("drafter.") and get("spec.num_draft_tokens") <= 0:
        return False
    needs = lookup(name).needs
    return needs is None or get(needs[0]) in needs[1]


def engine_config(values: dict[str, Any], defaults) -> EngineConfig:
    """The EngineConfig of these searched `values` on top of `defaults(name)`."""
    return EngineConfig(**{n.removeprefix("engine."): values[n] if n in values else defaults(n) for n in ENGINE_PARAMS})
