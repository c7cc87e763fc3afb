"""Terminal progress for a study (a line per finished trial, a final ranked table) and the
study-level MLflow record: the best trial's metrics, its config, and Optuna's plots."""
from __future__ import annotations

import tempfile
from pathlib import Path

from orchestrator.tracking import Tracker


def _fmt_params(params: dict) -> str:
    short = {"spec.num_draft_tokens": "k", "drafter.kind": "drafter", "drafter.layers": "L", "comm.backend": "comm",
             "parallel.tp": "tp", "drafter.ngram_max": "ngram"}
    return " ".join(f"{short.get(k, k.removeprefix('nccl.NCCL_'))}={v}" for k, v in sorted(params.items()))


class Progress:
    def __init__(self, study, n_goal: int, log):
        self.study, self.n_goal, self.log = study, n_goal, log

    def _complete(self):
        from optuna.trial import TrialState

        return self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))

    def trial_done(self, number: int, outcome) -> None:
        done = self._complete()
        best = max(done, key=lambda t: t.value) if done else None
        m = outcome.metrics
        perf = f"{m['throughput_tok_s']:.2f} tok/s, accepted length {m.get('accept_len_mean', 1.0):.2f}" if "throughput_tok_s" in m else "-"
        speed = f", x{m['speedup_vs_baseline']:.2f} vs baseline" if "speedup_vs_baseline" in m else ""
        why = f" ({outcome.reason})" if outcome.reason else ""
        best_s = f" | best #{best.number} {best.value:.2f} tok/s" if best else ""
        cfg = outcome.config.describe() if outcome.config else "?"
        self.log(f"[{len(done)}/{self.n_goal}] trial {number} {outcome.state}{why}: {cfg} | {perf}{speed}{best_s}")

    def table(self) -> str:
        rows = sorted(self._complete(), key=lambda t: -t.value)
        lines = [f"{'rank':>4} {'trial':>5} {'tok/s':>8} {'speedup':>7} {'accept':>6} {'comm%':>6}  params"]
        for i, t in enumerate(rows, 1):
            u = t.user_attrs
            lines.append(
                f"{i:>4} {t.number:>5} {t.value:>8.2f} {u.get('speedup_vs_baseline', float('nan')):>7.2f} "
                f"{u.get('accept_len_mean', 1.0):>6.2f} {100 * u.get('comm_fraction', 0.0):>5.1f}%  {_fmt_params(t.params)}"
            )
        return "\n".join(lines)

    def finish(self, tracker: Tracker, status: str) -> dict:
        done = self._complete()
        summary = {"complete": len(done), "n_trials": self.n_goal, "parent_run_id": tracker.parent_run_id}
        if done:
            best = max(done, key=lambda t: t.value)
            summary.update(best_trial=best.number, best_value=best.value, best_params=best.params)
            self.log("\n" + self.table())
            numeric = {k: v for k, v in best.user_attrs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            tracker.log_metrics(tracker.parent_run_id, {**numeric, "best_trial": best.number, "complete_trials": len(done)})
            tracker.set_tag(tracker.parent_run_id, "spectune.best_params", str(best.params))
            tracker.log_json(tracker.parent_run_id, {"trial": best.number, "params": best.params, "metrics": numeric}, "best_trial.json")
            self._plots(tracker)
        tracker.finish_study("FINISHED" if status == "FINISHED" and len(done) >= self.n_goal else "KILLED")
        return summary

    def _plots(self, tracker: Tracker) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import optuna.visualization.matplotlib as ovm

        plots = {"optuna_history.png": ovm.plot_optimization_history, "optuna_parallel_coordinate.png": ovm.plot_parallel_coordinate,
                 "optuna_importances.png": ovm.plot_param_importances}
        with tempfile.TemporaryDirectory() as tmp:
            for name, fn in plots.items():
                try:
                    ax = fn(self.study)
                    fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
                    fig.set_size_inches(8, 5)
                    fig.tight_layout()
                    fig.savefig(Path(tmp) / name, dpi=90)
                    plt.close(fig)
                    tracker.log_file(tracker.parent_run_id, Path(tmp) / name)
                except Exception as e:  # noqa: BLE001 - e.g. importances need 2+ trials with varied params
                    self.log(f"spectune: skipped {name}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
