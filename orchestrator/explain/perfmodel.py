"""Performance model of a speculative decoding step, fitted from a study's trials and, where one
exists, the allreduce latency table of `spectune bench-allreduce` (or `study.bench_allreduce`).

    step_ms(env, kind, k) = verify    compute(tp, k) + comm(env, k)      (fitted on verify_ms)
                          + drafter   c0[kind] + c[kind] * k             (fitted on what the step costs beyond that)
                          + the rest  o[k > 0] (o[k == 0] for plain steps): link messages, verification logic
    compute(tp, k) = a0[tp] + b * (k + 1)            or  a0[tp] + rise(k + 1) where the setup's width profile was measured
                   + v[kind] + e[kind] * k           (k > 0: what the drafter kind changes in the pass timed as verify)
    comm(env, k)   = rounds * latency_env(batch * (k + 1) * hidden * itemsize) / 1000   "bench"
                   or a fitted constant folded into a[env]: verify = a[env] + b (k+1)  "fitted"
    throughput(env, kind, k) = accept_len(kind, k) * 1000 / step_ms(env, kind, k)

`env` is one allreduce setup: TP size, backend and NCCL variables (`env_label`). A verify pass of
width k + 1 runs `rounds` allreduces (2 per layer: the attention and the MLP row-parallel outputs),
each of batch x (k + 1) x hidden x itemsize bytes. With a bench table ("bench" term), the latency
of one allreduce at that size is interpolated from the table (log-log, clamped at its ends) and only
the compute part is fitted: one constant a0 per TP size, shared by every allreduce setup at that
size (compute does not depend on how the sums travel), and one slope b per scored token. So the
model also predicts setups no trial tried, as long as the table timed them at a tried TP size.
Without a table for a setup ("fitted" term, e.g. a CPU study with study.bench_allreduce off), that
setup gets its own fitted constant a[env], which holds its allreduces and its compute together.
A setup no trial ran and no table timed is predicted from its family (TP size and backend, e.g.
"tp8 nccl") where other setups of the family were fitted ("backend" term): the fitted constants of
the family are explained as a base plus one additive correction per NCCL variable setting,
    a[env] = base[family] + sum over NCCL_X=v of env: d[family][NCCL_X=v]
(least squares over the family's fitted setups; a tiny penalty on the corrections alone keeps them
at zero where the setups do not tell them apart), so a trial with a new combination of known NCCL
settings is predicted; a setting no other trial used gets correction 0 and is named.
The table must describe the trials: a setup where some trial measured an allreduce time per step
(comm_ms_per_step, the step timed with and without its allreduces) more than `max_comm_ratio` (2x)
away from the table's gets the fitted term too (`PerfModel.rejected` keeps the measured / table
range; e.g. gloo timed 10 times on 2 shared CPU cores, where the table is mostly noise).
Draft and verify times are recorded separately and fitted in two stages, which keeps the parts
identifiable: a single fit on step time alone confounds a with b and b with c. The verify pass is
fitted first, on every trial's verify time (its kind's v and e included); then, per drafter kind, its
draft cost is a line in k through what each of its steps took beyond its fitted verify pass and the
mean rest. The line has an intercept c0 where the kind was measured at two k or more: a head drafter
pays a fixed feed of the positions the last step committed before its k chained steps.
v[kind] and e[kind] are what a drafter kind's steps change in the pass they time as verify, against the
plain pass and the shared line: an offset, as one token runs another path than a verify pass of two or
more (the decode graph's matrix-vector kernels; an MoE layer's one token reads top_k experts, two
already read nearly twice as many), so on a GPU width 1 can sit well below the line through the verify
widths; and a slope, as a drafter in the verifier ranks (MTP, EAGLE-3 there) leaves work of its own in
that pass that grows with k. Both carry a small ridge: 0 unless the kind's trials say otherwise, so one
k of one kind leaves them 0 and the slope b takes the width; b is the kinds' mean slope (no trial says
which kind's pass is the pure one) and b + e[kind] each kind's own. A kind no trial ran gets the
measured kinds' mean offset and slope b.
Where trials timed their verify pass at every width of the space (`verify_ms_w<W>`, the setup's width
profile: orchestrator/search/config_model.py `width_profiles`), a width's cost is that profile's rise over
its narrowest width, not the line b (k + 1): an MoE verifier's pass reads the union of the experts its
k + 1 tokens route to, so its cost grows with k far faster than a line through a few trials says.

Accepted length comes from the measured per-position acceptance: the verifier keeps a prefix, so
P(accepted >= i) = accept_rate_pos_i and accept_len(k) = 1 + sum_{i<=k} P(accepted >= i); past the
longest measured k the last ratio P(>= i) / P(>= i-1) continues geometrically.

Speculation with k drafts beats plain decoding under the same env iff
    accept_len / step_ms(k) > 1 / step_ms(0)  <=>  accept_len > breakeven(k) = step_ms(k) / step_ms(0).

Pure numpy: `fit` on `TrialPoint`s (plus an optional `BenchComm`); `loo_error` predicts each trial
from a fit on the others; `comm_check` compares the bench-derived allreduce time with the one the
trials measured themselves (comm_ms_per_step, from the step timed with the allreduce disabled).
`loo_predictions` also names the trials it could not predict, and why.
The configuration model (configurations no trial ran) is orchestrator/search/config_model.py.
`python -m orchestrator.explain.perfcheck EXP.yaml` prints the leave-one-out figures of a study.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from orchestrator.search.config_model import profile_of, profile_term, width_profiles
from orchestrator.search.points import TrialPoint, env_label, parse_env, point_parts, verify_ms_of


def latency_us(rows: list[dict], backend: str, env: str, size_bytes: int, mode: str = "graph", tp: int | None = None) -> float | None:
    """Allreduce latency at `size_bytes` from a bench-allreduce table: piecewise linear in
    (log size, log time), i.e. a power law between measured sizes, and the end value past either
    end (clamped: no extrapolation). Sizes timed twice are averaged. None: no such rows."""
    by_size: dict[int, list[float]] = {}
    for r in rows:
        if r["backend"] == backend and r["env"] == env and r["mode"] == mode and (tp is None or r.get("tp") == tp):
            by_size.setdefault(int(r["size_bytes"]), []).append(float(r["time_us"]))
    if not by_size:
        return None
    sizes = sorted(by_size)
    xs = np.log(sizes)
    ys = np.log([np.mean(by_size[s]) for s in sizes])
    return float(np.exp(np.interp(np.log(size_bytes), xs, ys)))  # np.interp holds the end values outside


@dataclass
class BenchComm:
    """The "bench" allreduce term: per verify pass, `rounds` allreduces of (k + 1) x `token_bytes`
    bytes (token_bytes = batch x hidden x itemsize), each taking the table's latency at that size.
    `mode` is the table's mode the trials ran in: "graph" (CUDA steps are graphed) or "eager" (CPU);
    a setup timed only in the other mode uses that one."""

    rows: list[dict]
    rounds: float  # allreduces per verify pass: 2 x n_layers
    token_bytes: int
    mode: str = "graph"
    setups: dict[str, tuple[int, str, str]] = field(init=False)  # env label -> (tp, backend, nccl)

    def __post_init__(self):
        self.setups = {
            env_label(r["tp"], r["backend"], r["env"]): (r["tp"], r["backend"], r["env"]) for r in self.rows if r.get("tp") is not None
        }

    def size(self, k: int) -> int:
        return (k + 1) * self.token_bytes

    def latency_us(self, env: str, k: int) -> float | None:
        if env not in self.setups:
            return None
        tp, backend, nccl = self.setups[env]
        for mode in (self.mode, "eager" if self.mode == "graph" else "graph"):
            lat = latency_us(self.rows, backend, nccl, self.size(k), mode, tp)
            if lat is not None:
                return lat
        return None

    def ms(self, env: str, k: int) -> float | None:
        """Allreduce time of one verify pass of width k + 1 under `env`, in ms."""
        lat = self.latency_us(env, k)
        return None if lat is None else self.rounds * lat / 1e3


@dataclass
class PerfModel:
    envs: list[str]
    kinds: list[str]
    a: dict[str, float]  # "fitted" envs: fixed verify cost (compute and allreduces together)
    b: float  # ms per scored token
    c: dict[str, float]  # ms per drafted token, per drafter kind
    c0: dict[str, float] = field(default_factory=dict)  # ms a drafting step pays whatever k, per drafter kind
    rates: dict[str, list[float]] = field(default_factory=dict)  # per kind: P(accepted >= i), i = 1..
    overhead: tuple[float, float] = (0.0, 0.0)  # o[k == 0], o[k > 0]
    a0: dict[int, float] = field(default_factory=dict)  # "bench" envs: fixed compute per TP size
    comm: BenchComm | None = None
    rejected: dict[str, tuple[float, float]] = field(default_factory=dict)  # table disagrees: measured / table range
    base: dict[str, float] = field(default_factory=dict)  # "backend" term: per family, the constant of its setups
    corrections: dict[str, dict[str, float]] = field(default_factory=dict)  # per family: "NCCL_X=v" -> correction
    parts: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)  # env -> (family, settings)
    profiles: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)  # measured width profiles (rise per width)
    v: dict[str, float] = field(default_factory=dict)  # per drafter kind: its verify pass's offset (k > 0)
    e: dict[str, float] = field(default_factory=dict)  # per drafter kind: its verify pass's extra ms per draft

    def width_term(self, env: str, k: int, kind: str = "none") -> float:
        """The verify pass's cost of scoring k + 1 tokens: the setup's measured profile (or its family's)
        where there is one, else the fitted line; k > 0 under a drafter kind, plus what that kind changes
        in the pass."""
        profile = self.profiles.get(("env", env)) or self.profiles.get(("family", self.parts_of(env)[0])) or {}
        term = profile_term(profile, k + 1) if len(profile) >= 2 else self.b * (k + 1)
        if k > 0 and kind != "none":
            term += self.v.get(kind, float(np.mean(list(self.v.values()))) if self.v else 0.0) + self.e.get(kind, 0.0) * k
        return term

    def flat_breakeven(self, env: str, kind: str, k: int) -> float:
        """The breakeven k drafts would have if scoring k + 1 tokens cost what scoring one does (as on a dense
        verifier at small batch, which streams the same weights for 1 or k + 1 tokens)."""
        return (self.step_ms(env, kind, k) - self.width_term(env, k, kind) + self.width_term(env, 0)) / self.step_ms(env, "none", 0)

    def parts_of(self, env: str) -> tuple[str, tuple[str, ...]]:
        return self.parts.get(env) or parse_env(env)

    def source(self, env: str) -> str:
        """Which allreduce term `env` uses: "bench" (the table's latency), "fitted" (in a[env]),
        "backend" (its family's base and NCCL corrections) or "unknown"."""
        if env in self.a:
            return "fitted"
        if self.comm is not None and env in self.comm.setups and self.comm.setups[env][0] in self.a0 and env not in self.rejected:
            return "bench"
        if self.parts_of(env)[0] in self.base:
            return "backend"
        return "unknown"

    def unknown_settings(self, env: str) -> list[str]:
        """NCCL settings of `env` no fitted setup of its family had (their correction is taken as 0)."""
        family, settings = self.parts_of(env)
        return [s for s in settings if s not in self.corrections.get(family, {})]

    def comm_ms(self, env: str, k: int) -> float | None:
        """The bench-derived allreduce time per step (None for a fitted env: it is inside a[env])."""
        return self.comm.ms(env, k) if self.source(env) == "bench" else None

    def verify_ms(self, env: str, k: int, kind: str = "none") -> float:
        src = self.source(env)
        if src == "bench":
            return self.a0[self.comm.setups[env][0]] + self.width_term(env, k, kind) + self.comm.ms(env, k)
        if src == "fitted":
            return self.a[env] + self.width_term(env, k, kind)
        if src == "backend":
            family, settings = self.parts_of(env)
            d = self.corrections.get(family, {})
            return self.base[family] + sum(d.get(x, 0.0) for x in settings) + self.width_term(env, k, kind)
        return float(np.mean([self.verify_ms(e, k, kind) for e in self.envs]))  # never seen: the average setup

    def step_ms(self, env: str, kind: str, k: int) -> float:
        rest = self.c0.get(kind, 0.0) + self.c.get(kind, 0.0) * k + self.overhead[1] if k > 0 else self.overhead[0]
        return self.verify_ms(env, k, kind) + rest

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


def comm_ratios(points: list[TrialPoint], comm: BenchComm | None) -> dict[str, list[float]]:
    """Per env of the table: measured / bench-derived allreduce time per step of each trial that measured one."""
    out: dict[str, list[float]] = {}
    for p in points:
        bench = comm.ms(p.env, p.k) if comm is not None else None
        if bench and p.comm_ms is not None and p.comm_ms > 0:
            out.setdefault(p.env, []).append(p.comm_ms / bench)
    return out


def fit(points: list[TrialPoint], comm: BenchComm | None = None, max_comm_ratio: float = 2.0) -> PerfModel:
    """Verify pass: least squares of (verify_ms - bench allreduce time) on one intercept per group
    and the per-scored-token slope b. A group is a TP size for envs the table covers (a0[tp]: their
    allreduces are the table's) or the env itself otherwise (a[env]: allreduces fitted in).
    Per drafter kind an offset v and a slope e (k > 0) against that line, ridged toward 0 as b is.
    Drafting: per kind, a line in k through what its steps took beyond the fitted verify pass and the
    mean rest. Overheads: the mean rest."""
    if not points:
        raise ValueError("no trials to fit")
    kinds = sorted({p.kind for p in points if p.k > 0})
    rejected = {e: (min(r), max(r)) for e, r in comm_ratios(points, comm).items() if min(r) < 1 / max_comm_ratio or max(r) > max_comm_ratio}
    covered = {p.env for p in points if comm is not None and p.env in comm.setups and p.env not in rejected}
    group = {p.env: (p.tp if p.env in covered else p.env) for p in points}
    groups = sorted(set(group.values()), key=str)
    # a measured width profile gives a point's width term (only the level is fitted); the slope b serves the rest
    profiles = width_profiles(points)
    # columns: one intercept per group, b, then v and e per drafter kind
    nb = len(groups)
    col_v = {kind: nb + 1 + j for j, kind in enumerate(kinds)}
    col_e = {kind: nb + 1 + len(kinds) + j for j, kind in enumerate(kinds)}
    X = np.zeros((len(points), nb + 1 + 2 * len(kinds)))
    y = np.zeros(len(points))
    for i, p in enumerate(points):
        X[i, groups.index(group[p.env])] = 1.0
        profile = profile_of(profiles, p.shape)
        X[i, nb] = 0.0 if profile else p.k + 1
        if p.k > 0:
            X[i, col_v[p.kind]], X[i, col_e[p.kind]] = 1.0, p.k
        y[i] = verify_ms_of(p) - (comm.ms(p.env, p.k) if p.env in covered else 0.0) - (profile_term(profile, p.k + 1) if profile else 0.0)
    # a tiny ridge on everything but the intercepts picks, among the least-squares solutions, the one with
    # the smallest kind terms, b taking the kinds' mean slope: v = e = 0 where a kind's trials cannot tell
    # them from b (one k), and where a group's trials all ran one k (the slope not identified) the
    # smallest |b| (decode is memory-bound: extra scored tokens cost little); the intercepts take what
    # the trials measured. b's ridge is far smaller, so the kinds' terms stay the deviations.
    # (least squares of X and the ridge rows stacked below it: better conditioned than the normal equations)
    lam = 1e-9 * max(1.0, float(np.trace(X.T @ X)) / X.shape[1])
    ridge = np.zeros(X.shape[1])
    ridge[nb] = np.sqrt(lam * 1e-4)  # b = the kinds' shared slope to about 1 part in 10^4
    ridge[nb + 1 :] = np.sqrt(lam)
    coef = np.linalg.lstsq(np.vstack([X, np.diag(ridge)]), np.concatenate([y, np.zeros(X.shape[1])]), rcond=None)[0]
    a = {g: float(coef[j]) for j, g in enumerate(groups) if isinstance(g, str)}
    a0 = {g: float(coef[j]) for j, g in enumerate(groups) if isinstance(g, int)}
    rest = {False: [], True: []}
    for p in points:
        rest[p.k > 0].append(p.step_ms - verify_ms_of(p) - p.draft_ms)
    overhead = (float(np.mean(rest[False])) if rest[False] else 0.0, float(np.mean(rest[True])) if rest[True] else 0.0)
    # the drafter's line: per kind, what a step took beyond the fitted verify pass and the mean rest
    # (y is the verify pass less the table's allreduces and the width profile: add them back)
    verify_fit = X @ coef + np.array([verify_ms_of(p) for p in points]) - y
    c, c0 = {}, {}
    for kind in kinds:
        mine = [i for i, p in enumerate(points) if p.kind == kind]
        ks = np.array([points[i].k for i in mine], dtype=float)
        cost = np.array([points[i].step_ms - verify_fit[i] - overhead[1] for i in mine])
        if len(set(ks)) >= 2:
            c[kind], c0[kind] = (float(v) for v in np.polyfit(ks, cost, 1))
        else:  # one k: no intercept to tell from the slope
            c[kind], c0[kind] = (float(ks @ cost / (ks @ ks)) if ks.any() else 0.0), 0.0
    rates: dict[str, list[float]] = {}
    for kind in kinds:
        longest = max((p for p in points if p.kind == kind and p.accept_rates), key=lambda p: len(p.accept_rates), default=None)
        if longest is not None:
            rates[kind] = list(longest.accept_rates)
    # every setup the model can speak for: the trials' and the table's at a TP size with a fitted a0
    untried = {e for e, (tp, _, _) in comm.setups.items() if tp in a0 and e not in rejected} if comm is not None else set()
    parts = {p.env: point_parts(p) for p in points}
    base, corrections = _families(a, parts)
    return PerfModel(
        envs=sorted({p.env for p in points} | untried),
        kinds=kinds,
        a=a,
        b=float(coef[nb]),
        v={kind: float(coef[col_v[kind]]) for kind in kinds},
        e={kind: float(coef[col_e[kind]]) for kind in kinds},
        c=c,
        c0=c0,
        rates=rates,
        overhead=overhead,
        a0=a0,
        comm=comm if a0 else None,
        rejected=rejected,
        base=base,
        corrections=corrections,
        parts=parts,
        profiles=profiles,
    )


def _families(a: dict[str, float], parts: dict[str, tuple[str, tuple[str, ...]]]) -> tuple[dict, dict]:
    """Per family of fitted setups: a[env] ~ base + sum of its settings' corrections (least squares,
    a tiny ridge on the corrections only: unidentified ones stay 0, the base takes the mean)."""
    base: dict[str, float] = {}
    corrections: dict[str, dict[str, float]] = {}
    for family in sorted({parts[e][0] for e in a}):
        envs = [e for e in sorted(a) if parts[e][0] == family]
        settings = sorted({x for e in envs for x in parts[e][1]})
        X = np.zeros((len(envs), len(settings) + 1))
        X[:, 0] = 1.0
        for i, e in enumerate(envs):
            for x in parts[e][1]:
                X[i, 1 + settings.index(x)] = 1.0
        y = np.array([a[e] for e in envs])
        penalty = np.eye(X.shape[1]) * 1e-6 * max(1.0, float(np.trace(X.T @ X)) / X.shape[1])
        penalty[0, 0] = 0.0
        coef = np.linalg.solve(X.T @ X + penalty, X.T @ y)
        base[family] = float(coef[0])
        corrections[family] = {x: float(coef[1 + j]) for j, x in enumerate(settings)}
    return base, corrections


@dataclass(frozen=True)
class Prediction:
    point: TrialPoint
    predicted: float  # decode tok/s
    term: str  # allreduce term of its setup in the fit on the others: bench | fitted | backend
    how: str  # one line: how its allreduce term was obtained


def loo_predictions(
    points: list[TrialPoint], comm: BenchComm | None = None, max_comm_ratio: float = 2.0
) -> tuple[list[Prediction], list[tuple[TrialPoint, str]]]:
    """Each trial predicted by a fit on the others (with its own measured accepted length: the model
    predicts speed, acceptance is the drafter's). Its setup's allreduce term: the table's ("bench"),
    its own fitted constant when other trials ran the same setup ("fitted"), else its family's base
    plus NCCL corrections ("backend"). A trial whose drafter kind no other trial used is kept: its drafts
    predicted free, its verify pass at the other kinds' mean offset and slope. Returns the predictions and the trials that could not be predicted, with why."""
    preds, missed = [], []
    for i, p in enumerate(points):
        rest = points[:i] + points[i + 1 :]
        if not rest:
            missed.append((p, "no other trial to fit on"))
            continue
        model = fit(rest, comm, max_comm_ratio)
        family, _ = model.parts[p.env] = point_parts(p)
        src = model.source(p.env)
        if src == "unknown":
            missed.append((p, f"no other trial ran {family} and no allreduce table row has {p.env}"))
            continue
        if src == "bench":
            how = "allreduce time from the table, compute fitted on the others"
        elif src == "fitted":
            how = "fitted constant of its setup (other trials ran it)"
        else:
            unknown = model.unknown_settings(p.env)
            how = f"base of {family} + NCCL corrections" + (f"; no other trial set {', '.join(unknown)}: taken as 0" if unknown else "")
        preds.append(Prediction(p, model.throughput(p.env, p.kind, p.k, accept_len=p.accept_len), src, how))
    return preds, missed


def loo_error(
    points: list[TrialPoint], comm: BenchComm | None = None, max_comm_ratio: float = 2.0
) -> tuple[float, list[tuple[TrialPoint, float, str]]]:
    """Median |predicted - measured| / measured throughput over `loo_predictions`, and (trial, predicted
    throughput, allreduce term its fit used) per predicted trial (`loo_predictions` names the others)."""
    preds = loo_predictions(points, comm, max_comm_ratio)[0]
    if not preds:
        return float("nan"), []
    errs = [abs(x.predicted - x.point.throughput) / x.point.throughput for x in preds]
    return float(np.median(errs)), [(x.point, x.predicted, x.term) for x in preds]


def comm_check(points: list[TrialPoint], comm: BenchComm | None) -> dict[str, tuple[float, float, float]]:
    """Per env of the table: (min, median, max) over its trials of measured / bench-derived allreduce
    time per step. ~1 = the table describes the trials' allreduces; far from 1: contention, another
    message size or mode than the table's, or a noisy table."""
    return {env: (min(r), float(np.median(r)), max(r)) for env, r in sorted(comm_ratios(points, comm).items())}


def what_if_tp(step_ms: float, comm_ms: float, tp_from: int, tp_to: int, comm_ms_to: float | None = None) -> float:
    """ESTIMATE of a step at another TP size: compute (step - comm) scales as tp_from / tp_to
    (memory-bound: each rank streams 1/tp of the weights); communication becomes `comm_ms_to`
    (e.g. rounds x a measured latency over another interconnect), or stays as it was."""
    compute = max(0.0, step_ms - comm_ms)
    return compute * tp_from / tp_to + (comm_ms if comm_ms_to is None else comm_ms_to)


def what_if_interconnect(step_ms: float, comm_ms: float, rounds: float, latency: float) -> float:
    """ESTIMATE of a step whose `rounds` allreduces take `latency` us each instead of the measured comm_ms."""
    return max(0.0, step_ms - comm_ms) + rounds * latency / 1e3
