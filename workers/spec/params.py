"""One declaration per parameter: a dataclass field made with `param(...)` is a parameter a trial
resolves, and everything else is derived from that one line (torch-free; the workers' side of the
contract declares its own fields, the driver reads them).

    @dataclass(frozen=True)
    class DrafterSpec:
        ngram_max: int = param(3, "ngram: the longest n-gram matched", low=1, high=8, drafters=("ngram",))

From such a field the driver derives (orchestrator/config/registry.py): the registry row `drafter.ngram_max`
(its search-space name and MLflow param), the YAML field `drafter.ngram_max` with its default, bounds and
documentation (orchestrator/config/schema.py), `spectune decode --ngram-max` (orchestrator/decode/flags.py),
when it is active (`drafters`: only with those drafter kinds), and the trial's value of it
(`TrialConfig.params`). A field made with plain `field(...)` or a bare default is internal: not searched,
not in the YAML, not recorded.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

PARAM = "spectune.param"  # the dataclass field's metadata key


@dataclass(frozen=True)
class Declared:
    """What a `param(...)` field says beyond its name and default."""

    doc: str  # one line: the YAML schema's description, decode's --help, docs/reference.md
    choices: tuple | None = None
    low: int | None = None
    high: int | None = None
    drafters: tuple[str, ...] | None = None  # active only with these drafter kinds (drafter.* fields)
    name: str | None = None  # the search-space / MLflow name, where not "<section>.<field>"
    yaml: tuple[str, ...] | None = None  # the YAML path, where not (section, field)
    flags: tuple[str, ...] | None = None  # decode's flag(s), where not --<field-with-dashes> (--no-<field> for a switch on by default)
    flag_doc: str | None = None  # decode's help where the flag reads otherwise (--no-compile: sets false)


def param(default: Any, doc: str, **kw: Any) -> Any:
    """A dataclass field that is a parameter (see the module docstring for what derives from it)."""
    return field(default=default, metadata={PARAM: Declared(doc, **kw)})


def declared(cls: type) -> list[tuple[str, Any, Declared]]:
    """(field name, default, declaration) of each `param(...)` field of dataclass `cls`, in order."""
    out = []
    for f in fields(cls):
        if PARAM in f.metadata:
            assert f.default is not MISSING, f"{cls.__name__}.{f.name}: a parameter has a default"
            out.append((f.name, f.default, f.metadata[PARAM]))
    return out


def check_choices(cls: type, obj: Any, section: str) -> None:
    """Every declared field of `obj` holds a value its declaration allows (bools are true or false)."""
    for name, default, d in declared(cls):
        value = getattr(obj, name)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{section}.{name}: {value!r} is not true or false")
        elif d.choices is not None and value not in d.choices:
            raise ValueError(f"{section}.{name}: {value!r} is not one of {', '.join(map(str, d.choices))}")
