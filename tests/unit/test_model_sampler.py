"""The `model` sampler (orchestrator/search/samplers.py) and the configuration model it stands on
(perfmodel.fit_configs / config_loo), on the synthetic machine of tests/unit/test_search_bench.py:
driven the way the trial loop drives a sampler (study.ask, space.suggest, proposals.admit, tell
with the metrics a trial records), one trial at a time and with trials running side by side."""

from __future__ import annotations

import math
import random

import numpy as np
import optuna
import pytest
from test_search_bench import Truth, experiment

from orchestrator.config.space import baseline_params, distinct_configs, identity_of, suggest, trial_config
from orchestrator.record import BASELINE_TAG, PARAMS_ATTR, SAMPLES_ATTR
from orchestrator.search.config_model import Miss, config_loo, config_loo_error, fit_configs
from orchestrator.search.points import config_point, config_shape
from orchestrator.search.proposals import Proposals
from orchestrator.search.samplers import ModelSampler, expected_improvement, make_sampler
from orchestrator.study.loop import search_line
from orchestrator.tracking.storage import frozen_trial

TRUTH = Truth(noise=0.0)


def _record(trial, cfg, noise: float, rng: random.Random) -> float:
    """Tell `trial` COMPLETE with what the synthetic machine measures for its configuration."""
    tc = trial_config(trial, cfg)
    objective, _, metrics = TRUTH.throughput(tc)
    samples = [objective * (1 + noise * rng.gauss(0, 1)) for _ in range(3 if tc.num_draft_tokens == 0 else 1)]
    for key, value in metrics.items():
        trial.set_user_attr(key, value)
    trial.set_user_attr(PARAMS_ATTR, tc.params())
    trial.set_user_attr(SAMPLES_ATTR, samples)
    value = float(np.median(samples))
    trial.study.tell(trial, value)
    return objective


def _study(cfg, seed=0):
    cfg = cfg.model_copy(update={"study": cfg.study.model_copy(update={"sampler": "model", "seed": seed})})
    study = optuna.create_study(direction="maximize", sampler=make_sampler(cfg))
    study.enqueue_trial(baseline_params(cfg), user_attrs={BASELINE_TAG: True})
    return cfg, study


def test_make_sampler_builds_the_model_sampler_from_the_schema():
    cfg = experiment(sampler="model")
    assert cfg.study.sampler == "model" and isinstance(make_sampler(cfg), ModelSampler)


def test_a_study_driven_like_the_trial_loop_finds_the_best_without_repeats():
    cfg, study = _study(experiment())
    space = distinct_configs(cfg)
    truth = {i: TRUTH.throughput(suggest(optuna.trial.FixedTrial(p), cfg))[0] for i, p in space.items()}
    book = Proposals(space, random.Random(0))
    rng, seen = random.Random(0), []
    for _ in range(8):
        trial = study.ask()
        asked = "fixed_params" in frozen_trial(study, trial.number).system_attrs
        identity = identity_of(trial, cfg)
        admission = book.admit(trial.number, identity, asked)
        assert admission.run, "the model sampler never proposes a known configuration"
        _record(trial, cfg, 0.02, rng)
        book.finished(trial.number, known=True)
        seen.append(identity)
    assert trial_config(study.trials[0], cfg).num_draft_tokens == 0  # the baseline first
    assert len(set(seen)) == 8
    assert max(truth[i] for i in seen) >= 0.97 * max(truth.values())
    picks = [p for p in study.sampler.picks.values() if p is not None and p.estimate is not None]
    assert picks and all(p.expected_improvement >= 0 for p in picks)


def test_trials_asked_side_by_side_never_share_a_configuration():
    """Running trials count as known: four asks before any tell give four configurations."""
    cfg, study = _study(experiment())
    first = study.ask()
    _record(first, cfg, 0.0, random.Random(0))  # the baseline measured: the model has a setup to stand on
    running = [study.ask() for _ in range(4)]
    ids = [identity_of(t, cfg) for t in running]
    assert None not in ids and len(set(ids)) == 4


def test_an_enqueued_trial_keeps_its_fixed_part():
    """The baseline is enqueued with k = 0 only: the sampler fills the rest (engine.gemv) with a k = 0 configuration."""
    cfg, study = _study(experiment())
    trial = study.ask()
    tc = trial_config(trial, cfg)
    assert tc.num_draft_tokens == 0 and "engine.gemv" in trial.params


