"""`spectune bench-search` on a synthetic record whose truth is known: a step-time and acceptance
model of every configuration of a space (verify a + b x width, plus an engine option's cost; drafts
per drafter; link messages; geometric acceptance per drafter), written as finished studies the way
`spectune run` records them (Optuna user attrs, repeats pooled). Checks the landscape (pooling,
outside the space), the replay's rules (baseline first, only recorded configurations offered, a
proposal outside the record asked again and not counted, budget = offered trials), the metrics
(fraction of the best, trials to come within noise), the JSON's shape, and the CLI's errors.

`synthetic_record` is shared with tests/unit/test_model_sampler.py."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

import numpy as np
import optuna
import pytest

from orchestrator.cli import main
from orchestrator.config.schema import validated
from orchestrator.config.space import config_identity, distinct_configs, suggest
from orchestrator.errors import UserError
from orchestrator.record import BASELINE_TAG, PARAMS_ATTR, SAMPLES_ATTR
from orchestrator.search.benchmark import NOT_RECORDED, bench, load_landscape, open_record, replay
from orchestrator.tracking.runs import experiment_params

SPACE = {
    "spec.num_draft_tokens": {"choices": [0, 1, 2, 3, 4, 6, 8]},
    "drafter.kind": {"choices": ["ngram", "layer_skip", "eagle3"]},
    "drafter.layers": {"choices": [4, 8, 16]},
    "drafter.placement": {"choices": ["actor", "rank0"]},
    "engine.gemv": {"choices": ["auto", "off"]},
}


def experiment(space: dict | None = None, **study) -> object:
    return validated(
        {
            "name": "synthetic",
            "model": {"path": "random:llama-3-8b"},
            "drafter": {"kind": "ngram", "model_path": "smollm2-135m-eagle3"},
            "parallel": {"tp": 1, "device": "cpu", "backend": "gloo"},
            "workload": {"max_new_tokens": 64},
            "search": {"space": space or SPACE},
            "study": {"n_trials": 10, **study},
        }
    )


@dataclass(frozen=True)
class Truth:
    """The synthetic machine: ms per verify pass, draft and rest, and P(accepted >= i) per drafter."""

    noise: float = 0.03  # relative spread of one measurement

    def parts(self, tc) -> tuple[float, float, float, list[float]]:
        k, d = tc.num_draft_tokens, tc.drafter
        verify = 10.0 + 0.3 * (k + 1) + (1.0 if tc.engine.gemv == "off" else 0.0)
        if k == 0:
            return verify, 0.0, 0.0, []
        if d.kind == "ngram":
            per, rest, first, ratio = 0.02, 0.05, 0.55, 0.8
        elif d.kind == "layer_skip":
            per, rest, first, ratio = 0.31 * d.layers, 1.5, {4: 0.35, 8: 0.55, 16: 0.75}[d.layers], {4: 0.5, 8: 0.7, 16: 0.8}[d.layers]
        else:
            per, rest, first, ratio = (0.6, 0.2, 0.8, 0.85) if d.placement == "rank0" else (0.7, 1.2, 0.8, 0.85)
        return verify, per * k, rest, [first * ratio**i for i in range(k)]

    def throughput(self, tc) -> tuple[float, float, dict]:
        """(objective, decode tok/s, metrics) of one noiseless measurement."""
        verify, draft, rest, rates = self.parts(tc)
        tau = 1.0 + sum(rates)
        step = verify + draft + rest
        decode = tau * 1000.0 / step
        objective = 1.0 / (0.5e-3 + 1.0 / decode)  # 0.5 ms per token of prefill and set-up
        metrics = {"step_ms_p50": step, "verify_ms_p50": verify, "draft_ms_p50": draft, "accept_len_mean": tau, "decode_tok_s": decode}
        metrics.update({f"accept_rate_pos_{i}": r for i, r in enumerate(rates, 1)})
        return objective, decode, metrics


def measured_configs(cfg, truth: Truth = Truth()) -> dict[str, tuple[dict, float]]:
    """identity -> (params, noiseless objective) of every configuration of `cfg`'s space."""
    out = {}
    for identity, params in distinct_configs(cfg).items():
        tc = suggest(optuna.trial.FixedTrial(params), cfg)
        out[identity] = (params, truth.throughput(tc)[0])
    return out


def synthetic_record(cfg, storage: str, study: str, keep: float = 1.0, seed: int = 0, repeats: int = 1, truth: Truth = Truth()) -> dict:
    """Write a finished study of `cfg`'s space at `storage`: a share `keep` of its configurations (the
    k = 0 point of the first choices always), each one COMPLETE trial of `repeats` noisy repeats, the
    baseline three times. Returns identity -> its true objective for the configurations written."""
    rng = random.Random(seed)
    s = optuna.create_study(study_name=study, storage=storage, direction="maximize")
    written = {}
    space = distinct_configs(cfg)
    first = next(iter(space))
    for identity, params in space.items():
        if identity != first and rng.random() > keep:
            continue
        tc = suggest(optuna.trial.FixedTrial(params), cfg)
        objective, _, metrics = truth.throughput(tc)
        n = 3 if tc.num_draft_tokens == 0 else repeats
        samples = [objective * (1 + truth.noise * rng.gauss(0, 1)) for _ in range(n)]
        attrs = {**metrics, PARAMS_ATTR: {**experiment_params(cfg), **tc.params()}, SAMPLES_ATTR: samples}
        attrs["throughput_tok_s"] = float(np.median(samples))
        if tc.num_draft_tokens == 0:
            attrs[BASELINE_TAG] = True
        s.add_trial(optuna.trial.create_trial(value=float(np.median(samples)), user_attrs=attrs))
        written[identity] = objective
    return written


