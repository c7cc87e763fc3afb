"""Experiment YAML -> validated, typed `ExperimentConfig` (pydantic; unknown keys are errors).

    spectune validate experiments/smoke-cpu.yaml --set parallel.tp=4

Sections: name, model, drafter, parallel, engine, workload, search, study, tracking, limits. Values
left out take the defaults below (a tunable parameter's default and limits come from its row in
orchestrator/config/registry.py, the one parameter registry); `--set dotted.key=value` overrides any field before validation
(the value is parsed as YAML, so numbers, booleans and lists work). Errors become one line
naming the field: `search.space.nccl.NCCL_ALGO: NVLS ... is refused`.
`spectune schema` writes the JSON schema editors use (experiments/spectune.schema.json).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from orchestrator.config.envpolicy import NVLS_OFF_ENV, refuse_nvls  # noqa: F401 - NVLS_OFF_ENV re-exported
from orchestrator.config.registry import NCCL_VAR, PARAMS, PARAMS_BY_YAML, lookup
from orchestrator.errors import UserError
from workers.spec import DRAFTER_KINDS
from workers.spec.allreduce_table import presets
from workers.spec.engine_config import EngineConfig

SEARCHABLE = tuple(PARAMS)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _params_of(section: str) -> type[_Section]:
    """A base section holding the YAML field of every registry parameter kept under `section`: its type
    (its choices as a Literal), default, limits and one line of documentation, all from its declaration."""
    fields: dict[str, Any] = {}
    for p in PARAMS.values():
        if p.path[0] != section:
            continue
        t: Any = Literal[p.choices] if p.choices is not None and p.kind is not bool else p.kind
        fields[p.path[1]] = (t | None if p.default is None else t, Field(p.default, ge=p.low, le=p.high, description=p.doc))
    words = [f for f in fields if PARAMS_BY_YAML[f"{section}.{f}"].kind is str]

    def yaml_words(cls, v, info):  # `gemv: off` reads as a boolean in YAML 1.1: back to the word
        return PARAMS_BY_YAML[f"{section}.{info.field_name}"].coerce(v)

    validators = {"_yaml_words": field_validator(*words, mode="before")(yaml_words)} if words else {}
    return create_model(f"_{section.title()}Params", __base__=_Section, __validators__=validators, **fields)


class ModelSection(_Section):
    path: str = "smollm2-135m"  # checkpoint directory or alias
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class DrafterSection(_params_of("drafter")):
    """Defaults for the drafter; the search space can override each field."""


class ParallelSection(_params_of("parallel")):
    device: Literal["cpu", "cuda"] = "cpu"
    nccl_env: dict[str, str] = Field(default_factory=dict)  # NCCL_* variables every trial gets
    threads: int = Field(1, ge=1)  # torch threads per worker (CPU)
    cpus_per_worker: float = Field(0.25, gt=0)  # Ray CPU resource per actor
    vocab_parallel: bool = False
    # emulated TP (orchestrator/config/emulation.py): one process runs rank 0's shard of TP emulate_tp
    # (tp stays 1) and each collective waits as allreduce_table says: a preset name or a table file
    emulate_tp: int | None = Field(None, ge=1, le=64, description="emulate one rank of this TP size (parallel.tp stays 1)")
    allreduce_table: str | None = Field(
        None, validate_default=True, description=f"with emulate_tp: a preset ({', '.join(presets())}) or a bench-allreduce --json file"
    )

    @field_validator("emulate_tp")
    @classmethod
    def _one_process(cls, v: int | None, info) -> int | None:
        tp = info.data.get("tp", 1)
        if v is not None and tp != 1:
            raise ValueError(f"emulates TP {v} in one process: parallel.tp must be 1, not {tp}")
        return v

    @field_validator("allreduce_table")
    @classmethod
    def _table_with_emulation(cls, v: str | None, info) -> str | None:
        emulating = info.data.get("emulate_tp") is not None
        if emulating and not v:
            raise ValueError(f"parallel.emulate_tp needs a table: a preset ({', '.join(presets())}) or a bench-allreduce --json file")
        if v and not emulating and "emulate_tp" in info.data:
            raise ValueError("is read only with parallel.emulate_tp (the TP size to emulate)")
        return v

    @field_validator("nccl_env")
    @classmethod
    def _nccl_names(cls, env: dict[str, str]) -> dict[str, str]:
        for k, v in env.items():
            if not NCCL_VAR.match(k):
                raise ValueError(f"{k!r} is not an NCCL_* variable")
            refuse_nvls(k, v)
        return env


class EngineSection(_params_of("engine")):
    """What the decode engine runs (workers/spec/engine_config.py `EngineConfig`); each field is also
    searchable as `engine.<field>` and logged as that MLflow param."""

    def config(self) -> EngineConfig:
        return EngineConfig(**self.model_dump())


def profile_from_file(path: str) -> list[float]:
    """P(accepted >= i), i = 1..n, from a JSON object with accept_rate_pos_1..n (what `spectune decode --json`
    prints: the per-position acceptance a real run measured). Bad input: a ValueError naming the file.

    accept_rate_pos_i counts the steps that drafted position i; a drafter that does not always draft k
    (n-gram finds no match) accepted less per step than they add up to, while an imposed profile holds
    every step to it. So where the run says its accepted length, the rates are scaled by its drafted
    share c = (accept_len_mean - 1) / sum_i accept_rate_pos_i: the imposed profile then accepts what the
    run did (c = 1 for a drafter that always drafts k)."""
    import json

    try:
        data = json.loads(Path(path).expanduser().read_text())
    except OSError as e:
        raise ValueError(f"{path!r}: {e.strerror or e}") from None
    except ValueError:
        raise ValueError(f"{path!r} is not JSON (give spectune decode --json output, or a list of P(accepted >= i))") from None
    rates = data.get("metrics", data) if isinstance(data, dict) else {}
    out = []
    while isinstance(rates, dict) and f"accept_rate_pos_{len(out) + 1}" in rates:
        out.append(float(rates[f"accept_rate_pos_{len(out) + 1}"]))
    if not out:
        raise ValueError(f"{path!r} holds no accept_rate_pos_1 (give spectune decode --json output of a run with k > 0)")
    tau = rates.get("accept_len_mean")
    if isinstance(tau, (int, float)) and sum(out) > 0 and 1.0 <= tau < 1.0 + sum(out):
        share = (tau - 1.0) / sum(out)
        out = [p * share for p in out]
    return out


def _check_profile(v: list[float], where: str = "") -> list[float]:
    """P(accepted >= i) for i = 1 .. n: n within the deepest k, each in [0, 1], never rising."""
    most = PARAMS["spec.num_draft_tokens"].high
    if not 1 <= len(v) <= most:
        raise ValueError(f"{where}P(accepted >= i) for i = 1 .. n needs 1 to {most} values, got {len(v)}")
    if any(not 0.0 <= p <= 1.0 for p in v) or any(b > a for a, b in zip(v, v[1:])):
        raise ValueError(f"{where}P(accepted >= i) for i = 1, 2, ...: each between 0 and 1, never rising, got {v}")
    return v


MAX_CONTEXTS = 8  # buckets a trial measures, each at every batch size
MIN_CONTEXT = 16  # a bucket shorter than this is no context at all


class WorkloadSection(_Section):
    prompts: str = "bundled"  # a Spec-Bench-style JSONL file, or "bundled"
    num_prompts: int | None = Field(4, ge=1)
    per_category: int | None = Field(None, ge=1)
    categories: list[str] | None = None
    # train: prompts 0-2 of every 4 per category, heldout: the 4th (orchestrator/prompts/loading.py); score a
    # drafter trained on one split (the demo EAGLE-3 head: train) on the other
    split: Literal["all", "train", "heldout"] = "all"
    max_new_tokens: int = Field(32, ge=1)
    temperature: float = Field(0.0, ge=0)
    seed: int = 0
    repeats: int = Field(1, ge=1, le=20)  # measure each trial this many times; objective = median - penalty x MAD
    # engine speed apart from drafter quality: trials with k > 0 accept exactly tau - 1 drafts per step
    # (on average); their tokens are not the model's output (no baseline comparison), their timing is real
    simulate_accept_len: float | None = Field(None, ge=1, le=PARAMS["spec.num_draft_tokens"].high + 1)
    # the same, position by position: P(accepted >= i) for i = 1, 2, ... (non-increasing, each in [0, 1]),
    # e.g. the accept_rate_pos_i a real trial of the model and drafter measured (`spectune decode --json`,
    # at any TP size: greedy acceptance does not depend on it); a step with k drafts keeps
    # sum_{i <= k} P_i of them on average (P_i = 0 past the list), so deeper k accepts more, as it does
    # or a JSON file holding one: `spectune decode --json` output (its accept_rate_pos_i), read when the YAML
    # is loaded; simulate_accept_profile_from then names the file (the record and the report say it);
    # or one per drafter kind, {kind: list or file}: each trial drafts at its kind's (every kind the
    # study drafts with needs one: orchestrator/execution/validate.py), e.g. a model's own MTP layer at its
    # published acceptance beside n-gram at what it measured on the deployment's text
    simulate_accept_profile: list[float] | dict[str, list[float] | str] | str | None = None
    # set from simulate_accept_profile's file(s), never by hand: the file, or {kind: file}
    simulate_accept_profile_from: str | dict[str, str] | None = None
    # decode the prompts in static batches of each size too: batch 1 is always measured (repeated,
    # pruned, the noise band); every size > 1 once per trial after it, as metrics *_b<B>
    batch_sizes: list[int] = Field(default_factory=lambda: [1], min_length=1)
    # context-length buckets: each trial also decodes the prompts drawn to exactly L tokens (the other
    # prompts' text before each, orchestrator/prompts/context.py), once per bucket and batch size after
    # the rest, as metrics *_c<L> (*_b<B>_c<L>); the schedule then has a row per batch size and bucket
    context_lengths: list[int] = Field(default_factory=list, max_length=MAX_CONTEXTS)

    @model_validator(mode="before")
    @classmethod
    def _profile_file(cls, data):
        """`simulate_accept_profile: run.json`: the accept_rate_pos_i of that decode --json output, in order."""
        if isinstance(data, dict) and data.get("simulate_accept_profile_from") is not None:
            raise ValueError("simulate_accept_profile_from: is set from the file simulate_accept_profile names, not by hand")
        if isinstance(data, dict) and isinstance(src := data.get("simulate_accept_profile"), str):
            return {**data, "simulate_accept_profile_from": src}  # read by the field's own validator (errors name the field)
        if isinstance(data, dict) and isinstance(per := data.get("simulate_accept_profile"), dict):
            files = {kind: v for kind, v in per.items() if isinstance(v, str)}
            return {**data, "simulate_accept_profile_from": files} if files else data
        return data

    @field_validator("simulate_accept_profile", mode="before")
    @classmethod
    def _read_profile(cls, v):
        if isinstance(v, dict):
            out = {}
            for kind, x in v.items():
                if not isinstance(x, (str, list)):
                    raise ValueError(f"{kind}: give a list of P(accepted >= i) or a spectune decode --json file, got {x!r}")
                try:
                    out[kind] = profile_from_file(x) if isinstance(x, str) else x
                except ValueError as e:
                    raise ValueError(f"{kind}: {e}") from None
            return out
        return profile_from_file(v) if isinstance(v, str) else v

    @field_validator("simulate_accept_profile")
    @classmethod
    def _profile(cls, v):
        if isinstance(v, dict):
            if not v:
                raise ValueError("one profile per drafter kind: give at least one, e.g. {mtp: [0.85, 0.6]}")
            if bad := sorted(set(v) - set(DRAFTER_KINDS[1:])):
                raise ValueError(f"no drafter kind {', '.join(map(repr, bad))} (kinds: {', '.join(DRAFTER_KINDS[1:])})")
            return {kind: _check_profile(p, f"{kind}: ") for kind, p in v.items()}
        return v if v is None else _check_profile(v)

    def profile_for(self, kind: str) -> tuple[float, ...] | None:
        """The P(accepted >= i) a trial drafting with `kind` is held to (None: none imposed on it)."""
        p = self.simulate_accept_profile
        p = p.get(kind) if isinstance(p, dict) else p
        return tuple(p) if p is not None else None

    @model_validator(mode="after")
    def _one_simulation(self):
        if self.simulate_accept_len is not None and self.simulate_accept_profile is not None:
            raise ValueError("set simulate_accept_len or simulate_accept_profile, not both")
        return self

    @property
    def simulated(self) -> bool:
        """Acceptance is imposed (either way): tokens are not the model's output, timings are real."""
        return self.simulate_accept_len is not None or self.simulate_accept_profile is not None

    def acceptance_words(self) -> str | None:
        """The imposed acceptance in words, for the record and the console (None: measured)."""
        if self.simulate_accept_len is not None:
            return f"accepted length {self.simulate_accept_len:g} (workload.simulate_accept_len)"
        p = self.simulate_accept_profile
        if isinstance(p, dict):
            per = "; ".join(f"{kind} {', '.join(f'{x:g}' for x in p[kind])}" for kind in sorted(p))
            return f"P(accepted >= i) per drafter: {per} (workload.simulate_accept_profile{self.profile_source()})"
        if p is not None:
            return f"P(accepted >= i) {', '.join(f'{x:g}' for x in p)} (workload.simulate_accept_profile{self.profile_source()})"
        return None

    def profile_source(self, kind: str | None = None) -> str:
        """ ", from FILE" where the profile (`kind`'s, or any of them) was read from a file, else ""."""
        src = self.simulate_accept_profile_from
        if isinstance(src, dict):
            src = src.get(kind) if kind is not None else ", ".join(f"{k}: {f}" for k, f in sorted(src.items())) or None
        return f", from {src}" if src else ""

    @field_validator("batch_sizes")
    @classmethod
    def _batch_sizes(cls, v: list[int]) -> list[int]:
        if any(b < 1 or b > MAX_BATCH for b in v):
            raise ValueError(f"each batch size must be between 1 and {MAX_BATCH}, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"batch sizes repeat: {v}")
        return sorted(set(v) | {1})

    @field_validator("context_lengths")
    @classmethod
    def _context_lengths(cls, v: list[int]) -> list[int]:
        if any(n < MIN_CONTEXT for n in v):
            raise ValueError(f"each context length is a number of tokens of at least {MIN_CONTEXT}, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"context lengths repeat: {v}")
        return sorted(v)

    def cells(self) -> list[tuple[int, int | None]]:
        """Every (batch size, context bucket) a trial measures besides batch 1 at the prompts' own
        lengths, in the order it measures them (None: the prompts as they are)."""
        contexts: list[int | None] = [None, *self.context_lengths]
        return [(b, c) for c in contexts for b in self.batch_sizes if (b, c) != (1, None)]


MAX_BATCH = 64  # a gang keeps one B-row KV cache and, on CUDA, static logits per (B, width) graph


class IntParam(_Section):
    low: int
    high: int
    step: int = 1
    log: bool = False
    when: dict[str, Any] | None = None


class FloatParam(_Section):
    low: float
    high: float
    log: bool = False
    when: dict[str, Any] | None = None


class CategoricalParam(_Section):
    choices: list[int | float | str | bool | None] = Field(min_length=1)
    when: dict[str, Any] | None = None


Param = CategoricalParam | IntParam | FloatParam


class SearchSection(_Section):
    """`space` maps a parameter's dotted name to {choices: [...]}, {low, high[, step|log]} or a fixed value.
    Implicit conditions: nccl.* only when comm.backend is nccl; drafter.* only when spec.num_draft_tokens > 0.
    An explicit `when: {other.param: value-or-list}` adds one."""

    space: dict[str, Param | int | float | str | bool] = Field(default_factory=dict)

    @field_validator("space", mode="before")
    @classmethod
    def _yaml_words(cls, space):
        """A choice or fixed value YAML read as a boolean (`off`) back to the word a parameter takes."""
        if not isinstance(space, dict):
            return space
        out = {}
        for name, p in space.items():
            row = PARAMS.get(name)
            if row is not None and isinstance(p, dict) and isinstance(p.get("choices"), list):
                p = {**p, "choices": [row.coerce(c) for c in p["choices"]]}
            elif row is not None:
                p = row.coerce(p)
            out[name] = p
        return out

    @model_validator(mode="after")
    def _check(self) -> SearchSection:
        if not self.space:
            raise ValueError("space: is empty (give at least one parameter, e.g. spec.num_draft_tokens: {choices: [0, 2, 4]})")
        for name, p in self.space.items():
            try:
                row = lookup(name)
            except ValueError as e:
                raise ValueError(f"space.{name}: {e}") from None
            for v in _values(p):
                if name.startswith("nccl."):
                    refuse_nvls(name.removeprefix("nccl."), v)
                elif why := row.problem(v):  # limits of the registry; those of the model: validate.py
                    raise ValueError(f"space.{name}: {why}")
            if isinstance(p, (IntParam, FloatParam)) and p.low > p.high:
                raise ValueError(f"space.{name}: low {p.low} is above high {p.high}")
            cond = getattr(p, "when", None) or {}
            for other in cond:
                if other not in self.space:
                    raise ValueError(f"space.{name}.when: {other!r} is not a parameter of the space")
        return self


RACE_TRIALS = 2  # study.race_trials by default, in a study of at least RACE_MIN_TRIALS trials
RACE_MIN_TRIALS = 8


class StudySection(_Section):
    name: str | None = None  # default: the experiment name
    n_trials: int = Field(6, ge=1)  # total COMPLETE trials; rerunning resumes up to this
    storage: str | None = None  # Optuna storage URL; default sqlite in $SPECTUNE_HOME
    # model: the performance model's best predicted untried configuration (orchestrator/search/samplers.py); it
    # became the default when it reached at least TPE's share of the best on every recorded landscape (docs/search.md)
    sampler: Literal["tpe", "random", "grid", "gp", "model"] = "model"
    seed: int | None = 0
    pruner: Literal["percentile", "median", "none"] = "percentile"
    baseline: bool = True  # enqueue k = 0 first (once per TP size), also when k is not searched
    baseline_repeats: int = Field(3, ge=1, le=20)  # the baseline measures its workload this many times (noise band)
    mad_penalty: float = Field(1.0, ge=0)  # objective = median throughput - mad_penalty x MAD over repeats
    bench_allreduce: bool = False  # before the trials: time the allreduce backends, log table + plot to the parent run
    max_failed_trials: int | None = Field(None, ge=0)  # default: n_trials
    # the last trials of n_trials re-measure the leaders on a fresh gang: while the winner is not clear of its
    # runners-up, the winner and every configuration within noise of it (fewest measurements first); a clear
    # winner measured in one trial once (then a race trial may try a new configuration, but not the last,
    # which re-measures the runner-up: what it found would lead unconfirmed). Default: RACE_TRIALS where n_trials >= RACE_MIN_TRIALS and the
    # sampler is not grid (a grid measures each point once), else 0
    race_trials: int | None = Field(None, ge=0)
    # trials measured at once, each on its own gang ("auto": every isolated slot of the cluster)
    max_concurrent_trials: int | Literal["auto"] = Field(1)
    # what concurrent trials may share: node (one trial a Ray node), gpu (disjoint GPUs of a node), none
    isolation: Literal["node", "gpu", "none"] = "node"

    @model_validator(mode="after")
    def _race_default(self):
        # after validation: n_trials is the int the YAML's value became (10.0 and "10" count as 10)
        if self.race_trials is None:
            enough = self.n_trials >= RACE_MIN_TRIALS and self.sampler != "grid"
            object.__setattr__(self, "race_trials", RACE_TRIALS if enough else 0)
        return self

    @field_validator("max_concurrent_trials")
    @classmethod
    def _concurrency(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError(f"{v} must be at least 1 (or auto)")
        return v


class TrackingSection(_Section):
    uri: str | None = None  # default: MLFLOW_TRACKING_URI, else sqlite in $SPECTUNE_HOME
    experiment: str | None = None  # default: the study's name (one MLflow experiment per study)


class LimitsSection(_Section):
    trial_timeout_s: float = Field(900, gt=0)
    setup_timeout_s: float = Field(600, gt=0)
    placement_timeout_s: float = Field(60, gt=0)
    max_rel_spread: float = Field(0.1, gt=0)  # MAD / median above this: the trial is measured again (once)


class ExperimentConfig(_Section):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    model: ModelSection = Field(default_factory=ModelSection)
    drafter: DrafterSection = Field(default_factory=DrafterSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    search: SearchSection
    study: StudySection = Field(default_factory=StudySection)
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)

    @property
    def study_name(self) -> str:
        return self.study.name or self.name

    @property
    def experiment_name(self) -> str:
        """The MLflow experiment: one per study (the YAML's `name` is its tag `spectune.name`)."""
        return self.tracking.experiment or self.study_name


def _values(p) -> list:
    if isinstance(p, CategoricalParam):
        return p.choices
    if isinstance(p, (IntParam, FloatParam)):
        return [p.low, p.high]
    return [p]


# ------------------------------------------------------------------------------- loading
def spectune_home() -> Path:
    return Path(os.environ.get("SPECTUNE_HOME", Path.home() / ".spectune"))


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """`a.b.c=value` -> raw["a"]["b"]["c"] = yaml(value). Keys of `search.space` contain dots
    themselves, so everything after `search.space.` up to the last known field is one key."""
    for item in overrides:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected dotted.key=value")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise UserError(f"--set {item!r}: empty key segment")
        if parts[:2] == ["search", "space"] and len(parts) > 2:
            parts = ["search", "space", ".".join(parts[2:])]
        node = raw
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise UserError(f"--set {key}: {part!r} is not a section")
            node = nxt
        node[parts[-1]] = yaml.safe_load(value) if value.strip() else None
    return raw


def _flat(msg: str, limit: int = 500) -> str:
    """One line, whatever the YAML held (keys and values can contain newlines)."""
    msg = " ".join(msg.split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _one_line(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith(("function-", "union[", "tagged-union")))
    # pydantic names union branches (CategoricalParam, int, ...) in loc: drop them for the user
    loc = re.sub(r"\.(CategoricalParam|IntParam|FloatParam|int|float|str|bool)(?=\.|$)", "", loc)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{loc}: {msg}" if loc else msg


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"experiment file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        byte = e.object[e.start : e.start + 1].hex()
        raise UserError(f"{path}: not UTF-8 text (byte 0x{byte} at offset {e.start}); save the experiment file as UTF-8") from None
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UserError(_flat(f"{path}{where}: not valid YAML ({getattr(e, 'problem', None) or e})")) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: the top level must be a mapping of sections, not {type(raw).__name__}")
    return validated(apply_overrides(raw, overrides or []), f"{path}: ")


def validated(raw: dict, where: str = "") -> ExperimentConfig:
    """ExperimentConfig of a YAML-shaped dict, or UserError naming the first bad field (one line)."""
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as e:
        raise UserError(_flat(f"{where}{_one_line(e)}")) from None


def json_schema() -> dict:
    schema = ExperimentConfig.model_json_schema()
    schema["title"] = "spectune experiment"
    # what the validators check, for editors: a profile's values and length, a mapping's keys (drafter kinds)
    workload = schema["$defs"]["WorkloadSection"]["properties"]
    profile = {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "minItems": 1}
    profile["maxItems"] = PARAMS["spec.num_draft_tokens"].high
    workload["simulate_accept_profile"]["anyOf"] = [
        profile,
        {"type": "string"},
        {
            "type": "object",
            "propertyNames": {"enum": list(DRAFTER_KINDS[1:])},
            "minProperties": 1,
            "additionalProperties": {"anyOf": [profile, {"type": "string"}]},
        },
        {"type": "null"},
    ]
    workload["simulate_accept_profile_from"]["readOnly"] = True  # set from the profile's file(s), never by hand
    return schema