def test_a_space_that_cannot_be_listed_gets_tpe_not_random():
    big = {"comm.backend": {"choices": ["nccl"]}, "nccl.NCCL_BUFFSIZE": {"low": 1, "high": 30_000}}
    cfg, study = _study(experiment(big))
    assert cfg.study.sampler == "model" and isinstance(study.sampler, optuna.samplers.TPESampler)
    assert isinstance(make_sampler(experiment()), ModelSampler)  # the default, where the space can be listed
    assert search_line(cfg).startswith("search: study.sampler tpe (study.sampler model needs a space it can list")
    assert search_line(experiment(sampler="model")).startswith("search: study.sampler model; study.race_trials")
    for _ in range(3):
        t = study.ask()
        suggest(t, cfg)
        study.tell(t, 1.0)


def _points(cfg, identities):
    out = []
    for identity in identities:
        tc = suggest(optuna.trial.FixedTrial(distinct_configs(cfg)[identity]), cfg)
        objective, _, metrics = TRUTH.throughput(tc)
        out.append(config_point(config_shape(tc, cfg), metrics, objective))
    return out


def test_the_configuration_model_predicts_untried_configurations_from_measured_parts():
    """Measured: the baseline, n-gram at k = 8 (every position's acceptance), eagle3 actor at k = 8 and
    layer-skip L = 8 at k = 4, all with gemv auto, and gemv off once. Predicted, none of them measured:
    n-gram at k = 3, eagle3 in the verifier ranks, layer-skip L = 16 (cost scales with its layers, acceptance
    from L = 8's), gemv off with any drafter."""
    cfg = experiment()
    space = distinct_configs(cfg)

    def find(k, kind=None, gemv="auto", **drafter):
        for identity, params in space.items():
            tc = suggest(optuna.trial.FixedTrial(params), cfg)
            if tc.num_draft_tokens == k and (k == 0 or tc.drafter.kind == kind) and tc.engine.gemv == gemv:
                if all(getattr(tc.drafter, n) == v for n, v in drafter.items()):
                    return identity
        raise AssertionError("no such configuration")

    measured = [
        find(0),
        find(8, "ngram"),
        find(8, "eagle3", placement="actor"),
        find(4, "layer_skip", layers=8),
        find(2, "ngram", gemv="off"),
    ]
    model = fit_configs(_points(cfg, measured))
    for identity, rel in ((find(3, "ngram"), 0.02), (find(6, "eagle3", placement="actor"), 0.02), (find(6, "ngram", gemv="off"), 0.02)):
        tc = suggest(optuna.trial.FixedTrial(space[identity]), cfg)
        est = model.predict(config_shape(tc, cfg))
        assert not isinstance(est, Miss)
        assert est.objective == pytest.approx(TRUTH.throughput(tc)[0], rel=rel), tc.describe()
    # another layer count: its acceptance was never measured, so without priors it is a miss; with them, an estimate
    far = suggest(optuna.trial.FixedTrial(space[find(4, "layer_skip", layers=16)]), cfg)
    assert isinstance(model.predict(config_shape(far, cfg)), Miss)
    assert not isinstance(model.predict(config_shape(far, cfg), ModelSampler(cfg).priors), Miss)


def test_leave_one_configuration_out_on_the_whole_space():
    """Every configuration predicted from the others: exact parts give a small error; misses are named."""
    cfg = experiment()
    points = _points(cfg, list(distinct_configs(cfg)))
    preds = config_loo(points)
    assert len(preds) == len(points) and all(x.predicted is not None for x in preds)
    assert config_loo_error(preds) < 0.03
    # a drafter measured at one k only cannot have its acceptance predicted without that measurement: a miss
    lone = [p for p in points if (p.k in (0, 4) or p.kind == "ngram") and "engine.gemv=auto" in p.shape.settings]
    preds = config_loo(lone)
    missed = [x for x in preds if x.predicted is None]
    assert missed and all("acceptance" in x.how for x in missed) and all(x.error == 1.0 for x in missed)
    assert all(x.shape.kind != "ngram" for x in missed)


def test_expected_improvement():
    assert expected_improvement(10.0, 0.0, 8.0) == 2.0 and expected_improvement(7.0, 0.0, 8.0) == 0.0
    assert expected_improvement(8.0, 1.0, 8.0) == pytest.approx(1 / math.sqrt(2 * math.pi))
    assert expected_improvement(6.0, 1.0, 8.0) < expected_improvement(6.0, 2.0, 8.0)  # wider: more to gain


