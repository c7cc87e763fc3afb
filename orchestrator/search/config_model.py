"""The configuration model: predicts configurations no trial ran, from parts other trials measured,
for the `model` sampler (orchestrator/search/samplers.py), `spectune bench-search`
(orchestrator/search/benchmark.py) and the report's predicted configurations; `config_loo` leaves
whole configurations out, their acceptance included. Pure numpy on orchestrator/search/points.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from orchestrator.search.points import ConfigShape, TrialPoint, verify_ms_of

# ---------------------------------------------------------------------------------------------------
# Configurations no trial ran. A finite search space is enumerable (config/space.py), so every
# configuration can be predicted from measured parts, none of them its own (`ConfigShape` says which
# parts it shares with others):
#   verify   base[family] + sum over the setup's settings of d[family, setting] + v[variant] + b x width:
#            one least squares over every trial (family = TP size and backend; settings = NCCL
#            variables and searched engine options; v, what a drafter variant changes in the timed
#            pass, e.g. an in-rank head beside it, 0 for plain decoding, its kind's mean for a variant
#            no trial ran). A small ridge on d and v keeps each at "no change" where the trials cannot
#            tell it from the width (one setup measured at one width only); where every trial ran one
#            width, b is a prior (SLOPE_PRIOR). (The allreduce table is not used here: the setups of a
#            search are fitted.)
#   draft    c[variant] x k: the variant's ms per draft (least squares through the origin on k); else,
#            for layer-skip, ms per draft per drafting layer x L (it runs L of the verifier's layers);
#            else the kind's mean over its measured variants
#   rest     what a step costs beyond its verify pass and drafts (link messages, verification, host
#            work the step timings miss): r[variant] + h x k, least squares over the speculative
#            trials on the step the decode throughput implies (accept_len x 1000 / decode_tok_s)
#            (h, host work per draft, shared; 0 where no variant was measured at two k); a variant
#            no trial ran takes its kind's r in the same place (inside the verifier ranks, or a
#            process of its own), else any kind's there.
#   outside  s per generated token outside the decode steps (prefill, a drafter's own prefill, set-up):
#            1/objective - 1/decode_tok_s, the median per drafter variant; a variant no trial ran takes
#            its kind's, else the plain trials'; no term in k. The objective prediction:
#            1 / (s + step / (1000 x accept)).
#   accept   1 + c sum_{i<=k} P_i. P_i = accept_rate_pos_i, the share of steps that drafted position i
#            in which it was accepted, pooled over every trial of the acceptance key (the proposer, i.e.
#            the variant less where it runs, under the setup's engine settings) that measured position
#            i; else the same proposer's under other engine settings; past the last measured position
#            the last ratio P_n / P_{n-1} continues geometrically (the model's rule). c, the share of
#            steps that draft at all (n-gram lookup drafts only where the text repeats), is the key's
#            measured sum(accept_len - 1) / sum(sum_{i<=k} P_i) over its trials (1 for a chain that
#            always drafts). A workload that imposes tau (workload.simulate_accept_len) accepts
#            1 + min(k, tau - 1): P_i = clip(tau - i, 0, 1), c = 1
#   decode   accept x 1000 / (verify + draft + rest) (tok/s)
# Every estimate carries a relative spread (one sigma): small where each part was measured, larger for
# a part borrowed from the kind, the family or a prior. Priors (a drafter no trial measured) serve only
# the `model` sampler's exploration; leave-one-out never uses them (such a configuration is a miss).


@dataclass(frozen=True)
class Priors:
    """What the model assumes where nothing was measured (exploration only). A draft costs
    `draft_layers` verifier layers' worth of a plain verify pass: layer-skip its L, an EAGLE-3 head
    about two (one decoder layer and its head), a draft model a quarter of the verifier, n-gram
    lookup nothing. A drafter kind no trial ran accepts `rates` (halving per position), every step
    drafting; layer-skip's first position at most L / N (a draft from the first L of the verifier's N
    layers agrees with the whole of it no more often than the share of it that drafts), then halving."""

    n_layers: int | None = None  # the verifier's layers (None: 32)
    rates: tuple[float, ...] = (0.5, 0.25, 0.125, 0.0625)  # P(accepted >= i): halves per position
    link_share: float = 0.1  # a drafter process of its own: its link messages cost this share of a plain verify pass per step

    def acceptance(self, shape: ConfigShape) -> list[float]:
        """P(accepted >= i), i = 1..k, of a drafter kind no trial ran."""
        rates = list(self.rates)
        if shape.kind == "layer_skip" and shape.layers:
            share = min(1.0, shape.layers / (self.n_layers or 32))
            rates = [min(p, share * p / rates[0]) for p in rates]
        return _extend(rates, shape.k)

    def draft_ms(self, shape: ConfigShape, plain_verify_ms: float) -> float:
        n = self.n_layers or 32
        equivalent = {"ngram": 0.0, "layer_skip": float(shape.layers), "eagle3": 2.0, "draft_model": n / 4}.get(shape.kind, n / 4)
        return equivalent / n * plain_verify_ms


# relative one-sigma spreads of each part, by where it came from (an estimate's `spread` combines them)
SPREAD_SETUP = {"fitted": 0.01, "bench": 0.02, "backend": 0.03, "unknown": 0.2}
SPREAD_SETTING = 0.03  # per setting of its family no measured setup had (its correction taken as 0)
SPREAD_DRAFT = {"variant": 0.05, "layers": 0.15, "kind": 0.3, "prior": 0.6}  # of the drafts' share of the step
SPREAD_REST = {"variant": 0.05, "kind": 0.2, "class": 0.4, "prior": 0.6, "unmeasured": 0.6}  # of the rest's share of the step
SPREAD_ACCEPT = {"measured": 0.03, "extrapolated": 0.15, "proposer": 0.1, "kind": 0.3, "prior": 0.5}  # of sum P_i


@dataclass(frozen=True)
class Estimate:
    decode_tok_s: float
    objective: float  # the study's throughput: decode plus the time per token outside decoding
    accept_len: float
    step_ms: float
    spread: float  # relative one-sigma uncertainty of `objective` (measurement noise not included)
    basis: str  # where the parts came from, one line


@dataclass(frozen=True)
class Miss:
    reason: str  # why the model cannot predict the configuration without a prior


def _extend(p: list[float], k: int) -> list[float]:
    """P_1..P_k from the measured prefix: the last ratio continues geometrically past it (capped at 1)."""
    probs = list(p[:k])
    if not probs:
        return probs
    ratio = p[-1] / p[-2] if len(p) >= 2 and p[-2] > 0 else p[-1]
    while len(probs) < k:
        probs.append(probs[-1] * min(1.0, ratio))
    return probs


def _mean_rates(rates: list[list[float]]) -> list[float]:
    """Position-wise mean of several P_i lists (each position over the lists that reach it)."""
    n = max(len(r) for r in rates)
    return [float(np.mean([r[i] for r in rates if len(r) > i])) for i in range(n)]


@dataclass
class VerifyFit:
    """verify_ms = base[family] + sum of d[family, setting] over the setup's settings + v[variant] + b x width.

    v[variant] is what a drafter variant changes in the pass the trials time as verify (an in-rank head
    runs beside it): 0 for plain decoding, fitted with a small ridge for every measured variant (no
    change unless its trials say otherwise), its kind's mean for a variant no trial ran."""

    base: dict[str, float]
    d: dict[tuple[str, str], float]
    b: float
    envs: frozenset[str]  # setups some trial ran
    v: dict[str, float] = field(default_factory=dict)  # drafter variant -> its offset ("none": 0)
    kind_v: dict[str, float] = field(default_factory=dict)  # drafter kind -> mean offset of its measured variants
    profiles: dict[tuple[str, str], dict[int, float]] = field(
        default_factory=dict
    )  # ("env" | "family", name) -> width -> ms above its narrowest

    def width_term(self, shape: ConfigShape) -> float:
        """What the width adds to the pass: from the setup's measured profile (else its family's), where
        one was measured (`profile_term`), else the line b x width."""
        profile = profile_of(self.profiles, shape)
        return profile_term(profile, shape.width) if profile else self.b * shape.width

    def source(self, shape: ConfigShape) -> str:
        """Where the verify time comes from: "fitted" (a trial ran this setup), "backend" (its family's
        base and corrections) or "unknown"."""
        return "fitted" if shape.env in self.envs else "backend" if shape.family in self.base else "unknown"

    def unknown_settings(self, shape: ConfigShape) -> list[str]:
        return [x for x in shape.settings if (shape.family, x) not in self.d]

    def offset(self, shape: ConfigShape) -> float:
        if shape.k == 0:
            return 0.0
        return self.v.get(shape.drafter, self.kind_v.get(shape.kind, 0.0))

    def ms(self, shape: ConfigShape) -> float:
        base = self.base.get(shape.family, float(np.mean(list(self.base.values()))))
        return base + sum(self.d.get((shape.family, x), 0.0) for x in shape.settings) + self.offset(shape) + self.width_term(shape)


