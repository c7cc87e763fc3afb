"""The study's Optuna storage: opened (tables created) before anything else is written, so a storage
that cannot be used is one line and exit 2; and the per-host lock drivers of one study take turns
under at start-up.

    storage, url = make_storage(cfg)      # RDBStorage on cfg.study.storage, default sqlite in $SPECTUNE_HOME
                                          # (a sqlite folder elsewhere must exist: `sqlite_file`)
    with study_lock(home, cfg, url): ...  # parent run, recovery, baseline: one driver at a time
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from pathlib import Path

from orchestrator.config.schema import ExperimentConfig, spectune_home
from orchestrator.errors import UserError, is_write_race


def make_storage(cfg: ExperimentConfig):
    """The Optuna storage, opened (and its tables created) before anything else is written:
    a storage that cannot be used is one line and exit 2, with no MLflow run, no Ray, no files elsewhere."""
    import optuna

    url = cfg.study.storage or f"sqlite:///{spectune_home() / 'optuna.db'}"
    kwargs: dict = {"pool_pre_ping": True}
    if url.startswith("sqlite:///"):
        path = sqlite_file(url, spectune_home())
        url = f"sqlite:///{path}"
        kwargs = {"connect_args": {"timeout": 60}}
    elif url.startswith(("postgresql", "mysql")):
        kwargs["connect_args"] = {"connect_timeout": 10}  # an unreachable host fails in seconds, not minutes
    try:
        return _open_rdb(optuna, url, kwargs), url
    except ImportError as e:  # optuna wraps the driver's ModuleNotFoundError
        missing = next((x.name for x in (e, e.__cause__, e.__context__) if isinstance(x, ModuleNotFoundError)), None)
        hint = {"psycopg": "pip install 'psycopg[binary]'", "psycopg2": "pip install psycopg2-binary", "pymysql": "pip install pymysql"}
        raise UserError(
            f"study.storage: {_redact(url)} needs the database driver {missing or 'module'!r}, which is not installed "
            f"({hint.get(missing or '', 'install the driver SQLAlchemy names for this URL')})"
        ) from None
    except Exception as e:  # noqa: BLE001 - any driver error: one line naming the storage
        raise UserError(f"study.storage: {_server_problem(url, e) or _driver_message(url, e)}") from None


def _driver_message(url: str, e: BaseException) -> str:
    """A storage error nothing more specific names: the driver's own first words, without SQLAlchemy's
    wrapping (the exception class in parentheses, its "Background on this error" link), on one line."""
    msg = str(getattr(e, "orig", None) or e)
    msg = re.sub(r"\(Background on this error at: [^)]*\)", "", msg)
    msg = re.sub(r"^\([\w.]+\)\s*", "", msg.strip())
    msg = " ".join(msg.split())
    msg = msg if len(msg) <= 200 else msg[:197] + "..."
    return f"cannot open {_redact(url)}: {type(e).__name__}: {msg}"


def _server_problem(url: str, e: BaseException) -> str | None:
    """What is wrong with a PostgreSQL URL, by the part that is wrong (database, role, password, host,
    port), from the server's or libpq's answer; None for any other error. Never the password itself."""
    if not url.startswith("postgresql"):
        return None
    from sqlalchemy.engine import make_url

    text = str(getattr(e, "orig", None) or e)
    try:
        u = make_url(url)
    except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot read failed before any connection
        return None
    host, port = u.host or "localhost", u.port or 5432
    server = f"the PostgreSQL server at {host}:{port}"
    user = u.username or "(the current user)"
    if m := re.search(r'database "([^"]*)" does not exist', text):
        return f"database {m.group(1)!r} does not exist on {server} (create it, or name an existing one in the URL's path)"
    if m := re.search(r'role "([^"]*)" does not exist', text):
        return f"role (user) {m.group(1)!r} does not exist on {server}"
    if m := re.search(r'password authentication failed for user "([^"]*)"', text):
        where = "the URL's" if u.password else "the given"
        return f"{server} refused user {m.group(1)!r}: {where} password is wrong, or there is no such role (PostgreSQL does not say which)"
    if "no password supplied" in text:
        passfile = u.query.get("passfile")
        if isinstance(passfile, str) and not os.path.isfile(os.path.expanduser(passfile)):
            return f"passfile {passfile!r} does not exist: no password for user {user!r} on {server}"
        given = f"passfile {passfile!r} has no line for it" if passfile else "the URL gives none (a password, ?passfile=FILE or PGPASSWORD)"
        return f"{server} asks user {user!r} for a password and {given}"
    if "Connection refused" in text:
        return f"nothing accepts connections at {host}:{port} (connection refused): is PostgreSQL running there, on that port?"
    if "failed to resolve host" in text or "could not translate host name" in text:
        return f"host {host!r} cannot be resolved (no such name)"
    if "timeout expired" in text:
        return f"{server} did not answer within 10 s"
    return None


def sqlite_file(url: str, home: Path) -> str:
    """The database file of a `sqlite:///` storage URL, checked before anything is written. Its folder
    is made only inside spectune's own `home` ($SPECTUNE_HOME, where the default storage lives);
    anywhere else it must exist: a mistyped path is one line, never a new, empty study."""
    path = os.path.expanduser(url.removeprefix("sqlite:///"))
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UserError(f"study.storage: {folder} is not a directory")
    if not os.path.exists(folder):
        real_home = os.path.realpath(home)
        if os.path.commonpath([os.path.realpath(folder), real_home]) != real_home:
            raise UserError(
                f"study.storage: cannot create {path}: its folder {folder} does not exist "
                "(spectune makes folders only in $SPECTUNE_HOME; create it first if this is the path you meant)"
            )
        try:
            os.makedirs(folder, exist_ok=True)
        except FileExistsError:
            raise UserError(f"study.storage: {folder} is not a directory") from None
        except OSError as e:
            raise UserError(f"study.storage: cannot create {folder} ({e.strerror})") from None
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UserError(f"study.storage: {path} is not writable")
    return path


def _open_rdb(optuna, url: str, kwargs: dict, attempts: int = 5):
    """RDBStorage. Two drivers starting together would both create the schema: on SQLite a file
    lock beside the database makes them take turns; elsewhere the loser of that race (a "table
    already exists" or a duplicate alembic version) tries again and finds the tables."""
    lock = None
    if url.startswith("sqlite:///"):
        import fcntl

        lock = open(url.removeprefix("sqlite:///") + ".lock", "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        for attempt in range(attempts):
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
            except Exception as e:  # noqa: BLE001 - only the schema race is retried
                if not is_write_race(e) or attempt == attempts - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))
    finally:
        if lock is not None:
            lock.close()  # releases the flock


def _redact(url: str) -> str:
    """The URL without its password."""
    import re

    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


@contextlib.contextmanager
def study_lock(home, cfg: ExperimentConfig, storage_url: str):
    """Drivers of one study on this host take turns at start-up (parent run, recovery, baseline)."""
    import fcntl

    folder = home / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(f"{storage_url}\0{cfg.study_name}".encode()).hexdigest()[:16]
    with open(folder / f"{key}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def frozen_trial(study, number: int):
    """Trial `number` of `study` as Optuna stores it (system attributes included: an enqueued
    trial's `fixed_params`), through the public API only."""
    for t in study.get_trials(deepcopy=False):
        if t.number == number:
            return t
    raise KeyError(f"trial {number} is not in study {study.study_name}")


def set_trial_user_attr(storage, study, number: int, key: str, value) -> None:
    """Set a user attribute of trial `number`, which this process may not hold as a live `Trial`
    (a RUNNING trial a dead driver left behind)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    storage.set_trial_user_attr(storage.get_trial_id_from_study_id_trial_number(study_id, number), key, value)
