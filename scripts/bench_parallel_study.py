"""Wall-clock of one study run one trial at a time against the same study run two at a time, side by
side in one run, on a real two-raylet Ray cluster on this machine (`ray.cluster_utils.Cluster`, a
head and a worker on loopback, one CPU each): SmolLM2 at TP 1 (one core a trial), n-gram drafting
over k, the random sampler with one seed, `study.isolation: none`. Prints one JSON line per study
(wall seconds, COMPLETE trials, their configurations, whether trial intervals overlapped) and the
ratio; `--out DIR` keeps the logs and the JSON.

    .venv/bin/python scripts/bench_parallel_study.py --out results/2026-12-05/parallel-trials-cpu

Both studies ask for the same configurations: the random sampler draws the same sequence, and a
proposal that repeats a running or a known configuration is skipped alike in both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def experiment(path: Path, name: str, concurrent: int, n_trials: int, prompts: int, tokens: int) -> Path:
    cfg = {
        "name": name,
        "model": {"path": "smollm2-135m"},
        "drafter": {"kind": "ngram"},
        "parallel": {"tp": 1, "device": "cpu", "backend": "gloo", "cpus_per_worker": 1.0},
        "workload": {"prompts": "bundled", "categories": ["summarization"], "num_prompts": prompts, "max_new_tokens": tokens},
        "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 1, 2, 3, 4, 5, 6, 7]}}},
        "study": {
            "n_trials": n_trials,
            "sampler": "random",
            "seed": 0,
            "pruner": "none",
            "max_concurrent_trials": concurrent,
            "isolation": "none",
        },
        "limits": {"trial_timeout_s": 900},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(exp: Path, home: Path, address: str, log: Path) -> tuple[float, int]:
    env = {**os.environ, "SPECTUNE_HOME": str(home), "RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled"}
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "orchestrator", "run", str(exp)], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        ).returncode
    return time.perf_counter() - t0, rc


def record(home: Path, name: str) -> dict:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{home / 'optuna.db'}")
    done = sorted((t for t in study.trials if t.state.name == "COMPLETE"), key=lambda t: t.number)
    spans = sorted((t.datetime_start, t.datetime_complete) for t in done)
    return {
        "complete": len(done),
        "states": [t.state.name for t in study.trials],
        "configurations": sorted(int(t.user_attrs["spectune.params"]["spec.num_draft_tokens"]) for t in done),
        "overlap": any(b[0] < a[1] for a, b in zip(spans, spans[1:])),
        "trial_seconds": [round((t.datetime_complete - t.datetime_start).total_seconds(), 1) for t in done],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-trials", type=int, default=6)
    ap.add_argument("--num-prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from ray.cluster_utils import Cluster

    work = Path(tempfile.mkdtemp(prefix="spectune-par-"))
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    ray_tmp = tempfile.mkdtemp(prefix="st-ray-", dir="/tmp")  # short: Ray's socket paths stay < 108 bytes
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "temp_dir": ray_tmp, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    results = {}
    try:
        for concurrent in (1, 2):
            name = f"parallel-bench-{concurrent}"
            home = work / f"home-{concurrent}"
            exp = experiment(work / f"{name}.yaml", name, concurrent, args.n_trials, args.num_prompts, args.max_new_tokens)
            wall, rc = run(exp, home, cluster.address, out / f"{name}.log")
            results[concurrent] = {"max_concurrent_trials": concurrent, "wall_s": round(wall, 1), "rc": rc, **record(home, name)}
            print(json.dumps(results[concurrent]), flush=True)
    finally:
        cluster.shutdown()
    summary = {
        "wall_ratio_2_over_1": round(results[2]["wall_s"] / results[1]["wall_s"], 3),
        "same_configurations": results[1]["configurations"] == results[2]["configurations"],
        "distinct_configurations": all(len(set(r["configurations"])) == len(r["configurations"]) for r in results.values()),
        "studies": list(results.values()),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "studies"}))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if all(r["rc"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