@pytest.fixture
def record(tmp_path):
    cfg = experiment()
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    truth = synthetic_record(cfg, url, "synthetic-a", keep=0.5, seed=1)
    return cfg, url, truth


def test_the_landscape_pools_the_record_by_configuration(record, tmp_path):
    cfg, url, truth = record
    # a second study of the same model and workload measures part of the space again: pooled, one landscape
    again = synthetic_record(cfg, url, "synthetic-b", keep=0.2, seed=2)
    land = load_landscape(cfg, open_record(cfg, url), ["synthetic-a", "synthetic-b"])
    assert set(land.configs) == set(truth) | set(again)
    both = set(truth) & set(again)
    assert both, "the two studies share configurations"
    for identity in both:
        c = land.configs[identity]
        assert len(c.trials) == 2 and c.throughput == pytest.approx(float(np.median(c.samples)))
    plain = next(c for c in land.configs.values() if c.label == "plain gloo tp1")
    assert len(plain.samples) == 6  # each study's baseline measured three times: six samples of one configuration
    assert land.noise_rel is not None and 0.005 < land.noise_rel < 0.1
    assert land.space_size == len(distinct_configs(cfg))
    assert land.best in land.near_best


def test_configurations_outside_the_space_are_left_out(record):
    cfg, url, truth = record
    narrow = experiment({**SPACE, "drafter.kind": {"choices": ["ngram", "eagle3"]}})
    land = load_landscape(narrow, open_record(narrow, url), ["synthetic-a"])
    assert land.outside > 0 and all("layer_skip" not in c.label for c in land.configs.values())
    assert len(land.configs) + land.outside == len(truth)


def test_the_replay_follows_the_study_rules(record):
    cfg, url, truth = record
    land = load_landscape(cfg, open_record(cfg, url), ["synthetic-a"])
    for strategy in ("random", "tpe", "model"):
        r = replay(cfg, land, strategy, seed=3, budget=8)
        assert len(r.offered) == 8 and len(set(r.offered)) == 8  # the budget counts offered trials, never a repeat
        assert all(i in land.configs for i in r.offered)  # only recorded configurations are offered
        assert land.configs[r.offered[0]].label.startswith("plain")  # the baseline first
        assert r.fraction_of_best == pytest.approx(max(land.configs[i].throughput for i in r.offered) / land.best_throughput)
        assert r.asked >= 8


def test_a_proposal_outside_the_record_is_asked_again_and_not_counted(record):
    """Half the space is unrecorded: random proposals land outside the record and are PRUNED, never offered."""
    cfg, url, truth = record
    land = load_landscape(cfg, open_record(cfg, url), ["synthetic-a"])
    r = replay(cfg, land, "random", seed=0, budget=12)
    assert len(r.offered) == 12 and r.asked > 12  # more proposals than offered trials: the others were asked again
    # the same replay's Optuna study: pruned "not in the record", never COMPLETE
    from orchestrator.search.benchmark import strategy_config  # noqa: F401 - the replay builds its sampler from it

    study_trials = _replayed_trials(cfg, land, "random", 0, 12)
    pruned = [t for t in study_trials if t.state == optuna.trial.TrialState.PRUNED]
    assert any(t.user_attrs.get("spectune.prune_reason") == NOT_RECORDED for t in pruned)
    assert len([t for t in study_trials if t.state == optuna.trial.TrialState.COMPLETE]) == 12


def _replayed_trials(cfg, land, strategy, seed, budget):
    """Run `replay` while keeping its in-memory study (optuna.create_study patched to hand it out)."""
    made = []
    real = optuna.create_study

    def keep(*a, **kw):
        made.append(real(*a, **kw))
        return made[-1]

    optuna.create_study = keep
    try:
        replay(cfg, land, strategy, seed, budget)
    finally:
        optuna.create_study = real
    return made[-1].trials


def test_trials_to_best_is_the_budget_plus_one_when_never_reached(record):
    cfg, url, truth = record
    land = load_landscape(cfg, open_record(cfg, url), ["synthetic-a"])
    r = replay(cfg, land, "random", seed=5, budget=1)  # the baseline alone is far from the best
    assert r.offered == (r.offered[0],) and r.trials_to_best == 2 and r.fraction_of_best < 0.9


