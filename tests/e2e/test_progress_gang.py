"""Decode progress from inside a real Ray gang: verifier rank 0's hook (Verifier.on_progress) puts
(tokens, seconds) into a Ray queue at most once per QueueProgress.every_s, and RayGang.run hands
the latest to the driver's callback while it waits for the run."""

from __future__ import annotations

import os

import pytest

from orchestrator.execution.cluster import RayGang, Resources
from workers.spec import GangSpec, Workload


@pytest.fixture
def local_ray():
    import ray
    from studyutil import ray_temp_dir

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", _temp_dir=ray_temp_dir())
    yield
    ray.shutdown()


def test_rank0_reports_progress_through_the_gang(local_ray, tiny_ckpt, monkeypatch):
    monkeypatch.setattr("orchestrator.tracking.progress.QueueProgress.__init__.__defaults__", (0.0,))  # every step, not once a second
    heard: list[tuple[int, float]] = []
    with RayGang(GangSpec(model_path=str(tiny_ckpt), tp=2), {}, Resources(cpus_per_worker=0.1)) as gang:
        gang.setup()
        w = Workload(prompts=((1, 2, 3, 4, 5),), max_new_tokens=300, num_draft_tokens=0)
        result = gang.run(w, on_progress=lambda tokens, seconds: heard.append((tokens, seconds)))
    assert heard, "the driver heard nothing while rank 0 decoded"
    tokens = [t for t, _ in heard]
    assert tokens == sorted(tokens) and 1 <= tokens[-1] <= len(result.prompts[0].tokens)
    assert all(s > 0 for _, s in heard)
