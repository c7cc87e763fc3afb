"""MLflow side of a study: one parent run per study, one nested run per trial (names: docs/tags.md, orchestrator/record.py).

    tracker = Tracker(uri, experiment, study_name, home, study, base_params)  # finds or creates the parent run (resume = same run)
    run_id = tracker.start_trial(number, params)     # nested run "#<number> <configuration>", RUNNING
    tracker.finish_trial(run_id, "COMPLETE")         # or PRUNED (MLflow KILLED), FAIL (FAILED), with a reason tag

The experiment is tagged `mlflow.experimentKind` so MLflow 3 shows its training-runs view; every
tag name is in docs/tags.md. Metrics are logged to 4 significant digits.

Uses MlflowClient only (no global active run), so nothing leaks between studies in one process.
The tracking URI comes from the YAML, else MLFLOW_TRACKING_URI, else a SQLite store in
$SPECTUNE_HOME; with a SQLite store, artifacts go to $SPECTUNE_HOME/mlartifacts (not the cwd).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.config import registry
from orchestrator.errors import is_write_race
from orchestrator.record import (
    FAIL_TAG,
    NAME_TAG,
    PARENT_ATTR,
    PARENT_TAG,
    PRUNE_TAG,
    ROLE_TAG,
    STATE_TAG,
    STUDY_TAG,
    TRIAL_TAG,
)
from orchestrator.tracking.local_store import seed_sqlite_store

# Tag names, shared by MLflow (run tags) and Optuna (trial user attrs); docs/tags.md is their table.
# MLflow 3 picks the UI of an experiment from this tag (mlflow/assistant/skills/mlflow-onboarding/SKILL.md:
# "custom_model_development" -> traditional ML, i.e. the training-runs view, not the GenAI one)
KIND_TAG, KIND_CLASSIC = "mlflow.experimentKind", "custom_model_development"
# MLflow run status of each Optuna outcome: a pruned trial was stopped on purpose (KILLED), not finished
RUN_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED", "INVALID": "FAILED"}
RUN_NAME_MARK = {"PRUNED": "pruned: ", "FAIL": "failed: ", "INVALID": "invalid: "}


def config_label(params: dict[str, Any]) -> str:
    """A trial's configuration in a few words, the name of its MLflow run and its label in the report:
    "ngram k=6 gloo tp2", "layer_skip L=8 k=4 nccl PROTO=LL tp2", "eagle3 rank0 lookup=2 k=4 gloo tp2",
    "eagle3 rank0 tree=3 k=4 gloo tp2", "plain gloo tp2" (k = 0), "plain nccl tp8 emulated" (one rank of
    TP 8 in one process, parallel.emulate_tp)."""
    k = int(params.get("spec.num_draft_tokens", 0) or 0)
    kind = str(params.get("drafter.kind", "none"))
    if k == 0:
        head = "plain"
    else:
        head = {"layer_skip": f"layer_skip L={params.get('drafter.layers', '?')}", "draft_model": "draft_model"}.get(kind, kind)
        if kind == "eagle3":  # where the head runs, whether n-gram lookup drafts before it, and a tree's width
            head += f" {params.get('drafter.placement', 'actor')}"
            head += f" lookup={params['drafter.lookup']}" if int(params.get("drafter.lookup") or 0) else ""
            head += f" tree={params['drafter.tree_width']}" if int(params.get("drafter.tree_width") or 0) >= 2 else ""
        head += f" k={k}"
    nccl = "".join(
        f" {key.removeprefix('nccl.').removeprefix('NCCL_')}={v}" for key, v in sorted(params.items()) if key.startswith("nccl.")
    )
    tp, emulated = params.get("parallel.tp"), params.get("parallel.emulate_tp")
    where = f" tp{emulated} emulated" if emulated not in (None, "", "None") else (f" tp{tp}" if tp is not None else "")
    return f"{head} {params.get('comm.backend', '?')}{nccl}{where}"


def trial_run_name(number: int, params: dict[str, Any]) -> str:
    """A trial's MLflow run name: its number and its configuration, "#4 ngram k=6 gloo tp2" (a pruned
    or failed trial's gets a mark in front, RUN_NAME_MARK)."""
    return f"#{number} {config_label(params)}"


