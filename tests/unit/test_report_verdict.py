"""The report's verdict (orchestrator/explain/report/verdict.py) on hand-built rows: a winner measured
beside another trial on its host is flagged; one measured alone is not; a win is clear only from two
measurements of the winner with nothing measured only beside other trials."""

from __future__ import annotations

import pytest

from orchestrator.explain.report.rows import Row
from orchestrator.explain.report.verdict import verdict


def _row(number: int, value: float, k: int, co_running: list[int]) -> Row:
    return Row(
        number=number, label=f"ngram k={k} gloo tp1" if k else "plain gloo tp1", params={}, value=value, median=None, mad=0.0,
        repeats=1, k=k, kind="ngram" if k else "plain", backend="gloo", env="gloo", tp=1, accept_len=1.5 if k else 1.0,
        decode_tok_s=None, step_ms=None, verify_ms=None, draft_ms=0.0, comm_ms=0.0, comm_fraction=None, co_running=co_running,
    )  # fmt: skip


def test_a_winner_measured_beside_other_trials_is_flagged():
    words = " ".join(verdict([_row(3, 12.0, 4, [2, 5]), _row(0, 10.0, 0, [])]))
    assert "trials 2, 5 ran on the same host" in words and "interference" in words
    alone = " ".join(verdict([_row(3, 12.0, 4, []), _row(0, 10.0, 0, [1])]))
    assert "same host" not in alone


def test_the_winner_is_clear_only_from_two_trials_and_nothing_measured_only_beside_others():
    """Outside the noise band is not enough: the winner measured in one trial (however many repeats: they
    share its gang), or a runner-up timed only beside other trials on its host (its timing a lower
    bound), leaves the win unclear; two trials of the winner and every configuration measured alone
    make it clear."""

    def rows(winner_trials: list[int], runner_up_beside: list[int]):
        best, second = _row(3, 12.0, 4, []), _row(0, 10.0, 0, runner_up_beside)
        best.config, best.pooled_trials, best.pooled_n = 0, winner_trials, 3 * len(winner_trials)
        second.config, second.pooled_trials, second.pooled_n, second.within_noise = 1, [0], 3, False
        return " ".join(verdict([best, second]))

    assert "outside the noise band, the winner is clear." in rows([3, 8], [])
    once = rows([3], [])  # one trial of three repeats
    assert "the winner was measured in one trial: not a clear win" in once and "the winner is clear" not in once
    shaken = rows([3, 8], [7])  # trial 0 ran beside trial 7 (of another configuration), never alone
    assert "trial 0 ran only beside other trials on their host" in shaken and "not a clear win until measured alone" in shaken
    assert "the winner is clear" not in shaken


