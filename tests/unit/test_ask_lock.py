"""The ask lock (orchestrator/study/ask_lock.py) and the driver's ask under it (asker.Asker): two
drivers, in two processes, asking at once on one storage never both measure one configuration;
a wait past the timeout is one line naming the storage; an interrupt inside the section releases it.

The race test drives the real `Asker.ask` (sync, ask, params, admit, a duplicate told PRUNED) in two
processes with a sampler that always proposes the same configuration. `_race(..., locked=False)`
runs it with a no-op lock instead: then admitted trials of one configuration overlap in time, which
the same check catches (checked by hand: docs/LOG.md, "Two drivers asking at once").

Set SPECTUNE_TEST_POSTGRES to a PostgreSQL URL (e.g. infra/services.sh's SPECTUNE_STORAGE) to run
the storage tests against its advisory lock too."""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
import time
import traceback
import uuid

import optuna
import pytest

from orchestrator.config.schema import validated
from orchestrator.config.space import distinct_configs, identity_of
from orchestrator.errors import UserError
from orchestrator.record import DUPLICATE_ATTR
from orchestrator.search.proposals import Proposals
from orchestrator.study.ask_lock import AdvisoryLock, FileLock, NoLock, ProcessLock, advisory_key, ask_lock
from orchestrator.study.asker import Asker
from orchestrator.study.context import StudyContext

POSTGRES = os.environ.get("SPECTUNE_TEST_POSTGRES")
STORAGES = ["sqlite"] + (["postgresql"] if POSTGRES else [])


def _cfg():
    return validated(
        {
            "name": "t",
            "model": {"path": "random:tiny"},
            "drafter": {"kind": "ngram"},
            "parallel": {"tp": 1, "device": "cpu", "backend": "gloo"},
            "search": {"space": {"spec.num_draft_tokens": {"choices": [2, 3]}}},
            "study": {"n_trials": 4, "race_trials": 0, "baseline": False},
        }
    )


def _url(kind: str, tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}" if kind == "sqlite" else POSTGRES


def _storage(url: str):
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


class _Same(optuna.samplers.BaseSampler):
    """Proposes the first choice of every parameter, always: every ask repeats one configuration."""

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, name, distribution):
        return distribution.to_external_repr(0) if hasattr(distribution, "choices") else distribution.low


class _Tracker:
    def start_trial(self, number, params, tags=None):
        return f"run-{number}"

    def finish_trial(self, run_id, state, reason=None):
        pass


class _NoOthers:
    """Other drivers as the goal counts them: none running (the goal is never near here)."""

    def running(self) -> int:
        return 0

    def running_below(self, number: int) -> int:
        return 0

    def recover(self) -> None:
        pass


def _driver(url: str, name: str, driver: str, rounds: int, locked: bool, start, seed: int) -> None:
    """One driver (a process): asks until `rounds` // 2 of its asks were admitted (at most 10 x `rounds`
    asks: how many asks meet the other driver's trial depends on the machine's load, how many are
    admitted must not); an admitted trial is measured for a few milliseconds and fails (a plain
    failure: its configuration stays open to the next ask, of either driver)."""
    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = _storage(url)
        study = optuna.load_study(study_name=name, storage=storage, sampler=_Same())
        cfg = _cfg()
        proposals = Proposals(distinct_configs(cfg), random.Random(seed))
        ctx = StudyContext(
            study=study, storage=storage, cfg=cfg, prepared=None, tracker=_Tracker(), progress=None, n_goal=10**6,
            max_failed=10**6, driver=driver, log=print, proposals=proposals, others=_NoOthers(),
        )  # fmt: skip
        asker = Asker(ctx, ctx.tracker, ask_lock(storage, name, print) if locked else NoLock())
        rng = random.Random(seed)
        start.wait()
        admitted = 0
        for _ in range(10 * rounds):
            if admitted >= rounds // 2:
                break
            asked = asker.ask(running=())
            if asked.verdict == "run":
                admitted += 1
                asker.asking = None
                time.sleep(rng.uniform(0.002, 0.02))  # measuring
                study.tell(asked.trial, state=optuna.trial.TrialState.FAIL)
                proposals.finished(asked.trial.number, known=False)
            elif asked.wait:
                time.sleep(0.005)  # nothing new to try while the other driver measures
        asker.lock.close()
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1) from None


