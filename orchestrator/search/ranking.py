"""Ranking a study's configurations with their measurement noise (pure: reads finished Optuna trials).

A configuration is one set of resolved parameters (`trial_params`, the trial's user attr
`spectune.params`). Trials that ran the same configuration (TPE re-proposes finished ones in a small
discrete space; the baseline is measured `study.baseline_repeats` times) are pooled: their per-repeat
throughputs (user attr `spectune.repeat_tok_s`) are samples of one configuration, summarised by the
median and the MAD (median absolute deviation from it).

Noise band. The relative noise of one measurement is estimated from every configuration measured at
least twice: sigma_rel = 1.4826 x median over their samples of |x - median_config| / median_config
(1.4826 MAD is the standard deviation of a normal sample). A configuration measured n times has a
median with standard error se = sigma_rel x median / sqrt(n). The winner (highest pooled median) is
clearly ahead of another configuration iff

    median_winner - median_other > 2 x sqrt(se_winner^2 + se_other^2)

otherwise the other is within noise of it. No configuration measured twice: the noise is unknown
(`noise_rel` None) and nothing is called a clear win.

Measurements taken beside another trial. A trial whose record names trials that ran beside it on its
host (`spectune.co_running`: isolation gpu or none) may have timed their load as well as its own, so
its samples are only a lower bound. A configuration with any trial measured alone is ranked by its
trials measured alone (the others are listed in `beside`, not pooled); one measured only beside
others is `disturbed`. The winner is clear only if it is ahead by more than the noise, from at least
MIN_CLEAR_TRIALS trials of it, and no configuration is disturbed (a disturbed one may be
faster than measured: the true winner, or closer than it looks). `race_pick`
(orchestrator/search/racing.py) re-measures disturbed configurations alone first.

    from orchestrator.search.ranking import rank
    r = rank(study.trials)            # r.as_dict(): the study summary's "ranking" entry
    print(r.verdict())                # "trial 7 (...) is within noise of trial 3 (...)" or "... is ahead ..."

`noise_aware_pruner(inner, fallback_rel)` wraps an Optuna pruner so that a trial whose value at a step
is within noise of the best COMPLETE trial's value at that step is never pruned.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from orchestrator.config.registry import PARAMS
from orchestrator.record import CO_RUNNING_ATTR, GANG_ATTR, GPUS_ATTR, NODE_ATTR, PARAMS_ATTR, SAMPLES_ATTR

SETUP_METRIC = "setup_s"  # a trial's gang launch time, 0 where it ran on a gang launched before it

MAD_TO_SIGMA = 1.4826
# a winner is called clear only from at least this many trials of its configuration: one trial's repeats
# share its gang and its moment (a lucky placement or a quiet minute lifts them all), so its lead may be
# one lucky gang however many repeats it ran
MIN_CLEAR_TRIALS = 2

# Between configurations the measurements cannot tell apart, prefer the simpler one: no drafter, then
# the cheaper drafter (n-gram runs no model, an MTP layer or layer-skip a part of the verifier, then a head, then a
# whole draft model), then fewer drafts a step
DRAFTER_COST = {"none": 0, "ngram": 1, "mtp": 2, "layer_skip": 2, "eagle3": 3, "draft_model": 4}


def simplicity(params: dict) -> tuple[int, int]:
    """Sort key: smaller is simpler (drafter cost, then k)."""
    k = int(params.get("spec.num_draft_tokens", 0) or 0)
    kind = "none" if k == 0 else str(params.get("drafter.kind", ""))
    return DRAFTER_COST.get(kind, len(DRAFTER_COST)), k


def why_simpler(chosen: dict, other: dict) -> str:
    """Why `chosen` is preferred over `other`, both within noise (one phrase)."""
    (cost_c, k_c), (cost_o, _) = simplicity(chosen), simplicity(other)
    if k_c == 0:
        return "plain decoding: no drafter to run or deploy"
    if cost_c < cost_o:
        return "the cheaper drafter"
    return "fewer drafts a step"


def trial_params(t) -> dict:
    """The trial's resolved parameters (what it ran), falling back to Optuna's suggested ones. A trial
    recorded before a parameter was declared ran that parameter's default: it is filled in where the
    parameter applies, so a resumed study's old and new trials of one configuration stay one."""
    resolved = t.user_attrs.get(PARAMS_ATTR)
    p = dict(resolved or t.params)
    if resolved:
        for name, row in PARAMS.items():
            if name not in p and row.needs is not None and row.default is not None and p.get(row.needs[0]) in row.needs[1]:
                p[name] = row.default
    return p


