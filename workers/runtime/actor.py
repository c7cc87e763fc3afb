"""The Ray actor of one gang process (orchestrator/execution/gang.py starts one per rank), and what the
driver hands it. Nothing here imports torch: the actor builds its `Worker` (workers/runtime/worker.py,
which does) in its own process, so the driver that creates actors never loads torch. `Rendezvous` (how
the ranks meet) lives in workers/runtime/gang.py.

    actor = ray.remote(concurrency_groups={PROGRESS_GROUP: 1})(WorkerActor).remote(rank, spec)
    port = ray.get(actor.open_store.remote("127.0.0.1"))          # rank 0
    ray.get(actor.setup.remote(Rendezvous(host="127.0.0.1", port=port)))
    ref = actor.run.remote(workload, progress=True)               # rank 0 keeps its latest progress,
    actor.progress.options(concurrency_group=PROGRESS_GROUP).remote()  # which the driver asks for meanwhile

The progress call runs in its own concurrency group (one thread beside the one that runs `run`), so the
driver hears a decode's progress without a queue actor: one process fewer per gang.
"""

from __future__ import annotations

import os

from workers.runtime.gang import RAY_NOSET_CUDA_ENV, Rendezvous  # noqa: F401 - re-exported for the driver

PROGRESS_GROUP = "progress"  # the concurrency group of WorkerActor.progress


class WorkerActor:
    """One gang process as a Ray actor: each method is the `Worker` method of the same name."""

    def __init__(self, rank: int, spec):
        from workers.runtime.worker import Worker

        self.worker = Worker(rank, spec)
        self._latest: _Latest | None = None

    def open_store(self, host: str, timeout_s: float = 600.0) -> int:
        return self.worker.open_store(host, timeout_s)

    def setup(self, rdv: Rendezvous, timeout_s: float = 600.0) -> dict:
        return self.worker.setup(rdv, timeout_s)

    def run(self, workload, progress: bool = False):
        """Decode `workload`; with `progress` (verifier rank 0) keep the latest (tokens, seconds) for `progress()`."""
        self._latest = _Latest() if progress else None
        return self.worker.run(workload, self._latest)

    def progress(self) -> tuple[int, float] | None:
        """The running decode's latest (tokens of the current prompt, seconds since it began), or None."""
        latest = self._latest
        return latest.value if latest is not None else None

    def pid(self) -> int:
        return os.getpid()

    def peak_rss_mb(self) -> float:
        return self.worker.peak_rss_mb()

    def shutdown(self) -> None:
        self.worker.shutdown()


class _Latest:
    """Verifier rank 0's progress hook (workers.engine.rank.ProgressHook) in an actor: keeps the last call."""

    def __init__(self):
        self.value: tuple[int, float] | None = None

    def __call__(self, tokens: int, seconds: float) -> None:
        self.value = (tokens, seconds)  # one reference assignment: the progress thread reads it whole
