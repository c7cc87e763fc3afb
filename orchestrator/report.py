"""`spectune report EXP.yaml`: why the winner wins.

Prints and saves (a self-contained HTML file, its path printed; both also logged to the study's
parent MLflow run): the best configuration, the runners-up within noise, parameter importances,
the comm_fraction of the baseline and of the best, the performance model (orchestrator/perfmodel.py):
which allreduce term it used per setup (bench-derived from an allreduce table, or fitted), its
prediction of every trial left out of the fit and the median error, the breakeven accepted length of
each allreduce setup (untried ones of the table too), what-if estimates at other TP sizes and
interconnects (labelled as estimates), and the best configuration as a ready-to-use YAML snippet.

    spectune report experiments/smoke-cpu.yaml [--set study.storage=...] [--out DIR] [--bench bench.json]

The allreduce table is `--bench FILE` (a `spectune bench-allreduce --json` output), else the one
`study.bench_allreduce` logged to the study's parent MLflow run, else none (every term fitted).
"""
from __future__ import annotations

import base64
import html
import io
import json
import sys
from pathlib import Path

import yaml

from orchestrator.config import ExperimentConfig, spectune_home
from orchestrator.errors import UserError
from orchestrator.perfcheck import bench_comm, load_bench_rows, model_summary, open_study, trial_points
from orchestrator.perfmodel import BenchComm, latency_us, what_if_interconnect, what_if_tp


def best_yaml(cfg: ExperimentConfig, params: dict) -> str:
    """The experiment with its search space replaced by the winner's values: ready for `spectune decode`-like reuse."""
    raw = cfg.model_dump(mode="json", exclude_none=True)
    k = params.get("spec.num_draft_tokens", raw["drafter"].get("num_draft_tokens"))
    raw["drafter"]["num_draft_tokens"] = k
    for key, section, field in (("drafter.kind", "drafter", "kind"), ("drafter.layers", "drafter", "layers"),
                                ("drafter.ngram_max", "drafter", "ngram_max"), ("drafter.model_path", "drafter", "model_path"),
                                ("drafter.placement", "drafter", "placement"),
                                ("comm.backend", "parallel", "backend"), ("parallel.tp", "parallel", "tp")):
        if key in params:
            raw[section][field] = params[key]
    nccl = {k.removeprefix("nccl."): str(v) for k, v in params.items() if k.startswith("nccl.")}
    if nccl:
        raw["parallel"]["nccl_env"] = {**raw["parallel"].get("nccl_env", {}), **nccl}
    raw["search"] = {"space": {"spec.num_draft_tokens": k}}
    raw["study"] = {"n_trials": 1, "baseline": k == 0}  # one trial of the winner (plus nothing to compare)
    for key in ("tracking", "limits"):
        raw.pop(key, None)
    return yaml.safe_dump(raw, sort_keys=False)


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _plots(done, best, base, model, preds) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    ranked = sorted(done, key=lambda t: -t.value)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar([str(t.number) for t in ranked], [t.value for t in ranked],
           color=["#d8703b" if t.number == best.number else "#3b7dd8" for t in ranked])
    ax.set(xlabel="trial", ylabel="objective (tok/s)", title="trials ranked by objective (best in orange)")
    out["trials"] = _png(fig)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    rows = [("baseline", base), ("best", best)] if base is not None else [("best", best)]
    for i, (name, t) in enumerate(rows):
        u = t.user_attrs
        comm = u.get("comm_ms_per_step", 0.0)
        draft = u.get("draft_ms_p50", 0.0)
        verify = max(0.0, u.get("verify_ms_p50", u.get("step_ms_p50", 0.0)) - comm)
        other = max(0.0, u.get("step_ms_p50", 0.0) - verify - comm - draft)
        left = 0.0
        for part, val, color in (("verify compute", verify, "#3b7dd8"), ("allreduce", comm, "#d83b3b"),
                                 ("draft", draft, "#3bd87d"), ("other", other, "#999999")):
            ax.barh(name, val, left=left, color=color, label=part if i == 0 else None)
            left += val
    ax.set(xlabel="ms per step (p50)", title="where a step's time goes")
    ax.legend(fontsize=7)
    out["step_split"] = _png(fig)
    if preds:
        fig, ax = plt.subplots(figsize=(4.5, 4))
        xs, ys = [p.throughput for p, _, _ in preds], [v for _, v, _ in preds]
        ax.scatter(xs, ys)
        lim = [0, max(xs + ys) * 1.1]
        ax.plot(lim, lim, "k--", lw=1)
        ax.set(xlabel="measured tok/s", ylabel="predicted (left out of the fit)", title="performance model")
        out["model"] = _png(fig)
    return out


