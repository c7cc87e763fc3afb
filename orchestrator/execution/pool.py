"""Gangs reused across trials: a trial whose gang would be the same as the live one (spec and NCCL
env) runs on it; a plain-decoding trial runs on any gang with its verifier setup.

    pool = GangPool(Resources()); gang = pool.get(spec, env, plain=False); ...; pool.close()
    pool.launch_failed          # after a GangError from get: the gang's identity, where its launch failed for good

A launch fails for good when a rank raised in its setup or warm-up (out of memory, a model it cannot
build, a kernel that refuses): every trial that needs that gang would fail alike. A rank that died or did
not answer in time, and an interrupted launch, may not fail again, so those leave `launch_failed` None.
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import replace

from orchestrator.execution.cluster import Resources
from orchestrator.execution.gang import RayGang
from workers.errors import GangError
from workers.spec import GangSpec, Workload

TRANSIENT = ("did not answer within", " died (", "interrupted")  # GangError texts a retry may not repeat


def fails_for_good(e: BaseException) -> bool:
    """A launch error every launch of the same gang would repeat: a rank raised (RayGang._gather's
    "what: rank N: ExcType: ..."), not a rank that died, missed its deadline or was interrupted."""
    return isinstance(e, GangError) and not any(t in str(e) for t in TRANSIENT)


def gang_key(spec: GangSpec, env: dict[str, str]) -> tuple:
    """What makes two gangs the same: the spec and the NCCL env it launches with."""
    return spec, tuple(sorted(env.items()))


def gang_identity(spec: GangSpec, env: dict[str, str]) -> str:
    """`gang_key` as a short stable string (what trials and proposals record)."""
    import hashlib

    return hashlib.sha256(repr(gang_key(spec, env)).encode()).hexdigest()[:16]


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
        self.gang_id: str | None = None  # drawn at each launch: the trials that reuse the gang record it (GANG_ATTR)
        self.setup_s = 0.0
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.interrupted = False  # set by `interrupt()`: the gang was closed under a running trial on purpose
        self.launching: RayGang | None = None  # the gang `get` is setting up (interrupt closes it too)
        self.progress = None  # one Ray queue for rank 0's progress, shared by every gang of the pool (made on first use)
        self.launch_failed: str | None = None  # the last get's gang (gang_identity), where its launch failed for good

    def interrupt(self) -> None:
        """Stop the running trial from another thread (Ctrl-C, `ray job stop`): its gang goes (also one
        still being launched), and the trial, seeing `interrupted`, fails as interrupted and is queued again."""
        self.interrupted = True
        if (launching := self.launching) is not None:
            launching.close()
        self.close()

    def get(self, spec: GangSpec, env: dict[str, str], plain: bool) -> RayGang:
        key = gang_key(spec, env)
        self.launch_failed = None
        if self.gang is not None and not self.gang._closed:
            if key == self.key:
                return self.gang
            same_verifier = replace(spec, drafter=self.key[0].drafter) == self.key[0] and key[1] == self.key[1]
            if plain and same_verifier:
                return self.gang
        self._drop_gang()
        t0 = time.perf_counter()
        if self.progress is None:
            from ray.util.queue import Queue

            self.progress = Queue(actor_options={"num_cpus": 0})
        gang = RayGang(spec, env, self.res, progress=self.progress)
        self.launching = gang
        try:
            self._unless_interrupted()  # interrupt() may have come while the placement group was being made
            setup = gang.setup()
            # an MoE verifier's expert path in the graphed steps (grouped kernel or every expert): the record says it
            self.moe_experts = next((s["moe_experts"] for s in setup or () if isinstance(s, dict) and s.get("moe_experts")), None)
            # warm-up: first calls pay for lazy initialisation, which no trial should be charged for
            warm = Workload(prompts=((1, 2, 3, 4),), max_new_tokens=2, num_draft_tokens=1 if spec.drafts else 0)
            gang.run(warm)
        except BaseException as e:
            gang.close()
            if not self.interrupted and fails_for_good(e):
                self.launch_failed = gang_identity(spec, env)
            raise
        finally:
            self.launching = None
        self.gang, self.key = gang, key
        if self.interrupted:  # between the launch and this line: it is the gang interrupt() did not see
            self.close()
            raise GangError("interrupted while its gang was launched")
        self.launched += 1
        self.gang_id = uuid.uuid4().hex[:12]
        self.setup_s = time.perf_counter() - t0
        self.log(
            f"spectune: launched gang #{self.launched} (tp={spec.tp}, drafter={spec.drafter.kind}, {len(env)} NCCL vars) in {self.setup_s:.1f}s"
        )
        return gang

    def _unless_interrupted(self) -> None:
        if self.interrupted:
            raise GangError("interrupted while its gang was launched")

    def _drop_gang(self) -> None:
        if self.gang is not None:
            self.gang.close()
        self.gang, self.key = None, None

    def close(self) -> None:
        """The live gang and the progress queue go (the end of the pool's use; a new gang made by `get`
        after it makes a new queue)."""
        self._drop_gang()
        if self.progress is not None:
            import ray

            try:
                ray.kill(self.progress.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone with its cluster
                pass
            self.progress = None
