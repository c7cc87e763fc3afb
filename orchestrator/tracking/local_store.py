"""A new local MLflow SQLite store, started from an empty, already migrated copy.

MLflow builds a new SQLite store by running each of its schema migrations in turn: seconds on a
small machine, paid by every study that starts in a fresh `SPECTUNE_HOME`. The first time, spectune
builds one empty store per MLflow version in its cache folder (`$SPECTUNE_CACHE`, else
`~/.cache/spectune`: where the demo model is kept too) and copies it from then on. The copy holds the schema and MLflow's default
workspace only: the "Default" experiment is removed from it, so MLflow recreates that one on open
with the artifact location it would have given it anyway. Anything that goes wrong here (a
read-only cache, a half-written file) leaves the store to MLflow, as before.

    seed_sqlite_store("sqlite:////path/to/mlflow.db")   # before the first MlflowClient on it
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    # the folder of workers/model/checkpoint.py's cache_root (not imported: it would import torch here)
    return Path(os.environ.get("SPECTUNE_CACHE") or Path.home() / ".cache" / "spectune")


def sqlite_path(uri: str) -> Path | None:
    """The file of a `sqlite:///` URI (absolute or relative), None for anything else (a server, memory)."""
    if not uri.startswith("sqlite:///") or uri == "sqlite:///:memory:":
        return None
    return Path(uri[len("sqlite:///") :].split("?", 1)[0])


def _template(folder: Path) -> Path:
    import mlflow

    path = folder / f"mlflow-{mlflow.__version__}-empty.db"
    if path.exists() and _is_migrated(path):
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        built = Path(tmp) / "store.db"
        store = SqlAlchemyStore(f"sqlite:///{built}", Path(tmp).as_uri())
        store.engine.dispose()
        with sqlite3.connect(built) as con:  # MLflow recreates Default (id 0) with the right location on open
            con.execute("delete from experiment_tags")
            con.execute("delete from experiments")
        os.replace(built, path)  # whole or absent: two builders at once both write a complete file
    return path


def _is_migrated(path: Path) -> bool:
    """A store MLflow migrated (it records its schema version): not a truncated or foreign file."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            return bool(con.execute("select version_num from alembic_version").fetchone())
    except sqlite3.Error:
        return False


def seed_sqlite_store(uri: str, cache: Path | None = None) -> bool:
    """Give a not-yet-existing SQLite store MLflow's current schema by copying the cached empty store.
    True if it was seeded; False if the store exists, is not a SQLite file, or seeding failed."""
    path = sqlite_path(uri)
    if path is None or path.exists() or not path.parent.is_dir():
        return False
    try:
        template = _template(cache or cache_dir())
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.close(fd)
        try:
            shutil.copyfile(template, tmp)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # as MLflow would have created it (mkstemp's file is private)
            os.link(tmp, path)  # never over a store another driver created meanwhile
        finally:
            os.unlink(tmp)
        return True
    except FileExistsError:
        return False
    except Exception:  # noqa: BLE001 - only a speed-up: MLflow builds the store itself
        return False
