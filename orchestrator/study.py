"""`spectune run`: the Optuna study loop. Create or load the study, recover trials a dead driver
left RUNNING, enqueue the baseline, then ask -> run on a Ray gang -> tell until `study.n_trials`
trials are COMPLETE. Rerunning the same command resumes; Ctrl-C, `ray job stop` (SIGTERM) and
crashes never lose a finished trial, and the interrupted one is retried with the same params.

    spectune run experiments/smoke-cpu.yaml --set study.n_trials=8
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import time
import warnings

from orchestrator.cluster import GangPool, Resources, connect
from orchestrator.config import ExperimentConfig, spectune_home
from orchestrator.errors import UserError
from orchestrator.progress import Progress
from orchestrator.space import baseline_params, grid_space, suggest
from orchestrator.tracking import Tracker, resolve_uri
from orchestrator.trial import TrialOutcome, run_trial
from orchestrator.validate import check_experiment

DRIVER_ATTR = "spectune.driver"  # host:pid of the driver running the trial
HEARTBEAT_ATTR = "spectune.heartbeat"  # unix time, refreshed after every prompt


def make_storage(cfg: ExperimentConfig):
    import optuna

    url = cfg.study.storage or f"sqlite:///{spectune_home() / 'optuna.db'}"
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        folder = os.path.dirname(os.path.abspath(path)) or "."
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise UserError(f"study.storage: cannot create {folder} ({e.strerror})") from None
        if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            raise UserError(f"study.storage: {path} is not writable")
    try:
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as e:  # noqa: BLE001 - any driver error: one line naming the storage
        raise UserError(f"study.storage: cannot open {url!r} ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def make_sampler(cfg: ExperimentConfig):
    import optuna

    s, seed = cfg.study.sampler, cfg.study.seed
    if s == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s == "grid":
        return optuna.samplers.GridSampler(grid_space(cfg), seed=seed)
    if s == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=3)


def make_pruner(cfg: ExperimentConfig):
    import optuna

    if cfg.study.pruner == "none":
        return optuna.pruners.NopPruner()
    if cfg.study.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1)
    # "clearly losing": below the 25th percentile of earlier trials at the same prompt
    return optuna.pruners.PercentilePruner(25.0, n_startup_trials=3, n_warmup_steps=1)


def _alive_here(driver: str) -> bool:
    host, _, pid = driver.rpartition(":")
    if host != socket.gethostname():
        return True  # another machine's driver: judged by its heartbeat only
    try:
        os.kill(int(pid), 0)
        return True
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True


def recover_stale(study, tracker: Tracker, stale_after_s: float, log) -> int:
    """Fail trials left RUNNING by a dead driver, mark their MLflow runs FAILED, retry their params."""
    import optuna
    from optuna.trial import TrialState

    recovered = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        driver = t.system_attrs.get(DRIVER_ATTR) or t.user_attrs.get(DRIVER_ATTR, "")
        beat = float(t.user_attrs.get(HEARTBEAT_ATTR, 0) or 0)
        if driver and _alive_here(driver) and time.time() - beat < stale_after_s:
            continue  # a live driver (another `spectune run`) is still on it
        try:
            study.tell(t.number, state=TrialState.FAIL)
        except (RuntimeError, ValueError):
            continue  # someone else finished or recovered it first
        study.set_user_attr(f"recovered.{t.number}", f"driver {driver or '?'} died; params retried")
        storage = study._storage
        storage.set_trial_user_attr(t._trial_id, "spectune.fail_reason", f"driver {driver or 'unknown'} died mid-trial")
        if run_id := t.user_attrs.get("mlflow_run_id"):
            tracker.finish_trial(run_id, "FAIL", f"driver {driver or 'unknown'} died mid-trial")
        study.enqueue_trial(t.params, user_attrs={"spectune.retry_of": t.number}, skip_if_exists=False)
        recovered += 1
        log(f"spectune: trial {t.number} was left RUNNING by dead driver {driver or '?'}: marked FAIL, params re-enqueued")
    return recovered


def _ensure_baseline(study, cfg: ExperimentConfig) -> None:
    from optuna.trial import TrialState

    if not cfg.study.baseline:
        return
    live = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
    if any(t.params.get("spec.num_draft_tokens") == 0 for t in study.get_trials(deepcopy=False, states=live)):
        return
    study.enqueue_trial(baseline_params(cfg), user_attrs={"spectune.baseline": True})


def count(study, *states) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def run_study(cfg: ExperimentConfig, log=None) -> dict:
    import optuna
    from optuna.trial import TrialState

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Some regimes for parameter")
    prepared = check_experiment(cfg)  # every input checked before anything launches
    home = spectune_home()
    storage = make_storage(cfg)
    tracker = Tracker(resolve_uri(cfg.tracking.uri, home), cfg.experiment_name, cfg.study_name, home)
    study = optuna.create_study(
        study_name=cfg.study_name, storage=storage, direction="maximize", sampler=make_sampler(cfg),
        pruner=make_pruner(cfg), load_if_exists=True,
    )
    study.set_user_attr("mlflow_parent_run_id", tracker.parent_run_id)
    recover_stale(study, tracker, cfg.limits.trial_timeout_s + 120, log)
    _ensure_baseline(study, cfg)
    n_goal, max_failed = cfg.study.n_trials, cfg.study.max_failed_trials if cfg.study.max_failed_trials is not None else cfg.study.n_trials
    progress = Progress(study, n_goal, log)
    where = connect()
    log(f"spectune: study {cfg.study_name!r}: {count(study, TrialState.COMPLETE)}/{n_goal} complete; {where}; "
        f"MLflow {tracker.uri} run {tracker.parent_run_id}")
    res = Resources(cfg.parallel.cpus_per_worker, cfg.limits.placement_timeout_s, cfg.limits.trial_timeout_s, cfg.limits.setup_timeout_s)
    pool = GangPool(res, log)
    failed_here = 0
    me = f"{socket.gethostname()}:{os.getpid()}"
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    status = "FINISHED"
    try:
        while count(study, TrialState.COMPLETE) < n_goal:
            if failed_here > max_failed:
                raise UserError(f"study: {failed_here} trials failed in this run (limit study.max_failed_trials={max_failed}); see the MLflow runs' spectune.reason")
            trial = study.ask()
            trial.set_user_attr(DRIVER_ATTR, me)
            trial.set_user_attr(HEARTBEAT_ATTR, time.time())
            outcome: TrialOutcome = run_trial(study, trial, cfg, prepared, pool, tracker, HEARTBEAT_ATTR)
            failed_here += outcome.state == "FAIL"
            progress.trial_done(trial.number, outcome)
    except KeyboardInterrupt:
        status = "KILLED"
        log("spectune: interrupted; finished trials are saved, run the same command to resume")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        pool.close()
        tracker.log_metrics(tracker.parent_run_id, {"gangs_launched_last_run": pool.launched})
        summary = progress.finish(tracker, status)
        summary["gangs_launched"] = pool.launched
    return summary


def _raise_interrupt(signum, frame):  # SIGTERM (ray job stop) -> the same clean path as Ctrl-C
    raise KeyboardInterrupt