def profile_of(profiles: dict[tuple[str, str], dict[int, float]], shape: ConfigShape) -> dict[int, float]:
    """`shape`'s setup's width profile (`width_profiles`), else its family's; {} where none of two or more widths."""
    profile = profiles.get(("env", shape.env)) or profiles.get(("family", shape.family)) or {}
    return profile if len(profile) >= 2 else {}


def profile_term(profile: dict[int, float], width: int) -> float:
    """A width's rise from a profile of two or more widths: measured, else linear between the nearest
    profiled widths, else along the profile's least-squares slope from its nearest end (a tree's width
    past the chains'; a setup profiled at fewer widths than the space has)."""
    if width in profile:
        return profile[width]
    widths = sorted(profile)
    below, above = [w for w in widths if w < width], [w for w in widths if w > width]
    if below and above:
        lo, hi = below[-1], above[0]
        return profile[lo] + (profile[hi] - profile[lo]) * (width - lo) / (hi - lo)
    slope = float(np.polyfit(widths, [profile[w] for w in widths], 1)[0])
    end = below[-1] if below else above[0]
    return profile[end] + slope * (width - end)


def width_profiles(points: list[TrialPoint]) -> dict[tuple[str, str], dict[int, float]]:
    """Per setup ("env", env) and per family ("family", family): each profiled width's verify pass
    above the setup's narrowest one, the median over the trials that timed both (`TrialPoint.width_ms`:
    the end-of-trial passes at every width of the space, on an empty cache; only the differences are
    used, the level is fitted)."""
    rises: dict[tuple[str, str], dict[int, list[float]]] = {}
    for p in points:
        profile = dict(p.width_ms)
        if len(profile) < 2:
            continue
        low = profile[min(profile)]
        for key in (("env", p.shape.env), ("family", p.shape.family)):
            for w, ms in profile.items():
                rises.setdefault(key, {}).setdefault(w, []).append(ms - low)
    return {key: {w: float(np.median(xs)) for w, xs in by_w.items()} for key, by_w in rises.items()}


