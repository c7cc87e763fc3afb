"""`spectune report EXP.yaml`: why the winner wins.

Prints and saves (a self-contained HTML file, its path printed; both also logged to the study's
parent MLflow run, the charts as PNGs under report/charts): a verdict paragraph (the winner by
configuration, its accepted length against its breakeven, its allreduce share, the runner-up and
whether it is within noise), a table of the trials (objective with noise band, accepted length,
breakeven, comm fraction, ms per generated token by part), charts labelled by configuration,
parameter importances, the performance model (orchestrator/explain/perfmodel.py):
which allreduce term it used per setup (bench-derived from an allreduce table, or fitted), its
prediction of every trial left out of the fit and the median error, the breakeven accepted length of
each allreduce setup (untried ones of the table too), what-if estimates at other TP sizes and
interconnects (labelled as estimates), the winner's allreduce in each serving engine and what an engine
without it keeps of the win (engines.py), and the best configuration as a ready-to-use YAML snippet.

    spectune report experiments/smoke-cpu.yaml [--set study.storage=...] [--out DIR] [--bench bench.json]

The allreduce table is `--bench FILE` (a `spectune bench-allreduce --json` output), else the one
`study.bench_allreduce` logged to the study's parent MLflow run, else none (every term fitted).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import yaml

from orchestrator.config import emulation
from orchestrator.config.registry import set_yaml
from orchestrator.config.schema import ExperimentConfig, spectune_home, validated
from orchestrator.errors import UserError
from orchestrator.explain.perfcheck import bench_comm, config_model_facts, load_bench_rows, model_summary, open_study
from orchestrator.explain.perfmodel import (
    BenchComm,
    latency_us,
    what_if_interconnect,
    what_if_tp,
)
from orchestrator.explain.report.batches import batch_chart, batch_sentences, batch_summary
from orchestrator.explain.report.charts import all_charts
from orchestrator.explain.report.contexts import context_sentences, context_summary
from orchestrator.explain.report.engines import engine_sentences, engine_summary
from orchestrator.explain.report.moe import moe_sentences, moe_summary
from orchestrator.explain.report.page import render
from orchestrator.explain.report.rows import Row, rows_of, within_noise
from orchestrator.explain.report.verdict import terminal_text, verdict
from orchestrator.export.schedule import build_schedule
from orchestrator.record import IMPORTANCE_MIN_TRIALS, OBJECTIVE
from orchestrator.search.points import trial_points
from orchestrator.search.ranking import rank
from orchestrator.tracking.runs import config_label, label_defaults, rounded


def best_study_name(cfg: ExperimentConfig) -> str:
    """The study `best_config.yaml` runs: a study of its own (its fixed part is not the searched
    study's, which would refuse it on resume), in an MLflow experiment of its own."""
    return f"{cfg.study_name}-best"


def best_yaml(cfg: ExperimentConfig, params: dict) -> str:
    """The experiment with its search space replaced by the winner's values, as `spectune run` takes it
    as it is: a study of its own (`best_study_name`), one trial of the winner, in the default stores
    (`--set study.storage=... --set tracking.uri=...` for others)."""
    raw = cfg.model_dump(mode="json", exclude_none=True)
    if src := raw["workload"].pop("simulate_accept_profile_from", None):  # the profile as the YAML named it: its file(s)
        raw["workload"]["simulate_accept_profile"] = {**raw["workload"]["simulate_accept_profile"], **src} if isinstance(src, dict) else src
    for name, value in params.items():  # each searched parameter into its YAML place (orchestrator/config/registry.py)
        set_yaml(raw, name, value)
    k = raw["drafter"]["num_draft_tokens"]
    raw["search"] = {"space": {"spec.num_draft_tokens": k}}
    # one trial of the winner (plus nothing to compare); the default stores (a storage URL may hold a password)
    raw["study"] = {"name": best_study_name(cfg), "n_trials": 1, "baseline": k == 0}
    for key in ("tracking", "limits"):
        raw.pop(key, None)
    validated(json.loads(json.dumps(raw)), "best_config.yaml: ")  # what it writes, `spectune run` accepts
    return yaml.safe_dump(raw, sort_keys=False)


def config_words(cfg: ExperimentConfig, params: dict) -> str:
    """A configuration in a few words: the report's label and the searched engine options it sets."""
    engine = " ".join(f"{n.split('.', 1)[1]}={params[n]}" for n in sorted(cfg.search.space) if n.startswith("engine.") and n in params)
    return config_label({**label_defaults(cfg), **params}) + (f" {engine}" if engine else "")


def interconnect_what_ifs(trial, comm: BenchComm, label: str) -> dict[str, str]:
    """ESTIMATES of `trial`'s step under every (backend, env) of a bench-allreduce table, e.g. a
    PCIe stand-in (NCCL_P2P_DISABLE=1): measured compute + rounds x that setup's latency."""
    u = trial.user_attrs
    comm_ms, step = u.get("comm_ms_per_step"), u.get("step_ms_p50")
    rounds = u.get("allreduce_per_step") or comm.rounds  # graphed steps count no calls
    if comm_ms is None or not step:
        return {}
    k = int(trial.params.get("spec.num_draft_tokens", 0))
    size = comm.size(k)
    out = {}
    for backend, env in sorted({(r["backend"], r["env"]) for r in comm.rows}):
        lat = latency_us(comm.rows, backend, env, size, comm.mode)
        if lat is None:
            lat = latency_us(comm.rows, backend, env, size, "eager" if comm.mode == "graph" else "graph")
        if lat is not None and (est := what_if_interconnect(step, comm_ms, rounds, lat)) > 0:
            out[f"estimate: {label} with its allreduces over {backend} {env} ({lat:.1f} us x {rounds:g} allreduces of {size} B)"] = (
                f"step {est:.2f} ms, about {u.get('accept_len_mean', 1.0) * 1000 / est:.1f} decode tok/s"
            )
    return out


def tp_what_ifs(row: Row) -> dict[str, str]:
    """ESTIMATES of `row`'s step at other TP sizes: compute scales as tp / tp_to (each rank streams
    1/tp of the weights); at TP 1 there is no allreduce, elsewhere each allreduce is assumed to cost
    what it costs now."""
    out = {}
    if not row.step_ms:
        return out
    for tp_to in sorted({1, 2, 4, 8} - {row.tp}):
        comm_to = 0.0 if tp_to == 1 else row.comm_ms
        est = what_if_tp(row.step_ms, row.comm_ms, row.tp, tp_to, comm_to)
        if est <= 0:  # the measured allreduce time covers the whole step: nothing left to scale
            continue
        how = "no allreduce" if tp_to == 1 else "each allreduce as slow as now"
        out[f"estimate: {row.label} at TP {tp_to} ({how})"] = f"step {est:.2f} ms, about {row.accept_len * 1000 / est:.1f} decode tok/s"
    return out


def hidden_size(cfg: ExperimentConfig) -> int | None:
    """The model's hidden size (the allreduce message per token), None where its config cannot be read."""
    try:
        from workers.model.locate import load_args, resolve_model_path

        return load_args(resolve_model_path(cfg.model.path)).dim
    except (OSError, ValueError):
        return None


def build_report(cfg: ExperimentConfig, study, out_dir: Path, bench_rows: list[dict] | None = None) -> tuple[str, Path, dict]:
    """Writes report.html, charts/*.png, best_config.yaml and summary.json to `out_dir`; returns
    (terminal text, the HTML path, the summary)."""
    from optuna.trial import TrialState

    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if not done:
        raise UserError(f"study {cfg.study_name!r} has no COMPLETE trial yet: run `spectune run` first")
    try:
        import warnings

        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "some regimes have less than 2 trials": expected in small studies
            importances = optuna.importance.get_param_importances(study) if len(done) >= IMPORTANCE_MIN_TRIALS else {}
    except Exception:  # noqa: BLE001 - needs varied params
        importances = {}
    points = trial_points(done, cfg)
    comm, note = bench_comm(cfg, bench_rows)
    model, preds, facts = model_summary(points, comm, note)
    rows = rows_of(done, cfg, model)
    best = rows[0]
    base = next((r for r in rows if r.k == 0), None)
    by_number = {t.number: t for t in done}
    ranking = rank(done)
    one_gang = ranking.noise_one_gang
    winner = ranking.configs[0] if ranking.configs else None
    summary = {
        "study": cfg.study_name,
        "objective": OBJECTIVE,
        "complete_trials": len(done),
        # the winning configuration (the ranking's, pooled over its trials), named by its first trial as the study's
        # summary and `export` name it, and every trial that measured it
        # emulated TP (parallel.emulate_tp): every figure is one rank's compute plus a table's allreduce waits
        "emulated": emulation.report_line(cfg),
        "best_trial": best.number,
        "best_trials": best.pooled_trials or [best.number],
        "best_label": best.label,
        "best_value": best.value,
        "best_pooled_median": best.pooled_median,
        # the figures `spectune run`'s summary and `spectune export` give, from the study's one ranking
        # (orchestrator/search/ranking.py): the winner's pooled median over the plain baseline's, and the noise
        # of one measurement at that median (sigma; None where no configuration was measured twice)
        "best_speedup_vs_plain": None if winner is None or winner.speedup_vs_baseline is None else round(winner.speedup_vs_baseline, 3),
        "noise_rel": ranking.noise_rel,
        "best_noise_band_tok_s": None if winner is None or ranking.noise_rel is None else round(ranking.noise_rel * winner.median, 2),
        "best_params": best.params,
        "verdict": verdict(rows, one_gang),
        "noise_one_gang": one_gang,
        "runners_up_within_noise": sorted(
            {r.pooled_trials[0] if r.pooled_trials else r.number for r in rows[1:] if r.config != best.config and within_noise(best, r)}
        ),
        "trials": [{**asdict(r), "band": list(r.band)} for r in rows],
        "importances": importances,
        # pooled over each configuration's trials, as the verdict says them
        "comm_fraction_baseline": (base.why_comm_fraction if base.why_accept_len is not None else base.comm_fraction) if base else None,
        "comm_fraction_best": best.why_comm_fraction if best.why_accept_len is not None else best.comm_fraction,
        **facts,
        **config_model_facts(done, cfg, lambda p: config_words(cfg, p), pruned=[t for t in study.trials if t.state == TrialState.PRUNED]),
        "breakeven": {},
        "what_if": {},
    }
    if model is not None:
        ks = sorted({p.k for p in points if p.k > 0}) or [4]
        for env in model.envs:
            for kind in model.kinds:
                summary["breakeven"][f"{env} | {kind}"] = {k: round(model.breakeven(env, kind, k), 3) for k in ks}
    # an MoE verifier: its verify pass against its width, the breakeven per k, where the expert union costs a k
    summary["moe"] = moe_summary(done, model, cfg, points)
    for r in [x for x in (base, best) if x is not None and x.tp > 1][:1]:
        summary["what_if"].update(tp_what_ifs(r))
    if comm is not None:
        for r in ([base] if base is not None and base is not best else []) + [best]:
            summary["what_if"].update(interconnect_what_ifs(by_number[r.number], comm, r.label))
    summary["batches"] = batch_summary(study, hidden_size(cfg), cfg.model.dtype)
    # the winner's allreduce in each serving engine, and what an engine without it keeps of the win
    schedule = build_schedule(study, dtype=cfg.model.dtype)
    summary["engines"] = engine_summary(schedule)
    prompt_tokens = next((int(t.user_attrs["prompt_tokens_median"]) for t in done if "prompt_tokens_median" in t.user_attrs), None)
    summary["contexts"] = context_summary(schedule, prompt_tokens)
    text = terminal_text(cfg.study_name, rows, summary)
    if summary["emulated"]:
        text = f"{summary['emulated']}\n{text}"
    if summary["batches"] is not None:
        text += "\n" + "\n".join(batch_sentences(summary["batches"]))
    if summary["engines"] is not None:
        text += "\n" + "\n".join(engine_sentences(summary["engines"]))
    if summary["contexts"] is not None:
        text += "\n" + "\n".join(context_sentences(summary["contexts"]))
    if summary["moe"] is not None:
        text += "\n" + "\n".join(moe_sentences(summary["moe"]))
    snippet = best_yaml(cfg, best.params)
    out_dir.mkdir(parents=True, exist_ok=True)
    charts = all_charts(rows, model, preds)
    if summary["batches"] is not None and (chart := batch_chart(study)) is not None:
        charts["batches"] = chart
    (out_dir / "charts").mkdir(exist_ok=True)
    for name, data in charts.items():
        (out_dir / "charts" / f"{name}.png").write_bytes(data)
    path = out_dir / "report.html"
    path.write_text(render(cfg.study_name, rows, summary, snippet, charts))
    (out_dir / "best_config.yaml").write_text(snippet)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return text + "\n\nbest config:\n" + snippet, path, summary


def log_report(client, run_id: str, out_dir: Path, summary: dict) -> None:
    """The report's files on the study's parent MLflow run: report/ (page, YAML, summary) and
    report/charts/ (each chart as a PNG, so the MLflow UI shows them without opening the page)."""
    for name in ("report.html", "best_config.yaml", "summary.json"):
        client.log_artifact(run_id, str(out_dir / name), artifact_path="report")
    for png in sorted((out_dir / "charts").glob("*.png")):
        client.log_artifact(run_id, str(png), artifact_path="report/charts")
    if summary["model_loo_median_rel_error"] == summary["model_loo_median_rel_error"]:
        client.log_metric(run_id, "perf_model_loo_error", rounded(summary["model_loo_median_rel_error"]))
    if summary.get("model_config_loo_median_rel_error") == summary.get("model_config_loo_median_rel_error"):
        client.log_metric(run_id, "perf_model_config_loo_error", rounded(summary["model_config_loo_median_rel_error"]))


def report(cfg: ExperimentConfig, out: str | None, log=None, bench: str | None = None, echo: bool = True) -> dict:
    """Build the report (in `out`, default $SPECTUNE_HOME/reports/<study>), print its text (`echo`),
    log its files and charts to the study's parent MLflow run."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    study = open_study(cfg)
    out_dir = Path(out) if out else spectune_home() / "reports" / cfg.study_name
    rows = load_bench_rows(cfg, study, bench)
    text, path, summary = build_report(cfg, study, out_dir, rows)
    if echo:
        print(text)
    log(f"spectune: report written to {path}")
    run_id = study.user_attrs.get("mlflow_parent_run_id")
    if run_id:
        try:
            from mlflow.tracking import MlflowClient

            from orchestrator.tracking.runs import resolve_uri

            log_report(MlflowClient(tracking_uri=resolve_uri(cfg.tracking.uri, spectune_home())), run_id, out_dir, summary)
        except Exception as e:  # noqa: BLE001 - the files on disk are the report; MLflow is a copy
            log(f"spectune: could not log the report to MLflow run {run_id}: {type(e).__name__}: {e}")
    summary["html"] = str(path)
    return summary


def after_run(cfg: ExperimentConfig, log=None) -> None:
    """At the end of `spectune run`: the report written and logged to the parent run (its charts
    under report/charts), so the MLflow UI explains the winner without a `spectune report`. A
    failure here is one line: the study's results stand without it."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        report(cfg, None, log=log, echo=False)
    except Exception as e:  # noqa: BLE001 - `spectune report` can build it later
        log(f"spectune: no report this time ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})")
