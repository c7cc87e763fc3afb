"""`spectune run`: the Optuna study. Create or load the study (a resumed study must keep its fixed
part, orchestrator/config/fixed.py), recover trials a dead driver left RUNNING (a driver is its
host, pid and the pid's start time), enqueue the k = 0 baseline once per TP size (searched k or
not), plan the slots trials run in (orchestrator/execution/slots.py), then hand over to the trial
loop (orchestrator/study/runner.py: ask -> run on a Ray gang -> tell, one or several trials at once)
until `study.n_trials` trials are COMPLETE, every distinct configuration of a finite space is known,
or `study.max_failed_trials` trials failed in this run. Rerunning the same command resumes; Ctrl-C,
`ray job stop` (SIGTERM) and crashes never lose a finished trial, and interrupted ones are retried
with the same params. The summary's "ranking" (orchestrator/search/ranking.py) pools repeated
configurations and says whether the winner is ahead of the runner-up by more than the noise.

    spectune run experiments/smoke-cpu.yaml --set study.n_trials=8
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.config import emulation
from orchestrator.config.fixed import check_resume
from orchestrator.config.fixed import record as record_fixed
from orchestrator.config.schema import ExperimentConfig, spectune_home
from orchestrator.config.space import (
    MAX_ENUMERATED,
    CategoricalParam,
    IntParam,
    baseline_params,
    candidates,
    check_constraints,
    distinct_configs,
)
from orchestrator.execution.cluster import PlacementError, Resources, check_capacity, cluster_nodes, connect
from orchestrator.execution.slot_table import slot_pools
from orchestrator.execution.slots import GangNeed, NodeInfo, Slot, hosts_line, plan_slots
from orchestrator.execution.validate import check_experiment
from orchestrator.record import BASELINE_TAG, DRIVER_ATTR, FAIL_TAG, HEARTBEAT_ATTR, RUN_ID_ATTR, requeue
from orchestrator.search.ranking import MAD_TO_SIGMA, noise_aware_pruner, rank
from orchestrator.search.samplers import make_sampler, model_sampler_fits
from orchestrator.study.ask_lock import ask_lock, taking_turns
from orchestrator.study.asker import gang_of_params
from orchestrator.study.context import StudyContext
from orchestrator.study.drivers import DriverRecord, process_alive, ray_session_dir, reap_dead, start_time
from orchestrator.study.goal import complete, known_configurations, space_finished
from orchestrator.study.runner import contention_note, describe, run_trials
from orchestrator.study.trial import baseline_tp
from orchestrator.tracking.progress import Progress
from orchestrator.tracking.runs import Tracker, experiment_params, label_defaults, resolve_uri
from orchestrator.tracking.storage import _redact, make_storage, set_trial_user_attr, study_lock
from workers.spec import DrafterSpec, GangSpec

if TYPE_CHECKING:
    import optuna

    from orchestrator.execution.pool import GangPool
    from orchestrator.search.proposals import Proposals


def bench_into_study(cfg: ExperimentConfig, prepared, tracker: Tracker, log) -> None:
    """`study.bench_allreduce`: the allreduce table of the study's backends at its verify-step sizes,
    logged to the parent run as an MLflow table, JSON and a latency-vs-size plot. Runs on the
    driver's machine (which must hold the devices); a failure is logged and the study goes on."""
    import tempfile
    from pathlib import Path

    from orchestrator.bench import bench, latency_plot, step_sizes
    from orchestrator.config.space import candidates

    tps = [t for t in candidates(cfg, "parallel.tp") if isinstance(t, int) and t > 1]
    if not tps:
        log("spectune: study.bench_allreduce: no TP size above 1 in this study, nothing to time")
        return
    cuda = cfg.parallel.device == "cuda"
    itemsize = 2 if cfg.model.dtype in ("bfloat16", "float16") else 4
    ks = sorted({k for k in candidates(cfg, "spec.num_draft_tokens") if isinstance(k, int)})
    sizes = sorted(set(step_sizes(prepared.args.dim, ks=ks, itemsize=itemsize)))
    backends = sorted({str(b) for b in candidates(cfg, "comm.backend")})
    try:
        rows, failures = bench(
            backends,
            max(tps),
            cfg.parallel.device,
            sizes,
            cfg.model.dtype,
            100 if cuda else 50,  # gloo on 2 cores: 10 iterations were mostly noise
            [dict(cfg.parallel.nccl_env)],
            log,
        )
    except Exception as e:  # noqa: BLE001 - a measurement that could not run here must not stop the study
        log(f"spectune: study.bench_allreduce skipped: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        return
    for failure in failures:
        log(f"spectune: study.bench_allreduce: {failure}")
    if not rows:
        return
    columns = {key: [r[key] for r in rows] for key in rows[0]}
    tracker.client.log_table(tracker.parent_run_id, data=columns, artifact_file="bench_allreduce_table.json")
    tracker.log_json(tracker.parent_run_id, rows, "bench_allreduce.json")
    with tempfile.TemporaryDirectory() as tmp:
        plot = Path(tmp) / "bench_allreduce_latency.png"
        latency_plot(rows, plot)
        tracker.log_file(tracker.parent_run_id, plot)
    log(f"spectune: bench-allreduce: {len(rows)} rows logged to the parent run")


def search_line(cfg: ExperimentConfig) -> str:
    """How this run searches (a resumed study takes this run's sampler and racing, not its first run's)."""
    sampler = cfg.study.sampler
    if sampler == "model" and not model_sampler_fits(cfg):
        sampler = f"tpe (study.sampler model needs a space it can list: no float range, at most {MAX_ENUMERATED} combinations)"
    race = f"the last {cfg.study.race_trials} re-measure the leaders" if cfg.study.race_trials else "no racing"
    return f"search: study.sampler {sampler}; study.race_trials {cfg.study.race_trials} ({race})"


def make_pruner(cfg: ExperimentConfig):
    import optuna

    if cfg.study.pruner == "none":
        return optuna.pruners.NopPruner()
    if cfg.study.pruner == "median":
        inner = optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1)
    else:  # "clearly losing": below the 25th percentile of earlier trials at the same prompt
        inner = optuna.pruners.PercentilePruner(25.0, n_startup_trials=3, n_warmup_steps=1)
    # ... and not within noise of the best (the noise band from repeats; limits.max_rel_spread until then)
    return noise_aware_pruner(inner, MAD_TO_SIGMA * cfg.limits.max_rel_spread)


