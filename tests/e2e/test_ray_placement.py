"""Where Ray really puts a gang, on a CPU machine: a custom unit-instance resource (`fake_gpu`)
stands in for GPUs, so the placement group, the actors' assigned instances and the model drafter's
0.1 share are Ray's own decisions (real Ray, no mocks); the driver's NCCL_* reach the actors.

    .venv/bin/python -m pytest tests/e2e/test_ray_placement.py
"""

from __future__ import annotations

import os

import pytest

from orchestrator.config.envpolicy import inherited_nccl_env
from orchestrator.execution.cluster import Resources
from orchestrator.execution.gang import RayGang
from workers.spec import DrafterSpec, GangSpec


@pytest.fixture(scope="module")
def fake_gpu_ray():
    import ray
    from studyutil import ray_temp_dir

    if ray.is_initialized():
        pytest.skip("another Ray is connected in this process")
    os.environ["RAY_custom_unit_instance_resources"] = "fake_gpu"  # instance ids, as GPUs have
    ray.init(
        address="local", num_cpus=2, resources={"fake_gpu": 2}, include_dashboard=False, _temp_dir=ray_temp_dir(), logging_level="ERROR"
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.pop("RAY_custom_unit_instance_resources", None)


def test_model_drafter_share_lands_on_rank0_gpu_and_nccl_env_reaches_actors(fake_gpu_ray, tiny_ckpt, monkeypatch):
    # set after Ray started: only the actors' runtime_env can carry it to them
    monkeypatch.setenv("NCCL_ALGO", "Ring")

    def _env_of(worker, key):  # runs inside an actor (a nested function travels by value)
        import os

        return os.environ.get(key)

    spec = GangSpec(model_path=str(tiny_ckpt), tp=2, drafter=DrafterSpec(kind="layer_skip", layers=1))
    with RayGang(spec, {}, Resources(cpus_per_worker=0.1, gpu_resource="fake_gpu")) as gang:
        instances = gang.check_placement()
        assert len(instances) == 3
        assert sorted(instances[0] + instances[1]) == [0, 1]  # one whole instance per verifier rank
        assert instances[2] == instances[0] and gang.drafter_note is None  # the 0.1 share is on rank 0's
        seen = fake_gpu_ray.get([a.__ray_call__.remote(_env_of, "NCCL_ALGO") for a in gang.actors])
        assert seen == ["Ring"] * 3
        assert fake_gpu_ray.get(gang.actors[0].__ray_call__.remote(_env_of, "NCCL_NVLS_ENABLE")) == "0"


def test_ngram_gang_takes_one_instance_per_rank(fake_gpu_ray, tiny_ckpt):
    spec = GangSpec(model_path=str(tiny_ckpt), tp=2, drafter=DrafterSpec(kind="ngram", ngram_actor=True))
    with RayGang(spec, {}, Resources(cpus_per_worker=0.1, gpu_resource="fake_gpu")) as gang:
        instances = gang.check_placement()
        assert sorted(instances[0] + instances[1]) == [0, 1] and instances[2] == []  # the n-gram actor needs no GPU


def test_inherited_nccl_env_leaves_nvls_the_version_and_others_out():
    env = {"NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring", "OMP_NUM_THREADS": "1", "NCCL_VERSION": "2.28.3-1"}
    assert inherited_nccl_env(env) == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}


def test_trial_records_inherited_nccl_env_and_rank_peak_rss(tmp_path, tiny_ckpt):
    """A study started from a shell with NCCL_ALGO set: its trial's MLflow params carry
    `nccl.NCCL_ALGO` and a tag naming it as inherited; the metrics carry `rank_peak_rss_mb_max`."""
    from studyutil import mlflow_runs, spectune, summary, tiny_experiment

    exp = tiny_experiment(tmp_path, tiny_ckpt, search={"space": {"spec.num_draft_tokens": {"choices": [0]}}})
    home = tmp_path / "home"
    r = spectune(["run", str(exp), "--set", "study.n_trials=1"], home, env={"NCCL_ALGO": "Ring"})
    assert summary(r)["complete"] == 1, r.stderr[-2000:]
    _, runs = mlflow_runs(f"sqlite:///{home / 'mlflow.db'}", "tiny-study")
    run = runs[0]
    assert run.data.params["nccl.NCCL_ALGO"] == "Ring" and run.data.tags["spectune.nccl_inherited"] == "NCCL_ALGO"
    assert 100 < run.data.metrics["rank_peak_rss_mb_max"] < 4096
