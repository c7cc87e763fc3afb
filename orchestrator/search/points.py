"""The points both performance models fit: one configuration as the models see it (`ConfigShape`),
one measured trial (`TrialPoint`), and the adapters from a study's trials to them (`trial_points`
for the step model of orchestrator/explain/perfmodel.py, `config_shape` / `config_points` for the
configuration model of orchestrator/search/config_model.py). Pure: no Optuna, no storage."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.emulation import deployed_tp
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.space import trial_config
from orchestrator.search.ranking import median_mad, trial_params, trial_samples
from workers.spec import tree_size, width_metric


def env_label(tp: int, backend: str, nccl: str = "default") -> str:
    """One allreduce setup, e.g. "tp2 nccl NCCL_PROTO=LL"; `nccl` as bench-allreduce labels it
    ("A=1,B=2" sorted by name, "default" for none)."""
    return f"tp{tp} {backend}" + ("" if nccl in ("", "default") else f" {nccl}")


@dataclass(frozen=True)
class ConfigShape:
    """What the model needs to know of one configuration, measured or not."""

    env: str  # the verify pass's setup: env_label of TP, backend and settings (NCCL variables, searched engine options)
    family: str  # TP size and backend, e.g. "tp2 gloo"
    settings: tuple[str, ...]  # "NCCL_X=v", "engine.gemv=off"
    tp: int
    kind: str  # drafter kind, "none" at k = 0
    drafter: str  # drafter variant: kind and its parameters (what one draft costs)
    acceptance: str  # what decides acceptance: the proposer under the setup's engine settings (their numerics
    # pick the greedy text among near ties, and a short workload's acceptance follows the text)
    k: int
    width: int  # tokens one verify pass scores per sequence: k + 1, or a tree's nodes + 1
    layers: int = 0  # layer_skip: the verifier's layers that draft
    simulated: float | None = None  # the workload's imposed accepted length tau: every drafter accepts 1 + min(k, tau - 1)
    simulated_profile: tuple[float, ...] = ()  # or its imposed P(accepted >= i): accepts 1 + sum_{i<=k} P_i
    in_verifier: bool = False  # the drafter runs inside the verifier ranks (no draft-link messages)
    proposer: str = ""  # the variant less where it runs: what it proposes (default: `acceptance`)


@dataclass(frozen=True)
class TrialPoint:
    env: str  # env_label(...)
    kind: str  # drafter kind ("none" for k = 0)
    k: int
    step_ms: float
    accept_len: float
    throughput: float
    accept_rates: tuple[float, ...] = ()  # accept_rate_pos_1..k
    verify_ms: float | None = None  # default: step_ms - draft_ms
    draft_ms: float = 0.0
    tp: int = 0  # TP size of `env` (groups the compute constant)
    comm_ms: float | None = None  # allreduce time per step the trial measured (comm_ms_per_step)
    trial: int | None = None  # Optuna trial number, for reports
    family: str = ""  # TP size and backend, e.g. "tp2 nccl" (default: parsed from env)
    settings: tuple[str, ...] = ()  # the NCCL variables of env, "NCCL_X=v" (default: parsed from env)
    # the configuration as the configuration model sees it (None: env, kind and k speak for it)
    config: ConfigShape | None = None
    objective: float | None = None  # the study's throughput (prefill included), throughput_tok_s
    width_ms: tuple[tuple[int, float], ...] = ()  # (width, ms of one verify pass): the setup's profile (verify_ms_w<W>)

    @property
    def shape(self) -> ConfigShape:
        if self.config is not None:
            return self.config
        family, settings = point_parts(self)
        return ConfigShape(self.env, family, settings, self.tp, self.kind, self.kind, self.kind, self.k, self.k + 1)


def parse_env(env: str) -> tuple[str, tuple[str, ...]]:
    """(family, NCCL settings) of an env label: "tp2 nccl A=1,B=2" -> ("tp2 nccl", ("A=1", "B=2"))."""
    words = env.split(" ")
    n = 2 if len(words) > 1 and words[0].startswith("tp") and words[0][2:].isdigit() else 1
    rest = " ".join(words[n:])
    return " ".join(words[:n]), tuple(sorted(x for x in rest.split(",") if "=" in x))


def point_parts(p: TrialPoint) -> tuple[str, tuple[str, ...]]:
    return (p.family, tuple(sorted(p.settings))) if p.family else parse_env(p.env)


def verify_ms_of(p: TrialPoint) -> float:
    """A point's verify pass: recorded, or its step less its drafts."""
    return p.verify_ms if p.verify_ms is not None else p.step_ms - p.draft_ms


WIDTH_PREFIX = width_metric(0)[:-1]  # "verify_ms_w"


def setup_of(cfg: ExperimentConfig, params: dict) -> tuple[int, str, str, tuple[str, ...]]:
    """(TP size, env label, family, NCCL settings) of a trial: the TP it deploys at (an emulated TP
    included), its backend and, for nccl, every NCCL variable it ran with (the label names the setup; family and settings let the model share terms)."""
    tp, backend = deployed_tp(params, cfg), str(params.get("comm.backend", cfg.parallel.backend))
    nccl = {**cfg.parallel.nccl_env, **{k.removeprefix("nccl."): v for k, v in params.items() if k.startswith("nccl.")}}
    settings = tuple(f"{k}={v}" for k, v in sorted(nccl.items())) if backend == "nccl" else ()
    return tp, env_label(tp, backend, ",".join(settings) or "default"), env_label(tp, backend), settings


