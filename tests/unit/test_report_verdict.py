"""The report's verdict (orchestrator/explain/report/verdict.py) on hand-built rows: a winner measured
beside another trial on its node is flagged; one measured alone is not."""

from __future__ import annotations

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
    assert "trials 2, 5 ran on the same node" in words and "interference" in words
    alone = " ".join(verdict([_row(3, 12.0, 4, []), _row(0, 10.0, 0, [1])]))
    assert "same node" not in alone