def label_defaults(cfg) -> dict[str, Any]:
    """What a trial runs with where the search space does not set it (Optuna's params hold only
    the searched names): merged under a trial's params before `config_label`."""
    # every parameter but the engine's (labels leave engine options to the report's own column)
    out = {n: registry.value(cfg, n) for n in registry.PARAMS if not n.startswith("engine.")}
    out = {n: v for n, v in out.items() if v is not None}
    if cfg.parallel.emulate_tp is not None:
        out["parallel.emulate_tp"] = cfg.parallel.emulate_tp
    return out


def experiment_params(cfg) -> dict[str, Any]:
    """The experiment's fixed settings as dotted MLflow params: model, dtype, device, workload
    (prompts, how many, max new tokens, batch sizes, repeats) and engine options. A trial's own
    params (the search space) are logged on top of these."""
    out: dict[str, Any] = {}
    for section in ("model", "workload", "engine"):
        part = getattr(cfg, section, None)
        if part is None:
            continue
        for key, value in part.model_dump(mode="json").items():
            # a mapping (a profile per drafter kind): a param per key
            items = {f"{key}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value}
            for name, v in items.items():
                if v is not None and v != []:  # an empty list: the setting is off
                    out[f"{section}.{name}"] = ",".join(map(str, v)) if isinstance(v, list) else v
    out["parallel.device"] = cfg.parallel.device
    out["parallel.tp"] = cfg.parallel.tp
    out["comm.backend"] = cfg.parallel.backend
    from orchestrator.config import emulation

    out.update(emulation.params(cfg))  # emulated TP: parallel.emulated, the table's name and hash, the acceptance
    return out


def rounded(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant digits: timings and rates carry no more than that."""
    if value == 0 or not math.isfinite(value) or float(value).is_integer():
        return float(value)
    return float(f"{value:.{digits}g}")


def resolve_uri(configured: str | None, home: Path) -> str:
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"


class Tracker:
    def __init__(
        self,
        uri: str,
        experiment: str,
        study_name: str,
        home: Path,
        study=None,
        base_params: dict[str, Any] | None = None,
        name: str | None = None,
    ):
        """`experiment`: the study's own MLflow experiment (ExperimentConfig.experiment_name), where a new
        study's runs go; a study whose record names its parent run stays in that run's experiment (a
        study begun when several studies shared one experiment resumes there). `name`: the experiment
        YAML's `name`, a tag (NAME_TAG) of the experiment and the parent run."""
        import logging

        from mlflow.tracking import MlflowClient

        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # our stdout is the summary JSON
        logging.getLogger("mlflow").setLevel(logging.ERROR)
        logging.getLogger("alembic").setLevel(logging.ERROR)
        self.uri, self.study_name, self.name = uri, study_name, name
        seed_sqlite_store(uri)  # a new local store: a copy of an empty migrated one, not MLflow's migrations
        self.client = MlflowClient(tracking_uri=uri)
        known = self._known_parent(study)
        exp = self.client.get_experiment(known.info.experiment_id) if known is not None else None
        if exp is None or exp.lifecycle_stage != "active":
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
        if exp is None or exp.tags.get(KIND_TAG) != KIND_CLASSIC:
            self._write(self.client.set_experiment_tag, self.experiment_id, KIND_TAG, KIND_CLASSIC)
        if name and (exp is None or exp.tags.get(NAME_TAG) != name):
            self._write(self.client.set_experiment_tag, self.experiment_id, NAME_TAG, name)
        self.base_params = dict(base_params or {})
        self.parent_run_id = self._parent(study, known)
        if study is not None:
            study.set_user_attr(PARENT_ATTR, self.parent_run_id)

    def where(self) -> str:
        """Where to look: for a tracking server, the URL of the study's runs in the training-runs view
        (`workflowType=machine_learning`: MLflow 3.x's UI otherwise opens on its GenAI pages until
        the user picks "Model training" once); for a local store, the URI."""
        if self.uri.startswith(("http://", "https://")):
            return f"MLflow UI {self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs?workflowType=machine_learning"
        return f"MLflow {self.uri}"

    def _parents(self) -> list:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{STUDY_TAG}` = '{self.study_name}' and tags.`{ROLE_TAG}` = 'study'",
            max_results=100,
        )
        return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))

    def _known_parent(self, study):
        """The parent run the Optuna study records (user attr `mlflow_parent_run_id`), where it is an
        active run of this tracking store; else None."""
        known = study.user_attrs.get(PARENT_ATTR) if study is not None else None
        if not known:
            return None
        try:
            run = self.client.get_run(known)
        except Exception:  # noqa: BLE001 - deleted, or another tracking store: find or create
            return None
        return run if run.info.lifecycle_stage == "active" else None

    def _parent(self, study, known=None) -> str:
        """The study's one parent run. The Optuna study records its id (user attr
        `mlflow_parent_run_id`), so every driver of the study, on any host, continues under the same
        run. Without a record: the earliest run tagged for the study, else a new one. A new run is
        checked after creation: if another driver created one first, ours is deleted and theirs used.
        (Drivers on one host also take a lock around this, see storage.study_lock.)"""
        if known is not None and known.info.experiment_id == self.experiment_id:
            self.client.update_run(known.info.run_id, status="RUNNING")
            return known.info.run_id
        if runs := self._parents():
            self.client.update_run(runs[0].info.run_id, status="RUNNING")
            return runs[0].info.run_id
        tags = {STUDY_TAG: self.study_name, ROLE_TAG: "study", **({NAME_TAG: self.name} if self.name else {})}
        mine = self.client.create_run(self.experiment_id, run_name=self.study_name, tags=tags).info.run_id
        first = self._parents()[0].info.run_id
        if first != mine:
            self.client.delete_run(mine)
        elif self.base_params:
            from mlflow.entities import Param

            self.client.log_batch(mine, params=[Param(k, str(v)) for k, v in self.base_params.items()])
        return first

    def start_trial(self, number: int, params: dict[str, Any], tags: dict[str, str] | None = None) -> str:
        """The trial's nested run, named by its number and configuration (`trial_run_name`), its number
        also a tag; params: the experiment's fixed settings with the trial's own on top."""
        run = self.client.create_run(
            self.experiment_id,
            run_name=trial_run_name(number, params),
            tags={
                STUDY_TAG: self.study_name,
                ROLE_TAG: "trial",
                TRIAL_TAG: str(number),
                STATE_TAG: "RUNNING",
                PARENT_TAG: self.parent_run_id,
                **(tags or {}),
            },
        )
        from mlflow.entities import Param

        self.client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in {**self.base_params, **params}.items()])
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, rounded(float(v)), now, step) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v]
        for i in range(0, len(batch), 900):
            self._write(self.client.log_batch, run_id, metrics=batch[i : i + 900])

    def log_step_series(self, run_id: str, series: dict[str, list[float]]) -> None:
        """Per-prompt values as metric histories (step = prompt index)."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, rounded(float(v)), now, i) for k, values in series.items() for i, v in enumerate(values)]
        for i in range(0, len(batch), 900):
            self._write(self.client.log_batch, run_id, metrics=batch[i : i + 900])

    def log_json(self, run_id: str, obj: Any, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(obj, indent=1, default=str))
            self.client.log_artifact(run_id, str(path))

    def load_json(self, run_id: str, name: str) -> Any:
        """An artifact `log_json` wrote (None when the run has no such file)."""
        from mlflow.exceptions import MlflowException

        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr carries our log lines
        with tempfile.TemporaryDirectory() as tmp:
            try:
                return json.loads(Path(self.client.download_artifacts(run_id, name, tmp)).read_text())
            except (MlflowException, OSError, ValueError):
                return None

    def log_file(self, run_id: str, path: Path, folder: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path=folder)

    def finish_trial(self, run_id: str, state: str, reason: str | None = None) -> None:
        """state: COMPLETE | PRUNED | FAIL | INVALID (the Optuna outcome, kept as a tag); the run's
        MLflow status follows RUN_STATUS, and a reason goes to spectune.prune_reason or spectune.fail_reason."""
        self.set_tag(run_id, STATE_TAG, state)
        if reason:
            self.set_tag(run_id, PRUNE_TAG if state == "PRUNED" else FAIL_TAG, reason[:4000])
        if mark := RUN_NAME_MARK.get(state):
            # MLflow's run list draws one icon for KILLED and FAILED: the name tells them apart
            name = self.client.get_run(run_id).info.run_name or ""
            if not name.startswith(mark):
                self._write(self.client.update_run, run_id, name=f"{mark}{name}")
        self.client.set_terminated(run_id, status=RUN_STATUS.get(state, "FAILED"))

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