def is_baseline(t) -> bool:
    return int(trial_params(t).get("spec.num_draft_tokens", -1)) == 0


def trial_samples(t) -> list[float]:
    """Per-repeat throughputs of a finished trial (one value for trials recorded without them)."""
    samples = t.user_attrs.get(SAMPLES_ATTR)
    if samples:
        return [float(x) for x in samples]
    value = t.user_attrs.get("throughput_median", t.user_attrs.get("throughput_tok_s", t.value))
    return [float(value)] if value is not None else []


def median_mad(values: list[float]) -> tuple[float, float]:
    med = float(np.median(values))
    return med, float(np.median(np.abs(np.asarray(values) - med)))


def config_key(params: dict) -> str:
    return json.dumps({k: str(v) for k, v in sorted(params.items())}, sort_keys=True)


def complete_trials(trials) -> list:
    from optuna.trial import TrialState

    return [t for t in trials if t.state == TrialState.COMPLETE and trial_samples(t)]


def ran_beside(t) -> list[int]:
    """The trials that ran beside `t` on its host while it was measured (empty: it was measured alone)."""
    return [int(n) for n in t.user_attrs.get(CO_RUNNING_ATTR) or []]


def trusted(trials: list) -> list:
    """The trials whose samples count: those measured alone where there are any, else all of them."""
    alone = [t for t in trials if not ran_beside(t)]
    return alone or list(trials)


def baseline_median(trials, tp: int) -> float | None:
    """Pooled median throughput of the COMPLETE k = 0 trials at TP `tp` (those measured alone where any
    were; None: no such trial)."""
    base = [t for t in complete_trials(trials) if is_baseline(t) and int(trial_params(t).get("parallel.tp", tp)) == tp]
    samples = [x for t in trusted(base) for x in trial_samples(t)]
    return median_mad(samples)[0] if samples else None


@dataclass
class ConfigStats:
    params: dict
    trials: list[int]  # the trials pooled: those measured alone, or every trial of a disturbed configuration
    samples: list[float]
    median: float
    mad: float
    speedup_vs_baseline: float | None = None
    beside: list[int] = field(default_factory=list)  # its trials measured beside others and left out (it has alone ones)
    disturbed: bool = False  # every trial of it ran beside another on its host: its figures are a lower bound

    @property
    def n(self) -> int:
        return len(self.samples)

    def se(self, sigma_rel: float) -> float:
        return sigma_rel * self.median / math.sqrt(self.n)

    def label(self) -> str:
        who = f"trial {self.trials[0]}" if len(self.trials) == 1 else "trials " + "+".join(map(str, self.trials))
        return f"{who} ({self.median:.2f} tok/s, n={self.n}{', beside other trials' if self.disturbed else ''})"


