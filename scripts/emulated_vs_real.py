"""Emulated TP against real TP on this machine's CPU, in one run: does one rank of TP 2 waiting as the
table `spectune bench-allreduce --json` measured here predict the real gloo TP 2 step?

    python -m scripts.emulated_vs_real                       # the demo model, held-out prompts, k = 0 and 4, 5 rounds
    python -m scripts.emulated_vs_real --num-prompts 2 --max-new-tokens 24 --rounds 1 --json

Steps: (1) `spectune bench-allreduce --backend gloo --tp 2 --json` over the message sizes the run
issues (one token's hidden state up to a prefill) -> a table file; (2) real TP 2 (two processes,
gloo): plain decoding and k = 4 with the n-gram drafter, which measures its accepted length;
(3) emulated TP 2 (one process, rank 0's shard, each allreduce a busy wait of the table's latency):
plain decoding and k = 4 at the real run's accepted length (workload.simulate_accept_len). Rounds: the
three steps again, --rounds times, real and emulated side by side in each (a shared 2-core machine drifts
by a fifth within minutes: one round's real and emulated runs see the same machine, and the median over
rounds of each figure is what is compared). It prints step_ms_p50 and comm_fraction of each round and
the medians' differences; the issue's bar is step time within 15% and comm fraction within 10 points.
Timings only: no assert.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.decode.flags import DecodeRun
from orchestrator.decode.run import decode
from workers.model.locate import load_args, resolve_model_path


def measure_table(path: Path, hidden: int, max_tokens: int, iters: int) -> None:
    """bench-allreduce --json over powers of two from one token's fp32 hidden state to `max_tokens` of them."""
    lo, hi = hidden * 4, hidden * 4 * max_tokens
    sizes = sorted({lo, hi} | {1 << p for p in range(lo.bit_length(), hi.bit_length())})
    cmd = [sys.executable, "-m", "orchestrator", "bench-allreduce", "--backend", "gloo", "--tp", "2", "--json"]
    cmd += ["--sizes", ",".join(map(str, sizes)), "--iters", str(iters)]
    print(f"measuring: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    path.write_text(r.stdout.strip().splitlines()[-1] + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--bench-iters", type=int, default=200)
    ap.add_argument("--ablation-iters", type=int, default=10)
    ap.add_argument("--table", default=None, help="use this table instead of measuring one each round")
    ap.add_argument("--rounds", type=int, default=5, help="real and emulated side by side this many times; medians compared")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args(argv)
    if ns.rounds < 1:
        ap.error("--rounds must be at least 1")
    args = load_args(resolve_model_path(ns.model))
    common = {
        "model.path": ns.model,
        "workload.split": "heldout",
        "workload.num_prompts": ns.num_prompts,
        "workload.max_new_tokens": ns.max_new_tokens,
        "drafter.kind": "ngram",
    }
    run = DecodeRun(ablation_iters=ns.ablation_iters, json=True, baseline=False)  # k = 0 is its own row
    rounds: dict[int, list[dict]] = {0: [], ns.k: []}
    with tempfile.TemporaryDirectory(prefix="spectune-emulated-") as tmp:
        for i in range(ns.rounds):
            table = ns.table
            if table is None:
                table = str(Path(tmp) / f"cpu-gloo-tp2-{i}.json")
                measure_table(Path(table), args.dim, max_tokens=512, iters=ns.bench_iters)
            for k in rounds:
                real = decode({**common, "parallel.tp": 2, "drafter.num_draft_tokens": k}, run)
                emu_given = {**common, "parallel.emulate_tp": 2, "parallel.allreduce_table": table, "drafter.num_draft_tokens": k}
                if k > 0:
                    emu_given["workload.simulate_accept_len"] = max(1.0, min(float(k + 1), real["accept_len_mean"]))
                rounds[k].append(compare(k, real, decode(emu_given, run)))
    rows = [median_row(k, rs) for k, rs in rounds.items()]
    if ns.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'k':>3} {'':>9} {'step_ms_p50':>12} {'comm_frac':>10} {'accept':>7}   (median of {ns.rounds} rounds; each round below)")
        for r in rows:
            for side in ("real", "emulated"):
                m = r[side]
                print(f"{r['k']:>3} {side:>9} {m['step_ms_p50']:>12.3f} {m['comm_fraction']:>10.3f} {m['accept_len_mean']:>7.2f}")
            ok = abs(r["step_rel_diff"]) <= 0.15 and abs(r["comm_fraction_diff_points"]) <= 10
            print(
                f"{r['k']:>3} {'diff':>9} {100 * r['step_rel_diff']:>+11.1f}% {r['comm_fraction_diff_points']:>+9.1f}pt"
                f"   ({'within' if ok else 'outside'} 15% / 10 points)"
            )
            for i, x in enumerate(r["rounds"]):
                print(
                    f"    round {i + 1}: real {x['real']['step_ms_p50']:.1f} ms ({100 * x['real']['comm_fraction']:.0f}% comm), "
                    f"emulated {x['emulated']['step_ms_p50']:.1f} ms ({100 * x['emulated']['comm_fraction']:.0f}% comm)"
                )
    return 0


def median_row(k: int, rounds: list[dict]) -> dict:
    """Each figure's median over the rounds, the differences of those medians, and every round."""
    import statistics

    med = {side: {key: statistics.median(r[side][key] for r in rounds) for key in rounds[0][side]} for side in ("real", "emulated")}
    return {
        "k": k,
        **med,
        "emulated_from": rounds[-1]["emulated_from"],
        "step_rel_diff": med["emulated"]["step_ms_p50"] / med["real"]["step_ms_p50"] - 1,
        "comm_fraction_diff_points": 100 * (med["emulated"]["comm_fraction"] - med["real"]["comm_fraction"]),
        "rounds": rounds,
    }


def compare(k: int, real: dict, emu: dict) -> dict:
    keys = ("step_ms_p50", "comm_fraction", "comm_ms_per_step", "compute_ms_per_step", "accept_len_mean", "throughput_tok_s")
    pick = lambda m: {key: m.get(key, float("nan")) for key in keys}  # noqa: E731
    return {
        "k": k,
        "real": pick(real),
        "emulated": pick(emu),
        "emulated_from": emu.get("emulated"),
        "step_rel_diff": emu["step_ms_p50"] / real["step_ms_p50"] - 1,
        "comm_fraction_diff_points": 100 * (emu.get("comm_fraction", 0.0) - real.get("comm_fraction", 0.0)),
    }


if __name__ == "__main__":
    sys.exit(main())
