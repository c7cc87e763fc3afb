"""Noise-aware ranking (orchestrator/search/ranking.py), the noise-aware pruner, the fixed part of a resumed
study (orchestrator/config/fixed.py) and the NCCL channel constraint of the space, on real Optuna
studies (in memory) with known measurements."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from orchestrator.config.fixed import check_resume, differences, fixed_part, record
from orchestrator.config.schema import ExperimentConfig, load_config
from orchestrator.config.space import check_constraints, constraint_violation, resolve
from orchestrator.errors import UserError
from orchestrator.record import FIXED_ATTR, PARAMS_ATTR, SAMPLES_ATTR
from orchestrator.search.ranking import MAD_TO_SIGMA, noise_aware_pruner, rank, simplicity

optuna.logging.set_verbosity(optuna.logging.WARNING)


def done(k: int, kind: str, samples: list[float], tp: int = 2, inter: dict[int, float] | None = None):
    params = {"parallel.tp": tp, "spec.num_draft_tokens": k, "drafter.kind": kind}
    return create_trial(
        state=TrialState.COMPLETE,
        value=sorted(samples)[len(samples) // 2],
        params={"drafter.kind": kind},
        distributions={"drafter.kind": CategoricalDistribution(["none", "ngram", "layer_skip"])},
        user_attrs={PARAMS_ATTR: params, SAMPLES_ATTR: samples},
        intermediate_values=inter or {},
    )


def study_of(*trials):
    s = optuna.create_study(direction="maximize")
    for t in trials:
        s.add_trial(t)
    return s


def test_repeats_of_one_configuration_are_pooled_and_the_noise_comes_from_them():
    s = study_of(done(0, "none", [10.0, 11.0, 12.0]), done(2, "ngram", [13.0]), done(2, "ngram", [15.0]), done(2, "layer_skip", [11.5]))
    r = rank(s.trials)
    assert [c.trials for c in r.configs] == [[1, 2], [3], [0]]  # ngram pooled: median 14 of 13 and 15
    ngram = r.configs[0]
    assert ngram.median == 14.0 and ngram.mad == 1.0 and ngram.n == 2
    assert ngram.speedup_vs_baseline == pytest.approx(14.0 / 11.0)  # medians on both sides
    # deviations |x - median| / median over configs measured twice: 1/11, 0, 1/11 and 1/14, 1/14
    assert r.noise_rel == pytest.approx(MAD_TO_SIGMA / 14) and r.noise_from == [0, 1, 2]
    # winner 14 (n=2) vs 11.5 (n=1): gap 2.5 against 2 x sqrt(se_w^2 + se_o^2)
    se_w, se_o = r.noise_rel * 14 / math.sqrt(2), r.noise_rel * 11.5
    assert r.within_noise(1) == (2.5 <= 2 * math.hypot(se_w, se_o)) is True
    # a tie, not a win: the simpler configuration is the one to deploy (n-gram runs no model, layer-skip does)
    assert r.winner_is_clear is False and r.verdict().startswith(
        "trials 1+2 (14.00 tok/s, n=2) and trial 3 (11.50 tok/s, n=1) tie within noise"
    )
    assert r.preferred is ngram and r.verdict().endswith("prefer trials 1+2 (14.00 tok/s, n=2): the simplest of them too")
    d = r.as_dict()
    assert d["runners_up_within_noise"] == [[3]] and d["winner_is_clear"] is False and d["preferred_trials"] == [1, 2]
    plain_ties = rank(study_of(done(0, "none", [10.0, 10.5, 9.5]), done(4, "ngram", [10.3])).trials)
    assert plain_ties.preferred.trials == [0] and "prefer trial 0" in plain_ties.verdict() and "no drafter" in plain_ties.verdict()


def test_a_clear_winner_and_an_unknown_noise():
    """A winner ahead by more than the noise is clear from two trials of it on; from one, it leads but is
    not called clear, however many repeats that trial ran (they share its gang; issue 43: "the winner is
    clear" from single measurements)."""
    once = rank(study_of(done(0, "none", [10.0, 10.2, 9.8]), done(2, "ngram", [14.0])).trials)
    assert once.winner_ahead is True and once.winner_is_clear is False and once.runners_up_within_noise == []
    assert "by more than the noise" in once.verdict() and "from 1 trial (a clear win takes 2)" in once.verdict()
    assert "is ahead of" not in once.verdict() and once.as_dict()["winner_is_clear"] is False
    repeats = rank(study_of(done(0, "none", [10.0, 10.2, 9.8]), done(2, "ngram", [14.0, 14.1, 13.9])).trials)
    assert repeats.winner_ahead is True and repeats.winner_is_clear is False and "from 1 trial (a clear win takes 2)" in repeats.verdict()
    # the sentence ends `spectune run`'s last line, which stays within 300 characters (tests/studyutil.py summary):
    # here with the longest prefix the line has (a space measured through before n_trials)
    from orchestrator.cli import verdict_line

    last = verdict_line({"complete": 12, "n_trials": 30, "space_exhausted": True, "space_size": 12, "ranking": repeats.as_dict()})
    assert len(last) <= 300 and last.endswith("not a clear win"), (len(last), last)
    clear = rank(study_of(done(0, "none", [10.0, 10.2, 9.8]), done(2, "ngram", [14.0]), done(2, "ngram", [14.1])).trials)
    assert clear.winner_is_clear is True and "is ahead of" in clear.verdict() and clear.runners_up_within_noise == []
    unknown = rank(study_of(done(0, "none", [10.0]), done(2, "ngram", [14.0])).trials)
    assert unknown.noise_rel is None and unknown.winner_is_clear is None and "noise is unknown" in unknown.verdict()


def test_the_pruner_keeps_a_trial_within_noise_of_the_best():
    # relative deviations 0.05, 0, 0.05 and 0.1, 0, 0.1: median 0.05, sigma_rel 0.074, band 2 sqrt(2) sigma_rel = 21%
    best = done(2, "ngram", [20.0, 21.0, 19.0], inter={0: 20.0})
    others = [done(0, "none", [10.0, 11.0, 9.0], inter={0: 10.0}), done(2, "layer_skip", [12.0], inter={0: 12.0})]
    s = study_of(best, *others)
    always = optuna.pruners.ThresholdPruner(upper=0.0)  # the inner pruner wants to prune anything positive
    pruner = noise_aware_pruner(always, fallback_rel=0.1)
    near = s.ask()
    near.report(18.0, 0)  # 10% below the best at this step: within noise
    assert pruner.prune(s, s._storage.get_trial(near._trial_id)) is False
    far = s.ask()
    far.report(12.0, 0)  # 40% below: clearly losing
    assert pruner.prune(s, s._storage.get_trial(far._trial_id)) is True
    assert noise_aware_pruner(optuna.pruners.NopPruner(), 0.1).prune(s, s._storage.get_trial(far._trial_id)) is False


def cfg(**over) -> ExperimentConfig:
    raw = {"name": "x", "search": {"space": {"drafter.kind": {"choices": ["ngram", "layer_skip"]}}}, "parallel": {"tp": 2}}
    for key, value in over.items():
        section, field = key.split("__")
        raw.setdefault(section, {})[field] = value
    return ExperimentConfig.model_validate(raw)


def test_the_fixed_part_names_what_must_not_change():
    base = fixed_part(cfg())
    assert [k for k, _, _ in differences(base, fixed_part(cfg(parallel__tp=1)))] == ["parallel.tp"]
    # budget, limits, tracking and the sampler may change; a searched parameter's YAML default is not fixed
    assert (
        differences(
            base,
            fixed_part(
                cfg(study__n_trials=50, limits__trial_timeout_s=5, tracking__uri="file:/x", study__seed=3, drafter__kind="layer_skip")
            ),
        )
        == []
    )
    assert [k for k, _, _ in differences(base, fixed_part(cfg(drafter__num_draft_tokens=2)))] == ["drafter.num_draft_tokens"]


def test_a_resumed_study_with_another_fixed_part_is_refused():
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="x", storage=storage)
    check_resume(storage, cfg())  # nothing recorded yet
    record(study, cfg())
    assert study.user_attrs[FIXED_ATTR] == fixed_part(cfg())
    check_resume(storage, cfg(study__n_trials=99))
    with pytest.raises(UserError) as e:
        check_resume(storage, cfg(parallel__tp=1, workload__max_new_tokens=7))
    msg = str(e.value)
    assert msg.startswith("parallel.tp, workload.max_new_tokens: differ from the study 'x'") and "study.name" in msg
    assert "\n" not in msg


