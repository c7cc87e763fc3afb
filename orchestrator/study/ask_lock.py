"""The ask lock: the drivers of one study take turns at the ask, across processes and machines.

The rule it enforces: from a driver's read of the store (what the other drivers are measuring now)
until its own asked trial's params are in the store and the trial is admitted, or found a duplicate
(told PRUNED after the section, with its MLflow run), no other driver of the study does the same (orchestrator/study/runner.py, `Asker.ask`).
Without it two drivers that ask at one moment both read the store before either's params are in it,
and both measure one configuration. A check after the params are written (yield to a live twin)
cannot fix that with reads and writes alone: depending on the order of the writes and the checks,
both yield (the configuration then counts as known but was never measured) or both run.

The section lasts tens of milliseconds. Per storage:

- PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) keyed by the study name, on a
  connection of its own (a driver that dies or drops its connection releases it on the server);
- SQLite, an Optuna journal file: `flock` on a file beside the database, `<file>.ask-lock` (released
  by the kernel when its process dies);
- in-memory: a lock of this process (no other process can share the storage);
- anything else (MySQL, a gRPC proxy, a Redis journal): no lock; one line says, once per process,
  that concurrent drivers on it may measure one configuration twice.

A wait longer than `timeout_s` (60 s) raises a one-line UserError naming the storage, never a hang;
an exception inside the section (Ctrl-C, SIGTERM raised as KeyboardInterrupt) releases the lock.

    lock = ask_lock(storage, study.study_name, log)  # once per driver (storage: make_storage's)
    with lock:                                       # each ask
        ...                                          # sync, ask, write the params, admit
    lock.close()                                     # PostgreSQL: its connection goes

A trial that fails and has its params queued again (a lost node, an interrupt, a dead driver's trial)
takes the driver's lock for those two writes (`taking_turns`, which never raises): between them its
configuration is neither running nor queued, and another driver's ask would measure it beside the retry.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
import weakref
from contextlib import contextmanager

from orchestrator.errors import UserError

TIMEOUT_S = 60.0  # a wait for the lock longer than this is an error: the section lasts tens of milliseconds

_warned: set[str] = set()  # storages this process has said it cannot lock
_process_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # in-memory storage -> its lock


class AskLock:
    """Mutual exclusion of one study's asks (a context manager, not re-entrant). Subclasses say how to
    try the lock once without waiting (`_try`) and how to let it go (`_release`); this class waits,
    polling with a short jittered back-off, until it is held or `timeout_s` has passed."""

    def __init__(self, where: str, study_name: str, timeout_s: float = TIMEOUT_S):
        self.where, self.study_name, self.timeout_s = where, study_name, timeout_s
        self._mine = threading.Lock()  # threads of this process that share this object take turns too

    def __enter__(self) -> AskLock:
        deadline = time.monotonic() + self.timeout_s
        if not self._mine.acquire(timeout=self.timeout_s):
            self._timed_out()
        try:
            delay = 0.002
            while not self._try():
                if time.monotonic() >= deadline:
                    self._timed_out()
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(2 * delay, 0.05)
        except BaseException:
            self._abandon()  # a wait that ended in an error or an interrupt holds nothing
            self._mine.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._release()
        finally:
            self._mine.release()

    def _timed_out(self):
        raise UserError(
            f"study.storage: waited over {self.timeout_s:g} s for the ask lock of study {self.study_name!r} on {self.where}: "
            "another driver of the study holds it (it is held for milliseconds: is that driver stuck?)"
        )

    def _try(self) -> bool:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError

    def _abandon(self) -> None:
        """Drop what a wait left half-held (a lock file, a connection) when it ends in an error."""

    def close(self) -> None:
        """Let go of what the lock keeps between asks (a database connection)."""


class NoLock(AskLock):
    """A storage that cannot be locked (or a test's stand-in for no lock): every ask goes ahead."""

    def __init__(self, where: str = "this storage", study_name: str = "", timeout_s: float = TIMEOUT_S):
        super().__init__(where, study_name, timeout_s)

    def _try(self) -> bool:
        return True

    def _release(self) -> None:
        pass


class ProcessLock(AskLock):
    """One lock per storage object in this process (an in-memory storage, which no other process shares)."""

    def __init__(self, storage, where: str, study_name: str, timeout_s: float = TIMEOUT_S):
        super().__init__(where, study_name, timeout_s)
        self._lock = _process_locks.setdefault(storage, threading.Lock())
        self._held = False

    def _try(self) -> bool:
        self._held = self._lock.acquire(blocking=False)
        return self._held

    def _release(self) -> None:
        self._held = False
        self._lock.release()

    def _abandon(self) -> None:
        if self._held:  # an interrupt between a successful try and the section
            self._release()


class FileLock(AskLock):
    """`flock` on a sidecar file (`<database>.ask-lock`), opened for each section: processes on this
    machine (or on a file system whose flock spans machines) take turns."""

    def __init__(self, path: str, where: str, study_name: str, timeout_s: float = TIMEOUT_S):
        super().__init__(where, study_name, timeout_s)
        self.path = path
        self._file = None

    def _try(self) -> bool:
        import fcntl

        if self._file is None:
            try:
                self._file = open(self.path, "a")  # created with the umask's mode, never truncated
            except OSError as e:
                raise UserError(f"study.storage: cannot open the ask lock {self.path} ({e.strerror})") from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except BaseException:
            self._close_file()
            raise
        return True

    def _release(self) -> None:
        self._close_file()  # closing the file releases the flock

    def _close_file(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.close()

    def _abandon(self) -> None:
        self._close_file()


class AdvisoryLock(AskLock):
    """PostgreSQL's session-level advisory lock on a connection of its own (an engine of one
    connection, made from the storage's URL and engine settings), keyed by the study name."""

    def __init__(self, storage, where: str, study_name: str, timeout_s: float = TIMEOUT_S):
        import sqlalchemy

        super().__init__(where, study_name, timeout_s)
        self.key = advisory_key(study_name)
        kwargs = {**(getattr(storage, "engine_kwargs", None) or {}), "pool_size": 1, "max_overflow": 0, "pool_pre_ping": True}
        self._engine = sqlalchemy.create_engine(storage.engine.url, **kwargs)
        self._conn = None

    def _try(self) -> bool:
        from sqlalchemy import text

        try:
            if self._conn is None:
                self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            return bool(self._conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar())
        except BaseException as e:
            self._drop()  # whatever the server granted goes with the session
            if isinstance(e, Exception):
                msg = " ".join(str(e).split())[:200]
                raise UserError(f"study.storage: the ask lock on {self.where} failed ({type(e).__name__}: {msg})") from None
            raise

    def _release(self) -> None:
        from sqlalchemy import text

        released = False
        try:
            released = bool(self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key}).scalar())
        except Exception:  # noqa: BLE001 - the connection is gone: so is its session's lock
            pass
        finally:
            if released:
                conn, self._conn = self._conn, None
                conn.close()  # back to the engine's pool, for the next ask
            else:
                self._drop()

    def _drop(self) -> None:
        """Close the connection for good (not back to the pool): the server ends its session and
        releases any advisory lock it held."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def _abandon(self) -> None:
        self._drop()

    def close(self) -> None:
        self._drop()
        self._engine.dispose()


def advisory_key(study_name: str) -> int:
    """The advisory lock's key: the first 8 bytes of a SHA-256 of the study name, a signed int64."""
    digest = hashlib.sha256(f"spectune-ask\0{study_name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def ask_lock(storage, study_name: str, log=None, timeout_s: float = TIMEOUT_S) -> AskLock:
    """The ask lock for `study_name` on `storage` (an Optuna storage, as make_storage returns it, or a
    study's wrapped one). `log(line)` hears once per process about a storage it cannot lock."""
    import optuna
    from optuna.storages._cached_storage import _CachedStorage

    if isinstance(storage, _CachedStorage):
        storage = storage._backend  # the RDB storage inside a study's cache
    where = type(storage).__name__
    if isinstance(storage, optuna.storages.RDBStorage):
        url = storage.engine.url
        where = url.render_as_string(hide_password=True)
        if url.get_backend_name() == "postgresql":
            return AdvisoryLock(storage, where, study_name, timeout_s)
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            return ProcessLock(storage, where, study_name, timeout_s)
        if url.get_backend_name() == "sqlite" and not url.database.startswith("file:"):
            return FileLock(os.path.abspath(url.database) + ".ask-lock", where, study_name, timeout_s)
    elif isinstance(storage, optuna.storages.InMemoryStorage):
        return ProcessLock(storage, "in-memory storage", study_name, timeout_s)
    elif isinstance(storage, optuna.storages.JournalStorage):
        path = getattr(storage._backend, "_file_path", None)
        if isinstance(path, str):
            return FileLock(os.path.abspath(path) + ".ask-lock", f"journal {path}", study_name, timeout_s)
    if where not in _warned:
        _warned.add(where)
        if log is not None:
            log(f"spectune: no ask lock for {where}: concurrent drivers of one study on it may measure one configuration twice")
    return NoLock(where, study_name, timeout_s)


@contextmanager
def taking_turns(lock: AskLock | None, log=None):
    """`lock` (the driver's ask lock; None: none) around a failure path's FAIL and its params queued again.
    A failure path must not fail: a lock it cannot take (a wait past the timeout, a lost connection) is
    said in one line and the writes go ahead without it (at worst one configuration measured twice)."""
    try:
        held = lock.__enter__() if lock is not None else None
    except Exception as e:  # noqa: BLE001 - UserError, a driver error: the retry matters more than the turn
        held = None
        (log or _stderr)(f"spectune: {e}; the trial's retry is queued without it")
    try:
        yield
    finally:
        if held is not None:
            held.__exit__(None, None, None)


def _stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)