@dataclass
class Ranking:
    configs: list[ConfigStats]  # best first, by pooled median throughput
    noise_rel: float | None  # sigma of one measurement relative to its median (None: nothing measured twice)
    noise_from: list[int] = field(default_factory=list)  # trials of the configurations it was estimated from
    # the noise band came from one gang only (each configuration measured more than once ran on one gang: the
    # spread between gangs is not in it); False: some configuration was measured on two gangs; None: unknown
    noise_one_gang: bool | None = None

    def within_noise(self, i: int, of: int = 0) -> bool | None:
        """Config i within noise of config `of` (default: the winner); None: noise unknown."""
        if self.noise_rel is None:
            return None
        w, o = self.configs[of], self.configs[i]
        return abs(w.median - o.median) <= 2 * math.hypot(w.se(self.noise_rel), o.se(self.noise_rel))

    def config_of(self, trial: int) -> int | None:
        """Index of the configuration of trial number `trial`, pooled or left out as measured beside
        others (None: not a COMPLETE trial)."""
        return next((i for i, c in enumerate(self.configs) if trial in c.trials or trial in c.beside), None)

    @property
    def disturbed(self) -> list[ConfigStats]:
        """The configurations measured only beside other trials on their host, best first."""
        return [c for c in self.configs if c.disturbed]

    @property
    def runners_up_within_noise(self) -> list[ConfigStats]:
        return [c for i, c in enumerate(self.configs[1:], 1) if self.within_noise(i)]

    @property
    def tied(self) -> list[ConfigStats]:
        """The winner and every configuration within noise of it (just the winner when the noise is unknown)."""
        return self.configs[:1] + (self.runners_up_within_noise if self.noise_rel is not None else [])

    @property
    def preferred(self) -> ConfigStats | None:
        """What to deploy: the simplest of the tied configurations (the winner when it is clear)."""
        if not self.configs:
            return None
        return min(self.tied, key=lambda c: (simplicity(c.params), -c.median))

    @property
    def winner_ahead(self) -> bool | None:
        """The winner's median is ahead of the runner-up's by more than the noise (None: unknown or one config)."""
        if len(self.configs) < 2 or self.noise_rel is None:
            return None
        return not self.within_noise(1)

    @property
    def winner_is_clear(self) -> bool | None:
        """Ahead by more than the noise, from at least MIN_CLEAR_TRIALS trials of the winner, with no
        configuration measured only beside others (None: the noise is unknown, or one configuration)."""
        ahead = self.winner_ahead
        if ahead is None:
            return None
        return ahead and len(self.configs[0].trials) >= MIN_CLEAR_TRIALS and not self.disturbed

    def _disturbed_words(self) -> str:
        """The disturbed configurations in words (empty: none)."""
        d = self.disturbed
        if not d:
            return ""
        who = ", ".join(str(c.trials[0]) if len(c.trials) == 1 else "+".join(map(str, c.trials)) for c in d)
        return f"trial{'s' if len(d) > 1 or len(d[0].trials) > 1 else ''} {who} ran only beside other trials on their host, so their timing may be low"

    def verdict(self) -> str:
        if not self.configs:
            return "no COMPLETE trial"
        w = self.configs[0]
        disturbed = self._disturbed_words()
        also = f"; {disturbed}" if disturbed else ""
        if len(self.configs) == 1:
            return f"{w.label()} is the only configuration measured{also}"
        r = self.configs[1]
        if self.noise_rel is None:
            return f"{w.label()} leads {r.label()}, but the noise is unknown (no configuration measured twice): not a clear win{also}"
        noise = f"noise {self.noise_rel:.1%} of a measurement" + (", on one gang only" if self.noise_one_gang else "")
        if self.winner_is_clear:
            return f"{w.label()} is ahead of {r.label()} ({noise})"
        if self.winner_ahead:
            t = len(w.trials)  # the words stay short: this sentence ends `spectune run`'s last line
            why = disturbed or f"from {t} trial{'s' if t != 1 else ''} (a clear win takes {MIN_CLEAR_TRIALS})"
            return f"{w.label()} leads {r.label()} by more than the noise ({noise}), but {why}: not a clear win"
        rest = self.tied[1:]  # one line on a terminal: name one other, count the rest
        others = (
            rest[0].label() if len(rest) == 1 else f"{len(rest)} other configurations (trials {', '.join(str(c.trials[0]) for c in rest)})"
        )
        p = self.preferred
        prefer = f"prefer {p.label()}: {why_simpler(p.params, w.params)}" if p is not w else f"prefer {w.label()}: the simplest of them too"
        return f"{w.label()} and {others} tie within noise ({noise}); {prefer}{also}"

    def as_dict(self) -> dict:
        return {
            "noise_rel": self.noise_rel,
            "noise_from_trials": self.noise_from,
            "noise_one_gang": self.noise_one_gang,
            "winner_is_clear": self.winner_is_clear,
            "winner_ahead": self.winner_ahead,
            "disturbed": [c.trials for c in self.disturbed],
            "verdict": self.verdict(),
            "runners_up_within_noise": [c.trials for c in self.runners_up_within_noise],
            "preferred_trials": self.preferred.trials if self.preferred else [],
            "configs": [
                {
                    "params": c.params,
                    "trials": c.trials,
                    "n": c.n,
                    "median_tok_s": c.median,
                    "mad_tok_s": c.mad,
                    "speedup_vs_baseline": c.speedup_vs_baseline,
                    "within_noise_of_winner": self.within_noise(i) if i else None,
                    "measured_beside_others": c.beside if not c.disturbed else c.trials,
                }
                for i, c in enumerate(self.configs)
            ],
        }


