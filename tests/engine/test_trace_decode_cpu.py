"""scripts/trace_decode.py on CPU end to end: the in-process verifier rank, the phase labels in the
trace (the idle accounting: tests/unit/test_trace_decode.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workers.model.checkpoint import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _trace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scripts.trace_decode", "--drafter", "ngram", *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


@pytest.mark.timeout(1200)
def test_trace_decode_on_cpu_writes_a_trace_with_every_phase(tmp_path):
    # a tiny random-weight model (`random:` + its config.json): what is checked is the trace, not the model's
    # tokens; the script's default, the demo model, would be fetched and loaded (a `slow` test's part)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(tiny_config()))
    model = ("--model", f"random:{cfg}")
    r = _trace(*model, "-k", "2", "--max-new-tokens", "8", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["steps"] >= 1 and s["gpu_busy_ms"] is None  # CPU: no kernels
    assert all(v["count"] == s["steps"] for v in s["phases"].values())
    names = {e.get("name") for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert {"spectune.propose", "spectune.verify", "spectune.decide", "spectune.publish"} <= names
    # batched decoding: two prompts on two rows, its steps labelled propose / verify / decide
    r = _trace(*model, "-k", "2", "--max-new-tokens", "8", "--batch-size", "2", "--out", str(tmp_path / "b2"))
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "b2" / "summary.json").read_text())
    assert s["steps"] >= 1 and s["options"]["batch_size"] == 2
    assert [s["phases"][p]["count"] for p in ("propose", "verify", "decide", "publish")] == [s["steps"]] * 3 + [0]
    bad = _trace(*model, "-k", "-1", "--out", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("trace_decode: --num-draft-tokens")
