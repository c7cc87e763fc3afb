"""The performance model's fit and breakeven math on synthetic data with known answers."""
from __future__ import annotations

import numpy as np
import pytest

from orchestrator.perfmodel import PerfModel, TrialPoint, fit, latency_us, loo_error, what_if_interconnect, what_if_tp

A = {"nccl": 10.0, "nccl NCCL_PROTO=LL": 8.0, "symm_mem": 7.0}
B, C = 0.5, {"ngram": 0.05, "layer_skip": 1.5}
RATES = {"ngram": [0.6, 0.4, 0.3, 0.2, 0.15, 0.1], "layer_skip": [0.8, 0.6, 0.45, 0.35, 0.25, 0.2]}


def truth_step(env, kind, k):
    return A[env] + B * (k + 1) + (C[kind] * k + 0.3 if k else 0.1)


def points(noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for env in A:
        for kind in ("none", "ngram", "layer_skip"):
            for k in ([0] if kind == "none" else [2, 4, 6]):
                tau = 1.0 + sum(RATES[kind][:k]) if k else 1.0
                jitter = 1 + noise * rng.standard_normal()
                verify = (A[env] + B * (k + 1)) * jitter
                draft = (C[kind] * k if k else 0.0) * jitter
                step = verify + draft + (0.3 if k else 0.1)  # link messages
                rates = tuple(RATES[kind][:k]) if k else ()
                out.append(TrialPoint(env, kind, k, step, tau, tau * 1000 / step, rates, verify_ms=verify, draft_ms=draft))
    return out


def test_fit_recovers_the_parameters():
    m = fit(points())
    for env, a in A.items():
        assert m.a[env] == pytest.approx(a, abs=1e-3)
    assert m.b == pytest.approx(B, abs=1e-3)
    for kind, c in C.items():
        assert m.c[kind] == pytest.approx(c, abs=1e-3)
    assert m.overhead == pytest.approx((0.1, 0.3))


def test_breakeven_and_throughput():
    m = fit(points())
    # breakeven(k) = step(k) / step(0): with 4 layer-skip drafts under symm_mem, (7 + 2.5 + 6) / 7.5
    assert m.breakeven("symm_mem", "layer_skip", 4) == pytest.approx((7 + 0.5 * 5 + 1.5 * 4 + 0.3) / 7.6, rel=1e-4)
    assert m.breakeven("nccl", "ngram", 0) == pytest.approx(1.0)
    tau = 1 + sum(RATES["ngram"][:4])
    assert m.throughput("nccl", "ngram", 4) == pytest.approx(tau * 1000 / truth_step("nccl", "ngram", 4), rel=1e-4)
    # speculation wins exactly when the accepted length beats breakeven
    for env in A:
        for kind in ("ngram", "layer_skip"):
            for k in (2, 4, 6):
                wins = m.throughput(env, kind, k) > m.throughput(env, "none", 0)
                assert wins == (m.accept_len(kind, k) > m.breakeven(env, kind, k))


def test_acceptance_extrapolates_geometrically():
    m = PerfModel(envs=["e"], kinds=["ngram"], a={"e": 1.0}, b=0.0, c={"ngram": 0.0}, rates={"ngram": [0.8, 0.4]})
    assert m.accept_len("ngram", 2) == pytest.approx(2.2)
    assert m.accept_len("ngram", 4) == pytest.approx(1 + 0.8 + 0.4 + 0.2 + 0.1)
    assert m.accept_len("ngram", 0) == 1.0


def test_leave_one_out_error_small_with_small_noise_large_with_wrong_model():
    err, preds = loo_error(points(noise=0.02, seed=1))
    assert len(preds) == len(points()) and err < 0.05
    # step times that have nothing to do with the configuration cannot be predicted: the error shows it
    shuffled = [TrialPoint(p.env, p.kind, p.k, s, p.accept_len, p.accept_len * 1000 / s, p.accept_rates, draft_ms=0.0)
                for p, s in zip(points(), np.random.default_rng(2).permutation([q.step_ms for q in points()]))]
    assert loo_error(shuffled)[0] > 0.1


def test_what_if_tp():
    # 10 ms step of which 4 ms allreduce, TP 2 -> TP 4 over a link with 6 ms of allreduce per step
    assert what_if_tp(10.0, 4.0, 2, 4, comm_ms_to=6.0) == pytest.approx(3.0 + 6.0)
    assert what_if_tp(10.0, 4.0, 2, 1) == pytest.approx(12.0 + 4.0)


def test_interconnect_what_if_from_a_bench_table():
    rows = [{"backend": "nccl", "env": "NCCL_P2P_DISABLE=1", "mode": "graph", "size_bytes": s, "time_us": t}
            for s, t in ((8192, 10.0), (32768, 40.0))]
    assert latency_us(rows, "nccl", "NCCL_P2P_DISABLE=1", 8192) == pytest.approx(10.0)
    assert latency_us(rows, "nccl", "NCCL_P2P_DISABLE=1", 16384) == pytest.approx(20.0)  # log-log: a power law
    assert latency_us(rows, "symm_mem", "default", 8192) is None
    # 4.5 ms step of which 0.5 ms allreduce; 64 allreduces at 20 us instead -> 4.0 + 1.28 ms
    assert what_if_interconnect(4.5, 0.5, 64, 20.0) == pytest.approx(5.28)