def test_model_beats_random_on_a_landscape_whose_best_is_known(record):
    """The performance model's sampler reaches more of the best after 6 trials than random does."""
    cfg, url, truth = record
    land = load_landscape(cfg, open_record(cfg, url), ["synthetic-a"])
    result = bench(cfg, land, ["random", "model"], budget=6, seeds=8)
    model, rand = result.strategies["model"], result.strategies["random"]
    assert model.fraction_of_best > rand.fraction_of_best
    assert model.fraction_of_best >= 0.95
    assert model.trials_to_best <= rand.trials_to_best


def test_bench_search_json(record, capsys):
    cfg, url, truth = record
    path = _yaml(cfg, url)
    argv = ["bench-search", path, "--storage", url, "--studies", "synthetic-a", "--budget", "5", "--seeds", "3"]
    assert main([*argv, "--sampler", "random", "model", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"default", "strategies"} and out["default"] == "model"
    assert set(out["strategies"]) == {"random", "model"}
    for r in out["strategies"].values():
        assert set(r) == {"fraction_of_best", "trials_to_best"}
        assert 0 < r["fraction_of_best"] <= 1 and 1 <= r["trials_to_best"] <= 6


def test_bench_search_table_and_errors(record, capsys, tmp_path):
    cfg, url, truth = record
    path = _yaml(cfg, url)
    argv = ["bench-search", path, "--storage", url, "--studies", "synthetic-a", "--budget", "4", "--seeds", "2"]
    assert main([*argv, "--sampler", "random"]) == 0
    text = capsys.readouterr().out
    assert "landscape:" in text and "leave one configuration out" in text and text.splitlines()[-1].startswith("random")
    for argv, field in (
        (["--studies", "nope"], "--studies: no study 'nope'"),
        (["--studies", "synthetic-a", "--sampler", "annealing"], "--sampler:"),
        (["--studies", "synthetic-a", "--budget", "0"], "--budget:"),
    ):
        args = {"--budget": "4", **dict(zip(argv[::2], argv[1::2]))}
        flat = [x for kv in args.items() for x in kv]
        assert main(["bench-search", path, "--storage", url, *flat]) == 2
        assert field in capsys.readouterr().err
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["bench-search", path, "--storage", missing, "--studies", "a", "--budget", "3"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()  # a record is read, never created


def test_a_record_of_another_model_is_refused(record):
    cfg, url, truth = record
    other = validated({**cfg.model_dump(mode="json", exclude_none=True), "model": {"path": "random:llama-3.2-1b"}})
    with pytest.raises(UserError, match="model.path"):
        load_landscape(other, open_record(other, url), ["synthetic-a"])


def _yaml(cfg, url) -> str:
    import tempfile

    import yaml

    raw = cfg.model_dump(mode="json", exclude_none=True)
    raw["study"]["storage"] = url
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    yaml.safe_dump(raw, f)
    f.close()
    return f.name


def test_truth_sanity():
    """The synthetic machine has one clear best (eagle3 rank0 at a deep k) well above plain decoding."""
    cfg = experiment()
    configs = measured_configs(cfg)
    best = max(configs, key=lambda i: configs[i][1])
    tc = suggest(optuna.trial.FixedTrial(configs[best][0]), cfg)
    assert tc.drafter.kind == "eagle3" and tc.drafter.placement == "rank0" and tc.engine.gemv == "auto"
    plain = next(v for p, v in configs.values() if p.get("spec.num_draft_tokens") == 0 and p.get("engine.gemv") == "auto")
    assert configs[best][1] > 2 * plain
    assert config_identity(tc) == best and not math.isnan(configs[best][1])


def test_gaps_of_the_record_never_replace_the_samplers_own_choice(record, monkeypatch):
    """A sampler whose next 20 proposals are all configurations the record lacks, then a recorded one: those
    are asked again and not counted, and (no repeat among them) the duplicate rule's random pick never
    replaces its choice: the recorded configuration it then proposes is the one offered."""
    import orchestrator.search.samplers as samplers
    from orchestrator.search.proposals import Proposals

    cfg, url, truth = record
    land = load_landscape(cfg, open_record(cfg, url), ["synthetic-a"])
    space = distinct_configs(cfg)
    gaps = [p for i, p in space.items() if i not in land.configs][:20]
    wanted = next(c for c in land.configs.values() if not c.label.startswith("plain"))
    plan = [*gaps, wanted.params]

    class Scripted(optuna.samplers.BaseSampler):
        def __init__(self):
            self.picks: dict[int, dict] = {}

        def infer_relative_search_space(self, study, trial):
            return {}

        def sample_relative(self, study, trial, search_space):
            return {}

        def sample_independent(self, study, trial, name, distribution):
            if trial.number not in self.picks:
                self.picks[trial.number] = plan[min(len(self.picks), len(plan) - 1)]
            value = self.picks[trial.number].get(name)
            return value if value is not None else distribution.choices[0]

    monkeypatch.setattr(samplers, "make_sampler", lambda c, offset=0: Scripted())
    monkeypatch.setattr(Proposals, "pick_untried", lambda self: pytest.fail("a gap of the record replaced the sampler's choice"))
    r = replay(cfg, land, "random", seed=0, budget=2)
    assert r.offered[1] == wanted.identity and r.asked >= 21  # the baseline, 19 or 20 gaps, the recorded pick
