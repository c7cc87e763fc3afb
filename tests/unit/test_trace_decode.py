"""scripts/trace_decode.py: the GPU idle accounting on made-up trace events (the tool on CPU end to
end: tests/engine/test_trace_decode_cpu.py)."""

from scripts.trace_decode import busy_intervals, summarize


def _x(name, ts, dur, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat}


def test_idle_time_is_the_part_of_each_phase_no_kernel_covers():
    assert busy_intervals([(5, 8), (0, 2), (1, 3), (8, 9)]) == [(0, 3), (5, 9)]
    events = [
        _x("spectune.propose", 0, 100),  # kernels cover 20..60: 60 us idle
        _x("k1", 20, 30, "kernel"),
        _x("k2", 40, 20, "kernel"),
        _x("spectune.verify", 100, 400),  # covered 100..480: 20 us idle
        _x("k3", 100, 380, "kernel"),
        _x("spectune.decide", 500, 50),  # nothing runs: 50 us idle
        _x("spectune.publish", 550, 50),
        _x("k4", 560, 100, "kernel"),  # runs past the window's end (600): 40 us counted, 10 idle
        _x("spectune.verify", 120, 900, "gpu_user_annotation"),  # the label's mirror on the GPU timeline: not a host span
    ]
    s = summarize(events)
    assert s["steps"] == 1 and s["wall_ms"] == 0.6
    assert abs(s["gpu_busy_ms"] - (0.04 + 0.38 + 0.04)) < 1e-9
    idle = {p: round(v["gpu_idle_ms"] * 1e3) for p, v in s["phases"].items()}
    assert idle == {"propose": 60, "verify": 20, "decide": 50, "publish": 10}
    # kernels by total time inside the window (k4 starts inside it: counted whole)
    top = [(k["name"], k["count"], round(k["total_ms"] * 1e3)) for k in s["top_kernels"]]
    assert top == [("k3", 1, 380), ("k4", 1, 100), ("k1", 1, 30), ("k2", 1, 20)]
    assert summarize([_x("k", 0, 5, "kernel")]) == {"steps": 0}
