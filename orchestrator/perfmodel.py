"""Performance model of a speculative decoding step, fitted from a study's trials.

    step_ms(env, kind, k) = a[env] + b * (k + 1)      verify pass (fitted on verify_ms)
                          + c[kind] * k               drafting   (fitted on draft_ms)
                          + o[k > 0]                  the rest: link messages, verification logic
    throughput(env, kind, k) = accept_len(kind, k) * 1000 / step_ms(env, kind, k)

`a[env]` is the fixed cost of one verify pass under an allreduce setup (backend + NCCL variables):
streaming the weights plus `rounds x latency` of the allreduces; `b` the extra cost of each token
the verifier scores; `c[kind]` what each drafted token costs the drafter (~0 for n-gram lookup).
The parts are fitted on their own measurements (verify and draft times are recorded separately),
which keeps them identifiable: a single fit on step time alone confounds a with b and b with c.
Accepted length comes from the measured per-position acceptance: the verifier keeps a prefix, so
P(accepted >= i) = accept_rate_pos_i and accept_len(k) = 1 + sum_{i<=k} P(accepted >= i); past the
longest measured k the last ratio P(>= i) / P(>= i-1) continues geometrically.

Speculation with k drafts beats plain decoding under the same env iff
    accept_len / step_ms(k) > 1 / step_ms(0)  <=>  accept_len > breakeven(k) = step_ms(k) / step_ms(0).

Pure numpy: fit on `TrialPoint`s, `loo_error` reports the median relative error of predicting each
trial from a fit on the others.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TrialPoint:
    env: str  # backend + NCCL variables, e.g. "nccl NCCL_PROTO=LL"
    kind: str  # drafter kind ("none" for k = 0)
    k: int
    step_ms: float
    accept_len: float
    throughput: float
    accept_rates: tuple[float, ...] = ()  # accept_rate_pos_1..k
    verify_ms: float | None = None  # default: step_ms - draft_ms
    draft_ms: float = 0.0


@dataclass
class PerfModel:
    envs: list[str]
    kinds: list[str]
    a: dict[str, float]
    b: float
    c: dict[str, float]
    rates: dict[str, list[float]] = field(default_factory=dict)  # per kind: P(accepted >= i), i = 1..
    overhead: tuple[float, float] = (0.0, 0.0)  # o[k == 0], o[k > 0]

    def step_ms(self, env: str, kind: str, k: int) -> float:
        a = self.a.get(env, float(np.mean(list(self.a.values()))))
        return a + self.b * (k + 1) + (self.c.get(kind, 0.0) * k + self.overhead[1] if k > 0 else self.overhead[0])

    def accept_len(self, kind: str, k: int) -> float:
        if k == 0:
            return 1.0
        p = self.rates.get(kind, [])
        if not p:
            return 1.0
        probs = list(p[:k])
        ratio = p[-1] / p[-2] if len(p) >= 2 and p[-2] > 0 else p[-1]
        while len(probs) < k:
            probs.append(probs[-1] * min(1.0, ratio))
        return 1.0 + float(sum(probs))

    def throughput(self, env: str, kind: str, k: int, accept_len: float | None = None) -> float:
        tau = self.accept_len(kind, k) if accept_len is None else accept_len
        return tau * 1000.0 / self.step_ms(env, kind, k)

    def breakeven(self, env: str, kind: str, k: int) -> float:
        """Accepted length below which k drafts lose to plain decoding under `env`."""
        return self.step_ms(env, kind, k) / self.step_ms(env, "none", 0)


def _verify_ms(p: TrialPoint) -> float:
    return p.verify_ms if p.verify_ms is not None else p.step_ms - p.draft_ms


def fit(points: list[TrialPoint]) -> PerfModel:
    """Verify pass: least squares over one-hot env intercepts and the per-verified-token slope.
    Drafting: per kind, least squares through the origin of draft_ms on k. Overheads: the mean rest."""
    if not points:
        raise ValueError("no trials to fit")
    envs = sorted({p.env for p in points})
    kinds = sorted({p.kind for p in points if p.k > 0})
    X = np.zeros((len(points), len(envs) + 1))
    y = np.array([_verify_ms(p) for p in points])
    for i, p in enumerate(points):
        X[i, envs.index(p.env)] = 1.0
        X[i, len(envs)] = p.k + 1
    # a small ridge keeps an unidentifiable slope (every trial at one k) near zero instead of wild
    lam = 1e-6 * max(1.0, float(np.trace(X.T @ X)) / X.shape[1])
    coef = np.linalg.solve(X.T @ X + lam * np.eye(X.shape[1]), X.T @ y)
    c = {}
    for kind in kinds:
        ks = np.array([p.k for p in points if p.kind == kind], dtype=float)
        ds = np.array([p.draft_ms for p in points if p.kind == kind])
        c[kind] = float(ks @ ds / (ks @ ks)) if ks.any() else 0.0
    rest = {False: [], True: []}
    for p in points:
        rest[p.k > 0].append(p.step_ms - _verify_ms(p) - p.draft_ms)
    overhead = (float(np.mean(rest[False])) if rest[False] else 0.0, float(np.mean(rest[True])) if rest[True] else 0.0)
    rates: dict[str, list[float]] = {}
    for kind in kinds:
        longest = max((p for p in points if p.kind == kind and p.accept_rates), key=lambda p: len(p.accept_rates), default=None)
        if longest is not None:
            rates[kind] = list(longest.accept_rates)
    return PerfModel(
        envs=envs, kinds=kinds, a={e: float(coef[i]) for i, e in enumerate(envs)}, b=float(coef[len(envs)]),
        c=c, rates=rates, overhead=overhead,
    )


def loo_error(points: list[TrialPoint]) -> tuple[float, list[tuple[TrialPoint, float]]]:
    """Median |predicted - measured| / measured throughput, each trial predicted by a fit on the others
    (its own measured accepted length is used: the model predicts speed, acceptance is the drafter's)."""
    preds = []
    for i, p in enumerate(points):
        rest = points[:i] + points[i + 1 :]
        if not rest or p.env not in {q.env for q in rest}:
            continue
        model = fit(rest)
        preds.append((p, model.throughput(p.env, p.kind, p.k, accept_len=p.accept_len)))
    if not preds:
        return float("nan"), []
    errs = [abs(pred - p.throughput) / p.throughput for p, pred in preds]
    return float(np.median(errs)), preds


def what_if_tp(step_ms: float, comm_ms: float, tp_from: int, tp_to: int, comm_ms_to: float | None = None) -> float:
    """ESTIMATE of a step at another TP size: compute (step - comm) scales as tp_from / tp_to
    (memory-bound: each rank streams 1/tp of the weights); communication becomes `comm_ms_to`
    (e.g. rounds x a measured latency over another interconnect), or stays as it was."""
    compute = max(0.0, step_ms - comm_ms)
    return compute * tp_from / tp_to + (comm_ms if comm_ms_to is None else comm_ms_to)


def latency_us(rows: list[dict], backend: str, env: str, size_bytes: int, mode: str = "graph") -> float | None:
    """Allreduce latency at `size_bytes` from a bench-allreduce table (log-log interpolation)."""
    pts = sorted((r["size_bytes"], r["time_us"]) for r in rows if r["backend"] == backend and r["env"] == env and r["mode"] == mode)
    if not pts:
        return None
    xs, ys = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.exp(np.interp(np.log(size_bytes), xs, ys)))


def what_if_interconnect(step_ms: float, comm_ms: float, rounds: float, latency: float) -> float:
    """ESTIMATE of a step whose `rounds` allreduces take `latency` us each instead of the measured comm_ms."""
    return max(0.0, step_ms - comm_ms) + rounds * latency / 1e3