def _point(env_settings, kind, k, verify, draft, rest, rates, coverage=1.0, objective_outside=0.0, drafter=None, in_verifier=True):
    """A configuration model point of hand-set parts (ms); decode from them, the objective with
    `objective_outside` s per token outside the steps."""
    from orchestrator.search.points import ConfigShape, TrialPoint

    tau = 1.0 + coverage * sum(rates[:k])
    step = verify + draft + rest
    decode = tau * 1000.0 / step
    settings = tuple(env_settings)
    shape = ConfigShape(
        env="tp1 gloo" + (" " + ",".join(settings) if settings else ""), family="tp1 gloo", settings=settings, tp=1,
        kind=kind if k else "none", drafter=(drafter or kind) if k else "none", acceptance=(drafter or kind) if k else "none",
        k=k, width=k + 1, in_verifier=in_verifier,
    )  # fmt: skip
    return TrialPoint(
        shape.env, shape.kind, k, step, tau, decode, tuple(rates[:k]), verify_ms=verify, draft_ms=draft, tp=1,
        family="tp1 gloo", settings=settings, config=shape, objective=1.0 / (objective_outside + 1.0 / decode),
    )  # fmt: skip


def test_the_objective_adds_each_variants_own_time_outside_the_steps_and_no_slope_in_k():
    """1/objective - 1/decode is per drafter variant (prefill: the plain trials' 0.5 ms a token, the drafter's
    0.8 ms): a noisy pair of objectives at two k reads as no cost per draft, and a variant no trial ran pays
    the plain trials' time outside."""
    from dataclasses import replace

    rates = [0.6, 0.4, 0.3, 0.2, 0.1, 0.05]
    plain = _point((), "none", 0, 10.0, 0.0, 0.0, [], objective_outside=0.5e-3)
    a = _point((), "ngram", 2, 10.6, 0.1, 0.2, rates, objective_outside=0.8e-3)
    b = _point((), "ngram", 6, 11.8, 0.3, 0.2, rates, objective_outside=0.8e-3)
    b = replace(b, objective=b.objective * 0.9)  # one noisy objective: the old k-slope made k = 6 look 10% dearer per draft
    model = fit_configs([plain, a, b])
    four = _point((), "ngram", 4, 11.2, 0.2, 0.2, rates).shape
    est = model.predict(four)
    outside = float(np.median([1 / a.objective - 1 / a.throughput, 1 / b.objective - 1 / b.throughput]))
    assert est.objective == pytest.approx(1.0 / (outside + 1.0 / est.decode_tok_s), rel=1e-9)
    assert model.outside.s(four) == pytest.approx(outside) and model.outside.s(plain.shape) == pytest.approx(0.5e-3)
    other = _point((), "eagle3", 2, 10.6, 0.5, 0.0, rates, drafter="eagle3 head").shape
    assert model.outside.s(other) == pytest.approx(0.5e-3)  # no eagle3 trial: the plain trials' prefill


def test_a_kind_no_trial_ran_gets_the_priors_acceptance_drafting_every_step():
    """n-gram lookup measured (drafting in half the steps, P = 0.9 each): an eagle3 head is not assumed to
    accept like the text's repeats; the prior's halving P_i, every step drafting. Another n-gram variant
    borrows n-gram's P_i and its share of steps."""
    from orchestrator.search.config_model import Priors

    rates = [0.9, 0.9, 0.9, 0.9]
    plain = _point((), "none", 0, 10.0, 0.0, 0.0, [])
    ng = _point((), "ngram", 4, 11.2, 0.1, 0.1, rates, coverage=0.5)
    model = fit_configs([plain, ng])
    assert model.coverage["ngram"] == pytest.approx(0.5)
    priors = Priors(n_layers=30)
    head = _point((), "eagle3", 4, 11.2, 1.0, 0.1, rates, drafter="eagle3 head").shape
    accepted, how, _ = model.acceptance(head, priors)
    assert "prior" in how and accepted == pytest.approx(sum(priors.rates))
    other = _point((), "ngram", 4, 11.2, 0.1, 0.1, rates, drafter="ngram ngram_max=5").shape
    accepted, how, _ = model.acceptance(other, priors)
    assert "ngram" in how and accepted == pytest.approx(0.5 * 3.6)


