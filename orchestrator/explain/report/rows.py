"""One row per COMPLETE trial, as the report reads it: its configuration in words, the objective
with its noise band, accepted length against breakeven, and its time per generated token split
into draft / verify compute / allreduce / the rest.

The noise band shown per row is median +- MAD of its repeats; whether a row is within noise of the
best is the study's one rule (orchestrator/search/ranking.py: trials of one configuration pooled, noise
estimated from every configuration measured twice), stored on the row as `within_noise`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.record import CO_RUNNING_ATTR
from orchestrator.search.points import setup_of
from orchestrator.search.ranking import rank
from orchestrator.tracking.runs import config_label, label_defaults


@dataclass
class Row:
    number: int
    label: str  # config_label: "ngram k=6 gloo tp2"
    params: dict
    value: float  # the Optuna objective: throughput_tok_s (median - mad_penalty x MAD over repeats)
    median: float | None  # throughput_tok_s median over repeats (None: one repeat)
    mad: float  # median absolute deviation over repeats (0 with one repeat)
    repeats: int
    k: int
    kind: str  # drafter kind, "plain" for k = 0
    backend: str
    env: str  # allreduce setup (perfmodel.env_label)
    tp: int
    accept_len: float
    decode_tok_s: float | None
    step_ms: float | None
    verify_ms: float | None
    draft_ms: float
    comm_ms: float  # allreduce per step, measured by the step timed with and without it (0 at tp 1)
    comm_fraction: float | None
    breakeven: float | None = None
    breakeven_source: str = ""  # "measured" (step / plain step of the same setup) or "model"
    speedup: float | None = None
    per_token: dict[str, float] = field(default_factory=dict)  # ms per generated token by part
    within_noise: bool | None = None  # of the best row's configuration (ranking.py); None: noise unknown
    # its configuration as ranking.py pools it: trials that ran it, median over all their repeats
    config: int | None = None
    pooled_trials: list[int] = field(default_factory=list)
    pooled_median: float | None = None
    pooled_n: int = 0
    pooled_speedup: float | None = None  # pooled median over the plain baseline's pooled median (same TP)
    co_running: list[int] = field(default_factory=list)  # trials measured at the same time on its host
    # why, from every trial of its configuration (medians), not from this trial alone: what the verdict explains with
    why_accept_len: float | None = None
    why_breakeven: float | None = None
    why_comm_fraction: float | None = None

    @property
    def trials_text(self) -> str:
        """ "trial 4", or "trials 4, 9" where its configuration ran in several."""
        trials = self.pooled_trials if len(self.pooled_trials) > 1 else [self.number]
        return ("trials " if len(trials) > 1 else "trial ") + ", ".join(map(str, trials))

    @property
    def band(self) -> tuple[float, float]:
        return noise_band(self)


def noise_band(row: Row) -> tuple[float, float]:
    """The range the objective is known to: median +- MAD of the per-repeat throughput_tok_s
    (one repeat: the value itself, no band)."""
    if row.median is None or row.repeats < 2:
        return row.value, row.value
    return row.median - row.mad, row.median + row.mad


def within_noise(best: Row, other: Row) -> bool | None:
    """`other` cannot be told apart from `best` by these measurements (None: the noise is unknown,
    no configuration was measured twice). Set by `rows_of` from the study's ranking."""
    return True if other is best else other.within_noise


PARTS = ("draft", "verify compute", "allreduce", "rest")


def per_token_split(step_ms: float | None, verify_ms: float | None, draft_ms: float, comm_ms: float, accept_len: float) -> dict[str, float]:
    """ms per generated token of each part of a step: the step's p50 parts divided by the tokens a
    step emits (accepted length). A step = draft + verify (compute + allreduce) + the rest (link
    messages, verification logic); perfmodel.py uses the same split. Medians of the parts need not
    add up to the median step: where draft + verify exceed it, both are scaled down to fit, so the
    parts always sum to the step."""
    if not step_ms or accept_len <= 0:
        return {}
    verify = verify_ms if verify_ms is not None else step_ms - draft_ms
    scale = min(1.0, step_ms / (verify + draft_ms)) if verify + draft_ms > 0 else 1.0
    verify, draft, comm = verify * scale, draft_ms * scale, min(comm_ms, verify * scale)
    parts = {"draft": draft, "verify compute": verify - comm, "allreduce": comm, "rest": step_ms - verify - draft}
    return {name: ms / accept_len for name, ms in parts.items()}