def noise_rel(configs: list[ConfigStats]) -> tuple[float | None, list[int]]:
    """sigma_rel pooled over every configuration measured at least twice, and the trials it came from."""
    devs, trials = [], []
    for c in configs:
        if c.n >= 2 and c.median > 0:
            devs += [abs(x - c.median) / c.median for x in c.samples]
            trials += c.trials
    if not devs:
        return None, []
    return MAD_TO_SIGMA * float(np.median(devs)), sorted(trials)


def gangs_of(trials) -> dict[int, int | None]:
    """Which gang each trial ran on, as its record tells it: the number of the first trial on it. A
    trial that recorded its gang's id (GANG_ATTR) shares a gang with the trials of the same id. An older
    record: a trial whose `setup_s` is above 0 launched its own gang; one at 0 ran on the gang launched
    last before it in the same place (its node and GPUs), which can mix gangs up where several run in
    one place (isolation none). None: the record does not say (no setup_s, or nothing launched in that
    place before it)."""
    out: dict[int, int | None] = {}
    last: dict[tuple, int] = {}
    first_on: dict[str, int] = {}
    for t in sorted(trials, key=lambda t: t.number):
        u = t.user_attrs
        if isinstance(gang := u.get(GANG_ATTR), str):
            out[t.number] = first_on.setdefault(gang, t.number)
            continue
        setup = u.get(SETUP_METRIC)
        if not isinstance(setup, (int, float)) or isinstance(setup, bool):
            out[t.number] = None
            continue
        place = (str(u.get(NODE_ATTR, "")), tuple(u.get(GPUS_ATTR) or ()))
        if setup > 0:
            last[place] = t.number
        out[t.number] = last.get(place)
    return out


def noise_one_gang(configs: list[ConfigStats], gangs: dict[int, int | None]) -> bool | None:
    """Whether the noise band (the configurations measured at least twice) came from one gang per
    configuration: a trial's repeats share its gang; trials of one configuration on two gangs bring the
    spread between gangs in (False). None: no noise band, or a configuration's gangs are unknown."""
    noisy = [c for c in configs if c.n >= 2 and c.median > 0]
    if not noisy:
        return None
    unknown = False
    for c in noisy:
        if len(c.trials) < 2:
            continue
        seen = {gangs.get(n) for n in c.trials}
        if None in seen:
            unknown = True
        elif len(seen) > 1:
            return False
    return None if unknown else True


def rank(trials) -> Ranking:
    """Pool the COMPLETE trials by configuration (those measured alone where a configuration has any)
    and rank them by median throughput."""
    by_config: dict[str, list] = {}
    trials = list(trials)
    done = complete_trials(trials)
    for t in sorted(done, key=lambda t: t.number):
        by_config.setdefault(config_key(trial_params(t)), []).append(t)
    groups: dict[str, ConfigStats] = {}
    for key, ts in by_config.items():
        pooled = trusted(ts)
        c = groups[key] = ConfigStats(
            trial_params(ts[0]), [t.number for t in pooled], [x for t in pooled for x in trial_samples(t)], 0.0, 0.0
        )
        c.beside = [t.number for t in ts if t.number not in c.trials]
        c.disturbed = all(ran_beside(t) for t in ts)
        c.median, c.mad = median_mad(c.samples)
        base = baseline_median(done, int(c.params.get("parallel.tp", 1)))
        c.speedup_vs_baseline = c.median / base if base else None
    configs = sorted(groups.values(), key=lambda c: -c.median)
    rel, used = noise_rel(configs)
    return Ranking(configs, rel, used, noise_one_gang(configs, gangs_of(trials)))


def noise_aware_pruner(inner, fallback_rel: float):
    """`inner` (an Optuna pruner) that never prunes a trial within noise of the best COMPLETE trial at
    the same step: pruned only if value < best x (1 - 2 sqrt(2) sigma_rel), sigma_rel from `rank`
    (two single measurements), `fallback_rel` while nothing was measured twice."""
    import optuna
    from optuna.trial import TrialState

    class NoiseAwarePruner(optuna.pruners.BasePruner):
        def __init__(self):
            self.inner = inner

        def prune(self, study, trial) -> bool:
            if not self.inner.prune(study, trial):
                return False
            step = trial.last_step
            if step is None:
                return True
            done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            best = max((t.intermediate_values[step] for t in done if step in t.intermediate_values), default=None)
            if best is None:
                return True
            rel = rank(done).noise_rel
            band = 2 * math.sqrt(2) * (fallback_rel if rel is None else rel)
            return trial.intermediate_values[step] < best * (1 - band)

    return NoiseAwarePruner()