def test_a_drafter_whose_pass_is_cheaper_does_not_bend_the_width_slope():
    """Verify 10 + 0.3 x width for n-gram at two widths; an in-rank head whose pass the trials time 1.5 ms
    shorter at width 4: its offset takes the difference, the slope stays 0.3, and each drafter's wider
    pass is predicted from its own offset."""
    rates = [0.6, 0.4, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01]
    points = [
        _point((), "none", 0, 10.3, 0.0, 0.0, []),
        _point((), "ngram", 2, 10.9, 0.05, 0.1, rates),
        _point((), "ngram", 8, 12.7, 0.1, 0.1, rates),
        _point((), "eagle3", 3, 10.0, 0.6, 0.0, rates, drafter="eagle3 head"),
    ]
    fit = fit_configs(points).verify
    assert fit.b == pytest.approx(0.3, rel=0.02)
    assert fit.ms(_point((), "eagle3", 7, 1, 0, 0, rates, drafter="eagle3 head").shape) == pytest.approx(10.0 + 4 * 0.3, rel=0.01)
    assert fit.ms(_point((), "ngram", 5, 1, 0, 0, rates).shape) == pytest.approx(10.0 + 6 * 0.3, rel=0.01)


def test_tied_picks_go_to_the_drafter_that_adds_least():
    """Only the baseline measured: EAGLE-3 with and without n-gram lookup (and as a tree) are predicted alike
    (no trial measured what lookup or a tree changes); the first pick is the plain chain."""
    space = {
        "spec.num_draft_tokens": {"choices": [0, 3]},
        "drafter.kind": {"choices": ["eagle3"]},
        "drafter.placement": {"choices": ["rank0"]},
        "drafter.lookup": {"choices": [0, 3]},
        "drafter.tree_width": {"choices": [0, 4]},
    }
    for seed in range(4):
        cfg, study = _study(experiment(space), seed=seed)
        _record(study.ask(), cfg, 0.0, random.Random(0))
        tc = trial_config(_asked(study, cfg), cfg)
        assert tc.num_draft_tokens == 3 and tc.drafter.lookup == 0 and tc.drafter.tree_width in (0, 1)


def _asked(study, cfg):
    trial = study.ask()
    suggest(trial, cfg)
    return trial


def test_a_layer_skip_drafter_no_trial_ran_accepts_at_most_its_share_of_the_layers():
    """The prior for a kind no trial ran: P_1 at most L / N for layer-skip (a draft from 8 of 32 layers agrees
    with the whole verifier at most a quarter of the time), halving after; an EAGLE-3 head keeps the halving
    prior from 0.5."""
    from orchestrator.search.config_model import Priors

    plain = _point((), "none", 0, 10.0, 0.0, 0.0, [])
    model = fit_configs([plain])
    priors = Priors(n_layers=32)
    skip = _point((), "layer_skip", 3, 11.0, 3.0, 0.0, [0.5, 0.25, 0.125], drafter="layer_skip layers=8").shape
    skip = type(skip)(**{**skip.__dict__, "layers": 8})
    assert priors.acceptance(skip) == pytest.approx([0.25, 0.125, 0.0625])
    assert model.acceptance(skip, priors)[0] == pytest.approx(0.4375)
    head = _point((), "eagle3", 3, 11.0, 1.0, 0.0, [0.5, 0.25, 0.125], drafter="eagle3 head").shape
    assert priors.acceptance(head) == pytest.approx([0.5, 0.25, 0.125])


@pytest.mark.parametrize(
    ("study", "race"),
    [
        ({"n_trials": 10}, 2),
        ({"n_trials": 10.0}, 2),  # a float in the YAML is the int it validates to, not "not an int"
        ({"n_trials": "10"}, 2),
        ({"n_trials": 7}, 0),
        ({"n_trials": 10, "sampler": "grid"}, 0),
        ({"n_trials": 10, "race_trials": 0}, 0),
        ({"n_trials": 4, "race_trials": 3}, 3),
    ],
)
def test_race_trials_default_follows_the_validated_study(study, race):
    from orchestrator.config.schema import StudySection

    assert StudySection(**study).race_trials == race