def fit_verify(points: list[TrialPoint]) -> VerifyFit:
    """One least squares: per family a base, per setting and per drafter variant a correction (a small
    ridge keeps each at "no change" unless the trials say otherwise), the slope in the width shared
    (where every trial ran one width, a prior: SLOPE_PRIOR of a pass per scored token). Where the
    setups' width profiles were measured (`width_profiles`), a point's width term is its profile's, not
    fitted: the slope then serves only widths no profile covers."""
    profiles = width_profiles(points)
    profiled = [bool(profile_of(profiles, p.shape)) for p in points]
    shapes = [p.shape for p in points]
    families = sorted({x.family for x in shapes})
    settings = sorted({(x.family, y) for x in shapes for y in x.settings})
    variants = sorted({x.drafter for x in shapes if x.k > 0})
    n_f, n_s, n_v = len(families), len(settings), len(variants)
    X = np.zeros((len(points), n_f + n_s + n_v + 1))
    y = np.array([verify_ms_of(p) for p in points])
    for i, x in enumerate(shapes):
        X[i, families.index(x.family)] = 1.0
        for z in x.settings:
            X[i, n_f + settings.index((x.family, z))] = 1.0
        if x.k > 0:
            X[i, n_f + n_s + variants.index(x.drafter)] = 1.0
        if profiled[i]:  # the width's share is measured: the rest is fitted
            y[i] -= profile_term(profile_of(profiles, x), x.width)
        else:
            X[i, -1] = x.width
    scale = max(1.0, float(np.trace(X.T @ X)) / X.shape[1])
    ridge = np.zeros(X.shape[1])
    ridge[n_f:-1] = 1e-4 * scale  # corrections and variant offsets: "no change" unless the trials say otherwise
    unprofiled = {x.width for x, done in zip(shapes, profiled) if not done}
    if len(unprofiled) > 1:  # (one width alone: the slope would absorb that width's offset; the prior)
        ridge[-1] = 1e-7 * scale  # the slope: the smallest one the trials allow
        coef = np.linalg.solve(X.T @ X + np.diag(ridge), X.T @ y)
    else:  # every trial at one width: the slope is a prior, SLOPE_PRIOR of the pass per scored token
        b = SLOPE_PRIOR * float(np.median(y)) / shapes[0].width
        coef = np.linalg.solve(X[:, :-1].T @ X[:, :-1] + np.diag(ridge[:-1]), X[:, :-1].T @ (y - b * X[:, -1]))
        coef = np.append(coef, b)
    v = {name: float(coef[n_f + n_s + j]) for j, name in enumerate(variants)}
    kinds: dict[str, set[float]] = {}
    for x in shapes:
        if x.k > 0:
            kinds.setdefault(x.kind, set()).add(v[x.drafter])
    return VerifyFit(
        base={f: float(coef[j]) for j, f in enumerate(families)},
        d={z: float(coef[n_f + j]) for j, z in enumerate(settings)},
        b=float(coef[-1]),
        envs=frozenset(x.env for x in shapes),
        v=v,
        kind_v={kind: float(np.mean(sorted(xs))) for kind, xs in kinds.items()},
        profiles=profiles,
    )


