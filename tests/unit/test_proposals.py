"""The driver's rules for proposals (orchestrator/search/proposals.py) and the space they range over:
duplicates of running and known configurations are never measured, an enqueued trial always is, a
sampler stuck on known points gets an unknown configuration picked for it, a finite space ends the
study once it is all known; and the whole scheduling rule (slots + proposals + a real Optuna sampler)
over 500 trials on 32 slots in simulated time."""

from __future__ import annotations

import heapq
import random

import optuna
import pytest

from orchestrator.config.schema import validated
from orchestrator.config.space import MAX_ENUMERATED, config_identity, distinct_configs, suggest
from orchestrator.execution.slots import GangNeed, NodeInfo, SlotBook, plan_slots
from orchestrator.search.proposals import MAX_DUPLICATES, Proposals
from orchestrator.tracking.storage import frozen_trial


def _cfg(space: dict, **study) -> object:
    return validated(
        {
            "name": "t",
            "model": {"path": "random:tiny"},
            "drafter": {"kind": "ngram"},
            "parallel": {"tp": 1, "device": "cpu", "backend": "gloo"},
            "search": {"space": space},
            "study": {"n_trials": 4, **study},
        }
    )


def test_the_space_counts_configurations_that_resolve_alike_once():
    cfg = _cfg(
        {
            "spec.num_draft_tokens": {"choices": [0, 2, 4]},
            "drafter.kind": {"choices": ["ngram", "layer_skip"]},
            "drafter.layers": {"choices": [1, 2]},
        }
    )
    space = distinct_configs(cfg)
    # k = 0 is one configuration whatever the drafter; per k > 0: ngram, layer_skip L=1, layer_skip L=2
    assert len(space) == 1 + 2 * 3
    for identity, params in space.items():  # each entry's params enqueue exactly that configuration
        assert config_identity(suggest(optuna.trial.FixedTrial(params), cfg)) == identity
    assert len(distinct_configs(_cfg({"spec.num_draft_tokens": {"low": 0, "high": 4}}))) == 5


def test_a_space_too_large_to_list_is_unbounded():
    """An unbounded space is never exhausted: its study ends at study.n_trials, as before."""
    big = {"comm.backend": {"choices": ["nccl"]}, "nccl.NCCL_BUFFSIZE": {"low": 1, "high": MAX_ENUMERATED + 1}}
    assert distinct_configs(_cfg(big)) is None


def test_duplicates_of_running_and_known_configurations_are_not_measured():
    p = Proposals({"a": {}, "b": {}, "c": {}})
    assert p.admit(0, "a", asked=False).run
    twin = p.admit(1, "a", asked=False)
    assert not twin.run and twin.twin == 0 and "running trial 0" in twin.reason
    p.finished(0, known=True)
    again = p.admit(2, "a", asked=False)
    assert not again.run and again.twin == 0 and "measured already" in again.reason
    assert p.admit(3, "a", asked=True).run  # the study asked for it (a retry, the baseline): measured
    p.finished(3, known=True)
    assert p.admit(4, "b", asked=False).run
    p.finished(4, known=False)  # a plain failure: retried, not known
    assert p.admit(5, "b", asked=False).run
    p.finished(5, known=True)
    assert not p.exhausted and p.untried() == [{}]
    assert p.admit(6, "c", asked=False).run
    p.finished(6, known=True)
    assert p.exhausted


def test_a_sampler_stuck_on_known_points_gets_an_unknown_configuration_picked():
    space = {f"c{i}": {"k": i} for i in range(5)}
    p = Proposals(space, random.Random(1))
    p.known("c0", 0)
    p.known("c1", 1)
    for n in range(MAX_DUPLICATES):
        assert not p.stuck
        assert not p.admit(10 + n, "c0", asked=False).run
    assert p.stuck
    pick = p.pick_untried()
    assert pick in ({"k": 2}, {"k": 3}, {"k": 4}) and not p.stuck
    assert Proposals(None).pick_untried() is None and not Proposals(None).exhausted  # unbounded: never exhausted


