"""NVLink multicast is off in the environment every process spectune starts begins with: the ranks of
`spectune decode --tp 2` and, with `--ray`, the embedded Ray's GCS, raylet, agents and the actors,
started from a shell that lacks the three variables. The test reads /proc/PID/environ (the
environment a process was started with) of every descendant of the driver while it runs.

Ray renames some of its Python processes (setproctitle), which overwrites the start of their
environment block in /proc; for such a process the variables that survive are checked and its
parent, whose environment it inherited, must carry all three.

The two decodes watched are also the checks of `spectune decode` as a user runs it (the JSON contract on
a local gang, and `--ray`), once in tests/e2e/test_cli_decode.py: each decode costs its own gang and Ray.

    .venv/bin/python -m pytest tests/e2e/test_nvls_env.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from studyutil import CONTRACT_METRICS

from workers.runtime.nvls import NVLS_OFF_ENV

WANT = [f"{k}={v}".encode() for k, v in NVLS_OFF_ENV.items()]
REQUIRED = [*CONTRACT_METRICS, "accept_rate_pos_1"]  # a decode with a drafter reports its acceptance by position too


def _ppids() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out[int(name)] = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def _descendants(root: int, ppids: dict[int, int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _watch(args: list[str], env: dict) -> tuple[subprocess.CompletedProcess, dict[int, dict]]:
    """Run `spectune args`; while it runs, read every descendant's cmdline and environ (the latest
    reading of each process is kept: a child caught between fork and exec still shows its parent's)."""
    # output to files, not pipes: nobody reads a pipe while the loop below watches, and a full one would stall the run
    out_f, err_f = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], stdout=out_f, stderr=err_f, env=env)
    seen: dict[int, dict] = {}
    try:
        while proc.poll() is None:
            ppids = _ppids()
            for pid in _descendants(proc.pid, ppids):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                seen[pid] = {"cmd": cmd, "env": environ, "ppid": ppids.get(pid)}
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out_f.seek(0)
    err_f.seek(0)
    out, err = out_f.read().decode(), err_f.read().decode()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seen


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in NVLS_OFF_ENV and k != "RAY_ADDRESS"}
    return {**env, "RAY_AUTH_MODE": "disabled", **extra}


def _has_all(entries: list[bytes]) -> bool:
    return all(w in entries for w in WANT)


def _name(s: dict) -> str:
    return s["cmd"].split(b"\0")[0].decode(errors="replace")


def test_decode_json_on_tiny_model_and_its_local_ranks_start_with_nvls_off(tiny_ckpt):
    """`spectune decode --tp 2 --json` on a local gang, as a user runs it: a JSON object with the contract's
    metric names, the engine flags as the trial's engine.* params, the outputs match the baseline, gloo's
    allreduces measured; each verifier rank's peak RSS; and its forkserver and ranks start with NVLink
    multicast off. (Once two tests, test_cli_decode.py's test_decode_json_on_tiny_model and this file's
    test_local_gang_ranks_start_with_nvls_off: one decode carries both, each costing its own gang.)"""
    r, seen = _watch(
        [
            "decode",
            "--model",
            str(tiny_ckpt),
            "--tp",
            "2",
            "--drafter",
            "ngram",
            "-k",
            "3",
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "24",
            "--gemv",
            "off",
            "--no-overlap",
            "--json",
        ],
        _clean_env(),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    for key in REQUIRED:
        assert key in out, key
    assert out["outputs_match_baseline"] == 1
    assert out["params"]["parallel.tp"] == 2 and out["params"]["drafter.kind"] == "ngram"
    # the engine flags are the trial's engine.* params (the YAML section `engine:`)
    assert out["params"]["engine.gemv"] == "off" and out["params"]["engine.overlap"] is False
    assert out["params"]["engine.attention"] == "auto" and out["params"]["spec.num_draft_tokens"] == 3
    assert out["tokens_generated"] == 2 * 24
    assert out["allreduce_per_step"] == 4 and out["comm_ms_per_step"] > 0
    rss = out["rank_peak_rss_mb"]  # each verifier rank's peak resident memory (torch alone is > 100 MiB)
    assert len(rss) == 2 and all(100 < mb < 4096 for mb in rss), rss
    # a CPU gang's ranks are forked from a forkserver (workers/runtime/procs.py): the forkserver and its two
    # ranks carry its command line, and the ranks start with the environment it started with
    ranks = [pid for pid, s in seen.items() if b"forkserver" in s["cmd"]]
    assert len(ranks) >= 3, {pid: _name(s) for pid, s in seen.items()}
    missing = {pid: _name(s) for pid, s in seen.items() if not _has_all(s["env"])}
    assert not missing, f"started without NVLink multicast off: {missing}"


def test_decode_as_ray_actors_with_nvls_off_in_every_process(tiny_ckpt):
    """`spectune decode --ray`: the same run with the gang as actors of an embedded local Ray (as a study
    places them); the same metrics, the outputs still match the baseline, and Ray is gone afterwards. The
    embedded Ray's GCS, raylet, agents and the actors start with NVLink multicast off. (Once two tests,
    test_cli_decode.py's test_decode_as_ray_actors and this file's
    test_ray_processes_and_actors_start_with_nvls_off: one decode carries both, each costing its own Ray.)"""
    from studyutil import ray_temp_dir

    from orchestrator.study.drivers import _writes_under

    ray_tmp = ray_temp_dir()
    env = _clean_env(SPECTUNE_RAY_TMPDIR=ray_tmp)
    r, seen = _watch(
        [
            "decode",
            "--ray",
            "--model",
            str(tiny_ckpt),
            "--tp",
            "2",
            "--drafter",
            "ngram",
            "-k",
            "3",
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "16",
            "--json",
        ],
        env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["gang"] == "ray" and out["outputs_match_baseline"] == 1 and out["tokens_generated"] == 2 * 16
    assert "gang as Ray actors: embedded local ray" in r.stderr
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _writes_under(int(pid), ray_tmp)]
    assert left == []
    names = {pid: _name(s) for pid, s in seen.items()}
    assert any(n.endswith("gcs_server") for n in names.values()) and any(n.endswith("raylet") for n in names.values()), names
    actors = [pid for pid, n in names.items() if n.startswith("ray::WorkerActor")]
    assert len(actors) >= 2, names
    intact = {pid for pid, s in seen.items() if s["env"] and s["env"][0]}  # a renamed process's block starts with its title's padding
    for pid, s in seen.items():
        if pid in intact:
            assert _has_all(s["env"]), f"{names[pid]} (pid {pid}) started without NVLink multicast off"
        else:
            parent = seen.get(s["ppid"])
            assert parent is not None and s["ppid"] in intact and _has_all(parent["env"]), (
                f"{names[pid]} (pid {pid}): its parent {s['ppid']} does not carry NVLink multicast off"
            )
            for key, want in zip(NVLS_OFF_ENV, WANT):  # what survived the rename is right
                assert not any(e.startswith(key.encode() + b"=") and e != want for e in s["env"]), (names[pid], key)