# each extra scored token costs this share of a verify pass where the trials measured one width only
# (decode is memory-bound: a few % per token on the GPUs and CPUs measured here)
SLOPE_PRIOR = 0.03


@dataclass
class RestFit:
    """rest = r[variant] + h x k (module comment), with its fallbacks for variants no trial ran."""

    r: dict[str, float]  # drafter variant ("none": plain steps) -> intercept
    h: float  # ms per draft, shared
    kind_r: dict[tuple[str, bool], float]  # (drafter kind, in the verifier ranks) -> mean r of those variants
    class_r: dict[bool, float]  # in the verifier ranks or not -> mean r of those variants

    def ms(self, shape: ConfigShape, link_ms: float | None) -> tuple[float, str]:
        """The rest of `shape`'s step and where it came from (a key of SPREAD_REST); `link_ms`: what
        a drafter process's link messages are assumed to cost where no process drafter was measured
        (None: no prior)."""
        slope = self.h * shape.k
        if shape.drafter in self.r:
            return self.r[shape.drafter] + slope, "variant"
        if shape.k == 0:  # plain steps measured nowhere else: no drafts, no link messages
            return 0.0, "class"
        # where the drafter runs decides most of it (a process of its own sends link messages; inside the
        # verifier ranks nothing crosses a link): the same kind in the same place, then any kind there
        if (shape.kind, shape.in_verifier) in self.kind_r:
            return self.kind_r[(shape.kind, shape.in_verifier)] + slope, "kind"
        if shape.in_verifier in self.class_r:
            return self.class_r[shape.in_verifier] + slope, "class"
        if link_ms is None:  # no prior: the drafters inside the ranks' rest (else none), no link messages
            return self.class_r.get(True, 0.0) + slope, "unmeasured"
        link = 0.0 if shape.in_verifier else link_ms
        return self.class_r.get(True, 0.0) + link + slope, "prior"


def fit_rest(points: list[TrialPoint], shapes: dict[int, ConfigShape], rests: list[float]) -> RestFit:
    """Least squares of each point's rest on one intercept per variant and a shared slope in k (a
    tiny ridge keeps the slope at 0 where no variant was measured at two k)."""
    variants = sorted({shapes[id(p)].drafter for p in points})
    X = np.zeros((len(points), len(variants) + 1))
    for i, p in enumerate(points):
        X[i, variants.index(shapes[id(p)].drafter)] = 1.0
        X[i, -1] = p.k
    ridge = np.zeros(X.shape[1])
    ridge[-1] = 1e-6 * max(1.0, float(np.trace(X.T @ X)) / X.shape[1])
    coef = np.linalg.solve(X.T @ X + np.diag(ridge), X.T @ np.asarray(rests))
    r = {v: float(coef[j]) for j, v in enumerate(variants)}
    where = {shapes[id(p)].drafter: (p.kind, shapes[id(p)].in_verifier) for p in points if p.k > 0}
    kind_r = {key: float(np.mean([r[v] for v, w in where.items() if w == key])) for key in set(where.values())}
    class_r = {c: float(np.mean([r[v] for v, (_, cv) in where.items() if cv == c])) for c in {cv for _, cv in where.values()}}
    return RestFit(r, float(coef[-1]), kind_r, class_r)


