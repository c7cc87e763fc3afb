"""Emulated TP (workers/comm/emulated.py) through a real gang of one process on CPU: rank 0's shard of
TP 2 of the tiny model, every allreduce a busy wait of the table's latency. Counted, not timed
against a limit: allreduce calls per step = 2 x layers, and the comm time the rank records is the
table's latency times the calls (a busy wait never ends early; a shared core may stretch it)."""

from __future__ import annotations

import json

import pytest

from workers.comm import load_table
from workers.errors import GangError
from workers.model.locate import load_args
from workers.runtime.local_gang import LocalGang
from workers.spec import DrafterSpec, GangSpec, Workload

LATENCY_US = 400.0


@pytest.fixture
def flat_table(tmp_path):
    """A bench-allreduce-shaped table: gloo at TP 2, LATENCY_US at every size from 64 B to 1 MiB."""
    rows = [
        {"backend": "gloo", "tp": 2, "mode": "eager", "env": "default", "size_bytes": 1 << p, "time_us": LATENCY_US} for p in range(6, 21)
    ]
    path = tmp_path / "flat.json"
    path.write_text(json.dumps(rows))
    return load_table(str(path))


def _prompts() -> tuple[tuple[int, ...], ...]:
    return ((5, 9, 11, 5, 9, 11, 7), (3, 4, 5, 6, 3, 4, 5, 6))


def test_one_process_runs_a_tp2_shard_and_waits_the_table(tiny_ckpt, flat_table):
    layers = load_args(str(tiny_ckpt)).n_layers
    spec = GangSpec(
        model_path=str(tiny_ckpt), tp=1, emulate_tp=2, allreduce_table=flat_table, drafter=DrafterSpec(kind="ngram"), max_seq=256
    )
    assert spec.world_size == 1 and spec.shard_world == 2
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        for k, tau in ((0, None), (3, 2.5)):
            drafter = "plain" if k == 0 else "simulated"
            r = gang.run(
                Workload(prompts=_prompts(), max_new_tokens=12, num_draft_tokens=k, simulate_accept_len=tau, comm_ablation_iters=3)
            )
            m = r.metrics
            assert m["allreduce_per_step"] == 2 * layers, drafter  # one after attention, one after the MLP, per layer
            want_ms = 2 * layers * LATENCY_US / 1e3
            # a busy wait never ends early; how much a shared core stretches it is the machine's load, not the code's:
            # no upper bound here (scripts/emulated_vs_real.py compares the times on a quiet machine)
            # (comm_ms_counted: the waits themselves; comm_ms_per_step is the ablation's with-minus-without, noise on a loaded core)
            assert m["comm_ms_counted"] >= 0.99 * want_ms, drafter
            assert 0 < m["comm_fraction"] <= 1
            assert len(r.prompts[0].tokens) == 12
            if tau is not None:
                assert m["accept_len_mean"] == pytest.approx(tau, abs=0.3)


def test_the_shard_is_rank_zeros_part(tiny_ckpt, flat_table):
    """The emulated rank holds TP 2's rank-0 slices (half the MLP, half the heads), not the whole model."""
    from workers.model.checkpoint import load_model
    from workers.model.tp import TPPart

    whole = load_model(str(tiny_ckpt))
    part = load_model(str(tiny_ckpt), tp=TPPart(0, 2))
    w, p = whole.layers[0].mlp.gate_proj.weight, part.layers[0].mlp.gate_proj.weight
    assert p.shape[0] * 2 == w.shape[0] and (p == w[: p.shape[0]]).all()


def test_a_message_outside_the_table_fails_the_run_naming_its_size(tiny_ckpt, tmp_path):
    rows = [{"backend": "gloo", "tp": 2, "mode": "eager", "size_bytes": s, "time_us": 10.0} for s in (4096, 8192)]
    path = tmp_path / "narrow.json"
    path.write_text(json.dumps(rows))
    spec = GangSpec(model_path=str(tiny_ckpt), tp=1, emulate_tp=2, allreduce_table=load_table(str(path)), max_seq=256)
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        with pytest.raises(GangError, match=r"message of \d+ B is outside table 'narrow'"):
            gang.run(Workload(prompts=_prompts(), max_new_tokens=4))


def test_a_drafter_process_joins_an_emulated_rank(tiny_ckpt, tiny_draft_ckpt, flat_table):
    """A draft model in its own process: the gang is the emulated rank + the drafter (world 2)."""
    spec = GangSpec(
        model_path=str(tiny_ckpt),
        tp=1,
        emulate_tp=2,
        allreduce_table=flat_table,
        drafter=DrafterSpec(kind="draft_model", model_path=str(tiny_draft_ckpt)),
        max_seq=256,
    )
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        r = gang.run(Workload(prompts=_prompts(), max_new_tokens=8, num_draft_tokens=2, simulate_accept_len=2.0))
    assert r.metrics["accept_len_mean"] == pytest.approx(2.0, abs=0.3)


def test_a_per_position_profile_keeps_sum_of_p_drafts_at_each_k(tiny_ckpt, flat_table):
    """workload.simulate_accept_profile (P(accepted >= i), e.g. a real run's accept_rate_pos_i): a step of
    k drafts keeps sum_{i<=k} P_i of them on average, so, unlike an imposed accepted length, a deeper k
    accepts more where the profile says it would, and nothing past the profile's end."""
    profile = (0.9, 0.6, 0.3)
    spec = GangSpec(
        model_path=str(tiny_ckpt), tp=1, emulate_tp=2, allreduce_table=flat_table, drafter=DrafterSpec(kind="ngram"), max_seq=256
    )
    with LocalGang(spec, timeout_s=300) as gang:
        gang.setup()
        for k, want in ((1, 1.9), (2, 2.5), (4, 2.8)):  # 1 + P_1; 1 + P_1 + P_2; 1 + all three (P_4 = 0)
            r = gang.run(Workload(prompts=_prompts(), max_new_tokens=40, num_draft_tokens=k, simulate_accept_profile=profile))
            assert r.metrics["accept_len_mean"] == pytest.approx(want, abs=0.15), k