def test_500_trials_on_32_slots_stay_busy_and_never_measure_a_configuration_twice():
    """The driver's rule in simulated time: fill every free slot at once (ask; a duplicate is told
    PRUNED and asked again; a stuck sampler gets an unknown configuration enqueued), trials of 1 to
    10 minutes freed out of order, over a space of 640 configurations with Optuna's random sampler.
    >= 95% of slot time is busy until the last trial starts, and 500 distinct configurations are measured."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = random.Random(0)
    choices = {"a": list(range(8)), "b": list(range(8)), "c": list(range(10))}
    space = {f"{a}-{b}-{c}": {"a": a, "b": b, "c": c} for a in choices["a"] for b in choices["b"] for c in choices["c"]}
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    proposals = Proposals(space, random.Random(0))
    nodes = [NodeInfo(f"n{i:03d}" + "x" * 20, f"h{i}", 64.0, 8.0) for i in range(32)]
    book = SlotBook(plan_slots(nodes, GangNeed(cpus=2.0, gpus=8.0), "node", "auto"))
    assert len(book) == 32
    now, started, events, spans, last_start, trials, measured, duplicates = 0.0, 0, [], [], 0.0, {}, [], 0
    while started < 500 or events:
        while started < 500 and book.free:
            trial = study.ask()
            key = "-".join(str(trial.suggest_categorical(n, v)) for n, v in choices.items())
            asked = "fixed_params" in frozen_trial(study, trial.number).system_attrs
            if not proposals.admit(trial.number, key, asked).run:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                duplicates += 1
                if proposals.stuck and (pick := proposals.pick_untried()) is not None:
                    study.enqueue_trial(pick)
                continue
            book.acquire(trial.number)
            d = rng.uniform(60, 600)
            heapq.heappush(events, (now + d, trial.number))
            trials[trial.number], spans, last_start = trial, spans + [(now, now + d)], now
            measured.append(key)
            started += 1
        now, done = heapq.heappop(events)
        book.release(done)
        study.tell(trials[done], rng.random())
        proposals.finished(done, known=True)
    assert len(measured) == 500 and len(set(measured)) == 500, "a configuration was measured twice"
    assert duplicates > 0  # the sampler did repeat itself; the rule caught every repeat
    busy = sum(min(end, last_start) - start for start, end in spans if start < last_start)
    assert busy / (32 * last_start) >= 0.95, busy / (32 * last_start)


@pytest.mark.parametrize("n_trials", [4, 10])
def test_a_grid_of_four_points_is_measured_once_each(n_trials):
    """What the driver does with the grid sampler: every distinct grid point once, then exhausted."""
    cfg = _cfg({"spec.num_draft_tokens": {"choices": [0, 2, 4, 6]}}, sampler="grid", n_trials=n_trials)
    space = distinct_configs(cfg)
    from orchestrator.search.samplers import make_sampler

    study = optuna.create_study(direction="maximize", sampler=make_sampler(cfg))
    p, measured = Proposals(space), []
    while not p.exhausted and len(measured) < n_trials:
        trial = study.ask()
        identity = config_identity(suggest(trial, cfg))
        if not p.admit(trial.number, identity, asked=False).run:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        measured.append(identity)
        study.tell(trial, 1.0)  # the grid's own stop would raise here outside study.optimize
        p.finished(trial.number, known=True)
    assert sorted(measured) == sorted(space) and len(space) == 4


def test_with_every_unknown_configuration_running_the_driver_waits_instead_of_spinning():
    """n_trials larger than the space, two slots: once the configurations not yet known are all running,
    a duplicate tells the driver to wait for a running trial (False), never to ask again at once."""
    p = Proposals({"a": {"k": 0}, "b": {"k": 1}, "c": {"k": 2}})
    p.known("a", 0)
    assert p.admit(1, "b", asked=False).run and p.admit(2, "c", asked=False).run
    assert not p.admit(3, "b", asked=False).run
    assert p.after_duplicate() is False  # nothing new while b and c run
    p.finished(1, known=True)
    assert p.after_duplicate() is False and not p.exhausted  # c still runs
    p.finished(2, known=True)
    assert p.exhausted


def test_configurations_other_drivers_measure_are_not_measured_beside_them():
    p = Proposals({"a": {"k": 0}, "b": {"k": 1}})
    p.others_running({"b": 7})
    twin = p.admit(1, "b", asked=False)
    assert not twin.run and twin.twin == 7 and "another driver" in twin.reason
    assert p.untried() == [{"k": 0}]
    assert p.after_duplicate() is None  # "a" is still there to try: ask again
    unbounded = Proposals(None)
    unbounded.known("x", 0)
    for n in range(MAX_DUPLICATES):
        assert not unbounded.admit(n + 1, "x", asked=False).run
    assert unbounded.after_duplicate() is False  # stuck with nothing to pick: wait while trials run


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_grid_keeps_the_points_of_one_gang_together(seed):
    """A grid over k and the drafter (kind, layer-skip depth): the driver measures every point once, and a
    new gang (anything but k changing) is needed only when a group of points is done, not between its
    points; Optuna's shuffled grid, left alone, alternates drafters and relaunches almost every trial."""
    space = {
        "spec.num_draft_tokens": {"choices": [0, 2, 4, 6]},
        "drafter.kind": {"choices": ["ngram", "layer_skip"]},
        "drafter.layers": {"choices": [1, 2]},
    }
    cfg = _cfg(space, sampler="grid", n_trials=100, seed=seed)
    from orchestrator.search.samplers import make_sampler

    study = optuna.create_study(direction="maximize", sampler=make_sampler(cfg))
    p, gangs = Proposals(distinct_configs(cfg)), []
    while not p.exhausted:
        trial = study.ask()
        tc = suggest(trial, cfg)
        if not p.admit(trial.number, config_identity(tc), asked=False).run:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        if tc.num_draft_tokens > 0:  # a plain trial runs on whatever gang is up
            gangs.append((tc.drafter.kind, tc.drafter.layers))
        study.tell(trial, 1.0)
        p.finished(trial.number, known=True)
    switches = sum(a != b for a, b in zip(gangs, gangs[1:]))
    assert len(set(gangs)) == 3 and switches == 2, gangs  # ngram, layer_skip L=1, L=2: one launch each


