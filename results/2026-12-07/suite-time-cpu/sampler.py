"""CPU-seconds per process kind while something runs: reads every process's utime + stime from /proc
every 0.3 s until OUT.stop exists, then writes {kind: [CPU-seconds, processes]} to OUT.

    python sampler.py /tmp/samp.json &  ...run the suite...;  touch /tmp/samp.json.stop

A process counts with the last value seen (its whole life, also before the sampler started)."""

import collections
import json
import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
KINDS = [  # (substring of the command line, kind): the first match names the process
    ("pytest -q -n", "pytest-controller"),
    ("exec(eval(sys.stdin", "pytest-worker"),
    ("forkserver", "forkserver(+ranks)"),
    ("spawn_main", "spawned-rank"),
    ("orchestrator run", "driver:run"),
    ("spectune run", "driver:run"),
    ("orchestrator decode", "cli:decode"),
    ("spectune decode", "cli:decode"),
    ("orchestrator train-drafter", "cli:train"),
    ("orchestrator", "cli:other"),
    ("bin/spectune", "cli:other"),
    ("default_worker.py", "ray:worker"),
    ("ray::", "ray:worker"),
    ("raylet", "ray:raylet"),
    ("gcs_server", "ray:gcs"),
    ("dashboard", "ray:agents"),
    ("agent", "ray:agents"),
    ("monitor", "ray:monitor"),
    ("mlflow", "mlflow-server"),
    ("postgres", "postgres"),
    ("chrom", "chromium"),
]


def kind(cmd: str) -> str:
    return next((k for needle, k in KINDS if needle in cmd), "other:" + cmd[:40])


def main(out: str) -> None:
    seen: dict[tuple[str, str], tuple[str, float]] = {}
    while not os.path.exists(out + ".stop"):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = open(f"/proc/{pid}/stat").read()
                cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if cmd:
                seen[(pid, fields[19])] = (kind(cmd), (int(fields[11]) + int(fields[12])) / HZ)
        time.sleep(0.3)
    cpu, count = collections.Counter(), collections.Counter()
    for k, seconds in seen.values():
        cpu[k] += seconds
        count[k] += 1
    json.dump({k: [round(v, 1), count[k]] for k, v in cpu.most_common()}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
