"""Ray side of a trial: connect to a cluster, place and launch a gang of worker actors, run, tear down.

    connect()                                   # RAY_ADDRESS (e.g. under `ray job submit`) or an embedded local Ray
    with RayGang(spec, env, resources) as gang: # placement group (STRICT_PACK) + one actor per rank
        gang.setup(); result = gang.run(workload)

A gang is TP verifier actors (ranks 0..tp-1, one GPU each on CUDA) plus, for a model drafter, the
drafter actor (the n-gram drafter runs inside every verifier rank and needs none), all
in one STRICT_PACK placement group so they share a node; each actor's runtime_env carries the
driver's own NCCL_* and the trial's NCCL variables (and NVLink multicast off; the embedded Ray's
own processes inherit that from the driver, `connect`). `check_placement` asks Ray which GPU each
actor got (a model drafter's 0.1 share may land beside another rank: said in one line); the ranks
themselves gather their device indices and peer access at setup. Rank 0 serves the rendezvous TCPStore on a
port the OS picks. Every call has a deadline; a rank that fails, dies or misses it tears the
whole gang down (the others would wait in a collective forever) and raises `GangError`.
`GangPool` keeps the current gang while the next trial needs the same env and placement.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace

from orchestrator.config.envpolicy import NVLS_OFF_ENV, inherited_nccl_env, nvls_off_here
from orchestrator.errors import UserError
from workers.runtime.errors import GangError
from workers.runtime.worker import RAY_NOSET_CUDA_ENV, Rendezvous, Worker
from workers.spec import GangSpec, RunResult, Workload


class PlacementError(UserError):
    """The gang cannot be placed on this cluster (one line: what was asked, what there is)."""


@dataclass(frozen=True)
class Resources:
    cpus_per_worker: float = 0.25
    placement_timeout_s: float = 60.0
    call_timeout_s: float = 900.0
    setup_timeout_s: float = 600.0
    # the resource a verifier rank takes one unit of: GPU on cuda, none on cpu; a custom resource
    # (declared unit-instance: RAY_custom_unit_instance_resources) stands in for GPUs in CPU tests
    gpu_resource: str | None = None


def assigned_instances(resource: str) -> list[int]:
    """Inside an actor: the ids of the unit instances of `resource` Ray assigned it (for GPU: its GPU ids)."""
    import ray

    if resource == "GPU":
        return sorted(int(i) for i in ray.get_gpu_ids())
    ids = ray._private.worker.global_worker.core_worker.resource_ids()
    return sorted({int(i) for key, pairs in ids.items() if key == resource or key.startswith(resource + "_group_") for i, _ in pairs})


def _instances_of(worker, resource: str) -> list[int]:  # run on an actor through __ray_call__
    return assigned_instances(resource)


def connect(num_cpus: int | None = None) -> str:
    """Join the cluster in RAY_ADDRESS, or start an embedded local one. Returns a description."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 turns token auth on unless told
    nvls_off_here()  # an embedded Ray's GCS, raylet, agents and workers inherit this environment
    if ray.is_initialized():
        return "ray (already connected)"
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="ERROR", log_to_driver=True)
        return f"ray cluster at {address}"
    extra = {"_temp_dir": os.environ["SPECTUNE_RAY_TMPDIR"]} if os.environ.get("SPECTUNE_RAY_TMPDIR") else {}
    ray.init(
        address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, logging_level="ERROR", log_to_driver=True, **extra
    )
    return f"embedded local ray ({ray.cluster_resources().get('CPU', 0):g} CPUs)"


def check_capacity(spec: GangSpec, res: Resources, nodes: list[dict] | None = None) -> None:
    """Fail fast, before anything launches, when no node can hold the gang. `nodes`: each node's
    resources (default: the live nodes of the connected Ray cluster)."""
    need_cpu = spec.world_size * res.cpus_per_worker
    need_gpu = spec.tp if spec.device == "cuda" else 0
    if nodes is None:
        import ray

        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if any(n.get("CPU", 0) >= need_cpu - 1e-9 and n.get("GPU", 0) >= need_gpu for n in nodes):
        return
    have = ", ".join(f"{n.get('CPU', 0):g} CPU/{n.get('GPU', 0):g} GPU" for n in nodes) or "no live nodes"
    what = f"{need_gpu} GPUs and " if need_gpu else ""
    raise PlacementError(
        f"a gang of tp={spec.tp}{' + drafter' if spec.has_drafter else ''} needs {what}{need_cpu:g} CPUs on one node; "
        f"the cluster's nodes have {have}"
    )