def test_a_gang_that_cannot_launch_rules_out_every_configuration_on_it():
    space = {"plain": {"d": "none"}, "ng1": {"d": "ngram", "k": 1}, "ls1": {"d": "ls", "k": 1}, "ls2": {"d": "ls", "k": 2}}
    p = Proposals(space, random.Random(0), gang_of=lambda params: f"gang-{params['d']}")
    assert p.admit(0, "ls1", asked=False, gang="gang-ls").run
    p.finished(0, known=False)  # its launch failed: a failure, so not known ...
    assert not p.unlaunchable("gang-ls", 0, "GangError: setup: rank 0: OutOfMemoryError")  # once may be a neighbour's memory
    assert p.admit(1, "ls2", asked=False, gang="gang-ls").run and p.ruled_out == 0
    p.finished(1, known=False)
    assert p.unlaunchable("gang-ls", 1, "GangError: setup: rank 0: OutOfMemoryError")  # twice, on fresh launches: ruled out
    # ... and no configuration on its gang is proposed, asked for or picked again
    for identity, asked in (("ls1", False), ("ls2", False), ("ls2", True)):
        no = p.admit(2, identity, asked=asked, gang="gang-ls")
        assert not no.run and no.twin == 0 and no.reason.startswith("its gang failed to launch in trials 0 and 1 (GangError: setup")
    assert p.ruled_out == 2
    assert sorted(map(str, p.untried())) == sorted(map(str, [{"d": "none"}, {"d": "ngram", "k": 1}]))
    for n, identity in enumerate(("plain", "ng1"), start=3):
        assert p.admit(n, identity, asked=False, gang=f"gang-{space[identity]['d']}").run
        assert not p.exhausted
        p.finished(n, known=True)
    assert p.exhausted and p.pick_untried() is None
