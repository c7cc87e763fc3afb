"""A gang of worker processes on this machine, without Ray (tests, `spectune decode` without `--ray`).

    with LocalGang(spec) as gang:           # the workers.runtime.gang.Gang interface
        gang.setup()
        result = gang.run(workload, timeout_s=600, on_progress=print)

Processes start as workers/runtime/procs.py says (CUDA gangs spawned fresh, CPU gangs forked from a
forkserver that imported torch once, both with this process's environment and NVLink multicast off)
and meet through a FileStore in a temporary directory, so no port is ever chosen. Each serves typed commands from a pipe. Any
failure, a process that dies, or a deadline that passes tears the whole gang down (a rank that
lost its peers would otherwise wait in a collective forever) and raises `GangError`. Rank 0's
progress (when the driver asks for it) travels over its pipe as `_Progress` messages between the
command and its reply.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait

from workers.errors import GangError
from workers.runtime.gang import Gang, OnProgress, Rendezvous, ThrottledProgress
from workers.runtime.procs import rank_context, with_env
from workers.spec import GangSpec, RunResult, Workload


@dataclass
class _Setup:
    rendezvous: Rendezvous
    timeout_s: float


@dataclass
class _Run:
    workload: Workload
    progress: bool = False  # rank 0 sends _Progress messages while it decodes


@dataclass
class _Progress:
    tokens: int
    seconds: float


@dataclass
class _PeakRss:
    pass


@dataclass
class _Stop:
    pass


@dataclass
class _Failure:
    rank: int
    message: str
    trace: str


class _PipeProgress(ThrottledProgress):
    def __init__(self, conn):
        super().__init__()
        self.conn = conn

    def send(self, tokens: int, seconds: float) -> None:
        self.conn.send(_Progress(tokens, seconds))


def _serve(rank: int, spec: GangSpec, conn) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))  # a spawned (CUDA) rank; Worker.setup sets torch's threads for all
    from workers.runtime.worker import Worker

    worker = Worker(rank, spec)
    handlers = {
        _Setup: lambda c: worker.setup(c.rendezvous, c.timeout_s),
        _Run: lambda c: worker.run(c.workload, _PipeProgress(conn) if c.progress and rank == 0 else None),
        _PeakRss: lambda c: worker.peak_rss_mb(),
    }
    try:
        while True:
            cmd = conn.recv()  # EOFError when the driver is gone: exit quietly
            if isinstance(cmd, _Stop):
                worker.shutdown()
                conn.send(None)
                return
            try:
                reply = handlers[type(cmd)](cmd)
            except BaseException as e:  # noqa: BLE001 - reported to the driver, which tears the gang down
                conn.send(_Failure(rank, f"{type(e).__name__}: {e}", traceback.format_exc()))
                return
            conn.send(reply)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


class LocalGang(Gang):
    def __init__(self, spec: GangSpec, timeout_s: float = 600.0):
        """`timeout_s`: the deadline of each call unless the call names its own."""
        self.spec, self.timeout_s = spec, timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="spectune-gang-")
        ctx = rank_context(spec.device)
        self.conns, self.procs = [], []
        self._closed = False
        for rank in range(spec.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=with_env, args=(dict(os.environ), _serve, rank, spec, child), daemon=True, name=f"spectune-rank{rank}"
            )
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _call_all(self, cmd, timeout_s: float, on_progress: OnProgress | None = None) -> list:
        for rank, conn in enumerate(self.conns):
            try:
                conn.send(cmd)
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.close(force=True)
                raise GangError(f"rank {rank}: process is gone (exit code {self.procs[rank].exitcode})") from None
        results: dict[int, object] = {}
        deadline = time.monotonic() + timeout_s
        pending = dict(enumerate(self.conns))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close(force=True)
                raise GangError(f"ranks {sorted(pending)} did not answer within {timeout_s:.0f}s")
            ready = wait(list(pending.values()) + [self.procs[r].sentinel for r in pending], timeout=min(left, 1.0))
            for rank, conn in list(pending.items()):
                if conn in ready or conn.poll():
                    try:
                        out = conn.recv()
                    except (EOFError, OSError):
                        out = _Failure(rank, "process exited", "")
                elif self.procs[rank].sentinel in ready:
                    out = _Failure(rank, f"process exited with code {self.procs[rank].exitcode}", "")
                else:
                    continue
                if isinstance(out, _Progress):
                    if on_progress is not None:
                        on_progress(out.tokens, out.seconds)
                    continue
                if isinstance(out, _Failure):
                    self.close(force=True)
                    raise GangError(f"rank {rank}: {out.message}") from _RemoteTrace(out.trace)
                results[rank] = out
                del pending[rank]
        return [results[r] for r in range(len(self.conns))]

    def setup(self) -> list[dict]:
        rdv = Rendezvous(file=os.path.join(self._tmp.name, "rendezvous"))
        return self._call_all(_Setup(rdv, self.timeout_s), self.timeout_s)

    def run(self, workload: Workload, timeout_s: float | None = None, on_progress: OnProgress | None = None) -> RunResult:
        limit = self.timeout_s if timeout_s is None else max(0.0, timeout_s)
        return self._call_all(_Run(workload, progress=on_progress is not None), limit, on_progress)[0]

    def peak_rss_mb(self) -> list[float]:
        """Each process's peak resident memory so far, in MiB (verifier ranks first, then the drafter)."""
        return self._call_all(_PeakRss(), 60)

    def close(self, force: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if not force:
            try:
                for conn in self.conns:
                    conn.send(_Stop())
                for conn in self.conns:
                    if conn.poll(10):
                        conn.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=0 if force else 5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self._tmp.cleanup()

    def __exit__(self, *exc) -> None:
        self.close(force=exc[0] is not None)


class _RemoteTrace(Exception):
    """The worker's traceback, chained under GangError for debugging."""
