"""Decode progress from inside a gang, through the one Gang interface (workers/runtime/gang.py): verifier
rank 0's hook (Verifier.on_progress) forwards (tokens, seconds) at most once per `every_s`, into a Ray
queue (RayGang, orchestrator/execution/gang.py) or over its pipe (LocalGang), and `run` hands them to
the driver's callback while it waits for the run."""

from __future__ import annotations

import os

import pytest

from orchestrator.execution.cluster import Resources
from orchestrator.execution.gang import RayGang
from workers.runtime.gang import Gang
from workers.runtime.local_gang import LocalGang
from workers.spec import GangSpec, Workload


@pytest.fixture
def local_ray():
    import ray
    from studyutil import ray_temp_dir

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # no idle workers started up front, as spectune's embedded Ray (orchestrator/execution/cluster.py): the
    # gang's actors get processes of their own, so those would only cost CPU (~1 s each)
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        _temp_dir=ray_temp_dir(),
        _system_config={"prestart_worker_first_driver": False},
    )
    yield
    ray.shutdown()


@pytest.mark.parametrize("kind", ["ray", "local"])
def test_rank0_reports_progress_through_the_gang(kind, request, tiny_ckpt, monkeypatch):
    spec = GangSpec(model_path=str(tiny_ckpt), tp=2)
    if kind == "ray":
        request.getfixturevalue("local_ray")
        monkeypatch.setattr("orchestrator.execution.gang.QueueProgress.__init__.__defaults__", (0.0,))  # every step, not once a second
        make = lambda: RayGang(spec, {}, Resources(cpus_per_worker=0.1))  # noqa: E731
    else:  # a local rank throttles at its own default: the first step is always heard
        make = lambda: LocalGang(spec, timeout_s=300)  # noqa: E731
    heard: list[tuple[int, float]] = []
    with make() as gang:
        assert isinstance(gang, Gang)
        gang.setup()
        w = Workload(prompts=((1, 2, 3, 4, 5),), max_new_tokens=300, num_draft_tokens=0)
        result = gang.run(w, timeout_s=300, on_progress=lambda tokens, seconds: heard.append((tokens, seconds)))
        assert len(gang.pids()) == 2 and len(gang.peak_rss_mb()) == 2
    assert heard, "the driver heard nothing while rank 0 decoded"
    tokens = [t for t, _ in heard]
    assert tokens == sorted(tokens) and 1 <= tokens[-1] <= len(result.prompts[0].tokens)
    assert all(s > 0 for _, s in heard)
