"""Racing (`study.race_trials`): the study's last trials re-measure its leaders instead of new
configurations, while the winner is not clear of its runners-up. Two parts, both pure of Ray:

- `race_pick`: which leader the next trial re-measures, from the ranking (orchestrator/search/ranking.py
  ranks; this only chooses), or None;
- `Racing`: the driver's side of it. Under the ask lock it enqueues the chosen leader's params with
  `spectune.race_of` (`enqueue_repeat`); when that trial is admitted, `place` says whether it starts
  now, starts alone, or waits. Rule: where the slots let trials share a host (isolation gpu or none) a
  re-measure runs alone: asked while trials run, it is held (asked, not started) until they end,
  and while it runs nothing starts beside it, so the measurement that settles the ranking is
  undisturbed. Every re-measure runs on a fresh gang (the driver closes its slot's pool first):
  gang-to-gang spread is the noise a deployment meets.

    racing = Racing(cfg.study.race_trials, alone=slots.hosts_shared, concurrency=len(slots))
    racing.enqueue_repeat(study, cfg, trials_left=lambda: 1, busy=set())  # under the ask lock, before study.ask()
    how = racing.place(trial, running=True)   # START, ALONE or HOLD
    racing.blocks                             # True while a re-measure is held or runs alone: ask nothing
    trial = racing.take_held()                # once the running trials ended
    racing.ended(trial.number)                # its thread ended
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.config.space import identity_of
from orchestrator.record import BASELINE_TAG, RACE_TAG, flag
from orchestrator.search.ranking import ConfigStats, Ranking, rank, simplicity
from orchestrator.tracking.storage import frozen_trial

if TYPE_CHECKING:
    import optuna

    from orchestrator.config.schema import ExperimentConfig


class Start(enum.Enum):
    """How an admitted trial starts: as any trial, alone (nothing starts beside it while it runs), or
    held until the running trials end (then alone)."""

    NOW = "now"
    ALONE = "alone"
    HOLD = "hold"


class Racing:
    """The driver's racing state. `race_trials`: study.race_trials (0: no racing); `alone`: the slots
    let trials share a host, so a re-measure runs alone; `concurrency`: trials this driver runs at
    once (racing's last round, `race_pick`)."""

    def __init__(self, race_trials: int, alone: bool = False, concurrency: int = 1):
        self.race_trials, self.alone, self.concurrency = race_trials, alone, concurrency
        self.held: optuna.Trial | None = None  # a re-measure asked while others ran: asked, not started
        self.solo: int | None = None  # the re-measure running alone: nothing starts beside it

    def enqueue_repeat(self, study: optuna.Study, cfg: ExperimentConfig, trials_left: Callable[[], int], busy: set[str]) -> int | None:
        """Enqueue a re-measure of a leader where `race_pick` asks for one, unless a trial is queued
        already (a retry, the baseline, an earlier repeat: it goes first). `trials_left()`: trials still
        to start before the study is complete, read only when racing may repeat; `busy`: the
        configurations running now (any driver). Returns the number of the re-measured configuration's
        first trial, or None. Called under the ask lock, right before the ask that takes it."""
        from optuna.trial import TrialState

        if self.race_trials <= 0 or study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return None
        number = race_pick(
            rank(study.get_trials(deepcopy=False)),
            trials_left(),
            self.race_trials,
            busy,
            lambda c: identity_of(frozen_trial(study, c.trials[0]), cfg),
            concurrency=self.concurrency,
        )
        if number is not None:
            first = frozen_trial(study, number)
            attrs = {RACE_TAG: number, **({BASELINE_TAG: True} if flag(first.user_attrs.get(BASELINE_TAG)) else {})}
            study.enqueue_trial(first.params, user_attrs=attrs, skip_if_exists=False)
        return number

    @staticmethod
    def is_repeat(trial: optuna.Trial) -> bool:
        """The trial re-measures a leader (it runs on a fresh gang)."""
        return RACE_TAG in trial.user_attrs

    def place(self, trial: optuna.Trial, running: bool) -> Start:
        """How an admitted trial starts; `running`: this driver has trials running now. A re-measure
        where hosts are shared starts alone, or is held while trials run (`take_held` once they end)."""
        if not (self.alone and self.is_repeat(trial)):
            return Start.NOW
        if running:
            self.held = trial
            return Start.HOLD
        self.solo = trial.number
        return Start.ALONE

    @property
    def blocks(self) -> bool:
        """A re-measure is held or runs alone: the driver asks for nothing and starts nothing else."""
        return self.held is not None or self.solo is not None

    def take_held(self) -> optuna.Trial | None:
        """The held re-measure, handed back once (the caller starts it alone, `place(trial, running=False)`,
        or gives it back)."""
        trial, self.held = self.held, None
        return trial

    def ended(self, number: int) -> None:
        """A trial's thread ended: if it was the re-measure running alone, others may start again."""
        if self.solo == number:
            self.solo = None


def race_pick(
    ranking: Ranking,
    trials_left: int,
    race_trials: int,
    running: set[str],
    identity_of_config: Callable[[ConfigStats], str | None],
    concurrency: int = 1,
) -> int | None:
    """`study.race_trials`: within the last `race_trials` trials of the study, the next trial re-measures
    a leader instead of a new configuration. While the winner is not clear of its runners-up, the
    leaders are the winner and every configuration within noise of it (the winner and the runner-up
    while the noise is unknown); those measured once go first, the simplest of them (the one a tie
    prefers: `ranking.simplicity`; while the noise is unknown, the faster), then among leaders measured
    more often the simplest, the fewest trials, the faster. A clear
    winner measured in one trial is measured once more: its lead and the noise band it was judged by
    come from one gang, and gang-to-gang spread is the noise a deployment meets. A clear winner measured
    twice frees a race trial for a new configuration, except in the study's last round (the last
    `concurrency` trials, which run beside each other): a configuration found there would lead on one
    measurement with no trial left to confirm it, so those re-measure the runner-up instead (the lead
    is then judged on two gangs each side), else the winner, else the next. Before all of that, a
    configuration measured only beside other trials on its host (`ranking.disturbed`) is re-measured,
    the fastest first: its timing is a lower bound, so it can be neither ruled out nor crowned on it
    (the driver runs that re-measure alone). Returns the number of that configuration's first trial
    (its params are enqueued again), or None."""
    if race_trials <= 0 or trials_left > race_trials or len(ranking.configs) < 2:
        return None
    if free := [c for c in ranking.disturbed if identity_of_config(c) not in running]:
        return free[0].trials[0]
    if ranking.winner_ahead:
        winner, runner_up = ranking.configs[:2]
        if len(winner.trials) < 2:
            return winner.trials[0] if identity_of_config(winner) not in running else None
        if trials_left > max(1, concurrency):
            return None
        free = [c for c in (runner_up, winner, *ranking.configs[2:]) if identity_of_config(c) not in running]
        return free[0].trials[0] if free else None
    leaders = ranking.tied if ranking.noise_rel is not None else ranking.configs[:2]
    if len(leaders) < 2:
        return None
    free = [c for c in leaders if identity_of_config(c) not in running]
    if not free:
        return None
    # one measured once first, and among those the one a tie would prefer (the simplest): where the race
    # cannot re-measure every leader, the configuration the verdict names is the one measured twice
    # (with the noise unknown nothing ties yet: the faster first)
    prefer = (lambda c: simplicity(c.params)) if ranking.noise_rel is not None else (lambda c: ())
    return min(free, key=lambda c: (min(len(c.trials), 2), prefer(c), len(c.trials), -c.median)).trials[0]
