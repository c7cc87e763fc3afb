"""`spectune bench-search`: a tabular benchmark of search strategies that replays finished studies.

    spectune bench-search EXP.yaml --storage sqlite:///results/.../optuna.db --tracking sqlite:///results/.../mlflow.db \
        --studies NAME[,NAME...] --budget 6 [--seeds 20] [--sampler tpe random gp model] [--json]

It reads records only (spectune's own Optuna store, MLflow for metrics a trial's record lacks), so
it runs on any machine, whatever devices the record was measured on.

The landscape. The COMPLETE trials of the named studies (one model and workload), each mapped to its
configuration under EXP.yaml: its resolved parameters (`spectune.params`) on top of EXP's defaults,
one identity per configuration (`space.config_identity`). Repeats are pooled: a configuration's
throughput is the median of every per-repeat sample of its trials (`spectune.repeat_tok_s`), each
of its metrics the median over its trials. Configurations outside EXP's search space are left out
(and counted). The landscape's noise is ranking's (sigma of one measurement, from the
configurations measured more than once); "within noise of the best" is ranking's rule
|best - x| <= 2 sqrt(se_best^2 + se_x^2).

The replay, per strategy and seed: an in-memory Optuna study with the strategy's sampler, built as
`samplers.make_sampler` builds it for a study with that seed, under a real study's rules:
- the k = 0 baseline is enqueued first (`space.baseline_params`), as `spectune run` does;
- a proposal that repeats a known configuration is PRUNED with `spectune.duplicate_of` and not
  counted (orchestrator/search/proposals.py); MAX_DUPLICATES such proposals in a row and the study
  itself picks an untried configuration of the record at random;
- only configurations in the record are offered: a proposal outside it is PRUNED ("not in the
  record") and asked again, not counted; it is no repeat, so it does not count toward the duplicate
  rule's in-a-row limit (a sampler whose best guesses the record lacks keeps its own next choice);
  only OUTSIDE_IN_A_ROW such proposals in a row make the study pick a recorded configuration at
  random (an enqueued baseline outside it is enqueued again, so its unfixed parameters are asked again);
- an offered configuration is told COMPLETE with its recorded throughput, its metrics set as the
  trial's user attrs as a real trial records them (what the `model` sampler reads);
- the budget counts every offered trial, the baseline included.

Per strategy, medians over seeds: fraction_of_best, the best throughput offered within the budget
over the landscape's best; trials_to_best, the offered trials until one is within the landscape's
noise of its best (budget + 1 where a seed never gets there). `--json` prints
{"default": NAME, "strategies": {NAME: {"fraction_of_best": F, "trials_to_best": T}, ...}}.
Also printed (stderr with --json): the landscape and the model's leave-one-configuration-out error
on it (perfmodel.config_loo: each configuration predicted from the others, misses counted as 100%).
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from orchestrator.config import registry
from orchestrator.config.schema import ExperimentConfig, StudySection
from orchestrator.errors import UserError
from orchestrator.record import BASELINE_TAG, DUPLICATE_ATTR, PARAMS_ATTR, PRUNE_TAG, RECORD_ONLY, RUN_ID_ATTR, SAMPLES_ATTR
from orchestrator.search.config_model import ConfigPrediction
from orchestrator.search.proposals import Proposals

STRATEGIES = ("tpe", "random", "gp", "model")  # what bench-search compares unless --sampler says
NOT_RECORDED = "not in the record: asked again, not counted"
BASELINE_RETRIES = 50  # an enqueued baseline resolving outside the record is asked again at most this often
# proposals outside the record in a row before the study picks a recorded configuration itself. Not the
# duplicate rule's MAX_DUPLICATES: a configuration the record lacks is no repeat, and a sampler whose best
# guesses the record happens to lack would otherwise have its next trial replaced by a random one
OUTSIDE_IN_A_ROW = 50
# metrics of a record that are not measurements of the configuration (never pooled into the landscape)
NOT_METRICS = frozenset({"repeats", "setup_s", "objective", "throughput_median", "throughput_mad"})


@dataclass(frozen=True)
class RecordedConfig:
    """One configuration of the landscape: its trials pooled."""

    identity: str
    params: dict[str, Any]  # the params that enqueue it in EXP's space
    label: str
    throughput: float  # median of every per-repeat sample of its trials
    samples: tuple[float, ...]
    trials: tuple[str, ...]  # "study#number"
    metrics: dict[str, float]  # each metric's median over its trials
    resolved: dict[str, Any]  # every resolved parameter (its first trial's spectune.params)


@dataclass(frozen=True)
class Landscape:
    studies: tuple[str, ...]
    configs: dict[str, RecordedConfig]  # by identity
    best: str  # identity of the best configuration
    noise_rel: float | None  # sigma of one measurement relative to its median (None: nothing measured twice)
    near_best: frozenset[str]  # identities within noise of the best (the best included)
    trials: int  # COMPLETE trials read
    outside: int  # recorded configurations outside EXP's search space (left out)
    space_size: int | None  # distinct configurations of EXP's space (None: not enumerable)

    @property
    def best_throughput(self) -> float:
        return self.configs[self.best].throughput


@dataclass(frozen=True)
class Replay:
    """One strategy's run over the landscape with one seed."""

    strategy: str
    seed: int
    offered: tuple[str, ...]  # identities, in order
    asked: int  # every proposal: offered, duplicates and ones outside the record
    fraction_of_best: float
    trials_to_best: int