def test_a_study_from_before_a_field_existed_resumes_at_its_default():
    """A field added to spectune later (workload.split) is missing from an old study's fixed part:
    the old study measured under its default, so the default resumes and anything else is refused."""
    old = {k: v for k, v in fixed_part(cfg()).items() if k not in ("workload.split", "workload.batch_sizes")}
    assert differences(old, fixed_part(cfg())) == []
    # studies recorded before kept each value as JSON text ('"auto"'): read the same way
    as_text = {k: json.dumps(v, sort_keys=True) for k, v in fixed_part(cfg()).items()}
    assert differences(as_text, fixed_part(cfg())) == []
    assert [k for k, _, _ in differences(as_text, fixed_part(cfg(parallel__tp=1)))] == ["parallel.tp"]
    assert not any(isinstance(v, str) and v.startswith('"') for v in fixed_part(cfg()).values())
    assert [k for k, _, _ in differences(old, fixed_part(cfg(workload__split="heldout")))] == ["workload.split"]
    assert [k for k, _, _ in differences(old, fixed_part(cfg(workload__batch_sizes=[1, 4])))] == ["workload.batch_sizes"]


def test_nccl_min_channels_above_max_is_a_violation():
    c = cfg(parallel__backend="nccl", parallel__device="cuda")
    assert constraint_violation(resolve({"nccl.NCCL_MIN_NCHANNELS": 8, "nccl.NCCL_MAX_NCHANNELS": 2, "comm.backend": "nccl"}, c)) == (
        "constraint: NCCL_MIN_NCHANNELS=8 is above NCCL_MAX_NCHANNELS=2 (min must be <= max); not run"
    )
    assert constraint_violation(resolve({"nccl.NCCL_MIN_NCHANNELS": 2, "nccl.NCCL_MAX_NCHANNELS": 2, "comm.backend": "nccl"}, c)) is None
    assert constraint_violation(resolve({"nccl.NCCL_MIN_NCHANNELS": 8}, c)) is None  # no max: NCCL's own default
    # a space where no trial can satisfy it is refused before anything runs; one where some can is fine
    never = c.model_copy(
        update={
            "search": c.search.model_validate(
                {
                    "space": {
                        "comm.backend": "nccl",
                        "nccl.NCCL_MIN_NCHANNELS": {"choices": [8, 16]},
                        "nccl.NCCL_MAX_NCHANNELS": {"choices": [2, 4]},
                    }
                }
            )
        }
    )
    with pytest.raises(UserError, match="search.space.nccl.NCCL_MIN_NCHANNELS: every value is above"):
        check_constraints(never)
    check_constraints(load_config(Path(__file__).parents[2] / "experiments" / "tp8-pcie.yaml"))