@dataclass
class OutsideFit:
    """What a configuration spends per generated token outside its decode steps (prompt prefill, a
    drafter's own prefill, per-prompt set-up): 1/objective - 1/decode_tok_s, in s. One value per
    drafter variant (the median over its trials; "none": plain); a variant no trial ran takes its
    kind's mean, else the plain trials' (the verifier's prefill, which every configuration pays). No
    term in k: the decode steps hold what grows with k, and a slope fitted on a few noisy objectives
    would only move predictions by the noise."""

    v: dict[str, float]
    kind_v: dict[str, float]
    default: float

    def s(self, shape: ConfigShape) -> float:
        if shape.drafter in self.v:
            return self.v[shape.drafter]
        if shape.k and shape.kind in self.kind_v:
            return self.kind_v[shape.kind]
        return self.default


def fit_outside(points: list[TrialPoint], shapes: dict[int, ConfigShape]) -> OutsideFit:
    each: dict[str, list[float]] = {}
    kind: dict[str, str] = {}
    for p in points:
        if _has_objective(p):
            each.setdefault(shapes[id(p)].drafter, []).append(1.0 / p.objective - 1.0 / p.throughput)
            kind[shapes[id(p)].drafter] = p.kind
    v = {variant: float(np.median(xs)) for variant, xs in each.items()}
    kind_v = {x: float(np.mean([v[y] for y in v if kind[y] == x])) for x in set(kind.values()) if x != "none"}
    every = [x for xs in each.values() for x in xs]
    default = v["none"] if "none" in v else float(np.median(every)) if every else 0.0
    return OutsideFit(v, kind_v, default)