@dataclass(frozen=True)
class StrategyResult:
    name: str
    fraction_of_best: float  # median over seeds
    trials_to_best: float  # median over seeds
    replays: tuple[Replay, ...]


@dataclass(frozen=True)
class BenchResult:
    default: str
    budget: int
    landscape: Landscape
    strategies: dict[str, StrategyResult]
    loo: tuple[ConfigPrediction, ...]

    def as_json(self) -> dict:
        return {
            "default": self.default,
            "strategies": {
                name: {"fraction_of_best": r.fraction_of_best, "trials_to_best": _number(r.trials_to_best)}
                for name, r in self.strategies.items()
            },
        }


def _number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


# ------------------------------------------------------------------------------------------- the landscape


def open_record(cfg: ExperimentConfig, storage_url: str | None):
    """The Optuna storage of the record (a sqlite file must exist: a record is never created here)."""
    url = storage_url or cfg.study.storage
    if not url:
        raise UserError("--storage: name the Optuna storage of the record (or set study.storage in the YAML)")
    if url.startswith("sqlite:///"):  # a file of a record: read as it is (no lock file beside it, nothing created)
        path = os.path.expanduser(url.removeprefix("sqlite:///"))
        if not os.path.isfile(path):
            raise UserError(f"--storage: {path} does not exist")
        import optuna

        try:
            return optuna.storages.RDBStorage(f"sqlite:///{path}")
        except Exception as e:  # noqa: BLE001 - not an Optuna database, or another schema
            raise UserError(f"--storage: cannot read {path} ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    from orchestrator.tracking.storage import make_storage

    return make_storage(cfg.model_copy(update={"study": cfg.study.model_copy(update={"storage": url})}))[0]


def _mlflow_metrics(tracking: str | None, run_ids: list[str]) -> dict[str, dict[str, float]]:
    """Latest metrics of MLflow runs (for trials whose Optuna record lacks them); {} without a store."""
    if not tracking or not run_ids:
        return {}
    if tracking.startswith("sqlite:///") and not os.path.isfile(os.path.expanduser(tracking.removeprefix("sqlite:///"))):
        raise UserError(f"--tracking: {tracking.removeprefix('sqlite:///')} does not exist")
    import logging

    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.ERROR)
    client = MlflowClient(tracking_uri=tracking)
    out = {}
    for run_id in run_ids:
        try:
            out[run_id] = dict(client.get_run(run_id).data.metrics)
        except Exception:  # noqa: BLE001 - a deleted run: the trial keeps what Optuna holds
            continue
    return out


def _workload(resolved: dict) -> dict:
    """What must be equal for two trials to be one landscape: the model and the workload (repeats aside)."""
    return {k: v for k, v in resolved.items() if k.startswith(("model.", "workload.")) and k != "workload.repeats"}


