"""The report's MoE section on synthetic trials with known answers: a verify pass whose cost grows
with its width (the expert union) makes a deep k lose although its accepted length clears the
breakeven a flat pass would give; a dense verifier gets no section."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.explain.perfmodel import fit
from orchestrator.explain.report.moe import moe_html, moe_sentences, moe_summary
from orchestrator.record import MOE_EXPERTS_TAG
from orchestrator.search.points import TrialPoint

RATES = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)  # P(accepted >= i): accepted length 1 + sum, 2.7 at k = 2, 4.9 at k = 6
RISE = {1: 0.0, 3: 1.0, 5: 6.0, 7: 14.0}  # ms over width 1: a union of experts that grows past k = 2


def _points(width_profiled: bool = True) -> list[TrialPoint]:
    out = []
    for k in (0, 2, 4, 6):
        verify = 10.0 + RISE[k + 1]
        tau = 1.0 + sum(RATES[:k])
        step = verify + (0.3 if k else 0.1)
        out.append(
            TrialPoint(
                "tp1 gloo",
                "ngram" if k else "none",
                k,
                step,
                tau,
                tau * 1000 / step,
                RATES[:k],
                verify_ms=verify,
                width_ms=tuple((w, 10.0 + r) for w, r in RISE.items()) if width_profiled else (),
            )
        )
    return out


def _cfg(path="random:qwen3-30b-a3b:layers=4"):
    return SimpleNamespace(model=SimpleNamespace(path=path))


def test_a_deep_k_that_loses_to_the_expert_union_is_named():
    pts = _points()
    model = fit(pts)
    # the trials counted the distinct experts a pass read (moe_experts_w<W>): median over trials, per k + 1
    done = [
        SimpleNamespace(user_attrs={MOE_EXPERTS_TAG: "grouped", "moe_experts_w3": 13.0 + i, "moe_experts_w7": 30.0})
        for i in range(len(pts))
    ]
    s = moe_summary(done, model, _cfg(), pts)
    assert s["profiled"] and s["random_weights"]
    assert {r["k"]: r["experts_per_pass"] for r in s["rows"]} == {2: 15.0, 4: None, 6: 30.0}
    assert "Distinct routed experts a verify pass read, per layer (counted over the decoded tokens): 3 tokens 15.0, 7 tokens 30.0." in (
        "\n".join(moe_sentences(s))
    )
    assert "<th>experts per pass</th>" in moe_html(s) and "<td>30.0</td>" in moe_html(s)
    by_k = {r["k"]: r for r in s["rows"]}
    assert by_k[6]["verify_x_width1"] == pytest.approx((10 + 14) / 10, rel=1e-3)
    assert not s["union_losses"]  # these rates pay at every k: the union costs k = 6 nothing it cannot afford
    # lower acceptance: a deep k now falls between the flat breakeven and the real one
    rates = (0.5, 0.3, 0.15, 0.1, 0.05, 0.03)
    low = [
        TrialPoint(
            p.env, p.kind, p.k, p.step_ms, 1 + sum(rates[: p.k]), p.throughput, rates[: p.k], verify_ms=p.verify_ms, width_ms=p.width_ms
        )
        for p in pts
    ]
    s = moe_summary(done, fit(low), _cfg(), low)
    losses = {r["k"] for r in s["union_losses"]}
    assert 6 in losses and 2 not in losses  # k = 2: its pass costs little more than one token's, and it still pays
    lines = moe_sentences(s)
    assert any("k=6" in line and "the expert union is what makes k=6 lose" in line for line in lines)
    assert any("Random weights route tokens almost uniformly" in line for line in lines)
    assert "<table>" in moe_html(s) and "x2.40" in moe_html(s)


def test_a_dense_verifier_has_no_section_and_a_line_is_said_to_be_one():
    pts = _points(width_profiled=False)
    model = fit(pts)
    dense = [SimpleNamespace(user_attrs={}) for _ in pts]
    assert moe_summary(dense, model, _cfg("smollm2-135m"), pts) is None and moe_sentences(None) == [] and moe_html(None) == ""
    moe = [SimpleNamespace(user_attrs={MOE_EXPERTS_TAG: "eager"}) for _ in pts]
    s = moe_summary(moe, model, _cfg("/ckpt/qwen3-moe"), pts)
    assert not s["profiled"] and not s["random_weights"]
    assert "a line through the trials' widths" in moe_sentences(s)[0]


def test_the_width_sentence_reads_the_pass_with_least_drafter_work_in_it():
    # an in-rank head's feed is timed with the verify pass: its ratio is the drafter's, not the experts'
    row = {"env": "tp8 nccl", "k": 4, "accept_len": 3.3, "breakeven": 1.5, "flat_breakeven": 1.2, "experts_per_pass": None}
    s = {
        "random_weights": True,
        "profiled": False,
        "union_losses": [],
        "rows": [
            {**row, "kind": "mtp", "verify_x_width1": 1.25},
            {**row, "kind": "ngram", "verify_x_width1": 1.15},
            {**row, "kind": "ngram", "k": 2, "verify_x_width1": 1.1},
        ],
    }
    assert "a verify pass of 5 tokens costs x1.15 one token's" in moe_sentences(s)[0] and "under ngram" in moe_sentences(s)[0]