def rows_of(trials, cfg, model=None) -> list[Row]:
    """Rows of the COMPLETE `trials`, best objective first. Breakeven: the trial's step over the
    plain step measured under the same allreduce setup, else the performance model's estimate."""
    rows = []
    for t in trials:
        u, p = t.user_attrs, t.params
        k = int(p.get("spec.num_draft_tokens", cfg.drafter.num_draft_tokens))
        tp, env, _, _ = setup_of(cfg, p)
        repeats = int(u.get("repeats", 1))
        comm = float(u.get("comm_ms_per_step", 0.0) or 0.0) if tp > 1 else 0.0
        row = Row(
            number=t.number,
            label=config_label({**label_defaults(cfg), **p}),
            params=dict(p),
            value=float(u.get("objective_b1", t.value)),  # batch 1's (a study of several batch sizes: the batch section)
            median=u.get("throughput_median") if repeats > 1 else None,
            mad=float(u.get("throughput_mad", 0.0)) if repeats > 1 else 0.0,
            repeats=repeats,
            k=k,
            kind=str(p.get("drafter.kind", cfg.drafter.kind)) if k else "plain",
            backend=str(p.get("comm.backend", cfg.parallel.backend)),
            env=env,
            tp=tp,
            accept_len=float(u.get("accept_len_mean", 1.0)),
            decode_tok_s=u.get("decode_tok_s"),
            step_ms=u.get("step_ms_p50"),
            verify_ms=u.get("verify_ms_p50"),
            draft_ms=float(u.get("draft_ms_p50", 0.0) or 0.0),
            comm_ms=comm,
            comm_fraction=u.get("comm_fraction"),
            speedup=u.get("speedup_vs_baseline"),
            co_running=[int(n) for n in u.get(CO_RUNNING_ATTR) or []],
        )
        row.per_token = per_token_split(row.step_ms, row.verify_ms, row.draft_ms, row.comm_ms, row.accept_len)
        rows.append(row)
    plain: dict[str, Row] = {}  # the best plain trial of each allreduce setup: the step speculation must beat
    for r in sorted(rows, key=lambda r: -r.value):
        if r.k == 0 and r.step_ms:
            plain.setdefault(r.env, r)
    for r in rows:
        if r.k == 0:
            r.breakeven, r.breakeven_source = 1.0, "measured"
        elif r.step_ms and r.env in plain:
            r.breakeven, r.breakeven_source = r.step_ms / plain[r.env].step_ms, "measured"
        elif model is not None and r.env in model.envs:
            r.breakeven, r.breakeven_source = model.breakeven(r.env, r.kind, r.k), "model"
    rows.sort(key=lambda r: (-r.value, r.number))
    if rows:
        ranking = rank(trials)
        for r in rows:
            i = ranking.config_of(r.number)
            r.within_noise = None if i is None else ranking.within_noise(i, 0)
            if i is not None:
                c = ranking.configs[i]
                r.config, r.pooled_trials, r.pooled_median, r.pooled_n, r.pooled_speedup = i, c.trials, c.median, c.n, c.speedup_vs_baseline
        # ranked as the study's ranking, the summary and `export` rank: by configuration (pooled median), the trials of
        # one configuration together in trial order (those it pooled first: a trial measured beside others is left out
        # where its configuration was measured alone), so the first row is the winner's first trial, the trial they name
        rows.sort(key=lambda r: (r.config if r.config is not None else len(rows) + 1, r.number not in r.pooled_trials, r.number))
        pool_whys(rows)
    return rows


def pool_whys(rows: list[Row]) -> None:
    """Each row's why from every trial of its configuration (medians): accepted length, allreduce share, and
    breakeven = the pooled step over the pooled plain step of the same setup (the model's estimate stays
    where no plain trial ran that setup). One trial's timing is noise; a configuration's is the measurement."""
    import numpy as np

    def med(xs):
        xs = [x for x in xs if x is not None]
        return float(np.median(xs)) if xs else None

    plain = {env: med([r.step_ms for r in rows if r.k == 0 and r.env == env]) for env in {r.env for r in rows}}
    groups: dict[object, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.config if r.config is not None else ("trial", r.number), []).append(r)
    for members in groups.values():
        accept = med([m.accept_len for m in members])
        step = med([m.step_ms for m in members])
        comm = med([m.comm_fraction for m in members])
        for m in members:
            m.why_accept_len, m.why_comm_fraction = accept, comm
            if m.k == 0:
                m.why_breakeven = 1.0
            elif step and plain.get(m.env):
                m.why_breakeven = step / plain[m.env]
            else:
                m.why_breakeven = m.breakeven
