"""Greedy outputs against the baseline, the engine's part: it records the baseline's per-token logit
margins that tell a valid near tie from a wrong output (the verdicts: tests/unit/test_equivalence.py)."""

from __future__ import annotations

from workers.runtime.local_gang import LocalGang
from workers.spec import GangSpec, Workload


def test_engine_records_the_baselines_margins(tiny_ckpt):
    """k = 0 with record_margins: one margin per emitted token, each in [0, 2] (relative), and the
    tokens are the argmax ones (greedy run without recording gives the same)."""
    spec = GangSpec(model_path=str(tiny_ckpt), tp=2, max_seq=256)
    prompts = ((1, 2, 3, 4, 5), (9, 8, 7))
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        rec = gang.run(Workload(prompts=prompts, max_new_tokens=12, record_margins=True))
        plain = gang.run(Workload(prompts=prompts, max_new_tokens=12))
    for r, p in zip(rec.prompts, plain.prompts):
        assert r.tokens == p.tokens and p.margins == []
        assert len(r.margins) == len(r.tokens) == 12
        assert all(0.0 <= m <= 2.0 for m in r.margins)
    assert any(m > 0 for r in rec.prompts for m in r.margins)
