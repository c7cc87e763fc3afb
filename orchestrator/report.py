"""`spectune report EXP.yaml`: why the winner wins.

Prints and saves (a self-contained HTML file, its path printed; both also logged to the study's
parent MLflow run): the best configuration, the runners-up within noise, parameter importances,
the comm_fraction of the baseline and of the best, the performance model (orchestrator/perfmodel.py)
with its leave-one-out prediction error and the breakeven accepted length of each allreduce setup,
what-if estimates at other TP sizes (labelled as estimates), and the best configuration as a
ready-to-use YAML snippet.

    spectune report experiments/smoke-cpu.yaml [--set study.storage=...] [--out DIR] [--bench bench.json]
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
from orchestrator.perfmodel import TrialPoint, fit, latency_us, loo_error, what_if_interconnect, what_if_tp


def _env_label(params: dict) -> str:
    nccl = ",".join(f"{k.removeprefix('nccl.')}={v}" for k, v in sorted(params.items()) if k.startswith("nccl."))
    return f"tp{params.get('parallel.tp', '?')} {params.get('comm.backend', '?')}" + (f" {nccl}" if nccl else "")


def trial_points(trials, cfg: ExperimentConfig) -> list[TrialPoint]:
    points = []
    for t in trials:
        u, p = t.user_attrs, t.params
        if "step_ms_p50" not in u:
            continue
        k = int(p.get("spec.num_draft_tokens", cfg.drafter.num_draft_tokens))
        full = {"parallel.tp": cfg.parallel.tp, "comm.backend": cfg.parallel.backend, **p}
        rates = tuple(u[f"accept_rate_pos_{i}"] for i in range(1, k + 1) if f"accept_rate_pos_{i}" in u)
        points.append(TrialPoint(
            env=_env_label(full), kind=p.get("drafter.kind", cfg.drafter.kind) if k else "none", k=k,
            step_ms=u["step_ms_p50"], accept_len=u.get("accept_len_mean", 1.0),
            throughput=u.get("decode_tok_s", u.get("throughput_tok_s", t.value)), accept_rates=rates,
            verify_ms=u.get("verify_ms_p50"), draft_ms=u.get("draft_ms_p50", 0.0),
        ))
    return points


def best_yaml(cfg: ExperimentConfig, params: dict) -> str:
    """The experiment with its search space replaced by the winner's values: ready for `spectune decode`-like reuse."""
    raw = cfg.model_dump(mode="json", exclude_none=True)
    k = params.get("spec.num_draft_tokens", raw["drafter"].get("num_draft_tokens"))
    raw["drafter"]["num_draft_tokens"] = k
    for key, section, field in (("drafter.kind", "drafter", "kind"), ("drafter.layers", "drafter", "layers"),
                                ("drafter.ngram_max", "drafter", "ngram_max"), ("drafter.model_path", "drafter", "model_path"),
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
        xs, ys = [p.throughput for p, _ in preds], [v for _, v in preds]
        ax.scatter(xs, ys)
        lim = [0, max(xs + ys) * 1.1]
        ax.plot(lim, lim, "k--", lw=1)
        ax.set(xlabel="measured tok/s", ylabel="predicted (left out of the fit)", title="performance model")
        out["model"] = _png(fig)
    return out


def interconnect_what_ifs(trial, bench_rows: list[dict], hidden: int, itemsize: int) -> dict[str, str]:
    """ESTIMATES of `trial`'s step under every (backend, env) of a bench-allreduce table, e.g. a
    PCIe stand-in (NCCL_P2P_DISABLE=1): measured compute + rounds x that setup's graphed latency."""
    u = trial.user_attrs
    rounds, comm, step = u.get("allreduce_per_step", 0.0), u.get("comm_ms_per_step"), u.get("step_ms_p50")
    if not rounds or comm is None or not step:
        return {}
    k = int(trial.params.get("spec.num_draft_tokens", 0))
    size = (k + 1) * hidden * itemsize
    out = {}
    for backend, env in sorted({(r["backend"], r["env"]) for r in bench_rows}):
        lat = latency_us(bench_rows, backend, env, size)
        if lat is not None:
            est = what_if_interconnect(step, comm, rounds, lat)
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
    model = fit(points) if points else None
    err, preds = loo_error(points) if len(points) > 2 else (float("nan"), [])
    summary = {
        "study": cfg.study_name, "complete_trials": len(done), "best_trial": best.number, "best_value": best.value,
        "best_params": best.params, "runners_up_within_noise": [t.number for t in runners],
        "importances": importances,
        "comm_fraction_baseline": base.user_attrs.get("comm_fraction") if base else None,
        "comm_fraction_best": best.user_attrs.get("comm_fraction"),
        "model_loo_median_rel_error": err, "breakeven": {}, "what_if": {},
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
    if bench_rows and model is not None:
        from workers.checkpoint import load_args, resolve_model_path

        try:
            hidden = load_args(resolve_model_path(cfg.model.path)).dim
            itemsize = 4 if cfg.model.dtype == "float32" else 2
            for t in ([base] if base is not None else []) + [best]:
                summary["what_if"].update(interconnect_what_ifs(t, bench_rows, hidden, itemsize))
        except (ValueError, OSError) as e:
            summary["what_if"]["interconnect estimates skipped"] = str(e)
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
    lines.append(f"performance model: median |error| predicting left-out trials = {s['model_loo_median_rel_error']:.1%}")
    for key, table in s["breakeven"].items():
        lines.append(f"breakeven accepted length ({key}): " + ", ".join(f"k={k}: {v}" for k, v in table.items()))
    for key, value in s["what_if"].items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _html(summary: dict, text: str, snippet: str, plots: dict[str, str]) -> str:
    imgs = "\n".join(f'<figure id="plot-{name}"><img alt="{name}" src="data:image/png;base64,{data}"></figure>' for name, data in plots.items())
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>spectune report: {html.escape(summary['study'])}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}} pre{{background:#f4f4f4;padding:1em;overflow:auto}}
figure{{display:inline-block;margin:0.5em}}</style></head>
<body><h1>spectune report: {html.escape(summary['study'])}</h1>
<h2>Summary</h2><pre id="summary">{html.escape(text)}</pre>
<h2>Plots</h2>{imgs}
<h2>Best configuration</h2><pre id="best-config">{html.escape(snippet)}</pre>
<p>Estimates are labelled ESTIMATE: they extrapolate measured compute and allreduce times.</p>
</body></html>
"""


def report(cfg: ExperimentConfig, out: str | None, log=None, bench: str | None = None) -> dict:
    import optuna

    from orchestrator.study import make_storage

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage, _ = make_storage(cfg)
    try:
        study = optuna.load_study(study_name=cfg.study_name, storage=storage)
    except KeyError:
        raise UserError(f"study.name: no study {cfg.study_name!r} in {cfg.study.storage or 'the default storage'}") from None
    out_dir = Path(out) if out else spectune_home() / "reports" / cfg.study_name
    rows = None
    if bench:
        try:
            rows = json.loads(Path(bench).read_text().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError) as e:
            raise UserError(f"--bench {bench!r}: not a `spectune bench-allreduce --json` output ({type(e).__name__})") from None
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
