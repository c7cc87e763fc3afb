"""The report's performance-model section on a synthetic record whose truth is known
(tests/unit/test_search_bench.py): the configuration model's error leaving each configuration out,
and the best configurations no trial ran, listed as predicted (never as measured)."""

from __future__ import annotations

import json

import optuna
import pytest
from test_search_bench import experiment, measured_configs, synthetic_record

from orchestrator.config.space import config_identity, trial_config
from orchestrator.explain.report.core import build_report


def test_the_report_gives_the_config_model_error_and_names_predicted_configurations(tmp_path):
    cfg = experiment()
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    synthetic_record(cfg, f"sqlite:///{tmp_path / 'record.db'}", "synthetic-a", keep=0.3, seed=4)
    study = _as_run(cfg, optuna.load_study(study_name="synthetic-a", storage=f"sqlite:///{tmp_path / 'record.db'}"), url)
    text, page, summary = build_report(cfg, study, tmp_path / "report")
    measured = {config_identity(trial_config(t, cfg)) for t in study.trials}
    assert 0 <= summary["model_config_loo_median_rel_error"] <= 0.10
    rows = summary["model_config_loo"]
    assert len(rows) == len(measured) and summary["model_config_loo_misses"] < len(rows) / 4
    missed = [r for r in rows if r["predicted_decode_tok_s"] is None]  # a drafter variant measured at one k only
    assert len(missed) == summary["model_config_loo_misses"] and all("acceptance" in r["how"] and r["rel_error"] is None for r in missed)
    assert all(row["trials"] and row["label"] for row in summary["model_config_loo"])
    untried = summary["predicted_untried"]
    assert 0 < len(untried) <= 5 and summary["predicted_untried_count"] >= len(untried)
    truth = measured_configs(cfg)
    assert all(config_identity(trial_config(optuna.trial.FixedTrial(r["params"]), cfg)) not in measured for r in untried)
    assert [r["predicted_tok_s"] for r in untried] == sorted((r["predicted_tok_s"] for r in untried), reverse=True)
    for r in untried:  # predicted from measured parts: close to what the synthetic machine would measure
        identity = config_identity(trial_config(optuna.trial.FixedTrial(r["params"]), cfg))
        assert r["predicted_tok_s"] == pytest.approx(truth[identity][1], rel=0.1)
    assert "each configuration left out" in text and "PREDICTED, not measured" in text
    assert all(f"{r['label']} ~{r['predicted_tok_s']:.2f} throughput_tok_s (predicted)" in text for r in untried)
    html = page.read_text()
    assert 'id="predicted-untried"' in html and "Predicted, not measured" in html and 'id="model-config-loo"' in html
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["predicted_untried"][0]["label"] == untried[0]["label"]


def _as_run(cfg, record, url):
    """The record's trials with the Optuna params `spectune run` would have suggested (the searched ones)."""
    from optuna.distributions import CategoricalDistribution

    from orchestrator.record import PARAMS_ATTR

    space = {name: CategoricalDistribution(p.choices) for name, p in cfg.search.space.items()}
    study = optuna.create_study(study_name="synthetic-a", storage=url, direction="maximize")
    for t in record.trials:
        resolved = t.user_attrs[PARAMS_ATTR]
        params = {n: resolved[n] for n in space if n in resolved and resolved[n] in space[n].choices}
        study.add_trial(
            optuna.trial.create_trial(
                value=t.value, params=params, distributions={n: space[n] for n in params}, user_attrs=dict(t.user_attrs)
            )
        )
    return study


def test_a_configuration_only_pruned_trials_ran_is_partly_measured_and_the_figures_are_the_studys(tmp_path):
    """A configuration a pruned trial ran for a few prompts is "partly measured" (its figure so far, the
    trial that ran it), never among the configurations no trial ran; the report's speedup and noise band of
    the winner are the ones `spectune run`'s ranking and `spectune export` give; no unfinished sentence."""
    from optuna.distributions import CategoricalDistribution

    from orchestrator.export.schedule import build_schedule
    from orchestrator.search.ranking import rank

    cfg = experiment()
    synthetic_record(cfg, f"sqlite:///{tmp_path / 'record.db'}", "synthetic-a", keep=0.3, seed=4)
    record = optuna.load_study(study_name="synthetic-a", storage=f"sqlite:///{tmp_path / 'record.db'}")
    study = _as_run(cfg, record, f"sqlite:///{tmp_path / 'optuna.db'}")
    _, _, before = build_report(cfg, study, tmp_path / "before")
    assert before["partly_measured"] == []
    target = before["predicted_untried"][0]
    space = {name: CategoricalDistribution(p.choices) for name, p in cfg.search.space.items()}
    params = {n: v for n, v in target["params"].items() if n in space}
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED,
            params=params,
            distributions={n: space[n] for n in params},
            intermediate_values={0: 3.0, 1: 2.5},
        )
    )
    pruned = study.trials[-1].number
    text, page, summary = build_report(cfg, study, tmp_path / "after")
    assert [r["label"] for r in summary["partly_measured"]] == [target["label"]]
    row = summary["partly_measured"][0]
    assert row["pruned_trials"] == [pruned] and row["measured_so_far_tok_s"] == 2.5 and row["prompts_measured"] == 2
    assert target["label"] not in [r["label"] for r in summary["predicted_untried"]]
    assert summary["predicted_untried_count"] == before["predicted_untried_count"] - 1
    html = page.read_text()
    assert 'id="partly-measured"' in html and "Partly measured" in html
    assert "complete trials on" not in html  # "parameter importances: from 10 complete trials on", unfinished

    ranking = rank(study.trials)
    export = build_schedule(study)["schedule"][0]
    assert summary["best_speedup_vs_plain"] == export["speedup_vs_plain"] == round(ranking.configs[0].speedup_vs_baseline, 3)
    assert summary["best_noise_band_tok_s"] == export["noise_band_tok_s"] and summary["noise_rel"] == ranking.noise_rel
