"""The performance model on real measurements: trial points, the allreduce table, and the
leave-one-out check (each trial's decode throughput predicted by a fit on the other trials).

    python -m orchestrator.explain.perfcheck experiments/smoke-cpu.yaml [--run] [--set k=v ...]
        [--bench BENCH.json] [--allreduce auto|bench|fitted] [--max-error 0.15]
    python -m orchestrator.explain.perfcheck --decode RUN.json... --bench BENCH.json --device cuda

A study: its COMPLETE trials (`--run` first runs or resumes it with `spectune run` in a
subprocess, so one command measures and checks). `--decode`: `spectune decode --json` outputs
instead, one "trial" each (e.g. results/2026-11-30/decode-allreduce-profile-h200/, with its bench_allreduce.json).
Prints one line per held-out trial (measured and predicted decode tok/s, the error, the allreduce
term its fit used and how), the trials that could not be predicted and why, and then
`median |error| ... = X%`; exits 1 when that is above `--max-error`. For a study it then leaves
each configuration out (`perfmodel.config_loo`: its trials pooled, predicted with none of its own
measurements, its acceptance from the same drafter at other k; a miss counts as 100%).
`--allreduce`: auto (the table where it agrees with the trials' own allreduce measurement, the
report's choice), bench (the table wherever it has the setup, even where it disagrees), fitted
(ignore any table). `spectune report` uses the helpers here for its performance-model section.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.config.schema import ExperimentConfig, load_config, spectune_home
from orchestrator.errors import UserError
from orchestrator.explain.perfmodel import BenchComm, comm_check, fit, loo_error, loo_predictions
from orchestrator.record import DUPLICATE_ATTR
from orchestrator.search.config_model import config_loo, config_loo_error
from orchestrator.search.points import TrialPoint, config_points, config_shape, env_label, trial_points
from orchestrator.search.ranking import trial_params

TERM_NAMES = {"bench": "bench-derived", "fitted": "fitted", "backend": "fitted per backend + NCCL corrections"}


PREDICTED_TOP = 5  # the best untried configurations the report lists


def config_model_facts(trials, cfg: ExperimentConfig, label_of, top: int = PREDICTED_TOP, pruned=()) -> dict:
    """The configuration model's figures for the report (`perfmodel.fit_configs` / `config_loo`):
    leave one configuration out (each measured configuration, its trials pooled, predicted with none
    of its own measurements, its acceptance included; a miss counts as 100%), and the best
    configurations of the space no trial measured, PREDICTED from measured parts only (no priors: one
    the model cannot predict that way is not listed). `label_of(params)` names a configuration;
    `pruned`: the study's PRUNED trials, whose per-position acceptance the model borrows (never their
    timings, which cover the first prompts only: `perfmodel.fit_configs`)."""
    from optuna.trial import FixedTrial

    from orchestrator.config.space import config_identity, distinct_configs, suggest, trial_config
    from orchestrator.search.config_model import Miss, fit_configs

    points = config_points(trials, cfg)
    lent = config_points(pruned, cfg)
    loo = config_loo(points, lent)
    by_number = {t.number: t for t in trials}
    rows = []
    for x in sorted(loo, key=lambda x: x.error):
        first = by_number.get(x.trials[0]) if x.trials else None
        rows.append(
            {
                "trials": list(x.trials),
                "label": label_of(trial_params(first)) if first is not None else x.shape.drafter,
                "measured_decode_tok_s": round(x.measured, 3),
                "predicted_decode_tok_s": None if x.predicted is None else round(x.predicted, 3),
                "rel_error": None if x.predicted is None else round((x.predicted - x.measured) / x.measured, 4),
                "how": x.how,
            }
        )
    untried, partly = [], []
    space = distinct_configs(cfg)
    if points and space is not None:
        measured = set()
        for t in trials:
            try:
                measured.add(config_identity(trial_config(t, cfg)))
            except Exception:  # noqa: BLE001 - a trial of another space
                continue
        # configurations only PRUNED trials ran, after measuring some prompts: partly measured, never "no trial ran"
        # (a pruned duplicate or a refused proposal measured nothing)
        pruned_by: dict[str, list] = {}
        for t in pruned:
            if not t.intermediate_values or t.user_attrs.get(DUPLICATE_ATTR) is not None:
                continue
            try:
                pruned_by.setdefault(config_identity(trial_config(t, cfg)), []).append(t)
            except Exception:  # noqa: BLE001 - a trial of another space
                continue
        model = fit_configs(points, lent)
        for identity, params in space.items():
            if identity in measured:
                continue
            tc = suggest(FixedTrial(params), cfg)
            est = model.predict(config_shape(tc, cfg))
            if isinstance(est, Miss) and identity not in pruned_by:
                continue
            row = {"label": label_of(tc.params()), "params": dict(params)}
            if not isinstance(est, Miss):
                row.update(
                    predicted_tok_s=round(est.objective, 3),
                    predicted_decode_tok_s=round(est.decode_tok_s, 3),
                    predicted_accept_len=round(est.accept_len, 3),
                    how=est.basis,
                )
            if identity in pruned_by:
                ts = sorted(pruned_by[identity], key=lambda t: t.number)
                row.update(
                    pruned_trials=[t.number for t in ts],
                    # what the pruner saw: the objective over its first prompts (the last value each trial reported)
                    measured_so_far_tok_s=round(max(t.intermediate_values[max(t.intermediate_values)] for t in ts), 3),
                    prompts_measured=max(len(t.intermediate_values) for t in ts),
                )
                partly.append(row)
            else:
                untried.append(row)
        untried.sort(key=lambda r: -r["predicted_tok_s"])
        partly.sort(key=lambda r: -r["measured_so_far_tok_s"])
    return {
        "model_config_loo_median_rel_error": config_loo_error(loo),
        "model_config_loo": rows,
        "model_config_loo_misses": sum(x.predicted is None for x in loo),
        "predicted_untried": untried[:top],
        "predicted_untried_count": len(untried),
        # partly measured: run only by trials the pruner stopped (their figures cover their first prompts)
        "partly_measured": partly,
        "space_size": None if space is None else len(space),
    }


def bench_comm(cfg: ExperimentConfig, rows: list[dict] | None) -> tuple[BenchComm | None, str]:
    """The bench-derived allreduce term for a study's model, or None and why not."""
    return model_comm(rows, cfg.model.path, cfg.model.dtype, cfg.parallel.device, cfg.parallel.tp)