@dataclass
class ConfigModel:
    verify: VerifyFit  # verify terms, fitted on every point
    rates: dict[str, list[float]]  # acceptance key -> pooled P_i, i = 1..longest measured
    coverage: dict[str, float]  # acceptance key -> c, the share of steps that draft
    key_kind: dict[str, str]  # acceptance key -> drafter kind
    key_proposer: dict[str, str]  # acceptance key -> its proposer
    draft: dict[str, float]  # drafter variant -> ms per draft
    per_layer: float | None  # layer_skip: ms per draft per drafting layer
    kind_draft: dict[str, float]  # drafter kind -> mean ms per draft over its variants
    rest: RestFit  # on the step the decode throughput implies
    outside: OutsideFit  # s per token outside the decode steps, per variant
    plain_verify_ms: float  # a plain verify pass (median of the measured ones): the prior's unit

    def acceptance(self, shape: ConfigShape, priors: Priors | None) -> tuple[float, str, float] | Miss:
        """Expected accepted drafts per step of `shape` (accept_len - 1), where they came from and
        their relative spread."""
        if shape.simulated_profile:  # imposed position by position: sum_{i<=k} P_i drafts kept per step
            return float(sum(shape.simulated_profile[: shape.k])), "acceptance simulated", 0.0
        if shape.simulated is not None:  # imposed: tau - 1 drafts kept per step on average, at most k
            return float(sum(min(1.0, max(0.0, shape.simulated - i)) for i in range(1, shape.k + 1))), "acceptance simulated", 0.0
        if shape.acceptance in self.rates:
            measured = self.rates[shape.acceptance]
            extra = max(0, shape.k - len(measured))
            how = "measured" if not extra else "extrapolated"
            spread = SPREAD_ACCEPT["measured"] + SPREAD_ACCEPT["extrapolated"] * extra / shape.k
            drafts = self.coverage[shape.acceptance] * float(sum(_extend(measured, shape.k)))
            return drafts, f"acceptance {how} ({len(measured)} positions)", spread
        keys: list[str] = []
        proposer = shape.proposer or shape.acceptance
        if alike := [key for key in self.rates if self.key_proposer.get(key) == proposer]:  # the same drafter, other engine settings
            keys, how, spread = alike, "acceptance of the drafter under other engine settings", SPREAD_ACCEPT["proposer"]
        elif priors is None:
            return Miss(f"no other trial measured the acceptance of {shape.acceptance}")
        elif same := [key for key in self.rates if self.key_kind.get(key) == shape.kind]:
            keys, how, spread = same, f"acceptance of other {shape.kind} variants", SPREAD_ACCEPT["kind"]
        else:  # a kind no trial ran: another kind's acceptance says nothing of it (n-gram lookup follows the
            # text's repeats, a model drafter its agreement with the verifier), so the prior's, every step drafting
            return float(sum(priors.acceptance(shape))), "acceptance assumed (prior)", SPREAD_ACCEPT["prior"]
        probs = _extend(_mean_rates([self.rates[key] for key in keys]), shape.k)
        # c is a drafter kind's own (n-gram lookup drafts only where the text repeats): borrowed from keys of
        # the same kind only; another kind's says nothing of it, so a drafter of a kind no trial ran drafts every step
        same = [key for key in keys if self.key_kind.get(key) == shape.kind]
        coverage = float(np.mean([self.coverage[key] for key in same])) if same else 1.0
        return coverage * float(sum(probs)), how, spread

    def draft_ms(self, shape: ConfigShape, priors: Priors | None) -> tuple[float, str] | Miss:
        """ms per draft of `shape`'s variant and where it came from (a key of SPREAD_DRAFT)."""
        if shape.drafter in self.draft:
            return self.draft[shape.drafter], "variant"
        if shape.kind == "layer_skip" and self.per_layer is not None and shape.layers:
            return self.per_layer * shape.layers, "layers"
        if shape.kind in self.kind_draft:
            return self.kind_draft[shape.kind], "kind"
        if priors is None:
            return Miss(f"no other trial ran a {shape.kind} drafter")
        return priors.draft_ms(shape, self.plain_verify_ms), "prior"

    def predict(self, shape: ConfigShape, priors: Priors | None = None) -> Estimate | Miss:
        """`shape`'s throughput from the measured parts (and, with `priors`, assumptions for the rest)."""
        src = self.verify.source(shape)
        if src == "unknown" and priors is None:
            return Miss(f"no other trial ran {shape.family}")
        verify = self.verify.ms(shape)
        unknown = self.verify.unknown_settings(shape) if src != "fitted" else []
        var = (SPREAD_SETUP[src] + SPREAD_SETTING * len(unknown)) ** 2
        basis = [f"setup {src}" + (f" ({', '.join(unknown)} taken as no change)" if unknown else "")]
        link = None if priors is None else priors.link_share * self.plain_verify_ms
        rest, rest_src = self.rest.ms(shape, link)
        if shape.k == 0:
            drafts, tau = 0.0, 1.0
        else:
            acc = self.acceptance(shape, priors)
            if isinstance(acc, Miss):
                return acc
            draft = self.draft_ms(shape, priors)
            if isinstance(draft, Miss):
                return draft
            accepted, how, acc_spread = acc
            drafts = draft[0] * shape.k
            tau = 1.0 + accepted
            var += (acc_spread * (tau - 1) / tau) ** 2
            basis += [f"draft {draft[1]}", f"rest {rest_src}", how]
        step = max(verify + drafts + rest, 1e-6)
        if shape.k:
            var += (SPREAD_DRAFT[draft[1]] * drafts / step) ** 2 + (SPREAD_REST[rest_src] * abs(rest) / step) ** 2
        decode = tau * 1000.0 / step
        objective = 1.0 / (self.outside.s(shape) + step / (1000.0 * tau))
        return Estimate(decode, objective, tau, step, float(np.sqrt(var)), ", ".join(basis))


def _has_objective(p: TrialPoint) -> bool:
    return bool(p.objective and p.objective > 0 and p.throughput > 0)


def _effective_step(p: TrialPoint) -> float:
    """The mean step the trial's decode throughput implies (its median step where there is none)."""
    return p.accept_len * 1000.0 / p.throughput if p.throughput > 0 else p.step_ms