def interconnect_what_ifs(trial, comm: BenchComm) -> dict[str, str]:
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
        if lat is not None:
            est = what_if_interconnect(step, comm_ms, rounds, lat)
            out[f"ESTIMATE trial {trial.number} step over {backend} {env} ({lat:.1f} us x {rounds:g} allreduces of {size} B)"] = \
                f"{est:.2f} ms, {u.get('accept_len_mean', 1.0) * 1000 / est:.1f} tok/s"
    return out


def build_report(cfg: ExperimentConfig, study, out_dir: Path, bench_rows: list[dict] | None = None) -> tuple[str, Path, dict]:
    from optuna.trial import TrialState

    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if not done:
        raise UserError(f"study {cfg.study_name!r} has no COMPLETE trial yet: run `spectune run` first")
    best = max(done, key=lambda t: t.value)
    base = next((t for t in done if t.params.get("spec.num_draft_tokens") == 0), None)
    mad = best.user_attrs.get("throughput_mad", 0.0)
    margin = max(2 * mad, 0.03 * best.value)  # within noise: 2 MAD of the best, or 3% without repeats
    runners = [t for t in sorted(done, key=lambda t: -t.value) if t.number != best.number and t.value >= best.value - margin]
    try:
        import optuna

        importances = optuna.importance.get_param_importances(study) if len(done) > 2 else {}
    except Exception:  # noqa: BLE001 - needs varied params
        importances = {}
    points = trial_points(done, cfg)
    comm, note = bench_comm(cfg, bench_rows)
    model, preds, facts = model_summary(points, comm, note)
    summary = {
        "study": cfg.study_name, "complete_trials": len(done), "best_trial": best.number, "best_value": best.value,
        "best_params": best.params, "runners_up_within_noise": [t.number for t in runners],
        "importances": importances,
        "comm_fraction_baseline": base.user_attrs.get("comm_fraction") if base else None,
        "comm_fraction_best": best.user_attrs.get("comm_fraction"),
        **facts, "breakeven": {}, "what_if": {},
    }
    if model is not None:
        ks = sorted({p.k for p in points if p.k > 0}) or [4]
        for env in model.envs:
            for kind in model.kinds:
                summary["breakeven"][f"{env} | {kind}"] = {k: round(model.breakeven(env, kind, k), 3) for k in ks}
        u = (base or best).user_attrs
        if "comm_ms_per_step" in u and u.get("step_ms_p50"):
            tp = int((base or best).params.get("parallel.tp", cfg.parallel.tp))
            for tp_to in sorted({1, 2, 4, 8} - {tp}):
                rounds_scale = 0.0 if tp_to == 1 else 1.0
                est = what_if_tp(u["step_ms_p50"], u["comm_ms_per_step"], tp, tp_to, u["comm_ms_per_step"] * rounds_scale)
                summary["what_if"][f"ESTIMATE plain step at tp={tp_to} (same interconnect)"] = f"{est:.2f} ms"
    if comm is not None:
        for t in ([base] if base is not None else []) + [best]:
            summary["what_if"].update(interconnect_what_ifs(t, comm))
    text = _text(summary, best, runners)
    snippet = best_yaml(cfg, best.params)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = _plots(done, best, base, model, preds)
    page = _html(summary, text, snippet, plots)
    path = out_dir / "report.html"
    path.write_text(page)
    (out_dir / "best_config.yaml").write_text(snippet)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return text + "\n\nbest config:\n" + snippet, path, summary