def model_comm(rows: list[dict] | None, model_path: str, dtype: str, device: str, tp: int) -> tuple[BenchComm | None, str]:
    """The bench-derived allreduce term of a model: 2 allreduces per layer, messages of
    (k + 1) x hidden x itemsize bytes (batch 1), the table's rows of the steps' mode."""
    if not rows:
        return None, "no allreduce table (study.bench_allreduce off and no --bench)"
    from workers.model.locate import load_args, resolve_model_path

    try:
        args = load_args(resolve_model_path(model_path))
    except (ValueError, OSError) as e:
        return None, f"allreduce table unused: model shape unknown ({e})"
    itemsize = 4 if dtype == "float32" else 2
    mode = "graph" if device == "cuda" else "eager"  # CUDA steps run as graphs, CPU steps eagerly
    rows = [{**r, "tp": r.get("tp", tp)} for r in rows]  # bench-allreduce records it; older tables did not
    comm = BenchComm(rows, rounds=2 * args.n_layers, token_bytes=args.dim * itemsize, mode=mode)
    return comm, (
        f"{comm.rounds:g} allreduces per step x latency of (k+1) x {comm.token_bytes} B ({mode} rows of the table, log-log interpolated)"
    )


def study_bench_rows(cfg: ExperimentConfig, study) -> list[dict] | None:
    """The allreduce table `study.bench_allreduce` logged to the study's parent MLflow run, if any."""
    run_id = study.user_attrs.get("mlflow_parent_run_id")
    if not run_id or not study.user_attrs.get("bench_allreduce_logged"):
        return None
    import tempfile

    from mlflow.tracking import MlflowClient

    from orchestrator.tracking.runs import resolve_uri

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr carries our log lines
    try:
        client = MlflowClient(tracking_uri=resolve_uri(cfg.tracking.uri, spectune_home()))
        with tempfile.TemporaryDirectory() as tmp:
            return json.loads(Path(client.download_artifacts(run_id, "bench_allreduce.json", tmp)).read_text())
    except Exception:  # noqa: BLE001 - skipped bench, deleted run, another store: no table
        return None