def fit_configs(points: list[TrialPoint], acceptance_from: list[TrialPoint] = ()) -> ConfigModel:
    """The configuration model of `points` (their `shape` says which parts they share).
    acceptance_from: more trials whose per-position acceptance and time per draft count, but not their
    verify passes, rest or throughput (PRUNED trials: the positions they drafted were verified like any
    other and each draft timed, but their throughput covers the first prompts only, and the pruner
    picked them for being slow there)."""
    if not points:
        raise ValueError("no trials to fit")
    verify_fit = fit_verify(points)
    shapes = {id(p): p.shape for p in [*points, *acceptance_from]}
    spec = [p for p in points if p.k > 0]
    accepting = spec + [p for p in acceptance_from if p.k > 0]
    rates: dict[str, list[float]] = {}
    key_kind: dict[str, str] = {}
    key_proposer: dict[str, str] = {}
    coverage: dict[str, float] = {}
    for p in accepting:
        key_kind[shapes[id(p)].acceptance] = p.kind
        key_proposer[shapes[id(p)].acceptance] = shapes[id(p)].proposer or shapes[id(p)].acceptance
    for key in sorted(key_kind):
        lists = [list(p.accept_rates) for p in accepting if shapes[id(p)].acceptance == key and p.accept_rates]
        if lists:
            rates[key] = _mean_rates(lists)
            mine = [p for p in accepting if shapes[id(p)].acceptance == key and p.accept_rates]
            drafted = sum(float(sum(_extend(rates[key], p.k))) for p in mine)
            coverage[key] = min(1.0, max(0.0, sum(p.accept_len - 1.0 for p in mine) / drafted)) if drafted > 0 else 1.0
    variant_kind = {shapes[id(p)].drafter: p.kind for p in accepting}
    draft: dict[str, float] = {}
    for variant in sorted(variant_kind):
        ks = np.array([p.k for p in accepting if shapes[id(p)].drafter == variant], dtype=float)
        ds = np.array([p.draft_ms for p in accepting if shapes[id(p)].drafter == variant])
        draft[variant] = float(ks @ ds / (ks @ ks))
    skip = [p for p in accepting if p.kind == "layer_skip" and shapes[id(p)].layers]
    per_layer = None
    if skip:
        x = np.array([p.k * shapes[id(p)].layers for p in skip], dtype=float)
        per_layer = float(x @ np.array([p.draft_ms for p in skip]) / (x @ x))
    kind_draft = {
        kind: float(np.mean([c for v, c in draft.items() if variant_kind[v] == kind])) for kind in sorted(set(variant_kind.values()))
    }
    # each trial's rest against the fitted verify pass (what a prediction adds it to)
    base = [verify_fit.ms(shapes[id(p)]) + p.draft_ms for p in points]
    rest = fit_rest(points, shapes, [_effective_step(p) - b for p, b in zip(points, base)])
    plain = [verify_ms_of(p) for p in points if p.k == 0]
    plain_verify = float(np.median(plain)) if plain else float(np.median([verify_fit.ms(replace(x, width=1)) for x in shapes.values()]))
    return ConfigModel(
        verify_fit, rates, coverage, key_kind, key_proposer, draft, per_layer, kind_draft, rest, fit_outside(points, shapes), plain_verify
    )


@dataclass(frozen=True)
class ConfigPrediction:
    """One configuration left out of the fit: its pooled measurement and the model's prediction."""

    shape: ConfigShape
    trials: tuple[int | None, ...]
    measured: float  # decode tok/s, median over its trials
    predicted: float | None  # None: a miss
    how: str  # the estimate's basis, or why it is a miss

    @property
    def error(self) -> float:
        """|predicted - measured| / measured; a miss counts as 1.0 (100%), above any goal."""
        return 1.0 if self.predicted is None else abs(self.predicted - self.measured) / self.measured


def config_loo(points: list[TrialPoint], pruned: list[TrialPoint] = ()) -> list[ConfigPrediction]:
    """Leave one configuration out: each configuration (its trials pooled) predicted by a fit on the
    other configurations only, its acceptance included (from the same acceptance key at other k, and
    the geometric rule past the measured positions; `pruned`: PRUNED trials of other configurations
    lend their per-position acceptance, `fit_configs`); no priors, so what only they could give is a miss."""
    groups: dict[ConfigShape, list[TrialPoint]] = {}
    for p in points:
        groups.setdefault(p.shape, []).append(p)
    out = []
    for shape, mine in groups.items():
        measured = float(np.median([p.throughput for p in mine]))
        trials = tuple(p.trial for p in mine)
        others = [p for p in points if p.shape != shape]
        if not others:
            out.append(ConfigPrediction(shape, trials, measured, None, "no other configuration to fit on"))
            continue
        est = fit_configs(others, [p for p in pruned if p.shape != shape]).predict(shape)
        if isinstance(est, Miss):
            out.append(ConfigPrediction(shape, trials, measured, None, est.reason))
        else:
            out.append(ConfigPrediction(shape, trials, measured, est.decode_tok_s, est.basis))
    return out


def config_loo_error(preds: list[ConfigPrediction]) -> float:
    """Median error over configurations, misses counted as 100% (NaN: none)."""
    return float(np.median([x.error for x in preds])) if preds else float("nan")