def config_of(resolved: dict, cfg: ExperimentConfig):
    """A recorded trial's configuration under `cfg`: its resolved parameters (registry names, and the
    NCCL variables `cfg` searches) on top of `cfg`'s defaults. Raises UserError where it does not resolve."""
    from orchestrator.config.space import resolve

    values = {n: v for n, v in resolved.items() if n in registry.PARAMS or (n.startswith("nccl.") and n in cfg.search.space)}
    return resolve(values, cfg)


def load_landscape(cfg: ExperimentConfig, storage, studies: list[str], tracking: str | None = None) -> Landscape:
    """The named studies' COMPLETE trials, pooled by configuration under `cfg` (module docstring)."""
    import optuna
    from optuna.trial import TrialState

    from orchestrator.config.space import config_identity, distinct_configs
    from orchestrator.search.ranking import ConfigStats, Ranking, median_mad, noise_rel, trial_params, trial_samples

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = distinct_configs(cfg)
    trials = []
    for name in studies:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            known = ", ".join(s.study_name for s in optuna.get_all_study_summaries(storage)) or "none"
            raise UserError(f"--studies: no study {name!r} in the storage (studies there: {known})") from None
        trials += [(name, t) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if trial_samples(t)]
    if not trials:
        raise UserError(f"--studies: {', '.join(studies)} hold no COMPLETE trial")
    lacking = [t.user_attrs[RUN_ID_ATTR] for _, t in trials if "step_ms_p50" not in t.user_attrs and RUN_ID_ATTR in t.user_attrs]
    from_mlflow = _mlflow_metrics(tracking, lacking)
    reference: dict | None = None
    groups: dict[str, list[tuple[str, Any, dict, Any]]] = {}
    outside = set()
    for name, t in trials:
        resolved = trial_params(t)
        workload = _workload(resolved)
        if reference is None:
            reference = workload
        elif workload != reference:
            diff = sorted(k for k in set(workload) | set(reference) if workload.get(k) != reference.get(k))
            raise UserError(f"--studies: trial {name}#{t.number} ran another model or workload than the first ({', '.join(diff)} differ)")
        if (ran := resolved.get("model.path")) is not None and ran != cfg.model.path:
            raise UserError(f"model.path: {cfg.model.path!r}, but the record ran {ran!r}")
        try:
            tc = config_of(resolved, cfg)
        except UserError:
            outside.add(repr(sorted(resolved.items())))
            continue
        identity = config_identity(tc)
        if space is not None and identity not in space:
            outside.add(identity)
            continue
        metrics = {k: v for k, v in t.user_attrs.items() if _is_metric(k, v)}
        metrics = {**from_mlflow.get(t.user_attrs.get(RUN_ID_ATTR, ""), {}), **metrics}
        groups.setdefault(identity, []).append((name, t, metrics, tc))
    if not groups:
        raise UserError(f"--studies: none of the {len(trials)} COMPLETE trials is a configuration of {cfg.name}'s search space")
    configs = {}
    for identity, members in groups.items():
        samples = tuple(x for _, t, _, _ in members for x in trial_samples(t))
        names = sorted({m for _, _, ms, _ in members for m in ms})
        metrics = {m: float(np.median([ms[m] for _, _, ms, _ in members if m in ms])) for m in names}
        first = members[0]
        params = space[identity] if space is not None else {n: v for n, v in trial_params(first[1]).items() if n in cfg.search.space}
        configs[identity] = RecordedConfig(
            identity=identity,
            params=dict(params),
            label=label(first[3]),
            throughput=median_mad(list(samples))[0],
            samples=samples,
            trials=tuple(f"{n}#{t.number}" for n, t, _, _ in members),
            metrics=metrics,
            resolved=dict(trial_params(first[1])),
        )
    ranked = sorted(configs.values(), key=lambda c: -c.throughput)
    stats = [ConfigStats(c.params, [], list(c.samples), *median_mad(list(c.samples))) for c in ranked]
    rel = noise_rel(stats)[0]
    ranking = Ranking(stats, rel)
    near = {ranked[0].identity} | {
        c.identity for i, c in enumerate(ranked[1:], 1) if ranking.within_noise(i) or c.throughput == ranked[0].throughput
    }
    return Landscape(
        tuple(studies), configs, ranked[0].identity, rel, frozenset(near), len(trials), len(outside), None if space is None else len(space)
    )