def _trial(k, kind, samples, setup_s, accept_len=1.0, step_ms=200.0, comm_fraction=0.3, node="n1", value=None, gang=None):
    import optuna
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from orchestrator.record import NODE_ATTR, PARAMS_ATTR, SAMPLES_ATTR

    params = {"spec.num_draft_tokens": k, "drafter.kind": kind if k else "ngram"}
    attrs = {
        PARAMS_ATTR: {"parallel.tp": 2, "comm.backend": "gloo", **params},
        SAMPLES_ATTR: samples,
        "setup_s": setup_s,
        NODE_ATTR: node,
        **({"spectune.gang": gang} if gang else {}),
        "accept_len_mean": accept_len,
        "step_ms_p50": step_ms,
        "verify_ms_p50": step_ms * 0.9,
        "draft_ms_p50": step_ms * 0.05 if k else 0.0,
        "comm_fraction": comm_fraction,
        "comm_ms_per_step": step_ms * comm_fraction,
        "repeats": len(samples),
    }
    return optuna.trial.create_trial(
        value=sorted(samples)[len(samples) // 2] if value is None else value,  # the objective: median - MAD
        params=params,
        distributions={"spec.num_draft_tokens": IntDistribution(0, 8), "drafter.kind": CategoricalDistribution(["ngram", "layer_skip"])},
        user_attrs=attrs,
    )


def _study(*trials):
    import optuna

    s = optuna.create_study(direction="maximize")
    for t in trials:
        s.add_trial(t)
    return s


def test_gangs_are_read_from_the_record_and_a_noise_band_of_one_gang_is_said():
    """setup_s > 0: the trial launched its gang; 0: it ran on the last one launched on its node. The noise band
    of repeats on one gang each is flagged; a configuration measured on two gangs brings their spread in."""
    from orchestrator.search.ranking import gangs_of, rank

    one = _study(_trial(0, "none", [10.0, 10.2, 9.9], 8.0), _trial(2, "ngram", [12.0], 0.0), _trial(4, "ngram", [11.0], 0.0))
    assert gangs_of(one.trials) == {0: 0, 1: 0, 2: 0}
    r = rank(one.trials)
    assert r.noise_one_gang is True and "on one gang only" in r.verdict() and r.as_dict()["noise_one_gang"] is True
    # the plain configuration again, on a gang launched for it (a race trial): two gangs
    two = _study(*one.trials, _trial(0, "none", [9.5, 9.4, 9.6], 7.5))
    assert gangs_of(two.trials)[3] == 3 and rank(two.trials).noise_one_gang is False
    assert "one gang" not in rank(two.trials).verdict()
    # twice on the gang trial 0 launched (setup 0): still one gang; no setup_s recorded: unknown
    again = _study(*one.trials, _trial(0, "none", [9.5, 9.4, 9.6], 0.0))
    assert rank(again.trials).noise_one_gang is True
    old = _study(*[_trial(0, "none", [10.0, 10.2], None), _trial(0, "none", [9.0, 9.2], None)])
    assert gangs_of(old.trials) == {0: None, 1: None} and rank(old.trials).noise_one_gang is None


def test_gangs_recorded_by_id_stay_apart_where_two_slots_share_a_node():
    """isolation none: two slots on one node launch gangs A and B and their trials interleave. The ids say
    which gang each trial ran on; the older rule (the last gang launched in that place) would put trial 2
    on trial 1's gang B."""
    from orchestrator.search.ranking import gangs_of

    trials = _study(
        _trial(0, "none", [10.0, 10.1], 8.0, gang="A"),
        _trial(2, "ngram", [12.0], 8.0, gang="B"),
        _trial(0, "none", [9.8, 9.9], 0.0, gang="A"),
        _trial(4, "ngram", [11.0], 0.0, gang="B"),
    ).trials
    assert gangs_of(trials) == {0: 0, 1: 1, 2: 0, 3: 1}
    without_ids = _study(*[optuna_trial_without_gang(t) for t in trials]).trials
    assert gangs_of(without_ids)[2] == 1  # what the record without ids can tell: the last launch in the place


def optuna_trial_without_gang(t):
    import optuna

    attrs = {k: v for k, v in t.user_attrs.items() if k != "spectune.gang"}
    return optuna.trial.create_trial(value=t.value, params=t.params, distributions=t.distributions, user_attrs=attrs)


def test_the_report_names_the_rankings_winner_and_explains_it_from_every_trial_of_it(tmp_path):
    """Trials 1 and 3 ran one configuration (pooled median 13.0, objective 12.0 each: their repeats spread), trial 2
    another whose objective (12.5) beats each of theirs: the ranking, the report and export all name the pooled
    winner and trial 1; its
    accepted length, breakeven and allreduce share are the medians over trials 1 and 3; the noise band came
    from one gang, and the verdict says so."""
    from orchestrator.config.schema import ExperimentConfig
    from orchestrator.explain.report.rows import rows_of
    from orchestrator.export.schedule import build_schedule
    from orchestrator.search.ranking import rank

    cfg = ExperimentConfig.model_validate(
        {"name": "x", "parallel": {"tp": 2}, "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4]}}}}
    )
    study = _study(
        _trial(0, "none", [10.0, 10.1, 9.9], 8.0, step_ms=200.0, comm_fraction=0.4),
        _trial(2, "ngram", [12.0, 13.0, 14.0], 0.0, accept_len=1.5, step_ms=230.0, comm_fraction=0.30, value=12.0),
        _trial(4, "ngram", [12.5], 0.0, accept_len=1.6, step_ms=240.0, comm_fraction=0.2),
        _trial(2, "ngram", [12.0, 13.0, 14.0], 0.0, accept_len=1.7, step_ms=250.0, comm_fraction=0.36, value=12.0),
    )
    ranking = rank(study.trials)
    rows = rows_of(study.trials, cfg)
    best = rows[0]
    assert ranking.configs[0].trials == [1, 3] and best.number == 1 and [r.number for r in rows[:2]] == [1, 3]
    assert build_schedule(study)["schedule"][0]["trial"] == 1 and build_schedule(study)["schedule"][0]["trials"] == [1, 3]
    assert best.why_accept_len == pytest.approx(1.6) and best.why_comm_fraction == pytest.approx(0.33)
    assert best.why_breakeven == pytest.approx(240.0 / 200.0)
    text = verdict(rows, ranking.noise_one_gang)
    assert text[0].startswith("ngram k=2 gloo tp2 leads (trials 1, 3)") or text[0].startswith("ngram k=2 gloo tp2 wins (trials 1, 3)")
    why = " ".join(text)
    assert "It accepts 1.60 tokens a step where this setup breaks even at 1.20" in why and "medians over its 2 trials" in why
    assert "Allreduce is 33% of its step (medians over its 2 trials) (plain decoding: 40%)" in why
    assert "measured on one gang only" in why


def test_the_summary_gives_the_pooled_allreduce_share_of_the_winner_and_the_baseline(tmp_path):
    """The report's summary: comm_fraction_best and comm_fraction_baseline are the medians over each
    configuration's trials (what the verdict says), best_trials every trial of the winner."""
    import optuna

    from orchestrator.config.schema import ExperimentConfig
    from orchestrator.explain.report.core import build_report

    cfg = ExperimentConfig.model_validate(
        {"name": "x", "model": {"path": "random:llama-3-8b"}, "parallel": {"tp": 2},
         "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4]}}}}
    )  # fmt: skip
    study = _study(
        _trial(0, "none", [10.0, 10.1, 9.9], 8.0, step_ms=200.0, comm_fraction=0.40),
        _trial(2, "ngram", [12.0, 13.0, 14.0], 0.0, accept_len=1.5, step_ms=230.0, comm_fraction=0.30, value=12.0),
        _trial(0, "none", [10.0, 10.1, 9.9], 0.0, step_ms=200.0, comm_fraction=0.20),
        _trial(2, "ngram", [12.0, 13.0, 14.0], 0.0, accept_len=1.7, step_ms=250.0, comm_fraction=0.36, value=12.0),
    )
    assert isinstance(study, optuna.Study)
    _, _, summary = build_report(cfg, study, tmp_path / "report")
    assert summary["best_trial"] == 1 and summary["best_trials"] == [1, 3]
    assert summary["comm_fraction_best"] == pytest.approx(0.33) and summary["comm_fraction_baseline"] == pytest.approx(0.30)


def test_parameter_importances_come_from_ten_complete_trials_on(tmp_path):
    """fANOVA's forest on a handful of trials fits noise: under IMPORTANCE_MIN_TRIALS the report gives none
    and says from how many it would; from there on it gives one per searched parameter."""
    from orchestrator.config.schema import ExperimentConfig
    from orchestrator.explain.report.core import build_report
    from orchestrator.record import IMPORTANCE_MIN_TRIALS

    cfg = ExperimentConfig.model_validate(
        {"name": "x", "model": {"path": "random:llama-3-8b"}, "parallel": {"tp": 2},
         "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4]}}}}
    )  # fmt: skip
    trials = [_trial(0, "none", [10.0, 10.1, 9.9], 8.0)]
    trials += [_trial(2 * (i % 2 + 1), ("ngram", "layer_skip")[i % 3 == 0], [11.0 + i % 3], 0.0, accept_len=1.5) for i in range(8)]
    text, _, summary = build_report(cfg, _study(*trials), tmp_path / "few")
    assert len(trials) == IMPORTANCE_MIN_TRIALS - 1 and summary["importances"] == {}
    want = (
        f"parameter importances: not computed, they need at least {IMPORTANCE_MIN_TRIALS} complete trials and this study has {len(trials)}"
    )
    assert want in text
    trials.append(_trial(4, "ngram", [12.5], 0.0, accept_len=1.6))
    text, _, summary = build_report(cfg, _study(*trials), tmp_path / "enough")
    assert set(summary["importances"]) == {"spec.num_draft_tokens", "drafter.kind"}
    assert "parameter importances: " in text and "complete trials on" not in text


def test_the_verdicts_speedup_is_the_rankings():
    """The report's "Nx plain decoding" is the ranking's pooled speedup (what `run` and `export` print),
    not this row's value over the plain row's (a single trial's figure where configurations repeat)."""
    best, plain = _row(3, 12.5, 4, []), _row(0, 10.0, 0, [])
    assert "1.25x plain decoding" in verdict([best, plain])[0]  # no ranking figure: the rows' ratio
    best.pooled_speedup = 1.18
    assert "1.18x plain decoding" in verdict([best, plain])[0]


@pytest.mark.parametrize(
    "shape",
    ["space_exhausted", "all_pruned_but_baseline", "tie", "one_repeat"],
)
def test_reports_of_several_study_shapes_agree_with_the_ranking_and_finish_every_sentence(tmp_path, shape):
    """The report's figures are the ranking's (what `run` prints and `export` takes): its speedup and
    noise band equal the summary's, the text quotes that speedup, and no sentence is left unfinished."""
    import re

    import optuna

    from orchestrator.config.schema import ExperimentConfig
    from orchestrator.explain.report.core import build_report
    from orchestrator.search.ranking import rank

    cfg = ExperimentConfig.model_validate(
        {"name": "x", "model": {"path": "random:llama-3-8b"}, "parallel": {"tp": 2},
         "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2, 4]}}}}
    )  # fmt: skip
    plain = _trial(0, "none", [10.0, 10.1, 9.9], 8.0)
    trials = {
        "space_exhausted": [
            plain,
            _trial(2, "ngram", [11.0, 11.2], 0.0, accept_len=1.4),
            _trial(4, "ngram", [12.0, 12.3], 0.0, accept_len=1.6),
        ],
        "all_pruned_but_baseline": [plain],
        "tie": [plain, _trial(2, "ngram", [11.0, 11.05], 0.0, accept_len=1.4), _trial(4, "ngram", [11.02, 11.04], 0.0, accept_len=1.5)],
        "one_repeat": [_trial(0, "none", [10.0], 8.0), _trial(4, "ngram", [12.0], 0.0, accept_len=1.6)],
    }[shape]
    study = _study(*trials)
    if shape == "all_pruned_but_baseline":
        for k in (2, 4):
            study.add_trial(
                optuna.trial.create_trial(
                    state=optuna.trial.TrialState.PRUNED,
                    params={"spec.num_draft_tokens": k, "drafter.kind": "ngram"},
                    distributions=trials[0].distributions,
                    user_attrs={
                        "spectune.params": {"parallel.tp": 2, "comm.backend": "gloo", "spec.num_draft_tokens": k, "drafter.kind": "ngram"}
                    },
                )
            )
    text, html, summary = build_report(cfg, study, tmp_path / shape)
    ranking = rank([t for t in study.trials if t.state.name == "COMPLETE"])
    winner = ranking.configs[0]
    assert summary["noise_rel"] == ranking.noise_rel
    want = None if winner.speedup_vs_baseline is None else round(winner.speedup_vs_baseline, 3)
    assert summary["best_speedup_vs_plain"] == want
    if want is not None and want != 1.0:
        assert f"{winner.speedup_vs_baseline:.2f}x plain decoding" in text
    page = re.sub(r"<(style|script)\b.*?</\1>", " ", html.read_text(), flags=re.S)  # the words, not the page's CSS or code
    nodes = [" ".join(node.split()) for node in re.split(r"<[^>]+>", page)]  # each text node as one line
    for lines in (text.splitlines(), nodes):
        dangling = [line for line in lines if re.search(r"\b(from|of|on|the|and|with)$", line.strip())]
        assert not dangling and not any("complete trials on" in line for line in lines), dangling
    import json

    written = json.loads((tmp_path / shape / "summary.json").read_text())  # what best_config.yaml and export sit beside
    assert (written["best_speedup_vs_plain"], written["noise_rel"]) == (summary["best_speedup_vs_plain"], summary["noise_rel"])