def model_summary(points: list[TrialPoint], comm: BenchComm | None, note: str, max_comm_ratio: float = 2.0) -> tuple[object, list, dict]:
    """Fit, leave-one-out predictions and the facts the report shows about the performance model."""
    model = fit(points, comm, max_comm_ratio) if points else None
    if len(points) > 2:
        predictions, missed = loo_predictions(points, comm, max_comm_ratio)
        err = loo_error(points, comm, max_comm_ratio)[0]
    else:
        predictions, missed = [], [(p, "fewer than 3 trials with step timings: no leave-one-out") for p in points]
        err = float("nan")
    preds = [(x.point, x.predicted, x.term) for x in predictions]
    rows = []
    for x in predictions:
        p, v = x.point, x.predicted
        seen = p.k == 0 or sum(q.kind == p.kind for q in points) > 1  # another trial tells the fit this drafter's cost
        rows.append(
            {
                "trial": p.trial,
                "env": p.env,
                "kind": p.kind,
                "k": p.k,
                "accept_len": round(p.accept_len, 3),
                "measured_tok_s": round(p.throughput, 3),
                "predicted_tok_s": round(v, 3),
                "rel_error": round((v - p.throughput) / p.throughput, 4),
                "drafter_in_fit": seen,
                "allreduce_term": TERM_NAMES[x.term],
                "how": x.how,
            }
        )
    # every trial with step timings is either predicted (rows) or named here with the reason
    facts = {
        "model_loo_median_rel_error": err,
        "model_loo_trials": len(preds),
        "model_loo_predictions": rows,
        "model_loo_not_predicted": [{"trial": p.trial, "env": p.env, "reason": why} for p, why in missed],
        "allreduce_term": {},
        "allreduce_term_why": {},
        "comm_check": {},
    }
    if model is not None:
        for e in model.envs:
            bench = model.source(e) == "bench"
            facts["allreduce_term"][e] = TERM_NAMES.get(model.source(e), "fitted")
            if e in model.rejected:
                lo, hi = model.rejected[e]
                note_e = (
                    f"the allreduce table disagrees with the allreduce time its trials measured "
                    f"(measured / table x{lo:.2f}..x{hi:.2f}, outside x{1 / max_comm_ratio:.2g}..x{max_comm_ratio:g})"
                )
            else:
                note_e = note if bench or comm is None or e in comm.setups else "not in the allreduce table"
            facts["allreduce_term_why"][e] = note_e
        facts["comm_check"] = {e: [round(x, 3) for x in r] for e, r in comm_check(points, comm).items()}
        if model.comm is not None and len(points) > 2:  # the same trials with every term fitted, for comparison
            facts["model_loo_median_rel_error_fitted_term"] = loo_error(points)[0]
    return model, preds, facts


