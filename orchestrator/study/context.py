"""What `spectune run` (orchestrator/study/loop.py) hands the trial loop (orchestrator/study/runner.py):
the study and everything a trial needs (`StudyContext`), and the other drivers of the study as the
loop sees them (`OtherDrivers`). Built once per run, by keyword:

    ctx = StudyContext(study=study, storage=storage, cfg=cfg, prepared=prepared, tracker=tracker,
                       progress=progress, n_goal=8, max_failed=8, driver=driver_id(), log=log,
                       proposals=proposals, others=LiveDrivers(...))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import optuna

    from orchestrator.config.schema import ExperimentConfig
    from orchestrator.execution.workload import PreparedWorkload
    from orchestrator.search.proposals import Proposals
    from orchestrator.tracking.progress import Progress
    from orchestrator.tracking.runs import Tracker


class OtherDrivers(Protocol):
    """The study's other drivers (other `spectune run` processes on one storage), as this one counts
    them. A trial counts as running while its driver is alive (loop.LiveDrivers: its pid on this host,
    its heartbeat elsewhere)."""

    def running(self) -> int:
        """Live RUNNING trials of other drivers."""
        ...

    def running_below(self, number: int) -> int:
        """Live RUNNING trials numbered below `number`, of any driver (this one's included)."""
        ...

    def recover(self) -> None:
        """Fail the trials dead drivers left RUNNING and queue their params again."""
        ...


@dataclass
class StudyContext:
    """The study and everything a trial needs; the run's goal and failure limit."""

    study: optuna.Study
    storage: optuna.storages.BaseStorage  # the study's Optuna storage (to mark a trial this process holds no live handle of)
    cfg: ExperimentConfig
    prepared: PreparedWorkload
    tracker: Tracker
    progress: Progress
    n_goal: int  # study.n_trials: COMPLETE trials the study ends at
    max_failed: int  # failures in this run that end it (study.max_failed_trials; 0: the first does)
    driver: str  # this driver: host:pid:start time (orchestrator/record.py DRIVER_ATTR)
    log: Callable[[str], None]
    proposals: Proposals  # the configurations known and running (orchestrator/search/proposals.py)
    others: OtherDrivers