def label(tc) -> str:
    """A configuration in a few words: the report's label and the engine options it changes."""
    from orchestrator.tracking.runs import config_label
    from workers.spec.engine_config import EngineConfig

    default = EngineConfig().describe()
    engine = "".join(f" {k}={v}" for k, v in tc.engine.describe().items() if v != default[k])
    return config_label(tc.params()) + engine


def _is_metric(key: str, value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and key not in RECORD_ONLY and key not in NOT_METRICS


# ----------------------------------------------------------------------------------------------- the replay


def strategy_config(cfg: ExperimentConfig, strategy: str, seed: int) -> ExperimentConfig:
    return cfg.model_copy(update={"study": cfg.study.model_copy(update={"sampler": strategy, "seed": seed})})


def replay(cfg: ExperimentConfig, land: Landscape, strategy: str, seed: int, budget: int) -> Replay:
    """One strategy over the landscape with one seed, under the study's rules (module docstring)."""
    import optuna
    from optuna.trial import TrialState

    from orchestrator.config.space import baseline_params, identity_of
    from orchestrator.search.samplers import make_sampler
    from orchestrator.tracking.storage import frozen_trial

    scfg = strategy_config(cfg, strategy, seed)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(scfg))
    baseline = baseline_params(cfg)
    if "spec.num_draft_tokens" not in cfg.search.space:
        baseline.pop("spec.num_draft_tokens")  # k is not searched: the baseline attr says k = 0
    study.enqueue_trial(baseline, user_attrs={BASELINE_TAG: True})
    book = Proposals({i: c.params for i, c in land.configs.items()}, random.Random(seed))
    offered: list[str] = []
    asked = baseline_retries = outside_in_a_row = 0
    while len(offered) < budget and not book.exhausted:
        trial = study.ask()
        asked += 1
        fixed = frozen_trial(study, trial.number).system_attrs.get("fixed_params")  # enqueued: the study asked for it
        identity = identity_of(trial, scfg)
        if identity is None or identity not in land.configs:
            trial.set_user_attr(PRUNE_TAG, NOT_RECORDED if identity else "does not resolve")
            study.tell(trial, state=TrialState.PRUNED)
            if BASELINE_TAG in trial.user_attrs:  # the study's own baseline: asked again, whatever it resolved to
                baseline_retries += 1
                if baseline_retries > BASELINE_RETRIES:
                    raise UserError(f"--studies: the record has no k = 0 configuration the baseline {baseline} resolves to")
                study.enqueue_trial(fixed or baseline, user_attrs={BASELINE_TAG: True})
                continue
            outside_in_a_row += 1  # a gap of the record, not a repeat: the sampler's own choice stands (it is asked again)
            if outside_in_a_row > OUTSIDE_IN_A_ROW and (pick := book.pick_untried()) is not None:
                study.enqueue_trial(pick)  # it keeps proposing what the record lacks: the study picks a recorded configuration
                outside_in_a_row = 0
            continue
        else:
            outside_in_a_row = 0
            admission = book.admit(trial.number, identity, asked=fixed is not None)
            if admission.run:
                rec = land.configs[identity]
                for key, value in rec.metrics.items():
                    trial.set_user_attr(key, value)
                trial.set_user_attr(PARAMS_ATTR, rec.resolved)
                trial.set_user_attr(SAMPLES_ATTR, list(rec.samples))
                trial.set_user_attr("throughput_tok_s", rec.throughput)
                study.tell(trial, rec.throughput)
                book.finished(trial.number, known=True)
                offered.append(identity)
                continue
            trial.set_user_attr(DUPLICATE_ATTR, admission.twin)
            trial.set_user_attr(PRUNE_TAG, admission.reason)
            study.tell(trial, state=TrialState.PRUNED)
        if book.stuck and (pick := book.pick_untried()) is not None:
            study.enqueue_trial(pick)  # the sampler keeps repeating itself: the study picks an untried configuration
    best = max(land.configs[i].throughput for i in offered)
    reached = next((n for n, i in enumerate(offered, 1) if i in land.near_best), budget + 1)
    return Replay(strategy, seed, tuple(offered), asked, best / land.best_throughput, reached)


