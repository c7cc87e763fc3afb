"""Where Ray really puts a gang, on a CPU machine: a custom unit-instance resource (`fake_gpu`)
stands in for GPUs, so the placement group, the actors' assigned instances and the model drafter's
0.1 share are Ray's own decisions (real Ray, no mocks); the driver's NCCL_* reach the actors.
That a study's trials record the NCCL_* they inherited (and their ranks' peak memory) is checked on
tests/e2e/test_study_e2e.py::test_the_last_trials_race_the_leaders_on_a_fresh_gang's study.

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
        address="local",
        num_cpus=2,
        resources={"fake_gpu": 2},
        include_dashboard=False,
        _temp_dir=ray_temp_dir(),
        logging_level="ERROR",
        _system_config={"prestart_worker_first_driver": False},  # as spectune's embedded Ray: no idle workers up front
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.pop("RAY_custom_unit_instance_resources", None)


def test_model_drafter_share_lands_on_rank0_gpu_and_nccl_env_reaches_actors(fake_gpu_ray, tiny_ckpt, monkeypatch):
    """A model drafter's 0.1 share lands on rank 0's instance and the driver's NCCL_* reach every actor;
    then, on the same Ray, an n-gram actor takes no instance. (Once two tests: the suite runs its tests
    longest first on whichever worker is free, so each started this module's Ray, ~6 CPU-s, for itself.)"""
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
    _ngram_gang_takes_one_instance_per_rank(tiny_ckpt)


def _ngram_gang_takes_one_instance_per_rank(tiny_ckpt):
    spec = GangSpec(model_path=str(tiny_ckpt), tp=2, drafter=DrafterSpec(kind="ngram", ngram_actor=True))
    with RayGang(spec, {}, Resources(cpus_per_worker=0.1, gpu_resource="fake_gpu")) as gang:
        instances = gang.check_placement()
        assert sorted(instances[0] + instances[1]) == [0, 1] and instances[2] == []  # the n-gram actor needs no GPU


def test_inherited_nccl_env_leaves_nvls_the_version_and_others_out():
    env = {"NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring", "OMP_NUM_THREADS": "1", "NCCL_VERSION": "2.28.3-1"}
    assert inherited_nccl_env(env) == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
