"""The parameters a trial resolves: `TrialConfig` (the values of one trial) and the registry, one row
per parameter, derived from the parameter's one declaration (`param(...)` on a dataclass field:
workers/spec/params.py) on `TrialConfig` itself, `DrafterSpec` (drafter.*) or `EngineConfig` (engine.*).

A row says where the parameter lives in the experiment YAML, its default, its limits and when it is
active. The YAML sections take their fields from here (orchestrator/config/schema.py), so do decode's
flags (orchestrator/decode/flags.py); the search space accepts exactly these names (plus `nccl.NCCL_*`),
validation names a bad value by its YAML path or its `search.space` entry
(orchestrator/execution/validate.py), a trial's MLflow params are these names (`TrialConfig.params`), and
the report writes the winner back into the YAML through `set_yaml` (orchestrator/explain/report/core.py).

    p = lookup("spec.num_draft_tokens")   # Param(path=("drafter", "num_draft_tokens"), low=0, high=16, ...)
    p.problem(17)                         # "17 must be an integer between 0 and 16"
    value(cfg, "engine.gemv")             # the YAML's value (its default when left out)
    set_yaml(raw, "comm.backend", "nccl") # raw["parallel"]["backend"] = "nccl"

A new parameter is one `param(...)` line on the dataclass whose code uses it. Implicit conditions
(`active`): nccl.* only when comm.backend is nccl; drafter.* only when spec.num_draft_tokens > 0; a
drafter's own parameter (`drafters=`) only with those drafter kinds.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field
from typing import Any

from workers.spec import MAX_DRAFT_TOKENS, NO_DRAFTER, DrafterSpec
from workers.spec.engine_config import EngineConfig
from workers.spec.params import declared, param

NCCL_VAR = re.compile(r"^NCCL_[A-Z0-9_]+$")


@dataclass(frozen=True)
class TrialConfig:
    """One trial's resolved configuration: what the gang runs and what MLflow records."""

    tp: int = param(1, "tensor-parallel verifier ranks", low=1, high=64, name="parallel.tp", yaml=("parallel", "tp"))
    backend: str = param("gloo", "allreduce backend: gloo, nccl, symm_mem, symm_mem_ll", name="comm.backend", yaml=("parallel", "backend"))
    num_draft_tokens: int = param(
        4,
        "k, tokens drafted per step (0: plain decoding)",
        low=0,
        high=MAX_DRAFT_TOKENS,
        name="spec.num_draft_tokens",
        yaml=("drafter", "num_draft_tokens"),
        flags=("--num-draft-tokens", "-k"),
    )
    drafter: DrafterSpec = field(default_factory=lambda: NO_DRAFTER)
    nccl_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def params(self) -> dict[str, Any]:
        """Every resolved parameter by its registry name: the MLflow params of the contract. A
        drafter's own parameter appears only with that drafter (`Param.needs`)."""
        values = {n: p.read(self) for n, p in PARAMS.items()}
        p = {n: v for n, v in values.items() if (needs := PARAMS[n].needs) is None or values[needs[0]] in needs[1]}
        for k, v in self.nccl_env:
            p[f"nccl.{k}"] = v
        return p

    def describe(self) -> str:
        d = self.drafter.kind if self.num_draft_tokens else "-"
        extra = f" L={self.drafter.layers}" if self.drafter.kind == "layer_skip" else ""
        nccl = "".join(f" {k.removeprefix('NCCL_')}={v}" for k, v in self.nccl_env)
        default = EngineConfig().describe()
        engine = "".join(f" {k}={v}" for k, v in self.engine.describe().items() if v != default[k])
        return f"tp={self.tp} {self.backend}{nccl} k={self.num_draft_tokens} {d}{extra}{engine}"


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
    attr: tuple[str, ...] = ()  # where a TrialConfig holds it: ("tp",), ("drafter", "ngram_max")
    flags: tuple[str, ...] = ()  # spectune decode's flag(s)
    flag_doc: str | None = None  # decode's help, where the flag reads otherwise than `doc` (--no-compile)

    @property
    def yaml_key(self) -> str:
        return ".".join(self.path)

    def read(self, tc: TrialConfig) -> Any:
        node: Any = tc
        for a in self.attr:
            node = getattr(node, a)
        return node

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


# where each declaring dataclass sits in a TrialConfig, and the YAML section / name prefix of its fields
_SECTIONS: tuple[tuple[tuple[str, ...], type], ...] = (((), TrialConfig), (("drafter",), DrafterSpec), (("engine",), EngineConfig))


def _kind(cls: type, name: str, default: Any) -> type:
    """int, str or bool: the default's type, or the field's annotation where the default is None."""
    if default is not None:
        return type(default)
    hint = typing.get_type_hints(cls)[name]
    return next(t for t in typing.get_args(hint) if t is not type(None))


def _rows() -> dict[str, Param]:
    rows = {}
    for attr, cls in _SECTIONS:
        for fname, default, d in declared(cls):
            name = d.name or ".".join((*attr, fname))
            rows[name] = Param(
                name,
                d.yaml or (*attr, fname),
                default,
                _kind(cls, fname, default),
                d.doc,
                choices=(True, False) if isinstance(default, bool) else d.choices,
                low=d.low,
                high=d.high,
                needs=("drafter.kind", d.drafters) if d.drafters else None,
                attr=(*attr, fname),
                # a switch that defaults to on is turned off by --no-<field>
                flags=d.flags or (("--no-" if default is True else "--") + fname.replace("_", "-"),),
                flag_doc=d.flag_doc,
            )
    return rows


PARAMS: dict[str, Param] = _rows()
PARAMS_BY_YAML: dict[str, Param] = {p.yaml_key: p for p in PARAMS.values()}
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


def section_values(section: str, get) -> dict[str, Any]:
    """Field -> `get(name)` of every parameter a TrialConfig holds in `section` (drafter, engine)."""
    return {p.attr[1]: get(n) for n, p in PARAMS.items() if p.attr[:1] == (section,)}


def markdown_table() -> str:
    """docs/reference.md's table of the parameters, from their declarations (a test keeps it current):
    python -m orchestrator.config.registry"""

    def show(v: Any) -> str:
        return "-" if v is None else f"`{str(v).lower() if isinstance(v, bool) else v}`"

    lines = ["| parameter (search name) | YAML field | default | values | meaning |", "| --- | --- | --- | --- | --- |"]
    for p in PARAMS.values():
        if p.kind is bool:
            values = "true, false"
        elif p.choices:
            values = ", ".join(f"`{c}`" for c in p.choices)
        elif p.kind is int:
            values = f"{p.low}..{p.high}" if p.high is not None else f">= {p.low}"
        else:
            values = "text"
        lines.append(f"| `{p.name}` | `{p.yaml_key}` | {show(p.default)} | {values} | {p.doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
