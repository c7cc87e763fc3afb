"""The one interface of a gang: TP verifier ranks plus (for a model drafter) the drafter, as processes
that decode together. Two implementations: `workers.runtime.local_gang.LocalGang` (local processes
on this machine: tests, `spectune decode`) and `orchestrator.execution.gang.RayGang` (Ray actors in a
placement group: studies, `spectune decode --ray`). Code that drives a gang takes a `Gang`:

    with make_gang(spec) as gang:
        gang.setup()
        result = gang.run(workload, timeout_s=600, on_progress=lambda tokens, s: ...)

Every call has a deadline; a rank that fails, dies or misses it tears the whole gang down (its peers
would otherwise wait in a collective forever) and raises `workers.errors.GangError`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from workers.spec import RunResult, Workload

RAY_NOSET_CUDA_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"  # Ray leaves CUDA_VISIBLE_DEVICES alone


@dataclass(frozen=True)
class Rendezvous:
    """How the gang's processes meet: a FileStore path (one machine), or the TCPStore that
    rank 0 serves on a port the OS picked (`Worker.open_store`), so no port is ever fixed."""

    file: str | None = None
    host: str | None = None
    port: int = 0


OnProgress = Callable[[int, float], None]  # (tokens of the current prompt, seconds since it began), on the driver


class Gang(ABC):
    @abstractmethod
    def setup(self) -> list[dict]:
        """Rendezvous and load the model on every rank; returns each rank's setup report."""

    @abstractmethod
    def run(self, workload: Workload, timeout_s: float | None = None, on_progress: OnProgress | None = None) -> RunResult:
        """Decode `workload` on every rank and return rank 0's result. `timeout_s` bounds the call
        (default: the gang's own limit); `on_progress` hears rank 0's progress about once a second."""

    @abstractmethod
    def pids(self) -> list[int]:
        """Each rank's process id (verifier ranks first, then the drafter)."""

    @abstractmethod
    def peak_rss_mb(self) -> list[float]:
        """Each rank's peak resident memory so far, in MiB (verifier ranks first, then the drafter)."""

    @abstractmethod
    def close(self) -> None:
        """Tear every rank down; safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ThrottledProgress:
    """A progress hook for verifier rank 0 (workers.engine.rank.ProgressHook) that forwards
    (tokens, seconds) to the driver at most every `every_s`, never waiting on the driver."""

    def __init__(self, every_s: float = 1.0):
        self.every_s, self.last = every_s, float("-inf")

    def __call__(self, tokens: int, seconds: float) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self.send(tokens, seconds)

    def send(self, tokens: int, seconds: float) -> None:
        raise NotImplementedError
