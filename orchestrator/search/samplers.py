"""The `model` sampler (`study.sampler: model`): the performance model as the search's guide.

From what the study's COMPLETE trials measured (verify time per width per setup, draft time per
drafter variant, per-position acceptance per drafter, the last two also from PRUNED trials;
`perfmodel.fit_configs`), it predicts every
configuration of the enumerable space that is neither known nor running, and proposes the one with
the largest expected improvement over the best configuration measured so far:

    EI(c) = (mu - best) Phi(z) + sigma phi(z),   z = (mu - best) / sigma
    mu    = the predicted objective (throughput_tok_s)
    sigma = mu x sqrt(spread^2 + noise^2)

`spread` is the estimate's own: small where every part of it was measured, wide where a part is
borrowed from the drafter's kind, the setup's family or a prior (`perfmodel.Priors`: a drafter no
trial ran). `noise` is the study's measurement noise (ranking.noise_rel; NOISE_DEFAULT until some
configuration was measured twice). So the first picks spread over drafters (wide, optimistic
estimates), and once a drafter's acceptance is measured its best k is predicted from its own
per-position acceptance. Exact ties (configurations the model cannot tell apart) go to the one
whose drafter adds least (`extras`: no n-gram lookup, a chain), then at random (seeded). The first proposal of a study
with nothing measured is its k = 0 point (what every estimate is relative to). A space that cannot
be enumerated (a float range, too many combinations) falls back to random sampling.

It is an ordinary Optuna sampler: the first parameter a trial asks for picks the whole
configuration, and every `suggest_*` of that trial returns the pick's value (`space.suggest` asks
in dependency order, so the pick's params are exactly the ones it asks). Running trials count as
known, so concurrent trials and other drivers never get the same pick. Enqueued trials (the
baseline, retries) are untouched.

    study = optuna.create_study(direction="maximize", sampler=ModelSampler(cfg, seed=0))
    tc = space.suggest(study.ask(), cfg)
    sampler.picks[trial.number]    # the Pick: identity, estimate, expected improvement
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.space import distinct_configs, grid_space, trial_config
from orchestrator.record import DUPLICATE_ATTR, INVALID_TAG
from orchestrator.search.config_model import ConfigModel, Estimate, Priors, fit_configs
from orchestrator.search.points import ConfigShape, config_point, config_shape

NOISE_DEFAULT = 0.03  # relative noise of one measurement before the study measured anything twice
TIE = 1e-6  # relative expected improvements closer than this are a tie (the simplest, then at random)


@dataclass(frozen=True)
class Pick:
    """One proposal and why: its configuration, the model's estimate and its expected improvement."""

    identity: str
    params: dict
    estimate: Estimate | None  # None: nothing measured yet (the k = 0 point), or no estimate at all
    expected_improvement: float
    best: float | None  # the best pooled objective measured when it was picked


def extras(tc) -> int:
    """What a configuration's drafter adds to its plain form: n-gram lookup before an EAGLE-3 head, a
    tree instead of a chain (0 for plain decoding and a drafter's plain chain)."""
    if not tc.num_draft_tokens:
        return 0
    d = tc.drafter
    return int(d.kind == "eagle3" and (d.lookup or 0) > 0) + int(d.kind == "eagle3" and (d.tree_width or 0) >= 2)


def expected_improvement(mu: float, sigma: float, best: float) -> float:
    """E[max(0, X - best)] for X ~ N(mu, sigma^2)."""
    if sigma <= 0:
        return max(0.0, mu - best)
    z = (mu - best) / sigma
    return (mu - best) * 0.5 * math.erfc(-z / math.sqrt(2)) + sigma * math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