def test_a_constraint_violating_trial_is_recorded_pruned_and_never_run(tmp_path):
    """The real trial path (Optuna, an MLflow store): no gang is asked for (pool None), the MLflow run
    carries the reason."""
    from orchestrator.study.trial import run_trial
    from orchestrator.tracking.runs import Tracker

    c = ExperimentConfig.model_validate(
        {
            "name": "x",
            "parallel": {"tp": 2, "device": "cuda", "backend": "nccl"},
            "search": {"space": {"nccl.NCCL_MIN_NCHANNELS": {"choices": [8]}, "nccl.NCCL_MAX_NCHANNELS": {"choices": [2]}}},
        }
    )
    study = optuna.create_study(direction="maximize")
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "x", "x", tmp_path, study=study)
    trial = study.ask()
    out = run_trial(study, trial, c, None, None, tracker)
    assert out.state == "PRUNED" and "NCCL_MIN_NCHANNELS=8 is above NCCL_MAX_NCHANNELS=2" in out.reason
    frozen = study.trials[0]
    assert frozen.state == TrialState.PRUNED and frozen.user_attrs["spectune.prune_reason"] == out.reason
    run = tracker.client.get_run(frozen.user_attrs["mlflow_run_id"])
    assert run.data.tags["spectune.state"] == "PRUNED" and run.data.tags["spectune.prune_reason"] == out.reason
    assert run.data.params["nccl.NCCL_MIN_NCHANNELS"] == "8" and run.data.params["spec.num_draft_tokens"] == "4"


