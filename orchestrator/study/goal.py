"""When a study is done, read from its record: `study.n_trials` COMPLETE trials, or every distinct
configuration of a finite space known (measured: COMPLETE, pruned, invalid) and its racing round run:
a space smaller than `study.n_trials` still gets its `study.race_trials` re-measures of the leaders
(orchestrator/search/racing.py), each as a last round, since no new configuration is left to find; it
ends once they ran or the ranking wants none. `StudyGoal` is the
trial loop's limit on concurrency: another trial may start only while the COMPLETE trials, the
running ones (this driver's and the other drivers') stay short of the goal.

    proposals = known_configurations(study, cfg, distinct_configs(cfg), cfg.study.seed)
    goal = StudyGoal(study, cfg, n_goal=8, proposals=proposals, others=others)
    goal.room(running=2)        # another trial may start
    goal.surplus(number)        # an asked trial that would go beyond the goal (another driver took the place)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.config.space import identity_of
from orchestrator.record import DUPLICATE_ATTR, INVALID_TAG, RACE_TAG
from orchestrator.search.proposals import Proposals
from orchestrator.search.racing import race_pick
from orchestrator.search.ranking import rank

if TYPE_CHECKING:
    import optuna

    from orchestrator.config.schema import ExperimentConfig
    from orchestrator.study.context import OtherDrivers


def counts_as_known(t: optuna.trial.FrozenTrial) -> bool:
    """A finished trial whose configuration is measured: COMPLETE, pruned, invalid. A duplicate points at
    its twin; a plain failure (a gang error, an interruption) is retried, not known."""
    from optuna.trial import TrialState

    if t.state not in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) or DUPLICATE_ATTR in t.user_attrs:
        return False
    return t.state != TrialState.FAIL or INVALID_TAG in t.user_attrs


def known_configurations(study: optuna.Study, cfg: ExperimentConfig, space: dict | None, seed: int | None) -> Proposals:
    """The study's record as `Proposals`: every finished trial's configuration that counts as known."""
    book = Proposals(space, random.Random(seed))
    for t in study.get_trials(deepcopy=False):
        if counts_as_known(t) and (identity := identity_of(t, cfg)) is not None:
            book.known(identity, t.number)
    return book


def space_finished(study: optuna.Study, cfg: ExperimentConfig, proposals: Proposals, need_baseline: bool = False) -> bool:
    """Every distinct configuration of a finite space is known (or ruled out), nothing is queued (a
    retry, the baseline), and racing wants no more re-measures (`race_wanted`). `need_baseline`: also
    every TP size has its COMPLETE baseline (k = 0 outside the space is not among `proposals`; a rerun
    whose baseline failed must run it, so it is not finished)."""
    from optuna.trial import TrialState

    from orchestrator.config.space import candidates
    from orchestrator.study.trial import find_baseline

    if not proposals.exhausted or study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return False
    if need_baseline and cfg.study.baseline:
        tps = [int(t) for t in candidates(cfg, "parallel.tp")] if "parallel.tp" in cfg.search.space else [cfg.parallel.tp]
        if any(find_baseline(study, tp) is None for tp in tps):
            return False
    return not race_wanted(study, cfg)


def race_wanted(study: optuna.Study, cfg: ExperimentConfig) -> bool:
    """A space all known still wants a re-measure of a leader: the study has asked for fewer than
    `study.race_trials` of them, and the ranking picks one as it would in a study's last round."""
    if cfg.study.race_trials <= 0:
        return False
    trials = study.get_trials(deepcopy=False)
    if sum(RACE_TAG in t.user_attrs for t in trials) >= cfg.study.race_trials:
        return False
    return race_pick(rank(trials), 1, cfg.study.race_trials, set(), lambda c: None) is not None


def complete(study: optuna.Study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


@dataclass
class StudyGoal:
    """The study's goal as the trial loop checks it; `running`: this driver's running trials."""

    study: optuna.Study
    cfg: ExperimentConfig
    n_goal: int
    proposals: Proposals
    others: OtherDrivers

    def complete(self) -> int:
        return complete(self.study)

    def reached(self) -> bool:
        return self.complete() >= self.n_goal

    def space_finished(self) -> bool:
        return space_finished(self.study, self.cfg, self.proposals)

    def left(self, running: int) -> int:
        """Trials still to start, after the COMPLETE ones and every driver's running ones."""
        return self.n_goal - self.complete() - running - self.others.running()

    def race_left(self, running: int) -> int:
        """Trials left as racing counts them (`race_pick`'s `trials_left`): once the space is all known
        none of them can find a new configuration, so each is a last round."""
        left = self.left(running)
        return min(left, 1) if self.proposals.exhausted else left

    def room(self, running: int) -> bool:
        """Another trial may start: the running trials, if they all complete, leave the goal short."""
        return self.left(running) > 0

    def surplus(self, number: int) -> bool:
        """Asked trial `number` would go beyond the goal: the COMPLETE trials and the live ones asked
        before it (any driver's) make it up. Another driver took the last place between our count and our ask."""
        return self.complete() + self.others.running_below(number) >= self.n_goal