def _race(url: str, rounds: int = 30, locked: bool = True) -> tuple[list[str], int, int]:
    """Two driver processes on one study at `url`. Returns the overlaps (two admitted trials of one
    configuration measured at once), the admitted trials and the duplicates of the other driver's
    running trial (each one an ask that met a live twin)."""
    name = f"race-{uuid.uuid4().hex[:8]}"
    optuna.create_study(study_name=name, storage=_storage(url), direction="maximize")
    mp = multiprocessing.get_context("spawn")
    start = mp.Barrier(2)
    procs = [mp.Process(target=_driver, args=(url, name, f"d{i}", rounds, locked, start, i)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0, 0], "a driver process failed (its traceback is above)"
    cfg = _cfg()
    trials = optuna.load_study(study_name=name, storage=_storage(url)).get_trials(deepcopy=False)
    admitted: dict[str, list] = {}
    for t in trials:
        if t.state == optuna.trial.TrialState.FAIL and DUPLICATE_ATTR not in t.user_attrs:
            admitted.setdefault(identity_of(t, cfg), []).append(t)
    overlaps = []
    for identity, ts in admitted.items():
        ts.sort(key=lambda t: t.datetime_start)
        for a, b in zip(ts, ts[1:]):
            if b.datetime_start <= a.datetime_complete:
                overlaps.append(f"trials {a.number} and {b.number} ({identity}) were measured at once")
    met_twin = sum("another driver is measuring" in str(t.user_attrs.get("spectune.prune_reason", "")) for t in trials)
    return overlaps, sum(map(len, admitted.values())), met_twin


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", STORAGES)
def test_two_drivers_asking_at_once_never_measure_one_configuration_twice(kind, tmp_path):
    overlaps, admitted, met_twin = _race(_url(kind, tmp_path))
    assert not overlaps, overlaps
    # the test means something only if the drivers did meet: each ask found the other's trial running
    assert admitted >= 20 and met_twin >= 5, (admitted, met_twin)


@pytest.mark.parametrize("kind", STORAGES)
def test_a_wait_past_the_timeout_is_one_line_naming_the_storage(kind, tmp_path):
    storage = _storage(_url(kind, tmp_path))
    name = f"wait-{uuid.uuid4().hex[:8]}"
    held = ask_lock(storage, name)
    assert isinstance(held, AdvisoryLock if kind == "postgresql" else FileLock)
    other = ask_lock(storage, name, timeout_s=0.3)
    try:
        with held:
            t0 = time.monotonic()
            with pytest.raises(UserError, match=r"waited over 0.3 s for the ask lock of study 'wait-.*' on (sqlite|postgresql)") as e:
                with other:
                    pass
            assert time.monotonic() - t0 < 5
            assert "\n" not in str(e.value)
        with other:  # released, and the failed wait held nothing
            pass
    finally:
        held.close()
        other.close()


@pytest.mark.parametrize("kind", STORAGES)
def test_an_interrupt_inside_the_section_releases_the_lock(kind, tmp_path):
    storage = _storage(_url(kind, tmp_path))
    name = f"int-{uuid.uuid4().hex[:8]}"
    first, second = ask_lock(storage, name), ask_lock(storage, name, timeout_s=2)
    try:
        with pytest.raises(KeyboardInterrupt):
            with first:
                raise KeyboardInterrupt
        with second:  # the interrupted holder let go
            pass
        with first:  # and can take it again
            pass
    finally:
        first.close()
        second.close()


def test_each_storage_gets_its_lock_and_one_that_cannot_be_locked_is_said_once(tmp_path):
    lines: list[str] = []
    assert isinstance(ask_lock(optuna.storages.InMemoryStorage(), "s", lines.append), ProcessLock)
    journal = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log")))
    lock = ask_lock(journal, "s", lines.append)
    assert isinstance(lock, FileLock) and lock.path == str(tmp_path / "j.log") + ".ask-lock"
    study = optuna.create_study(storage=_storage(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    lock = ask_lock(study._storage, "s", lines.append)  # a study's cached storage: the RDB storage inside
    assert isinstance(lock, FileLock) and lock.path == str(tmp_path / "db.sqlite") + ".ask-lock"
    assert not lines

    class Elsewhere:  # a storage the lock knows nothing of (a gRPC proxy, a Redis journal)
        pass

    for _ in range(2):
        assert isinstance(ask_lock(Elsewhere(), "s", lines.append), NoLock)
    assert lines == ["spectune: no ask lock for Elsewhere: concurrent drivers of one study on it may measure one configuration twice"]
    assert advisory_key("a") == advisory_key("a") != advisory_key("b") and -(2**63) <= advisory_key("a") < 2**63


def test_an_in_memory_storage_is_locked_within_the_process():
    storage, inside, most = optuna.storages.InMemoryStorage(), [0], [0]

    def asker():
        lock = ask_lock(storage, "s")  # each thread its own lock object: they share the storage's lock
        for _ in range(50):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                time.sleep(0.0005)
                inside[0] -= 1

    threads = [threading.Thread(target=asker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def test_a_failed_trials_retry_is_queued_inside_the_ask_lock(tmp_path):
    """A dead driver's trial is told FAIL and its params queued again in one turn of the ask lock (as a
    lost node's or an interrupted trial's): while another driver holds the lock it waits, so no ask can
    find the configuration neither running nor queued and measure it beside the retry."""
    import socket
    import subprocess
    import sys

    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    from orchestrator.record import DRIVER_ATTR, RETRY_TAG
    from orchestrator.study.loop import recover_stale

    url = _url("sqlite", tmp_path)
    storage = _storage(url)
    study = optuna.create_study(study_name="t", storage=storage, direction="maximize")
    trial = study.ask({"spec.num_draft_tokens": CategoricalDistribution([2, 3])})
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    trial.set_user_attr(DRIVER_ATTR, f"{socket.gethostname()}:{gone}:0")  # its driver has exited
    other = ask_lock(storage, "t")
    recovered: list[int] = []
    with other:  # another driver mid-ask
        worker = threading.Thread(target=lambda: recovered.append(recover_stale(study, storage, _Tracker(), 60.0, print)))
        worker.start()
        worker.join(0.5)
        assert worker.is_alive(), "recovery went ahead while another driver held the ask lock"
        assert [t.state for t in study.get_trials()] == [TrialState.RUNNING]
    worker.join(30)
    other.close()
    trials = study.get_trials()
    assert recovered == [1] and [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[1].system_attrs["fixed_params"] == trial.params and trials[1].user_attrs[RETRY_TAG] == 0


def test_a_failure_path_that_cannot_take_the_lock_says_so_and_queues_the_retry_anyway(tmp_path):
    """taking_turns never raises: a lock it cannot take in time is one line, and the FAIL and the retry
    are written without it (a trial stuck RUNNING, or a Ctrl-C turned into another error, is worse)."""
    from orchestrator.study.ask_lock import taking_turns

    storage = _storage(_url("sqlite", tmp_path))
    optuna.create_study(study_name="t", storage=storage)
    lines, wrote = [], []
    other = ask_lock(storage, "t")
    with other:  # a driver that does not let go
        with taking_turns(ask_lock(storage, "t", timeout_s=0.2), lines.append):
            wrote.append(True)
    other.close()
    assert wrote == [True] and len(lines) == 1
    assert "waited over 0.2 s for the ask lock of study 't'" in lines[0] and lines[0].endswith("the trial's retry is queued without it")
    with taking_turns(None):  # a caller without a lock
        wrote.append(True)
    assert wrote == [True, True]
