"""Terminal progress for a study and the study-level MLflow record.

Console: a live line while a trial decodes (`LiveLine`: prompt i of n, tokens, current tok/s;
rewritten in place on a terminal, a line every few seconds elsewhere), one line per finished trial
(the counter of COMPLETE trials only on COMPLETE lines), a final ranked table. MLflow (the parent
run): the best trial's metrics, its config, Optuna's plots.
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from pathlib import Path

from orchestrator.record import BEST_CONFIG_TAG, BEST_PARAMS_TAG, IMPORTANCE_MIN_TRIALS, OBJECTIVE, RECORD_ONLY, batch_metric, metric_cell
from orchestrator.tracking.runs import Tracker, config_label


class LiveLine:
    """The lines under way while trials decode, one per running trial. `update` is cheap to call
    often (from several trial threads at once): on a terminal it rewrites the line, every running
    trial side by side, at most every `tty_every_s`; elsewhere (a log file, `ray job logs`) it
    prints a trial's line at most every `every_s` per trial. `done` clears a terminal line before a
    trial's result line."""

    def __init__(self, stream=None, every_s: float = 10.0, tty_every_s: float = 0.2):
        import threading

        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = tty_every_s if self.tty else every_s
        self.last: dict[int, float] = {}  # per trial; the first update always shows (monotonic time may be small: a fresh boot)
        self.texts: dict[int, str] = {}
        self.shown = False
        self.lock = threading.Lock()

    def update(
        self,
        trial: int,
        label: str,
        prompt: int,
        prompts: int,
        tokens: int,
        seconds: float,
        repeat: int = 0,
        repeats: int = 1,
        force: bool = False,
    ) -> None:
        now = time.monotonic()
        with self.lock:
            if not force and now - self.last.get(trial, float("-inf")) < self.every_s:
                return
            self.last[trial] = now
            rep = f", repeat {repeat + 1} of {repeats}" if repeats > 1 else ""
            rate = f"{tokens / seconds:.2f} tok/s" if seconds > 0 else "-"
            upto = "prompt 1" if prompt == 1 else f"prompts 1-{prompt}"  # the count sums this repeat's prompts so far
            text = f"trial {trial} {label}: prompt {prompt} of {prompts}{rep}, {tokens} tokens over {upto}, {rate}"
            self.texts[trial] = text
            if self.tty:
                self.stream.write("\r\033[K  " + " | ".join(self.texts[n] for n in sorted(self.texts)))
                self.shown = True
            else:
                self.stream.write("  " + text + "\n")
            self.stream.flush()

    def finished(self, trial: int) -> None:
        """A trial's line is no longer under way."""
        with self.lock:
            self.texts.pop(trial, None)
            self.last.pop(trial, None)

    def done(self) -> None:
        with self.lock:
            if self.tty and self.shown:
                self.stream.write("\r\033[K")
                self.stream.flush()
            self.shown = False
            self.last = {}  # the next update of any trial shows