class RayGang:
    def __init__(self, spec: GangSpec, env: dict[str, str], res: Resources):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.spec, self.env, self.res = spec, dict(env), res
        self._ray, self._remove_pg = ray, remove_placement_group
        self.actors: list = []
        self._closed = False
        self._progress = None  # Ray queue rank 0 reports decode progress into (made on the first run that asks)
        check_capacity(spec, res)
        self.accel = accel = res.gpu_resource or ("GPU" if spec.device == "cuda" else None)
        gpu = 1 if accel else 0
        # a model drafter on GPUs shares rank 0's GPU: 0.9 + 0.1 of one device in the same pack
        # (Ray may still put the 0.1 on another GPU with room: `check_placement` says where it went)
        self.share = share = 0.1 if gpu and spec.has_drafter and spec.drafter.runs_a_model else 0.0
        gpus = [gpu - (share if r == 0 else 0.0) for r in range(spec.tp)] + ([share] if spec.has_drafter else [])
        bundles = [{"CPU": res.cpus_per_worker, **({accel: g} if g else {})} for g in gpus[: spec.tp]]
        if spec.has_drafter:
            bundles.append({"CPU": res.cpus_per_worker, **({accel: share} if share else {})})
        self.instances: list[list[int]] = []
        self.drafter_note: str | None = None
        self.pg = placement_group(bundles, strategy="STRICT_PACK", name="")
        try:
            ray.get(self.pg.ready(), timeout=res.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise PlacementError(
                f"placement group {bundles} (STRICT_PACK) was not satisfied within {res.placement_timeout_s:g}s; "
                f"cluster has {ray.cluster_resources()}, free {ray.available_resources()}"
            ) from None
        # what the engine runs travels in `spec.engine`, not in the actors' environment; the driver's own
        # NCCL_* (trial params record them as inherited) reach actors on any cluster
        env = {**inherited_nccl_env(), **self.env, **NVLS_OFF_ENV, "OMP_NUM_THREADS": str(spec.threads)}
        if accel == "GPU":
            # every actor sees every GPU of the node and takes the one Ray gave it (workers/runtime/worker.py
            # `_device`): torch's symmetric memory identifies ranks on one node by device index, so
            # two actors that each see their GPU as cuda:0 cannot rendezvous (symm_mem, symm_mem_ll)
            env[RAY_NOSET_CUDA_ENV] = "1"
        runtime_env = {"env_vars": env}
        actor_cls = ray.remote(Worker)
        for rank in range(spec.world_size):
            on_gpu = gpus[rank]
            self.actors.append(
                actor_cls.options(
                    num_cpus=res.cpus_per_worker,
                    max_restarts=0,
                    **({"num_gpus": on_gpu} if accel == "GPU" else {"resources": {accel: on_gpu}} if on_gpu else {}),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=rank),
                    runtime_env=runtime_env,
                ).remote(rank, spec)
            )

    def _gather(self, refs: list, timeout_s: float, what: str, poll=None) -> list:
        """ray.get on every rank, failing fast on the first error and tearing down on any; `poll`
        (if any) is called about twice a second while waiting."""
        ray = self._ray
        index = {ref: i for i, ref in enumerate(refs)}
        results: dict[int, object] = {}
        pending = list(refs)
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, min(left, 0.5) if poll else left))
            if poll is not None:
                poll()
                if not ready and time.monotonic() < deadline:
                    continue
            if not ready:
                ranks = sorted(index[r] for r in pending)
                self.close()
                raise GangError(f"{what}: ranks {ranks} did not answer within {timeout_s:g}s")
            ref = ready[0]
            try:
                results[index[ref]] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self.close()
                raise GangError(f"{what}: rank {index[ref]} died ({type(e).__name__})") from None
            except ray.exceptions.RayTaskError as e:
                self.close()
                cause = e.cause if getattr(e, "cause", None) is not None else e
                raise GangError(
                    f"{what}: rank {index[ref]}: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
                ) from None
            except ray.exceptions.RayError as e:  # e.g. the runtime env could not be set up: this trial fails, not the study
                self.close()
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise GangError(f"{what}: rank {index[ref]}: {type(e).__name__}: {first[:300]}") from None
        return [results[i] for i in range(len(refs))]

    def check_placement(self) -> list[list[int]]:
        """Where Ray really put each actor: the GPU (instance) ids of each rank, drafter last. A model
        drafter's share that did not land on rank 0's GPU still works (the draft link is gloo, over the
        CPU) but shares another GPU: said in one line (`drafter_note`)."""
        if not self.accel:
            return []
        self.instances = self._gather([a.__ray_call__.remote(_instances_of, self.accel) for a in self.actors], 60, "placement")
        if self.share and self.spec.has_drafter and self.instances[self.spec.tp] != self.instances[0]:
            self.drafter_note = (
                f"spectune: the drafter's {self.share:g} {self.accel} landed on {self.accel} {self.instances[self.spec.tp]}, "
                f"not rank 0's {self.instances[0]}: it shares that device; the draft link stays on gloo (CPU)"
            )
            print(self.drafter_note, file=sys.stderr, flush=True)
        return self.instances

    def setup(self) -> list[dict]:
        self.check_placement()
        port = self._gather([self.actors[0].open_store.remote(self.res.setup_timeout_s)], self.res.setup_timeout_s, "rendezvous")[0]
        rdv = Rendezvous(host="127.0.0.1", port=port)  # STRICT_PACK: every rank is on rank 0's node
        return self._gather([a.setup.remote(rdv, self.res.setup_timeout_s) for a in self.actors], self.res.setup_timeout_s, "setup")

    def run(self, workload: Workload, timeout_s: float | None = None, on_progress=None) -> RunResult:
        """Decode `workload` on every rank; `timeout_s` (default: the per-call limit) bounds the call.
        `on_progress(tokens, seconds)`, on the driver, hears rank 0's progress through the current
        prompt about once a second (progress.QueueProgress)."""
        limit = self.res.call_timeout_s if timeout_s is None else max(0.0, timeout_s)
        if on_progress is None:
            return self._gather([a.run.remote(workload) for a in self.actors], limit, "run")[0]
        from ray.util.queue import Queue

        from orchestrator.tracking.progress import QueueProgress

        if self._progress is None:
            self._progress = Queue(actor_options={"num_cpus": 0})
        hook = QueueProgress(self._progress)

        def poll() -> None:
            try:
                items = self._progress.get_nowait_batch(self._progress.qsize()) if self._progress.qsize() else []
            except Exception:  # noqa: BLE001 - progress is a courtesy: a lost queue never fails the run
                return
            if items:
                on_progress(*items[-1])

        refs = [a.run.remote(workload, hook if i == 0 else None) for i, a in enumerate(self.actors)]
        return self._gather(refs, limit, "run", poll)[0]

    def pids(self) -> list[int]:
        return self._gather([a.pid.remote() for a in self.actors], 60, "pid")

    def peak_rss_mb(self) -> list[float]:
        """Each actor's peak resident memory so far, in MiB (verifier ranks first, then the drafter)."""
        return self._gather([a.peak_rss_mb.remote() for a in self.actors], 60, "peak_rss_mb")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for actor in self.actors + ([self._progress.actor] if self._progress is not None else []):
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            self._remove_pg(self.pg)
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> RayGang:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class GangPool:
    """Holds at most one live gang and reuses it while trials need the same env and placement.

    A plain-decoding trial (k = 0) can run on any gang with the same verifier setup: its drafter
    only listens. NCCL reads its env when a communicator is created, so another env means new actors.
    """

    def __init__(self, res: Resources, log=None):
        self.res = res
        self.gang: RayGang | None = None
        self.key: tuple | None = None
        self.launched = 0
        self.setup_s = 0.0
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def get(self, spec: GangSpec, env: dict[str, str], plain: bool) -> RayGang:
        key = (spec, tuple(sorted(env.items())))
        if self.gang is not None and not self.gang._closed:
            if key == self.key:
                return self.gang
            same_verifier = replace(spec, drafter=self.key[0].drafter) == self.key[0] and key[1] == self.key[1]
            if plain and same_verifier:
                return self.gang
        self.close()
        t0 = time.perf_counter()
        gang = RayGang(spec, env, self.res)
        try:
            gang.setup()
            # warm-up: first calls pay for lazy initialisation, which no trial should be charged for
            warm = Workload(prompts=((1, 2, 3, 4),), max_new_tokens=2, num_draft_tokens=1 if spec.drafts else 0)
            gang.run(warm)
        except BaseException:
            gang.close()
            raise
        self.gang, self.key = gang, key
        self.launched += 1
        self.setup_s = time.perf_counter() - t0
        self.log(
            f"spectune: launched gang #{self.launched} (tp={spec.tp}, drafter={spec.drafter.kind}, {len(env)} NCCL vars) in {self.setup_s:.1f}s"
        )
        return gang

    def close(self) -> None:
        if self.gang is not None:
            self.gang.close()
        self.gang, self.key = None, None