def test_racing_remeasures_the_leaders_only_near_the_end_and_only_while_they_tie():
    """study.race_trials: within the last race_trials trials, a tied winner's leaders are re-measured,
    the least measured first; a clear winner is confirmed on a second gang, then frees race trials but
    the last (the runner-up's); a budget not yet reached or leaders all running: none."""
    from orchestrator.search.racing import race_pick

    tied = rank(
        study_of(
            done(0, "none", [10.0, 11.0, 12.0]), done(2, "ngram", [13.0]), done(2, "ngram", [15.0]), done(2, "layer_skip", [11.5])
        ).trials
    )
    ident = lambda c: str(c.trials[0])  # noqa: E731 - a configuration's identity for the test
    assert tied.winner_is_clear is False
    assert race_pick(tied, trials_left=2, race_trials=2, running=set(), identity_of_config=ident) == 3  # layer_skip: 1 trial
    assert race_pick(tied, trials_left=2, race_trials=2, running={"3"}, identity_of_config=ident) == 1  # then the winner
    assert race_pick(tied, trials_left=3, race_trials=2, running=set(), identity_of_config=ident) is None  # not yet
    assert race_pick(tied, trials_left=2, race_trials=0, running=set(), identity_of_config=ident) is None  # racing off
    assert race_pick(tied, trials_left=2, race_trials=2, running={"1", "3"}, identity_of_config=ident) is None
    clear = rank(study_of(done(0, "none", [10.0, 10.2, 9.8]), done(2, "ngram", [14.0])).trials)
    # a clear winner measured in one trial (one gang) is measured once more; then (or while it runs) no race
    assert race_pick(clear, trials_left=1, race_trials=2, running=set(), identity_of_config=ident) == 1
    assert race_pick(clear, trials_left=1, race_trials=2, running={"1"}, identity_of_config=ident) is None
    assert race_pick(clear, trials_left=3, race_trials=2, running=set(), identity_of_config=ident) is None
    twice = rank(study_of(done(0, "none", [10.0, 10.2, 9.8]), done(2, "ngram", [14.0]), done(2, "ngram", [14.2])).trials)
    # measured twice: a race trial may explore, but not the last (what it found would lead unconfirmed):
    # the last re-measures the runner-up
    assert twice.winner_is_clear and race_pick(twice, trials_left=2, race_trials=2, running=set(), identity_of_config=ident) is None
    assert race_pick(twice, trials_left=1, race_trials=2, running=set(), identity_of_config=ident) == 0
    assert race_pick(twice, trials_left=1, race_trials=2, running={"0"}, identity_of_config=ident) == 1  # the winner then
    assert race_pick(twice, trials_left=1, race_trials=2, running={"0", "1"}, identity_of_config=ident) is None
    # two trials at once: the last two run beside each other, so neither explores
    assert race_pick(twice, trials_left=2, race_trials=2, running=set(), identity_of_config=ident, concurrency=2) == 0
    # four leaders tie, two race trials: the simplest of those measured once (what the verdict would
    # prefer) goes first, so the configuration the tie names is measured twice
    four = rank(
        study_of(
            done(0, "none", [10.0, 10.2, 9.8]), done(2, "ngram", [14.0]), done(2, "ngram", [14.4]),
            done(6, "ngram", [14.3]), done(1, "ngram", [13.9]), done(2, "layer_skip", [14.2]),
        ).trials
    )  # fmt: skip
    assert four.winner_is_clear is False and simplicity(four.preferred.params) == (1, 1)
    assert race_pick(four, trials_left=2, race_trials=2, running=set(), identity_of_config=ident) == 4  # n-gram k = 1
    assert race_pick(four, trials_left=1, race_trials=2, running={"4"}, identity_of_config=ident) == 3  # then k = 6
    unknown = rank(study_of(done(0, "none", [10.0]), done(2, "ngram", [10.5])).trials)  # noise unknown: the top two race
    assert race_pick(unknown, trials_left=1, race_trials=2, running=set(), identity_of_config=ident) == 1


def test_racing_is_on_by_default_in_a_study_long_enough_for_it():
    """study.race_trials left out: 2 in a study of at least 8 trials (not a grid, which measures each point
    once), 0 in a shorter one; a value given is kept."""
    from orchestrator.config.schema import RACE_MIN_TRIALS, RACE_TRIALS, StudySection

    assert StudySection(n_trials=10).race_trials == RACE_TRIALS == 2 and RACE_MIN_TRIALS == 8
    assert StudySection(n_trials=7).race_trials == 0 and StudySection().race_trials == 0
    assert StudySection(n_trials=10, sampler="grid").race_trials == 0
    assert StudySection(n_trials=10, race_trials=0).race_trials == 0 and StudySection(n_trials=3, race_trials=1).race_trials == 1
    assert cfg(study__n_trials=12).study.race_trials == 2