def decode_points(paths: list[str]) -> tuple[list[TrialPoint], str]:
    """One TrialPoint per `spectune decode --json` output (its speculative run), and the model path."""
    points, models = [], set()
    for i, path in enumerate(paths):
        try:
            m = json.loads(Path(path).read_text())
            p = m["params"]
            k, tp = int(p["spec.num_draft_tokens"]), int(p["parallel.tp"])
            points.append(
                TrialPoint(
                    env=env_label(tp, p["comm.backend"]),
                    kind=p["drafter.kind"] if k else "none",
                    k=k,
                    step_ms=m["step_ms_p50"],
                    accept_len=m["accept_len_mean"],
                    throughput=m.get("decode_tok_s", m["throughput_tok_s"]),
                    accept_rates=tuple(m[f"accept_rate_pos_{j}"] for j in range(1, k + 1) if f"accept_rate_pos_{j}" in m),
                    verify_ms=m["verify_ms_p50"],
                    draft_ms=m["draft_ms_p50"],
                    tp=tp,
                    comm_ms=m.get("comm_ms_per_step") if tp > 1 else None,
                    trial=i,
                )
            )
            models.add(p["model.path"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"--decode {path!r}: not a `spectune decode --json` output ({type(e).__name__}: {e})") from None
    if len(models) != 1:
        raise UserError(f"--decode: the runs must share one model, got {sorted(models)}")
    return points, models.pop()


def open_study(cfg: ExperimentConfig):
    import optuna

    from orchestrator.tracking.storage import make_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage, _ = make_storage(cfg)
    try:
        return optuna.load_study(study_name=cfg.study_name, storage=storage)
    except KeyError:
        raise UserError(f"study.name: no study {cfg.study_name!r} in {cfg.study.storage or 'the default storage'}") from None


def load_bench_rows(cfg: ExperimentConfig, study, bench: str | None) -> list[dict] | None:
    """`--bench FILE` (bench-allreduce --json, or the study's logged bench_allreduce.json), else the study's own table."""
    if not bench:
        return study_bench_rows(cfg, study)
    try:
        text = Path(bench).read_text().strip()
        try:
            return json.loads(text)
        except ValueError:  # log lines before the JSON line
            return json.loads(text.splitlines()[-1])
    except (OSError, ValueError, IndexError) as e:
        raise UserError(f"--bench {bench!r}: not a `spectune bench-allreduce --json` output ({type(e).__name__})") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.explain.perfcheck", description=__doc__.splitlines()[0])
    ap.add_argument("experiment", nargs="?", help="experiment YAML of the study (or --decode)")
    ap.add_argument("--set", action="append", default=[], metavar="dotted.key=value")
    ap.add_argument("--run", action="store_true", help="run (or resume) the study first")
    ap.add_argument("--decode", nargs="+", default=None, metavar="RUN.json", help="spectune decode --json outputs instead of a study")
    ap.add_argument("--device", default="cpu", help="with --decode: where the runs ran (cuda: graphed steps)")
    ap.add_argument("--dtype", default=None, help="with --decode: float32 / bfloat16 (default: bfloat16 on cuda)")
    ap.add_argument("--bench", default=None, help="allreduce table (default: the one the study logged, if any)")
    ap.add_argument("--allreduce", choices=("auto", "bench", "fitted"), default="auto")
    ap.add_argument("--max-error", type=float, default=None, help="exit 1 when the median |error| is above this (e.g. 0.15)")
    ns = ap.parse_args(argv)
    if bool(ns.experiment) == bool(ns.decode):
        ap.error("give an experiment YAML or --decode RUN.json..., not both")
    try:
        if ns.decode:
            points, model_path = decode_points(ns.decode)
            configs = []  # decode runs carry no configuration of a space: no configuration leave-one-out
            rows = None if ns.allreduce == "fitted" or not ns.bench else load_bench_rows(None, None, ns.bench)
            dtype = ns.dtype or ("bfloat16" if ns.device == "cuda" else "float32")
            comm, note = model_comm(rows, model_path, dtype, ns.device, points[0].tp)
            title = f"{len(ns.decode)} decode runs: " + ", ".join(f"#{i} {Path(f).stem}" for i, f in enumerate(ns.decode))
        else:
            cfg = load_config(ns.experiment, ns.set)
            if ns.run:
                args = [sys.executable, "-m", "orchestrator", "run", ns.experiment] + [f"--set={s}" for s in ns.set]
                env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
                if subprocess.run(args, check=False, stdout=subprocess.DEVNULL, env=env).returncode != 0:
                    print("perfcheck: the study did not finish", file=sys.stderr)
                    return 1
            from optuna.trial import TrialState

            study = open_study(cfg)
            complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
            points = trial_points(complete, cfg)
            pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
            configs = config_loo(config_points(complete, cfg), config_points(pruned, cfg))
            rows = None if ns.allreduce == "fitted" else load_bench_rows(cfg, study, ns.bench)
            comm, note = bench_comm(cfg, rows)
            title = f"study {cfg.study_name}: {len(points)} complete trials with step timings"
        if ns.allreduce == "fitted":
            note = "every allreduce term fitted (--allreduce fitted)"
        _, _, facts = model_summary(points, comm, note, float("inf") if ns.allreduce == "bench" else 2.0)
    except UserError as e:
        print(f"spectune: error: {e}", file=sys.stderr)
        return 2
    print(title)
    for env, term in facts["allreduce_term"].items():
        print(f"allreduce term {term} for {env}: {facts['allreduce_term_why'][env]}")
    for env, (lo, med, hi) in facts["comm_check"].items():
        print(f"measured / bench-derived allreduce time per step, {env}: min x{lo:.2f}, median x{med:.2f}, max x{hi:.2f}")
    print(
        f"{'trial':>5} {'setup':<24} {'allreduce':<13} {'drafter':<11} {'k':>2} {'accept':>6} {'measured':>9} {'predicted':>9} {'error':>7}"
    )
    for r in facts["model_loo_predictions"]:
        print(
            f"{r['trial']:>5} {r['env'][:24]:<24} {r['allreduce_term']:<13} {r['kind']:<11} {r['k']:>2} {r['accept_len']:>6.2f} "
            f"{r['measured_tok_s']:>9.2f} {r['predicted_tok_s']:>9.2f} {r['rel_error']:>+7.1%}"
            + ("" if r["drafter_in_fit"] else "  (drafter in no other trial: draft time taken as 0)")
            + (f"  [{r['how']}]" if r["allreduce_term"] not in ("fitted", "bench-derived") else "")
        )
    for r in facts["model_loo_not_predicted"]:
        print(f"{r['trial']:>5} {r['env'][:24]:<24} not predicted: {r['reason']}")
    err = facts["model_loo_median_rel_error"]
    print(
        "(each trial predicted by a fit on the others, with its own measured accepted length; "
        "allreduce: the term that fit used for its setup)"
    )
    missed = len(facts["model_loo_not_predicted"])
    print(
        f"median |error| predicting decode tok/s of trials left out of the fit: {err:.1%} "
        f"({facts['model_loo_trials']} trials" + (f"; {missed} could not be predicted, named above)" if missed else ")")
    )
    if "model_loo_median_rel_error_fitted_term" in facts:
        fitted = facts["model_loo_median_rel_error_fitted_term"]
        print(
            "  with every allreduce term fitted instead: "
            + (
                f"{fitted:.1%}"
                if fitted == fitted
                # NaN: no fit
                else "no prediction (a left-out setup's constant is fitted only from other trials of the same setup)"
            )
        )
    if configs:
        print_config_loo(configs)
    return 1 if ns.max_error is not None and not err <= ns.max_error else 0


def print_config_loo(configs: list) -> None:
    """Leave one configuration out (perfmodel.config_loo): each configuration, its trials pooled,
    predicted without any of its own measurements; a miss counts as 100%."""
    print("leave one configuration out (no measurement of its own, its acceptance included):")
    for x in sorted(configs, key=lambda x: (x.shape.drafter, x.shape.env, x.shape.k)):
        who = "+".join(str(t) for t in x.trials)
        if x.predicted is None:
            print(
                f"  {x.shape.drafter[:36]:<36} k={x.shape.k:<2} {x.shape.env[:24]:<24} trials {who}: measured {x.measured:9.2f}, miss: {x.how}"
            )
        else:
            err = (x.predicted - x.measured) / x.measured
            print(
                f"  {x.shape.drafter[:36]:<36} k={x.shape.k:<2} {x.shape.env[:24]:<24} trials {who}: measured {x.measured:9.2f}, "
                f"predicted {x.predicted:9.2f} {err:+7.1%}  [{x.how}]"
            )
    misses = sum(x.predicted is None for x in configs)
    print(
        f"median |error| leaving each configuration out: {config_loo_error(configs):.1%} ({len(configs)} configurations"
        + (f"; {misses} could not be predicted, counted as 100%)" if misses else ")")
    )


if __name__ == "__main__":
    sys.exit(main())