class ModelSampler(optuna.samplers.BaseSampler):
    def __init__(self, cfg: ExperimentConfig, seed: int | None = None, priors: Priors | None = None):
        from orchestrator.config.space import distinct_configs

        self.cfg = cfg
        self._seed = seed
        self._rng = random.Random(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self.space = distinct_configs(cfg)  # identity -> params that enqueue it; None: not enumerable
        self._priors = priors
        self._shapes: dict[str, ConfigShape] = {}
        self._extras: dict[str, int] = {}  # identity -> what its drafter adds to its plain form (`extras`)
        self._resolved: dict[int, tuple[str, ConfigShape] | None] = {}  # finished trials' configurations, by number
        self._fits: dict[tuple, tuple[ConfigModel | None, dict[str, float], float]] = {}
        self.picks: dict[int, Pick | None] = {}  # trial number -> its pick (None: random)

    # Optuna's interface: nothing relative; the first independent parameter of a trial picks all of them
    def infer_relative_search_space(self, study, trial) -> dict:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict:
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        if trial.number not in self.picks:
            self.picks[trial.number] = self._pick(study, trial)
        pick = self.picks[trial.number]
        if pick is not None and param_name in pick.params:
            value = pick.params[param_name]
            try:
                if param_distribution._contains(param_distribution.to_internal_repr(value)):
                    return value
            except (ValueError, TypeError):
                pass
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def reseed_rng(self) -> None:
        self._random.reseed_rng()
        self._rng = random.Random()

    @property
    def priors(self) -> Priors:
        if self._priors is None:
            self._priors = Priors(n_layers=model_layers(self.cfg))
        return self._priors

    def shape(self, identity: str) -> ConfigShape:
        if identity not in self._shapes:
            from optuna.trial import FixedTrial

            from orchestrator.config.space import suggest

            tc = suggest(FixedTrial(self.space[identity]), self.cfg)
            self._shapes[identity] = config_shape(tc, self.cfg)
            self._extras[identity] = extras(tc)
        return self._shapes[identity]

    def _resolve(self, t) -> tuple[str, ConfigShape] | None:
        """A trial's configuration: its identity and shape (None: it does not resolve under the space)."""
        from orchestrator.config.space import config_identity

        if t.state.is_finished() and t.number in self._resolved:
            return self._resolved[t.number]
        try:
            tc = trial_config(t, self.cfg)
            out = (config_identity(tc), config_shape(tc, self.cfg))
        except Exception:  # noqa: BLE001 - a trial asked but not yet suggested, or of another space
            out = None
        if t.state.is_finished():
            self._resolved[t.number] = out
        return out

    def _model(self, complete: list, pruned: list = ()) -> tuple[ConfigModel | None, dict[str, float], float]:
        """The configuration model of the COMPLETE trials (the PRUNED ones lending their acceptance and
        time per draft: `perfmodel.fit_configs`), each measured configuration's pooled objective, and
        the measurement noise (cached while those trials stay the same)."""
        key = (tuple(t.number for t in complete), tuple(t.number for t in pruned))
        if key not in self._fits:
            from orchestrator.search.ranking import ConfigStats, median_mad, noise_rel, trial_samples

            samples: dict[str, list[float]] = {}
            points = []
            for t in complete:
                if (resolved := self._resolve(t)) is None:
                    continue
                identity, shape = resolved
                mine = trial_samples(t)
                samples.setdefault(identity, []).extend(mine)
                if (p := config_point(shape, t.user_attrs, median_mad(mine)[0] if mine else None, t.number)) is not None:
                    points.append(p)
            measured = {i: median_mad(s)[0] for i, s in samples.items() if s}
            stats = [ConfigStats({}, [], s, *median_mad(s)) for s in samples.values() if s]
            rel = noise_rel(stats)[0]
            lent = [
                p
                for t in pruned
                if (r := self._resolve(t)) is not None and (p := config_point(r[1], t.user_attrs, None, t.number)) is not None
            ]
            self._fits = {key: (fit_configs(points, lent) if points else None, measured, NOISE_DEFAULT if rel is None else rel)}
        return self._fits[key]

    def known(self, study, number: int) -> set[str]:
        """Identities of every configuration measured, judged or running (trial `number` aside): what a
        proposal must not repeat. A plain failure is retried by the study, so it does not count."""
        out = set()
        for t in study.get_trials(deepcopy=False):
            if t.number == number or t.state == TrialState.WAITING or DUPLICATE_ATTR in t.user_attrs:
                continue
            if t.state == TrialState.FAIL and INVALID_TAG not in t.user_attrs:
                continue
            if (resolved := self._resolve(t)) is not None:
                out.add(resolved[0])
        return out

    def _pick(self, study, trial) -> Pick | None:
        if self.space is None:
            return None  # not enumerable: random
        known = self.known(study, trial.number)
        fixed = trial.system_attrs.get("fixed_params") or {}  # an enqueued trial's fixed part (the baseline's k = 0)
        left = [i for i in self.space if i not in known and all(self.space[i].get(n, v) == v for n, v in fixed.items())]
        if not left:
            return None  # every configuration known: the study ends; whatever is asked is a duplicate
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        model, measured, noise = self._model(complete, study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)))
        if model is None or not measured:  # nothing measured: the k = 0 point of the first choices
            first = next((i for i in left if self.shape(i).k == 0), left[0])
            return Pick(first, dict(self.space[first]), None, 0.0, None)
        self._rng.shuffle(left)  # near ties go to whichever comes first
        best = max(measured.values())
        scored = []
        for identity in left:
            est = model.predict(self.shape(identity), self.priors)
            sigma = est.objective * math.hypot(est.spread, noise)
            scored.append((expected_improvement(est.objective, sigma, best), est, identity))
        top = max(s[0] for s in scored)
        # near ties (configurations the model cannot tell apart, e.g. a drafter option no trial measured):
        # the one whose drafter adds least (no lookup, a chain) first. Not ranking.simplicity, the verdict's
        # order among measured ties (drafter cost, then k): here the tied candidates differ in options
        tied = [s for s in scored if s[0] >= top - TIE * max(top, 1e-12)]
        ei, est, identity = min(tied, key=lambda s: self._extras[s[2]])
        return Pick(identity, dict(self.space[identity]), est, ei, best)