def trial_points(trials, cfg: ExperimentConfig) -> list[TrialPoint]:
    points = []
    for t in trials:
        u, p = t.user_attrs, trial_params(t)  # resolved: a fixed k or drafter counts as much as a searched one
        if "step_ms_p50" not in u:
            continue
        k = int(p.get("spec.num_draft_tokens", cfg.drafter.num_draft_tokens))
        rates = tuple(u[f"accept_rate_pos_{i}"] for i in range(1, k + 1) if f"accept_rate_pos_{i}" in u)
        tp, env, family, settings = setup_of(cfg, p)
        points.append(
            TrialPoint(
                env=env,
                kind=p.get("drafter.kind", cfg.drafter.kind) if k else "none",
                k=k,
                step_ms=u["step_ms_p50"],
                accept_len=u.get("accept_len_mean", 1.0),
                throughput=u.get("decode_tok_s", u.get("throughput_tok_s", t.value)),
                accept_rates=rates,
                verify_ms=u.get("verify_ms_p50"),
                draft_ms=u.get("draft_ms_p50", 0.0),
                tp=tp,
                comm_ms=u.get("comm_ms_per_step") if tp > 1 else None,
                trial=t.number,
                family=family,
                settings=settings,
            )
        )
    return points


def config_shape(tc, cfg: ExperimentConfig) -> ConfigShape:
    """The model's view of one configuration (a `space.TrialConfig`): its setup (TP size, backend,
    NCCL variables and the engine options the space searches), its drafter variant (kind and every
    drafter parameter), its proposer (the variant less `placement`: where a drafter runs changes what
    a draft costs, not what it proposes), its acceptance key (the proposer under the searched engine
    options, whose numerics pick the greedy text among near ties), k and the verify width."""
    params = tc.params()
    tp, _, family, nccl = setup_of(cfg, params)
    engine = tuple(f"{n}={params[n]}" for n in sorted(cfg.search.space) if n.startswith("engine.") and n in params)
    settings = nccl + engine
    k = tc.num_draft_tokens
    drafter = proposer = acceptance = "none"
    if k:
        own = [(n.removeprefix("drafter."), v) for n, v in sorted(params.items()) if n.startswith("drafter.") and n != "drafter.kind"]
        drafter = " ".join([tc.drafter.kind] + [f"{n}={v}" for n, v in own])
        proposer = " ".join([tc.drafter.kind] + [f"{n}={v}" for n, v in own if n != "placement"])
        acceptance = " ".join([proposer, *engine])
    return ConfigShape(
        env=env_label(tp, str(params["comm.backend"]), ",".join(settings) or "default"),
        family=family,
        settings=settings,
        tp=tp,
        kind=tc.drafter.kind if k else "none",
        drafter=drafter,
        acceptance=acceptance,
        proposer=proposer,
        k=k,
        width=(tree_size(k, tc.drafter.tree_width) + 1) if k else 1,
        layers=tc.drafter.layers if tc.drafter.kind == "layer_skip" else 0,
        simulated=cfg.workload.simulate_accept_len,
        simulated_profile=cfg.workload.profile_for(tc.drafter.kind) or (),
        in_verifier=k > 0 and tc.drafter.in_verifier,
    )


def config_point(shape: ConfigShape, u: dict, objective: float | None, trial: int | None = None) -> TrialPoint | None:
    """A measured configuration as a point of the configuration model: `u` holds the trial's metrics
    (its Optuna user attrs); None without step timings."""
    if "step_ms_p50" not in u:
        return None
    rates = tuple(float(u[f"accept_rate_pos_{i}"]) for i in range(1, shape.k + 1) if f"accept_rate_pos_{i}" in u)
    return TrialPoint(
        env=shape.env,
        kind=shape.kind,
        k=shape.k,
        step_ms=float(u["step_ms_p50"]),
        accept_len=float(u.get("accept_len_mean", 1.0)),
        throughput=float(u.get("decode_tok_s", u.get("throughput_tok_s", objective or 0.0))),
        accept_rates=rates,
        verify_ms=u.get("verify_ms_p50"),
        draft_ms=float(u.get("draft_ms_p50", 0.0)),
        tp=shape.tp,
        comm_ms=u.get("comm_ms_per_step") if shape.tp > 1 else None,
        trial=trial,
        family=shape.family,
        settings=shape.settings,
        config=shape,
        objective=objective,
        width_ms=width_profile(u),
    )


def width_profile(u: dict) -> tuple[tuple[int, float], ...]:
    """A trial's verify pass per width (its `verify_ms_w<W>` metrics, workers/spec.py width_metric)."""
    widths = (int(key[len(WIDTH_PREFIX) :]) for key in u if key.startswith(WIDTH_PREFIX) and key[len(WIDTH_PREFIX) :].isdigit())
    return tuple(sorted((w, float(u[width_metric(w)])) for w in widths))


def config_points(trials, cfg: ExperimentConfig) -> list[TrialPoint]:
    """COMPLETE trials as points of the configuration model, labelled by `config_shape` (a trial whose
    parameters do not resolve under `cfg`'s space is left out)."""
    points = []
    for t in trials:
        try:
            shape = config_shape(trial_config(t, cfg), cfg)
        except Exception:  # noqa: BLE001 - a trial of another space
            continue
        samples = trial_samples(t)
        if (p := config_point(shape, t.user_attrs, median_mad(samples)[0] if samples else None, t.number)) is not None:
            points.append(p)
    return points
