"""Contention never silent (issue 43): a trial measured beside another on its host (`spectune.co_running`,
recorded by orchestrator/execution/slots.py's book) is neither pruned on that measurement nor crowned by
it. The ranking (orchestrator/search/ranking.py) pools a configuration's trials measured alone where it
has any, marks one measured only beside others as disturbed and calls no winner clear while one is;
`race_pick` re-measures disturbed configurations first (the driver runs those alone); the pruner is not
consulted while a trial's measurement may be disturbed (orchestrator/study/trial.py)."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from orchestrator.record import CO_RUNNING_ATTR, PARAMS_ATTR, SAMPLES_ATTR
from orchestrator.search.racing import race_pick
from orchestrator.search.ranking import baseline_median, rank

optuna.logging.set_verbosity(optuna.logging.WARNING)


def done(k: int, samples: list[float], beside: list[int] = ()):
    """A COMPLETE trial of n-gram k (k = 0: plain) at TP 1; `beside`: the trials that ran beside it on its host."""
    params = {"parallel.tp": 1, "spec.num_draft_tokens": k, "drafter.kind": "ngram"}
    attrs = {PARAMS_ATTR: params, SAMPLES_ATTR: samples, **({CO_RUNNING_ATTR: list(beside)} if beside else {})}
    return create_trial(
        state=TrialState.COMPLETE,
        value=sorted(samples)[len(samples) // 2],
        params={"drafter.kind": "ngram"},
        distributions={"drafter.kind": CategoricalDistribution(["ngram"])},
        user_attrs=attrs,
    )


def trials(*ts):
    s = optuna.create_study(direction="maximize")
    for t in ts:
        s.add_trial(t)
    return s.trials


def ident(c):
    return str(c.trials[0])


# issue 43's study, isolation node on three raylets of one host, two trials at a time: n-gram k = 2 measured
# 0.39x plain beside another trial (1.12x alone), k = 6 at 1.84 tok/s; plain "won" and was called clear
CONTENDED = [done(0, [10.0, 10.2, 9.8], beside=[1]), done(2, [3.9], beside=[0]), done(6, [1.84], beside=[3]), done(4, [3.5], beside=[2])]


def test_a_winner_is_not_clear_while_a_configuration_was_measured_only_beside_others():
    r = rank(trials(*CONTENDED))
    assert r.winner_ahead is True  # by the numbers plain leads by far more than the noise...
    assert r.winner_is_clear is False  # ...but every timing of the study may include a neighbour's load
    assert [c.trials for c in r.disturbed] == [[0], [1], [3], [2]]
    words = r.verdict()
    assert "ran only beside other trials on their host" in words and "not a clear win" in words and "is ahead of" not in words
    d = r.as_dict()
    assert d["winner_is_clear"] is False and d["disturbed"] == [[0], [1], [3], [2]]
    assert d["configs"][1]["measured_beside_others"] == [1]
    # the same timings, every trial measured alone: a clear win once plain decoding was measured in a
    # second trial (what the old ranking said of the above from one trial of three repeats)
    alone = rank(trials(*[done(0, [10.0, 10.2, 9.8]), done(2, [3.9, 4.0]), done(6, [1.84]), done(4, [3.5]), done(0, [10.1])]))
    assert alone.winner_is_clear is True and alone.disturbed == [] and "is ahead of" in alone.verdict()
    one_trial = rank(trials(*[done(0, [10.0, 10.2, 9.8]), done(2, [3.9, 4.0]), done(6, [1.84]), done(4, [3.5])]))
    assert (
        one_trial.winner_ahead is True
        and one_trial.winner_is_clear is False
        and "from 1 trial (a clear win takes 2)" in one_trial.verdict()
    )


def test_a_configuration_is_ranked_by_its_trials_measured_alone():
    """n-gram k = 2 re-measured alone (trial 4): its disturbed trial 1 is left out of its figures (kept on
    record and findable), and it now leads; plain, measured only beside another, still blocks a clear win.
    The speedups' baseline is likewise the plain trials measured alone, where there are any."""
    r = rank(trials(*CONTENDED, done(2, [11.2])))
    k2 = r.configs[0]
    assert k2.trials == [4] and k2.beside == [1] and k2.samples == [11.2] and not k2.disturbed
    assert r.config_of(1) == 0 and r.config_of(4) == 0
    assert [c.trials for c in r.disturbed] == [[0], [3], [2]] and r.winner_is_clear is not True
    assert "beside other trials" not in k2.label() and "beside other trials" in r.configs[1].label()
    base = trials(done(0, [5.0], beside=[1]), done(0, [10.0, 10.2]), done(2, [12.0]))
    assert baseline_median(base, 1) == 10.1  # the plain trial measured alone, not the disturbed 5.0
    assert baseline_median(trials(done(0, [5.0], beside=[1])), 1) == 5.0  # none alone: what there is


def test_racing_re_measures_disturbed_configurations_first_the_fastest_first():
    r = rank(trials(*CONTENDED))
    assert race_pick(r, trials_left=2, race_trials=2, running=set(), identity_of_config=ident) == 0  # plain, the leader
    assert race_pick(r, trials_left=2, race_trials=2, running={"0"}, identity_of_config=ident) == 1  # then n-gram k = 2
    assert race_pick(r, trials_left=3, race_trials=2, running=set(), identity_of_config=ident) is None  # not yet
    assert race_pick(r, trials_left=2, race_trials=0, running=set(), identity_of_config=ident) is None  # racing off
    # nothing disturbed: the old rules (a clear lead measured in one trial is measured once more)
    lead = rank(trials(done(0, [10.0, 10.2, 9.8]), done(2, [14.0])))
    assert lead.winner_ahead and not lead.winner_is_clear
    assert race_pick(lead, trials_left=1, race_trials=2, running=set(), identity_of_config=ident) == 1


class _FakeTrial:
    number, user_attrs = 1, {}

    def __init__(self):
        self.reported: list[int] = []

    def report(self, value, step):
        self.reported.append(step)

    def should_prune(self):
        return True  # the pruner would prune at every step

    def set_user_attr(self, key, value):
        pass


def _decode_pruning(disturbed: bool) -> tuple[bool, list[int]]:
    """A trial's decode loop on a fake gang whose pruner always wants to prune: (pruned?, steps reported)."""
    from orchestrator.config.schema import ExperimentConfig
    from orchestrator.study.trial import _decode, _Trial
    from workers.spec import RunResult, Workload
    from workers.spec.run_stats import RunStats

    cfg = ExperimentConfig.model_validate({"name": "x", "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2]}}}})
    prepared = SimpleNamespace(token_ids=[(1, 2, 3)] * 3, workload=lambda cfg, tc, prompts: Workload(prompts=prompts))
    gang = SimpleNamespace(run=lambda w, timeout_s: RunResult(prompts=[], stats=RunStats(tokens=10, seconds=1.0), num_draft_tokens=2))
    trial = _FakeTrial()
    t = _Trial(None, trial, cfg, None, SimpleNamespace(tp=1, params=dict), {}, {}, plain=False, simulated=False)
    _, pruned, _ = _decode(t, prepared, gang, 1, None, disturbed=lambda: disturbed)
    return pruned, trial.reported


def test_a_trial_measured_beside_another_is_never_pruned():
    assert _decode_pruning(disturbed=False) == (True, [0])  # alone: pruned at its first prompt
    assert _decode_pruning(disturbed=True) == (False, [0, 1, 2])  # beside another: measured to the end
