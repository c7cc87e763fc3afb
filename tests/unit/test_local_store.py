"""A new local MLflow store starts from the cached empty, migrated copy (orchestrator/tracking/local_store.py).

.venv/bin/python -m pytest tests/unit/test_local_store.py
"""

from __future__ import annotations

import os
import sqlite3

from orchestrator.tracking.local_store import seed_sqlite_store, sqlite_path


def test_a_seeded_store_is_a_working_mlflow_store_and_a_store_in_use_is_never_touched(tmp_path):
    from mlflow.tracking import MlflowClient

    cache, home = tmp_path / "cache", tmp_path / "home"
    home.mkdir()
    first, second = f"sqlite:///{home / 'a.db'}", f"sqlite:///{home / 'b.db'}"
    assert seed_sqlite_store(first, cache) and seed_sqlite_store(second, cache)
    assert len(list(cache.iterdir())) == 1  # one template per MLflow version, built once
    client = MlflowClient(tracking_uri=first)
    default = client.get_experiment("0")  # recreated on open, located where MLflow puts it, not where the template was built
    assert default.name == "Default" and str(cache) not in default.artifact_location
    run = client.create_run(client.create_experiment("study"))
    client.log_metric(run.info.run_id, "throughput_tok_s", 5.0)
    assert client.get_run(run.info.run_id).data.metrics == {"throughput_tok_s": 5.0}
    # a store that exists is left alone: its runs stay
    assert not seed_sqlite_store(first, cache)
    assert MlflowClient(tracking_uri=first).get_run(run.info.run_id).data.metrics == {"throughput_tok_s": 5.0}
    with sqlite3.connect(home / "b.db") as con:  # the other copy is empty: the template holds no runs
        assert con.execute("select count(*) from runs").fetchone() == (0,)


def test_what_is_not_a_new_local_sqlite_file_is_left_to_mlflow(tmp_path):
    assert sqlite_path("http://127.0.0.1:5000") is None and sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("sqlite:////x/y.db?timeout=5") == sqlite_path("sqlite:////x/y.db")
    assert not seed_sqlite_store(f"sqlite:///{tmp_path / 'missing' / 'm.db'}", tmp_path / "cache")  # no folder: MLflow's error
    blocked = tmp_path / "ro-cache"
    blocked.write_text("a file where the cache folder should be")
    assert not seed_sqlite_store(f"sqlite:///{tmp_path / 'm.db'}", blocked)  # no cache: MLflow builds it, as before
    assert not (tmp_path / "m.db").exists() and not list(tmp_path.glob(".m.db.*"))


def test_a_broken_template_is_built_again_and_a_copy_has_the_umasks_mode(tmp_path):
    import mlflow

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"mlflow-{mlflow.__version__}-empty.db").write_bytes(b"SQLite format 3\0 truncated")
    uri = f"sqlite:///{tmp_path / 'a.db'}"
    assert seed_sqlite_store(uri, cache)
    with sqlite3.connect(tmp_path / "a.db") as con:
        assert con.execute("select version_num from alembic_version").fetchone()  # a migrated store, not the broken file
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a.db").stat().st_mode & 0o777 == 0o666 & ~umask
