"""MLflow side of a study: one parent run per study, one nested run per trial (names from DESIGN.md).

    tracker = Tracker(uri, experiment, study_name)   # finds or creates the parent run (resume = same run)
    run_id = tracker.start_trial(number, params)     # nested run, RUNNING
    tracker.finish_trial(run_id, metrics, state="FINISHED")

Uses MlflowClient only (no global active run), so nothing leaks between studies in one process.
The tracking URI comes from the YAML, else MLFLOW_TRACKING_URI, else a SQLite store in
$SPECTUNE_HOME; with a SQLite store, artifacts go to $SPECTUNE_HOME/mlartifacts (not the cwd).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.errors import is_write_race

STUDY_TAG = "spectune.study"
TRIAL_TAG = "spectune.trial"
STATE_TAG = "spectune.state"
PARENT_TAG = "mlflow.parentRunId"
PARENT_ATTR = "mlflow_parent_run_id"  # the Optuna study's user attr naming the parent run


def resolve_uri(configured: str | None, home: Path) -> str:
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"


class Tracker:
    def __init__(self, uri: str, experiment: str, study_name: str, home: Path, study=None):
        import logging

        from mlflow.tracking import MlflowClient

        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # our stdout is the summary JSON
        logging.getLogger("mlflow").setLevel(logging.ERROR)
        logging.getLogger("alembic").setLevel(logging.ERROR)
        self.uri, self.study_name = uri, study_name
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            local = uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri
            location = (home / "mlartifacts" / experiment).resolve().as_uri() if local else None
            try:
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
            except Exception:  # noqa: BLE001 - another driver created it first
                self.experiment_id = self.client.get_experiment_by_name(experiment).experiment_id
        else:
            self.experiment_id = exp.experiment_id
        self.parent_run_id = self._parent(study)
        if study is not None:
            study.set_user_attr(PARENT_ATTR, self.parent_run_id)

    def _parents(self) -> list:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{STUDY_TAG}` = '{self.study_name}' and tags.`spectune.role` = 'study'",
            max_results=100,
        )
        return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))

    def _parent(self, study) -> str:
        """The study's one parent run. The Optuna study records its id (user attr
        `mlflow_parent_run_id`), so every driver of the study, on any host, continues under the same
        run. Without a record: the earliest run tagged for the study, else a new one. A new run is
        checked after creation: if another driver created one first, ours is deleted and theirs used.
        (Drivers on one host also take a lock around this, see study.study_lock.)"""
        known = study.user_attrs.get(PARENT_ATTR) if study is not None else None
        if known:
            try:
                run = self.client.get_run(known)
                if run.info.lifecycle_stage == "active" and run.info.experiment_id == self.experiment_id:
                    self.client.update_run(known, status="RUNNING")
                    return known
            except Exception:  # noqa: BLE001 - deleted, or another tracking store: find or create below
                pass
        if runs := self._parents():
            self.client.update_run(runs[0].info.run_id, status="RUNNING")
            return runs[0].info.run_id
        mine = self.client.create_run(
            self.experiment_id, run_name=self.study_name,
            tags={STUDY_TAG: self.study_name, "spectune.role": "study"},
        ).info.run_id
        first = self._parents()[0].info.run_id
        if first != mine:
            self.client.delete_run(mine)
        return first

    def start_trial(self, number: int, params: dict[str, Any], tags: dict[str, str] | None = None) -> str:
        run = self.client.create_run(
            self.experiment_id, run_name=f"trial-{number}",
            tags={STUDY_TAG: self.study_name, TRIAL_TAG: str(number), STATE_TAG: "RUNNING",
                  PARENT_TAG: self.parent_run_id, **(tags or {})},
        )
        from mlflow.entities import Param

        self.client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in params.items()])
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v]
        for i in range(0, len(batch), 900):
            self._write(self.client.log_batch, run_id, metrics=batch[i : i + 900])

    def log_step_series(self, run_id: str, series: dict[str, list[float]]) -> None:
        """Per-prompt values as metric histories (step = prompt index)."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, i) for k, values in series.items() for i, v in enumerate(values)]
        for i in range(0, len(batch), 900):
            self._write(self.client.log_batch, run_id, metrics=batch[i : i + 900])

    def log_json(self, run_id: str, obj: Any, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(obj, indent=1, default=str))
            self.client.log_artifact(run_id, str(path))

    def log_file(self, run_id: str, path: Path) -> None:
        self.client.log_artifact(run_id, str(path))

    def finish_trial(self, run_id: str, state: str, reason: str | None = None) -> None:
        """state: COMPLETE | PRUNED | FAIL | INVALID (the Optuna outcome, kept as a tag)."""
        self.set_tag(run_id, STATE_TAG, state)
        if reason:
            self.set_tag(run_id, "spectune.reason", reason[:4000])
        self.client.set_terminated(run_id, status="FINISHED" if state in ("COMPLETE", "PRUNED") else "FAILED")

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self._write(self.client.set_tag, run_id, key, value)

    @staticmethod
    def _write(fn, *args, attempts: int = 5, **kwargs) -> None:
        """An MLflow write that two drivers of one study may race on (both set the parent's best
        tag and metrics when they finish together: a SQLite store raises UNIQUE constraint for the
        loser's insert); the retry finds the row and updates it."""
        import time

        for attempt in range(attempts):
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - only the write race is retried
                if not is_write_race(e) or attempt == attempts - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def finish_study(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.parent_run_id, status=status)