def bench(cfg: ExperimentConfig, land: Landscape, strategies: list[str], budget: int, seeds: int) -> BenchResult:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's experimental-feature warnings (TPE's multivariate / group, GP)
        results = {}
        for name in strategies:
            runs = tuple(replay(cfg, land, name, seed, budget) for seed in range(seeds))
            results[name] = StrategyResult(
                name,
                float(np.median([r.fraction_of_best for r in runs])),
                float(np.median([r.trials_to_best for r in runs])),
                runs,
            )
    return BenchResult(default_sampler(), budget, land, results, tuple(landscape_loo(cfg, land)))


def default_sampler() -> str:
    return StudySection.model_fields["sampler"].default


def landscape_loo(cfg: ExperimentConfig, land: Landscape) -> list[ConfigPrediction]:
    """The configuration model's leave-one-configuration-out on the landscape (pooled metrics)."""
    from orchestrator.search.config_model import config_loo
    from orchestrator.search.points import config_point, config_shape

    points = []
    for c in land.configs.values():
        p = config_point(config_shape(config_of(c.resolved, cfg), cfg), c.metrics, c.throughput)
        if p is not None:
            points.append(replace(p, trial=None))
    return config_loo(points)


# ------------------------------------------------------------------------------------------------- output


def table(result: BenchResult, seeds: int) -> str:
    from orchestrator.search.config_model import config_loo_error

    land = result.landscape
    best = land.configs[land.best]
    noise = "unknown (no configuration measured twice)" if land.noise_rel is None else f"{land.noise_rel:.1%} of a measurement"
    space = "" if land.space_size is None else f" of the {land.space_size} in the search space"
    lines = [
        f"landscape: {len(land.configs)} configurations{space} from {land.trials} COMPLETE trials of {', '.join(land.studies)}"
        + (f" ({land.outside} recorded configurations outside the space left out)" if land.outside else ""),
        f"best: {best.label} {best.throughput:.2f} tok/s (n={len(best.samples)}); noise {noise}; "
        f"{len(land.near_best)} configuration(s) within noise of the best",
    ]
    if result.loo:
        misses = sum(x.predicted is None for x in result.loo)
        lines.append(
            f"performance model, leave one configuration out: median |error| {config_loo_error(list(result.loo)):.1%} "
            f"over {len(result.loo)} configurations" + (f" ({misses} could not be predicted, counted as 100%)" if misses else "")
        )
    lines.append(
        f"{'strategy':<10} {'fraction_of_best':>17} {'trials_to_best':>15}   (median of {seeds} seeds; budget {result.budget} trials, baseline included)"
    )
    for name, r in result.strategies.items():
        mark = "  (default)" if name == result.default else ""
        lines.append(f"{name:<10} {r.fraction_of_best:>17.3f} {_number(r.trials_to_best):>15}{mark}")
    return "\n".join(lines)


def loo_lines(result: BenchResult) -> list[str]:
    out = []
    for x in sorted(result.loo, key=lambda x: (x.shape.drafter, x.shape.env, x.shape.k)):
        pred = "miss" if x.predicted is None else f"{x.predicted:9.2f}"
        err = "" if x.predicted is None else f" {(x.predicted - x.measured) / x.measured:+7.1%}"
        out.append(
            f"  {x.shape.drafter[:40]:<40} k={x.shape.k:<2} {x.shape.env[:28]:<28} measured {x.measured:9.2f} predicted {pred}{err}  [{x.how}]"
        )
    return out


def check_args(budget: int, seeds: int, strategies: list[str]) -> None:
    from typing import get_args

    choices = get_args(StudySection.model_fields["sampler"].annotation)
    for s in strategies:
        if s not in choices:
            raise UserError(f"--sampler: {s!r} is not one of {', '.join(choices)}")
    if budget < 1:
        raise UserError(f"--budget: {budget} must be at least 1 (the baseline counts)")
    if seeds < 1:
        raise UserError(f"--seeds: {seeds} must be at least 1")