def driver_id() -> str:
    """This process as a trial's driver: host, pid and the pid's start time (a reused pid is another process)."""
    return f"{socket.gethostname()}:{os.getpid()}:{start_time(os.getpid()) or ''}"


def _alive_here(driver: str) -> bool:
    host, pid, born = (driver.split(":") + ["", ""])[:3]  # host:pid:start time (host:pid from older drivers)
    if host != socket.gethostname():
        return True  # another machine's driver: judged by its heartbeat only
    try:
        return process_alive(int(pid), int(born) if born else None)
    except ValueError:
        return False


def recover_stale(study, storage, tracker: Tracker, stale_after_s: float, log) -> int:
    """Fail trials left RUNNING by a dead driver, mark their MLflow runs FAILED, retry their params."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    recovered, lock = 0, None
    try:
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            driver = t.user_attrs.get(DRIVER_ATTR, "")
            if not _stale(t, stale_after_s):
                continue  # a live driver (another `spectune run`) is still on it
            reason = f"driver {driver or 'unknown'} died mid-trial"
            lock = lock or ask_lock(storage, study.study_name)
            with taking_turns(lock, log):
                try:
                    set_trial_user_attr(storage, study, t.number, FAIL_TAG, reason)
                    study.tell(t.number, state=TrialState.FAIL)
                except (RuntimeError, ValueError, UpdateFinishedTrialError):
                    continue  # someone else finished or recovered it first
                requeue(study, t.system_attrs.get("fixed_params") or t.params, t.user_attrs, t.number)
            study.set_user_attr(f"recovered.{t.number}", f"driver {driver or '?'} died; params retried")
            if run_id := t.user_attrs.get(RUN_ID_ATTR):
                tracker.finish_trial(run_id, "FAIL", reason)
            recovered += 1
            log(f"spectune: trial {t.number} was left RUNNING by dead driver {driver or '?'}: marked FAIL, params re-enqueued")
    finally:
        if lock is not None:
            lock.close()
    return recovered


def _stale(t, stale_after_s: float) -> bool:
    """A RUNNING trial whose driver is dead (same host: its pid is gone) or silent for too long."""
    driver = t.user_attrs.get(DRIVER_ATTR, "")
    if not driver:  # just asked by a driver that has not tagged it yet, or one killed right then
        started = t.datetime_start or datetime.datetime.now()
        return (datetime.datetime.now() - started).total_seconds() > stale_after_s
    host = driver.split(":")[0]
    if host == socket.gethostname():
        return not _alive_here(driver)  # same host: pid and start time decide (a long model load is not death)
    last_beat = float(t.user_attrs.get(HEARTBEAT_ATTR, 0) or 0)
    return time.time() - last_beat >= stale_after_s


def _ensure_baseline(study, cfg: ExperimentConfig) -> None:
    """One k = 0 trial per TP size of the study (searched or fixed, k searched or not), unless one is
    done, running or queued. Without k in the space it is marked by the user attr `spectune.baseline`
    (trial.trial_config runs it with k = 0)."""
    from optuna.trial import TrialState

    if not cfg.study.baseline:
        return
    space_tp = cfg.search.space.get("parallel.tp")
    tps = [int(t) for t in candidates(cfg, "parallel.tp")] if "parallel.tp" in cfg.search.space else [cfg.parallel.tp]
    have = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)):
        if (tp := baseline_tp(t, cfg.parallel.tp)) is not None:
            have.add(tp)
    for tp in tps:
        if tp in have:
            continue
        params = baseline_params(cfg)
        if "spec.num_draft_tokens" not in cfg.search.space:
            params.pop("spec.num_draft_tokens")  # not a parameter of the space: the user attr says k = 0
        if isinstance(space_tp, (CategoricalParam, IntParam)):  # suggested (a fixed value in the space is not)
            params["parallel.tp"] = tp
        study.enqueue_trial(params, user_attrs={BASELINE_TAG: True})


def nothing_left(storage, cfg: ExperimentConfig) -> bool:
    """The study exists and holds `study.n_trials` COMPLETE trials, or every distinct configuration of its
    finite space is known and its racing round ran (goal.space_finished): a rerun only reports it."""
    import optuna
    from optuna.trial import TrialState

    try:
        study = optuna.load_study(study_name=cfg.study_name, storage=storage)
    except KeyError:
        return False
    if count(study, TrialState.COMPLETE) >= cfg.study.n_trials:
        return True
    space = distinct_configs(cfg)
    return space is not None and space_finished(study, cfg, known_configurations(study, cfg, space, cfg.study.seed), need_baseline=True)


def count(study, *states) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def _live_running(study, stale_after_s: float, below: int | None = None) -> list:
    from optuna.trial import TrialState

    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if (below is None or t.number < below) and not _stale(t, stale_after_s)
    ]


def gang_shapes(cfg: ExperimentConfig) -> tuple[list[int], bool]:
    """The TP sizes the space can ask for (largest first), and whether some trial runs a model
    drafter as a process of its own (eagle3 unless placed in the verifier ranks; the n-gram drafter
    runs inside the verifier ranks)."""
    tps = [t for t in candidates(cfg, "parallel.tp") if isinstance(t, int)] or [cfg.parallel.tp]
    kinds = [cfg.drafter.kind, *candidates(cfg, "drafter.kind")]
    return sorted(set(tps), reverse=True), any(DrafterSpec(kind=k).runs_a_model for k in kinds)


def check_gang_fits(cfg: ExperimentConfig, nodes: list[dict]) -> None:
    """The largest gang the space can ask for against the nodes on offer, before anything launches."""
    tps, drafter = gang_shapes(cfg)
    for tp in tps:
        spec = GangSpec(model_path="", tp=tp, device=cfg.parallel.device, drafter=DrafterSpec(kind="draft_model" if drafter else "none"))
        try:
            check_capacity(spec, Resources(cfg.parallel.cpus_per_worker), nodes)
        except PlacementError as e:
            field = "search.space.parallel.tp" if "parallel.tp" in cfg.search.space else "parallel.tp"
            raise PlacementError(f"{field}: {e}") from None


def _local_nodes(device: str) -> list[dict]:
    """What an embedded local Ray will offer: this machine's CPUs and, for a CUDA study, its CUDA
    devices (counted through torch, which a CPU study's driver never imports)."""
    gpus = 0
    if device == "cuda":
        try:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:  # noqa: BLE001
            pass
    return [{"CPU": float(os.cpu_count() or 1), "GPU": float(gpus)}]


def study_slots(cfg: ExperimentConfig, log) -> tuple[list[Slot], list[NodeInfo]]:
    """The slots concurrent trials run in (one unpinned slot: one trial at a time) and the cluster's
    nodes they were planned on, said in one line when the cluster gives fewer than
    `study.max_concurrent_trials` asked for (naming the hosts its nodes share, where they do), and in
    one line where the slots let trials share a host."""
    asked = cfg.study.max_concurrent_trials
    if asked == 1:
        return [Slot(0)], []
    tps, drafter = gang_shapes(cfg)
    need = GangNeed(cpus=(tps[0] + drafter) * cfg.parallel.cpus_per_worker, gpus=float(tps[0] if cfg.parallel.device == "cuda" else 0))
    nodes = cluster_nodes()
    slots = plan_slots(nodes, need, cfg.study.isolation, asked) or [Slot(0)]
    if asked != "auto" and len(slots) < asked:
        cluster = hosts_line(nodes)
        if cluster != f"{len(nodes)} node(s)" and cfg.study.isolation == "node":
            cluster += (
                ": Ray nodes that share an address or a boot id are one machine, whose CPUs, memory and buses they share, "
                "and isolation node runs one trial per host"
            )
        log(
            f"spectune: study.max_concurrent_trials={asked}, but isolation {cfg.study.isolation} gives {len(slots)} slot(s) "
            f"on this cluster ({cluster}): {len(slots)} at a time"
        )
    if note := contention_note(slots, nodes, cfg.study.isolation):
        log(note)
    return slots, nodes


@dataclass
class LiveDrivers:
    """The study's other drivers as this one counts them (context.OtherDrivers): a RUNNING trial counts
    while its driver is alive (`_stale`: its pid on this host, its heartbeat elsewhere)."""

    study: optuna.Study
    storage: optuna.storages.BaseStorage
    tracker: Tracker
    driver: str  # this driver (driver_id())
    stale_after_s: float
    log: Callable[[str], None]

    def running(self) -> int:
        return len([t for t in _live_running(self.study, self.stale_after_s) if t.user_attrs.get(DRIVER_ATTR) != self.driver])

    def running_below(self, number: int) -> int:
        return len(_live_running(self.study, self.stale_after_s, below=number))

    def recover(self) -> None:
        recover_stale(self.study, self.storage, self.tracker, self.stale_after_s, self.log)


@dataclass
class _Run:
    """What the end of a run reports, however it ends: set as the run gets that far."""

    study: optuna.Study | None = None
    tracker: Tracker | None = None
    progress: Progress | None = None
    proposals: Proposals | None = None
    pools: dict[int, GangPool] = field(default_factory=dict)
    status: str = "KILLED"  # the parent run's status: FINISHED, FAILED (an error), KILLED (interrupted)


def run_study(cfg: ExperimentConfig, log: Callable[[str], None] | None = None) -> dict:
    """The study, run to its end: checked, connected, taken over, its trials run (runner.run_trials),
    and reported (the summary, also on the parent MLflow run)."""
    import ray

    log = log or _stderr
    _quiet_optuna()
    # every input is checked before anything launches or is written: YAML, model, prompts, storage, resources
    prepared = check_experiment(cfg)
    check_constraints(cfg)
    for note in prepared.notes:
        log(f"spectune: note: {note}")
    home = spectune_home()
    ours = not ray.is_initialized()  # this run connects (and so disconnects); a caller's own Ray stays
    embedded = not os.environ.get("RAY_ADDRESS") and ours
    if embedded:
        check_gang_fits(cfg, _local_nodes(cfg.parallel.device))
    storage, storage_url = make_storage(cfg)
    check_resume(storage, cfg)  # a resumed study keeps its fixed part: checked before anything starts
    finished = nothing_left(storage, cfg)  # a finished study is reported, not run: no Ray
    record = DriverRecord(home) if embedded and not finished else None
    stale_after = cfg.limits.trial_timeout_s + 120
    run = _Run()
    try:
        where = _start_ray(cfg, home, embedded, finished, record, log)
        run.study = study = open_study(cfg, storage)
        with study_lock(home, cfg, storage_url):
            run.tracker = tracker = _take_over(study, storage, cfg, home, stale_after, log)
        n_goal = cfg.study.n_trials
        if cfg.study.bench_allreduce and not finished and not study.user_attrs.get("bench_allreduce_logged"):
            bench_into_study(cfg, prepared, tracker, log)
            study.set_user_attr("bench_allreduce_logged", True)
        run.progress = progress = Progress(study, n_goal, log, defaults=label_defaults(cfg))
        log(
            f"spectune: study {cfg.study_name!r}: {complete(study)}/{n_goal} complete; {where}; "
            f"Optuna {_redact(storage_url)}; {tracker.where()} (parent run {tracker.parent_run_id})"
        )
        log(f"spectune: {search_line(cfg)}")
        if (emulated := emulation.report_line(cfg)) is not None:
            log(f"spectune: {emulated}")
        run.proposals = proposals = _known(study, cfg, log)
        proposals.gang_of = gang_of_params(cfg, prepared)  # a gang whose launch fails rules out every configuration on it
        me = driver_id()
        slots, nodes = ([Slot(0)], []) if finished else study_slots(cfg, log)
        if len(slots) > 1:
            log(f"spectune: {describe(slots, cfg)}")
        run.pools = pools = slot_pools(slots, _resources(cfg), log)
        ctx = StudyContext(
            study=study,
            storage=storage,
            cfg=cfg,
            prepared=prepared,
            tracker=tracker,
            progress=progress,
            n_goal=n_goal,
            max_failed=cfg.study.max_failed_trials if cfg.study.max_failed_trials is not None else n_goal,
            driver=me,
            log=log,
            proposals=proposals,
            others=LiveDrivers(study, storage, tracker, me, stale_after, log),
        )
        _run_to_the_end(run, ctx, slots, pools, nodes)  # returns once the trials are complete or the space is all measured
    finally:
        summary = _wrap_up(run, ours, record)
    return summary


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Some regimes for parameter")


def _start_ray(cfg: ExperimentConfig, home, embedded: bool, finished: bool, record: DriverRecord | None, log) -> str:
    """Ray for the study (none for a study with nothing left to measure), the driver recorded where it
    starts its own; returns where the study runs, in words. The largest gang is checked against the
    nodes Ray offers."""
    import ray

    if record is not None:
        reap_dead(home, log)
        record.start(os.environ.get("SPECTUNE_RAY_TMPDIR"))
    if finished:
        return "nothing left to measure (Ray not started)"
    with _own_session() if embedded else contextlib.nullcontext():
        where = connect()
    if not embedded:  # the address the cluster itself reports (loopback for a loopback cluster), not the one we were handed
        where = f"ray cluster at {ray.get_runtime_context().gcs_address}"
    if record is not None:
        record.note_session(ray_session_dir())
    check_gang_fits(cfg, [n["Resources"] for n in ray.nodes() if n.get("Alive")])
    return where


def open_study(cfg: ExperimentConfig, storage) -> optuna.Study:
    """Create or load the study, with this run's sampler and pruner (a resumed study takes this run's,
    not its first run's)."""
    import optuna

    study = optuna.create_study(
        study_name=cfg.study_name,
        storage=storage,
        direction="maximize",
        sampler=make_sampler(cfg),
        pruner=make_pruner(cfg),
        load_if_exists=True,
    )
    study.sampler = make_sampler(cfg, offset=len(study.trials))
    if study.metric_names is None:
        # optuna-dashboard names the objective instead of "Objective 0"
        w = cfg.workload
        over = "batch_sizes_and_contexts" if w.context_lengths else "batch_sizes"
        study.set_metric_names(["throughput_tok_s" if not w.cells() else f"throughput_tok_s_geomean_over_{over}"])
    return study


def _take_over(study, storage, cfg: ExperimentConfig, home, stale_after_s: float, log) -> Tracker:
    """Under the per-host study lock: the fixed part checked (another driver may have created the study
    meanwhile) and recorded, the MLflow tracker, trials of dead drivers recovered, the baseline queued."""
    check_resume(storage, cfg)
    record_fixed(study, cfg)
    tracker = Tracker(
        resolve_uri(cfg.tracking.uri, home),
        cfg.experiment_name,
        cfg.study_name,
        home,
        study=study,
        base_params=experiment_params(cfg),
        name=cfg.name,
    )
    recover_stale(study, storage, tracker, stale_after_s, log)
    _ensure_baseline(study, cfg)
    return tracker


def _known(study, cfg: ExperimentConfig, log) -> Proposals:
    """The configurations the study has measured (said in one line where that is all of a finite space)."""
    space = distinct_configs(cfg)
    proposals = known_configurations(study, cfg, space, cfg.study.seed)
    if space is not None and proposals.exhausted:
        log(f"spectune: every distinct configuration of the search space ({len(space)}) is measured already")
    return proposals


def _resources(cfg: ExperimentConfig) -> Resources:
    return Resources(cfg.parallel.cpus_per_worker, cfg.limits.placement_timeout_s, cfg.limits.trial_timeout_s, cfg.limits.setup_timeout_s)


def _run_to_the_end(run: _Run, ctx: StudyContext, slots: list[Slot], pools: dict[int, GangPool], nodes: list[NodeInfo]) -> None:
    """The trial loop, SIGTERM (`ray job stop`) taken as Ctrl-C; `run.status` says how it ended."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        run_trials(ctx, slots, pools, nodes)
        run.status = "FINISHED"
    except KeyboardInterrupt:  # the CLI prints this one line (and nothing else) for it
        ctx.progress.live.done()
        raise KeyboardInterrupt("spectune: interrupted; finished trials are saved, run the same command to resume") from None
    except Exception:  # too many failed trials, a lost cluster: the parent run says it failed, not that it was stopped
        run.status = "FAILED"
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _wrap_up(run: _Run, ours: bool, record: DriverRecord | None) -> dict | None:
    """However the run ended: the pools closed, Ray shut down where this run connected it, the driver
    record closed; the summary (also on the parent run, with its status) where the run got that far."""
    import ray

    launched = sum(p.launched for p in run.pools.values())
    for each in run.pools.values():
        each.close()
    if ours and ray.is_initialized():
        ray.shutdown()  # an embedded Ray goes; a cluster's driver disconnects (its last log lines arrive now)
    if record is not None:
        record.close()
    if run.tracker is None or run.progress is None:
        return None
    run.tracker.log_metrics(run.tracker.parent_run_id, {"gangs_launched_last_run": launched})
    summary = run.progress.finish(run.tracker, run.status)
    summary["gangs_launched"] = launched
    summary["ranking"] = rank(run.study.trials).as_dict()  # noise-aware: pooled repeats, winner within noise?
    if run.proposals is not None and run.proposals.size is not None:
        summary["space_size"] = run.proposals.size
        summary["space_exhausted"] = run.proposals.exhausted  # every distinct configuration measured or ruled out: done
        if run.proposals.ruled_out:
            summary["space_ruled_out"] = run.proposals.ruled_out  # on gangs that failed to launch twice in this run
    return summary


def _raise_interrupt(signum, frame):  # SIGTERM (ray job stop) -> the same clean path as Ctrl-C
    raise KeyboardInterrupt


@contextlib.contextmanager
def _own_session():
    """The processes an embedded Ray starts (GCS, raylet, agents, and through the raylet every worker)
    start in a session of their own, out of the driver's process group. A signal to the driver's group
    (`timeout`, `kill -TERM -PGID`, a service manager) then reaches the driver alone, which stops as on
    Ctrl-C (every running trial failed and queued again) and shuts its Ray down itself; had the GCS died
    with it, every Ray call would wait 60 s for it and Ray would end the process, the trials left
    RUNNING. (Ctrl-C's SIGINT Ray blocks in its processes.) Its processes still go with the driver: the
    driver record's watchdog kills them (orchestrator/study/drivers.py)."""
    from ray._private import services

    base = services.ConsolePopen

    class OwnSession(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSession
    try:
        yield
    finally:
        services.ConsolePopen = base
