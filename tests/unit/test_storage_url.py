"""The storage URL rule (orchestrator/tracking/storage.py): a SQLite storage whose folder is missing is one
line and exit 2, never a new, empty study somewhere unexpected, except inside spectune's own
$SPECTUNE_HOME, where the default storage lives and folders are made as needed. No processes.

    .venv/bin/python -m pytest tests/unit/test_storage_url.py
"""

from __future__ import annotations

import pytest

from orchestrator.config.schema import ExperimentConfig
from orchestrator.errors import UserError
from orchestrator.tracking.storage import _redact, make_storage, sqlite_file


def test_a_missing_folder_outside_home_is_one_line_and_makes_nothing(tmp_path):
    home = tmp_path / "home"
    typo = tmp_path / "nonexistent" / "dir"
    with pytest.raises(UserError, match=r"^study.storage: cannot create .*/nonexistent/dir/optuna.db: its folder .* does not exist"):
        sqlite_file(f"sqlite:///{typo}/optuna.db", home)
    assert not typo.parent.exists() and not home.exists()


def test_folders_inside_home_are_made(tmp_path):
    home = tmp_path / "home"
    assert sqlite_file(f"sqlite:///{home}/optuna.db", home) == f"{home}/optuna.db"  # the default location
    assert sqlite_file(f"sqlite:///{home}/studies/a/optuna.db", home) == f"{home}/studies/a/optuna.db"
    assert (home / "studies" / "a").is_dir()


def test_an_existing_folder_is_used_as_is(tmp_path):
    (tmp_path / "data").mkdir()
    assert sqlite_file(f"sqlite:///{tmp_path}/data/o.db", tmp_path / "home") == f"{tmp_path}/data/o.db"


def test_a_file_where_the_folder_should_be(tmp_path):
    (tmp_path / "experiment.yaml").write_text("name: x\n")
    with pytest.raises(UserError, match=r"^study.storage: .*experiment.yaml is not a directory$"):
        sqlite_file(f"sqlite:///{tmp_path}/experiment.yaml/optuna.db", tmp_path / "home")


def test_make_storage_refuses_a_mistyped_folder_before_writing_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path / "home"))
    raw = {
        "name": "x",
        "search": {"space": {"drafter.kind": {"choices": ["ngram"]}}},
        "study": {"storage": "sqlite:////nonexistent/dir/optuna.db"},
    }
    cfg = ExperimentConfig.model_validate(raw)
    with pytest.raises(
        UserError, match=r"^study.storage: cannot create /nonexistent/dir/optuna.db: its folder /nonexistent/dir does not exist"
    ):
        make_storage(cfg)
    assert not (tmp_path / "home").exists()


def test_the_password_never_shows():
    assert (
        _redact("postgresql+psycopg://spectune:s3cret@127.0.0.1:5432/optuna") == "postgresql+psycopg://spectune:***@127.0.0.1:5432/optuna"
    )
    assert _redact("postgresql+psycopg://spectune@127.0.0.1:5432/optuna") == "postgresql+psycopg://spectune@127.0.0.1:5432/optuna"