class Progress:
    def __init__(self, study, n_goal: int, log, live: LiveLine | None = None, defaults: dict | None = None):
        self.study, self.n_goal, self.log = study, n_goal, log
        self.live = live or LiveLine()
        self.defaults = defaults or {}  # tracking.label_defaults: what the searched params leave out

    def label(self, params: dict) -> str:
        return config_label({**self.defaults, **params})

    def _complete(self):
        from optuna.trial import TrialState

        return self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))

    def trial_done(self, number: int, outcome) -> None:
        """One line: `[3/6] trial 4 COMPLETE ngram k=4 gloo tp2: throughput_tok_s 3.60 (...) | best ...`;
        a PRUNED or FAIL trial's line has no counter (it did not add a COMPLETE trial) and says why."""
        self.live.done()
        done = self._complete()
        best = max(done, key=lambda t: t.value) if done else None
        m = outcome.metrics
        label = self.label(outcome.config.params()) if outcome.config else "?"
        if outcome.state == "COMPLETE":
            value = m.get("objective", m.get(OBJECTIVE))
            noise = (
                f" (median {m['throughput_median']:.2f} +- {m['throughput_mad']:.2f} MAD, {m['repeats']:g} repeats)"
                if m.get("repeats", 1) > 1
                else ""
            )
            perf = f"{OBJECTIVE} {value:.2f}{noise}, accepted length {m.get('accept_len_mean', 1.0):.2f}"
            if "objective_b1" in m:  # several cells (batch sizes, context buckets): the objective is their geometric mean
                cells = sorted(
                    (c for k in m if (c := metric_cell(k, OBJECTIVE)) is not None and c != (1, None)), key=lambda c: (c[1] or 0, c[0])
                )
                per = ", ".join(
                    [f"b1 {m['objective_b1']:.2f}{noise}"]
                    + [f"{batch_metric('', b, c)[1:]} {m[batch_metric(OBJECTIVE, b, c)]:.2f}" for b, c in cells]
                )
                over = "batch sizes and contexts" if any(c is not None for _, c in cells) else "batch sizes"
                perf = f"objective {value:.2f} (geometric mean over {over} of {OBJECTIVE}, batch 1 noise-aware: {per})"
            perf += f", x{m['speedup_vs_baseline']:.2f} vs plain" if "speedup_vs_baseline" in m else ""
            head = f"[{len(done)}/{self.n_goal}] trial {number} COMPLETE"
        else:
            so_far = f" at {m[OBJECTIVE]:.2f} tok/s so far" if OBJECTIVE in m else ""
            perf = f"{outcome.reason or 'no reason recorded'}{so_far}"
            head = f"{' ' * (len(str(self.n_goal)) * 2 + 3)} trial {number} {outcome.state}"
        best_s = f" | best: #{best.number} {self.label(best.params)} {best.value:.2f}" if best else ""
        self.log(f"{head} {label}: {perf}{best_s}")

    def table(self) -> str:
        rows = sorted(self._complete(), key=lambda t: -t.value)
        lines = [f"{'rank':>4} {'trial':>5} {OBJECTIVE:>16} {'speedup':>7} {'accept':>6} {'comm%':>6}  configuration"]
        for i, t in enumerate(rows, 1):
            u = t.user_attrs
            lines.append(
                f"{i:>4} {t.number:>5} {t.value:>16.2f} {u.get('speedup_vs_baseline', float('nan')):>7.2f} "
                f"{u.get('accept_len_mean', 1.0):>6.2f} {100 * u.get('comm_fraction', 0.0):>5.1f}%  {self.label(t.params)}"
            )
        return "\n".join(lines)

    def finish(self, tracker: Tracker, status: str) -> dict:
        """The ranked table, the best trial on the parent run, and the parent run ended with `status`:
        FINISHED where the study ended as it should (its trials complete, or every configuration of its
        space measured), KILLED where it was interrupted, FAILED where it stopped on an error."""
        done = self._complete()
        summary = {"complete": len(done), "n_trials": self.n_goal, "parent_run_id": tracker.parent_run_id}
        if done:
            best = max(done, key=lambda t: t.value)
            summary.update(best_trial=best.number, best_value=best.value, best_params=best.params)
            self.log("\n" + self.table())
            # measurements only: the driver's heartbeat and the retry / baseline marks are bookkeeping
            numeric = {
                k: v for k, v in best.user_attrs.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in RECORD_ONLY
            }
            tracker.log_metrics(tracker.parent_run_id, {**numeric, "best_trial": best.number, "complete_trials": len(done)})
            tracker.set_tag(tracker.parent_run_id, BEST_PARAMS_TAG, str(best.params))
            tracker.set_tag(tracker.parent_run_id, BEST_CONFIG_TAG, f"{self.label(best.params)} (trial {best.number})")
            tracker.log_json(tracker.parent_run_id, {"trial": best.number, "params": best.params, "metrics": numeric}, "best_trial.json")
            self._plots(tracker)
        tracker.finish_study(status)
        return summary

    def _plots(self, tracker: Tracker) -> None:
        """Optuna's history and parallel-coordinate plots, and its importances from IMPORTANCE_MIN_TRIALS on."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import optuna.visualization.matplotlib as ovm

        plots = {
            "optuna_history.png": ovm.plot_optimization_history,
            "optuna_parallel_coordinate.png": ovm.plot_parallel_coordinate,
        }
        if len(self._complete()) >= IMPORTANCE_MIN_TRIALS:
            plots["optuna_importances.png"] = ovm.plot_param_importances
        with tempfile.TemporaryDirectory() as tmp:
            for name, fn in plots.items():
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # small studies: "too few trials", "identical ylims"
                        ax = fn(self.study)
                    fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
                    fig.set_size_inches(8, 5)
                    fig.tight_layout()
                    fig.savefig(Path(tmp) / name, dpi=90)
                    plt.close(fig)
                    tracker.log_file(tracker.parent_run_id, Path(tmp) / name)
                except Exception as e:  # noqa: BLE001 - e.g. importances need 2+ trials with varied params
                    self.log(f"spectune: skipped {name}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