def model_sampler_fits(cfg: ExperimentConfig) -> bool:
    """The model sampler picks among the space's distinct configurations: it needs a space it can list
    (no float range, at most MAX_ENUMERATED combinations)."""
    return distinct_configs(cfg) is not None


def gang_order(points: list[tuple], names: list[str]) -> list[tuple]:
    """Grid points (tuples of values in `names` order), regrouped so that points differing only in k
    (spec.num_draft_tokens) come one after another: a gang is set up for the rest of a point (the
    drafter and its settings, TP, backend, NCCL and engine options), and each change of it launches a
    new gang (on a GPU, the model loaded and its graphs captured again). Groups keep the order in
    which their first point came (Optuna's seeded shuffle), and points within a group theirs."""
    k = names.index("spec.num_draft_tokens") if "spec.num_draft_tokens" in names else None
    first: dict[tuple, int] = {}
    for i, p in enumerate(points):
        first.setdefault(tuple(v for j, v in enumerate(p) if j != k), i)
    return sorted(points, key=lambda p: first[tuple(v for j, v in enumerate(p) if j != k)])  # stable


def make_sampler(cfg: ExperimentConfig, offset: int = 0):
    """The configured sampler. `offset` (the number of trials already in the study) shifts the seed,
    so a resumed study does not replay the proposals of its first run."""
    import optuna

    s, seed = cfg.study.sampler, (None if cfg.study.seed is None else cfg.study.seed + offset)
    if s == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s == "grid":

        class Grid(optuna.samplers.GridSampler):
            """The grid without its own stop: Optuna's calls `study.stop()` once the grid is exhausted, which
            works only inside `study.optimize` (an ask/tell loop gets a RuntimeError from its last tell).
            The driver ends the study itself when every distinct configuration is known (proposals.py).
            Its order keeps the points of one gang together (`gang_order`)."""

            def __init__(self, space, seed=None):
                super().__init__(space, seed=seed)
                self._all_grids = gang_order(self._all_grids, self._param_names)

            def after_trial(self, study, trial, state, values) -> None:
                return None

        return Grid(grid_space(cfg), seed=seed)
    if s == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if s == "model" and model_sampler_fits(cfg):  # the performance model's best predicted untried configuration
        return ModelSampler(cfg, seed=seed)
    # (a space the model sampler cannot enumerate gets TPE: run_study says so in its header)
    # constant liar: a running trial (this driver's concurrent ones, another driver's) counts as a poor result, so TPE
    # does not propose the same point beside it
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=3, constant_liar=True)


def model_layers(cfg: ExperimentConfig) -> int | None:
    """The verifier's layer count (the draft-cost prior's unit) from what is on this machine (a demo
    model is never fetched for it); None where the model cannot be read here."""
    from workers.model.locate import DEMO_MODELS, cache_root, load_args, resolve_model_path

    try:
        path = cache_root() / cfg.model.path if cfg.model.path in DEMO_MODELS else resolve_model_path(cfg.model.path)
        return int(load_args(path).n_layers)
    except Exception:  # noqa: BLE001 - a checkpoint not on this machine: the prior's default
        return None