def test_a_measured_width_profile_predicts_a_step_in_width_that_a_line_cannot():
    """On 2 CPU cores a verify pass of 1-3 rows costs the same and one of 4-7 rows a quarter more (the
    matrix kernels change with the rows). Leaving n-gram k = 2 (width 3) or k = 3 (width 4) out, a line
    through the other widths misses by several %; with each trial's end-of-run profile of every width
    (on an empty cache: another level, the same steps), the left-out width's pass comes from the profile
    of the other trials and the prediction is exact."""
    from dataclasses import replace

    def verify(width):  # the decode steps' pass: 20 ms above the end-of-run profile's level
        return 120.0 + (30.0 if width >= 4 else 0.0) + 2.0 * max(0, width - 4)

    profile = tuple((w, verify(w) - 20.0) for w in (1, 2, 3, 4, 5, 7))
    rates = [0.6, 0.4, 0.3, 0.2, 0.1, 0.05]
    ks = (0, 1, 2, 3, 4, 6)
    lined = [_point((), "ngram" if k else "none", k, verify(k + 1), 0.0, 0.0, rates) for k in ks]
    profiled = [replace(p, width_ms=profile) for p in lined]
    for pts, worst in ((lined, 0.05), (profiled, 1e-6)):
        preds = {x.shape.k: x for x in config_loo(pts)}
        errors = {k: preds[k].error for k in (2, 3)}
        assert (min(errors.values()) > worst) if pts is lined else (max(errors.values()) < worst), errors
    model = fit_configs(profiled)
    rises = {w: verify(w) - verify(1) for w in (1, 2, 3, 4, 5, 7)}
    assert model.verify.profiles[("env", "tp1 gloo")] == rises == model.verify.profiles[("family", "tp1 gloo")]
    # a width between profiled ones: linear between them; past them (k = 8, width 9): along the
    # profile's slope from its widest (2 ms a token past the step here, 5.5 fitted over all of it)
    six = _point((), "ngram", 5, 1.0, 0.0, 0.0, rates).shape
    nine = _point((), "ngram", 8, 1.0, 0.0, 0.0, rates).shape
    assert model.verify.width_term(six) == pytest.approx((rises[5] + rises[7]) / 2)
    slope = np.polyfit(list(rises), list(rises.values()), 1)[0]
    assert model.verify.width_term(nine) == pytest.approx(rises[7] + 2 * slope) and model.verify.width_term(nine) > rises[7]


def test_a_cpu_trial_profiles_every_chain_width_of_the_space():
    """Workload.profile_widths: k + 1 for every k the space (or the fixed drafter section) can run;
    none on CUDA, where a width the run did not capture would run uncaptured."""
    from orchestrator.execution.workload import profile_widths

    cfg = experiment({"spec.num_draft_tokens": {"choices": [0, 2, 6]}, "drafter.kind": {"choices": ["ngram"]}})
    assert profile_widths(cfg) == (1, 3, 5, 7)  # and the drafter section's default k = 4
    ranged = experiment({"spec.num_draft_tokens": {"low": 1, "high": 5, "step": 2}})
    assert set(profile_widths(ranged)) >= {2, 4, 6}
    gpu = cfg.model_copy(update={"parallel": cfg.parallel.model_copy(update={"device": "cuda"})})
    assert profile_widths(gpu) == ()


def test_pruned_trials_lend_their_acceptance_and_draft_time_but_not_their_timings():
    """The main job's shape: one complete trial per drafter, the drafter's other k pruned. Leaving the
    complete n-gram trial out, its acceptance and time per draft come from the pruned trial (the pruned
    pass's verify time, off here by 5x, is not used); without the pruned trial it is a miss."""
    from dataclasses import replace

    rates = [0.6, 0.4, 0.3, 0.2]
    plain = _point((), "none", 0, 10.0, 0.0, 0.0, [])
    two = _point((), "ngram", 2, 10.6, 0.1, 0.0, rates)
    four = replace(_point((), "ngram", 4, 11.2, 0.2, 0.0, rates), verify_ms=56.0, throughput=1.0)  # pruned: first prompts only
    alone = {x.shape.k: x for x in config_loo([plain, two])}
    assert alone[2].predicted is None and "acceptance" in alone[2].how
    lent = {x.shape.k: x for x in config_loo([plain, two], [four])}
    assert lent[2].predicted is not None and lent[2].error < 0.02, lent[2]
    assert "rest unmeasured" in lent[2].how


def test_an_imposed_profile_predicts_the_sum_of_its_first_k_positions():
    """workload.simulate_accept_profile: the configuration model takes a configuration's drafts kept per
    step as sum_{i<=k} P_i (what the engine imposes), with no measurement of that drafter and no prior."""
    plain = _point((), "none", 0, 10.0, 0.0, 0.0, [])
    model = fit_configs([plain])
    shape = _point((), "ngram", 3, 11.0, 1.0, 0.0, []).shape
    imposed = type(shape)(**{**shape.__dict__, "simulated_profile": (0.9, 0.6, 0.3, 0.1)})
    drafts, basis, spread = model.acceptance(imposed, None)
    assert drafts == pytest.approx(1.8) and basis == "acceptance simulated" and spread == 0.0
    deeper = type(shape)(**{**imposed.__dict__, "k": 6})
    assert model.acceptance(deeper, None)[0] == pytest.approx(1.9)  # P_i = 0 past the profile
