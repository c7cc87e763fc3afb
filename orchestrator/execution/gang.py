"""A gang as Ray actors (the `workers.runtime.gang.Gang` interface): place, launch, run, tear down.

    with RayGang(spec, env, resources) as gang: # placement group (STRICT_PACK) + one actor per rank
        gang.setup(); result = gang.run(workload)

A gang is TP verifier actors (ranks 0..tp-1, one GPU each on CUDA) plus, for a model drafter, the
drafter actor (the n-gram drafter runs inside every verifier rank and needs none), all
in one STRICT_PACK placement group so they share a node; each actor's runtime_env carries the
driver's own NCCL_* and the trial's NCCL variables (and NVLink multicast off; the embedded Ray's
own processes inherit that from the driver, `cluster.connect`). `check_placement` asks Ray which GPU each
actor got (a model drafter's 0.1 share may land beside another rank: said in one line); the ranks
themselves gather their device indices and peer access at setup. Rank 0 serves the rendezvous TCPStore on its node's
loopback at a port the OS picks. Every call has a deadline; a rank that fails, dies or misses it tears the
whole gang down (the others would wait in a collective forever) and raises `GangError`.
"""

from __future__ import annotations

import sys
import time

from orchestrator.config.envpolicy import NVLS_OFF_ENV, inherited_nccl_env
from orchestrator.execution.cluster import PlacementError, Resources, assigned_instances, check_capacity, node_info
from workers.errors import GangError
from workers.runtime.actor import RAY_NOSET_CUDA_ENV, Rendezvous, WorkerActor
from workers.runtime.gang import Gang, OnProgress, ThrottledProgress
from workers.spec import GangSpec, RunResult, Workload


def _instances_of(worker, resource: str) -> list[int]:  # run on an actor through __ray_call__
    return assigned_instances(resource)


class QueueProgress(ThrottledProgress):
    """The progress hook handed to verifier rank 0: puts (tokens, seconds) into a Ray queue without
    waiting for the put; the driver drains the queue while it waits for the run (`RayGang.run`)."""

    def __init__(self, queue, every_s: float = 1.0):
        super().__init__(every_s)
        self.queue = queue

    def send(self, tokens: int, seconds: float) -> None:
        self.queue.actor.put_nowait.remote((tokens, seconds))


class RayGang(Gang):
    def __init__(self, spec: GangSpec, env: dict[str, str], res: Resources, progress=None):
        """`progress`: a Ray queue for rank 0's progress that outlives this gang (GangPool shares one across
        the gangs it launches: one actor process fewer per gang); by default the gang makes its own."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.spec, self.env, self.res = spec, dict(env), res
        self._ray, self._remove_pg = ray, remove_placement_group
        self.actors: list = []
        self._closed = False
        self._progress = progress  # Ray queue rank 0 reports decode progress into (made on the first run that asks)
        self._own_progress = progress is None  # closed with the gang only where the gang made it
        self._borrowed_fresh = progress is not None  # a shared queue not yet drained of an earlier gang's items
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
        self._node: tuple[str, str] | None = None  # (node id, host) once read (`node`)
        pin = {"bundle_label_selector": [{"ray.io/node-id": res.node_id}] * len(bundles)} if res.node_id else {}
        self.pg = placement_group(bundles, strategy="STRICT_PACK", name="", **pin)
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
        actor_cls = ray.remote(WorkerActor)
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

    def node(self) -> tuple[str, str]:
        """(node id, host) of the gang's node: STRICT_PACK puts every bundle on one. Read once and kept:
        once its node has left the cluster, Ray maps the placement group's bundles to no node (it waits to
        be placed again), yet a gang reused after that (its actors died with the node) is still on that
        node, and a failure there must name it. Where Ray maps none from the start, the node the gang was
        pinned to (`Resources.node_id`). The host is the node's `spectune.io/host` label, else its
        hostname, as the slots' isolation names it; Ray's node table keeps nodes that left."""
        if self._node is not None:
            return self._node
        from ray.util.placement_group import placement_group_table

        node_id = next(iter(placement_group_table(self.pg).get("bundles_to_node_id", {}).values()), "") or self.res.node_id or ""
        host = next((node_info(n).host_name for n in self._ray.nodes() if n["NodeID"] == node_id), "") if node_id else ""
        if node_id:
            self._node = (node_id, host)
        return node_id, host

    def setup(self) -> list[dict]:
        self.check_placement()
        self.node()  # read (and kept) while the gang's node is certainly in the cluster
        # STRICT_PACK puts every rank on rank 0's node, so the ranks meet on that node's loopback on any
        # cluster: the store is never reachable from another machine
        host = "127.0.0.1"
        port = self._gather([self.actors[0].open_store.remote(host, self.res.setup_timeout_s)], self.res.setup_timeout_s, "rendezvous")[0]
        rdv = Rendezvous(host=host, port=port)
        return self._gather([a.setup.remote(rdv, self.res.setup_timeout_s) for a in self.actors], self.res.setup_timeout_s, "setup")

    def run(self, workload: Workload, timeout_s: float | None = None, on_progress: OnProgress | None = None) -> RunResult:
        """Decode `workload` on every rank; `timeout_s` (default: the per-call limit) bounds the call.
        `on_progress(tokens, seconds)`, on the driver, hears rank 0's progress through the current
        prompt about once a second (`QueueProgress`)."""
        limit = self.res.call_timeout_s if timeout_s is None else max(0.0, timeout_s)
        if on_progress is None:
            return self._gather([a.run.remote(workload) for a in self.actors], limit, "run")[0]
        from ray.util.queue import Queue

        if self._borrowed_fresh:  # a shared queue: what an earlier gang's runs left is not this gang's (once per gang)
            self._borrowed_fresh = False
            try:
                if self._progress.qsize():
                    self._progress.get_nowait_batch(self._progress.qsize())
            except Exception:  # noqa: BLE001 - its actor is gone (a lost node, a concurrent close): this gang makes its own
                self._progress, self._own_progress = None, True
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
        for actor in self.actors + ([self._progress.actor] if self._progress is not None and self._own_progress else []):
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            self._remove_pg(self.pg)
        except Exception:  # noqa: BLE001
            pass
