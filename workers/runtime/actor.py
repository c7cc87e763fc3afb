"""The Ray actor of one gang process (orchestrator/execution/gang.py starts one per rank), and what the
driver hands it. Nothing here imports torch: the actor builds its `Worker` (workers/runtime/worker.py,
which does) in its own process, so the driver that creates actors never loads torch. `Rendezvous` (how
the ranks meet) lives in workers/runtime/gang.py.

    actor = ray.remote(WorkerActor).remote(rank, spec)
    port = ray.get(actor.open_store.remote("127.0.0.1"))          # rank 0
    ray.get(actor.setup.remote(Rendezvous(host="127.0.0.1", port=port)))
"""

from __future__ import annotations

import os

from workers.runtime.gang import RAY_NOSET_CUDA_ENV, Rendezvous  # noqa: F401 - re-exported for the driver


class WorkerActor:
    """One gang process as a Ray actor: each method is the `Worker` method of the same name."""

    def __init__(self, rank: int, spec):
        from workers.runtime.worker import Worker

        self.worker = Worker(rank, spec)

    def open_store(self, host: str, timeout_s: float = 600.0) -> int:
        return self.worker.open_store(host, timeout_s)

    def setup(self, rdv: Rendezvous, timeout_s: float = 600.0) -> dict:
        return self.worker.setup(rdv, timeout_s)

    def run(self, workload, progress=None):
        return self.worker.run(workload, progress)

    def pid(self) -> int:
        return os.getpid()

    def peak_rss_mb(self) -> float:
        return self.worker.peak_rss_mb()

    def shutdown(self) -> None:
        self.worker.shutdown()