def _text(s: dict, best, runners) -> str:
    lines = [f"study {s['study']}: {s['complete_trials']} complete trials",
             f"best: trial {best.number}, {best.value:.2f} tok/s objective, params {best.params}"]
    if runners:
        lines.append("runners-up within noise: " + ", ".join(f"#{t.number} {t.value:.2f} {t.params}" for t in runners))
    if s["importances"]:
        lines.append("parameter importances: " + ", ".join(f"{k} {v:.2f}" for k, v in s["importances"].items()))
    fb, fbest = s["comm_fraction_baseline"], s["comm_fraction_best"]
    lines.append(f"comm_fraction: baseline {fb if fb is None else round(fb, 3)}, best {fbest if fbest is None else round(fbest, 3)}")
    lines.append(f"performance model: median |error| predicting left-out trials = {s['model_loo_median_rel_error']:.1%} "
                 f"({s['model_loo_trials']} trials, each predicted by a fit on the others)")
    terms: dict[tuple[str, str], list[str]] = {}
    for env, term in s["allreduce_term"].items():
        terms.setdefault((term, s["allreduce_term_why"][env]), []).append(env)
    for (term, why), envs in terms.items():
        lines.append(f"allreduce term {term} for {', '.join(envs)}: {why}")
    if "model_loo_median_rel_error_fitted_term" in s:
        lines.append(f"  (with every allreduce term fitted instead: {s['model_loo_median_rel_error_fitted_term']:.1%})")
    if s["comm_check"]:
        lines.append("measured / bench-derived allreduce time per step (min, median, max over trials): "
                     + ", ".join(f"{env} x{lo:.2f}, x{med:.2f}, x{hi:.2f}" for env, (lo, med, hi) in s["comm_check"].items()))
    if s["model_loo_predictions"]:
        mixed = any(r["allreduce_term"] != "fitted" for r in s["model_loo_predictions"])
        lines.append("held-out trials (measured -> predicted decode tok/s): " + "; ".join(
            f"#{r['trial']} {r['kind']} k={r['k']} {r['measured_tok_s']:.2f} -> {r['predicted_tok_s']:.2f} ({r['rel_error']:+.1%}"
            + (f", {r['allreduce_term']})" if mixed else ")")
            + ("" if r["drafter_in_fit"] else " [drafter in no other trial: draft time taken as 0]")
            for r in s["model_loo_predictions"]))
    for key, table in s["breakeven"].items():
        lines.append(f"breakeven accepted length ({key}): " + ", ".join(f"k={k}: {v}" for k, v in table.items()))
    for key, value in s["what_if"].items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _predictions_table(s: dict) -> str:
    head = "<tr><th>trial</th><th>setup</th><th>allreduce term</th><th>drafter</th><th>k</th><th>measured tok/s</th>" \
           "<th>predicted tok/s</th><th>error</th><th>note</th></tr>"
    rows = "".join(f"<tr><td>{r['trial']}</td><td>{html.escape(r['env'])}</td><td>{r['allreduce_term']}</td>"
                   f"<td>{html.escape(r['kind'])}</td><td>{r['k']}</td><td>{r['measured_tok_s']:.2f}</td>"
                   f"<td>{r['predicted_tok_s']:.2f}</td><td>{r['rel_error']:+.1%}</td>"
                   f"<td>{'' if r['drafter_in_fit'] else 'drafter in no other trial: draft time taken as 0'}</td></tr>"
                   for r in s["model_loo_predictions"])
    return f'<table id="model-predictions" border="1" cellpadding="4">{head}{rows}</table>' \
           f"<p>median |error| {s['model_loo_median_rel_error']:.1%}</p>"


def _html(summary: dict, text: str, snippet: str, plots: dict[str, str]) -> str:
    imgs = "\n".join(f'<figure id="plot-{name}"><img alt="{name}" src="data:image/png;base64,{data}"></figure>' for name, data in plots.items())
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>spectune report: {html.escape(summary['study'])}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}} pre{{background:#f4f4f4;padding:1em;overflow:auto}}
figure{{display:inline-block;margin:0.5em}}</style></head>
<body><h1>spectune report: {html.escape(summary['study'])}</h1>
<h2>Summary</h2><pre id="summary">{html.escape(text)}</pre>
<h2>Plots</h2>{imgs}
<h2>Performance model: trials left out of the fit</h2>{_predictions_table(summary)}
<h2>Best configuration</h2><pre id="best-config">{html.escape(snippet)}</pre>
<p>Estimates are labelled ESTIMATE: they extrapolate measured compute and allreduce times.</p>
</body></html>
"""


def report(cfg: ExperimentConfig, out: str | None, log=None, bench: str | None = None) -> dict:
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    study = open_study(cfg)
    out_dir = Path(out) if out else spectune_home() / "reports" / cfg.study_name
    rows = load_bench_rows(cfg, study, bench)
    text, path, summary = build_report(cfg, study, out_dir, rows)
    print(text)
    log(f"spectune: report written to {path}")
    run_id = study.user_attrs.get("mlflow_parent_run_id")
    if run_id:
        try:
            from mlflow.tracking import MlflowClient

            from orchestrator.tracking import resolve_uri

            client = MlflowClient(tracking_uri=resolve_uri(cfg.tracking.uri, spectune_home()))
            for name in ("report.html", "best_config.yaml", "summary.json"):
                client.log_artifact(run_id, str(out_dir / name), artifact_path="report")
            if summary["model_loo_median_rel_error"] == summary["model_loo_median_rel_error"]:
                client.log_metric(run_id, "perf_model_loo_error", summary["model_loo_median_rel_error"])
        except Exception as e:  # noqa: BLE001 - the files on disk are the report; MLflow is a copy
            log(f"spectune: could not log the report to MLflow run {run_id}: {type(e).__name__}: {e}")
    summary["html"] = str(path)
    return summary
