"""Allreduce tables (workers/spec/allreduce_table.py): what an emulated rank waits, interpolated log-log between
measured sizes, and the one-line errors for a size outside the table, a backend or TP size it lacks,
and files that are not tables; the bundled presets state their source and date; the schema's rules
of parallel.emulate_tp / parallel.allreduce_table."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator.config.schema import validated
from orchestrator.errors import UserError
from workers.comm import TableError, emulation_refusal, load_table, presets, refusal
from workers.comm.capability import GangInfo
from workers.spec.allreduce_table import parse_table


def _table(rows: list[dict], name: str = "t"):
    return parse_table(json.dumps(rows).encode(), default_name=name)


def _row(size: int, us: float, backend: str = "nccl", tp: int = 8, mode: str = "graph", env: str = "default") -> dict:
    return {"backend": backend, "tp": tp, "mode": mode, "env": env, "size_bytes": size, "time_us": us}


def test_measured_sizes_exactly_and_log_log_between():
    t = _table([_row(1024, 10.0), _row(4096, 40.0), _row(16384, 40.0)])
    assert t.latency_us("nccl", 8, 1024) == 10.0 and t.latency_us("nccl", 8, 4096) == 40.0
    # a power law between the two sizes around it: halfway in log size is the geometric mean
    assert t.latency_us("nccl", 8, 2048) == pytest.approx(math.sqrt(10.0 * 40.0))
    assert t.latency_us("nccl", 8, 8192) == pytest.approx(40.0)


def test_a_zero_latency_interpolates_linearly():
    t = _table([_row(1000, 0.0), _row(3000, 20.0)])
    assert t.latency_us("nccl", 8, 2000) == pytest.approx(10.0)
    zero = _table([_row(256, 0.0), _row(1 << 20, 0.0)])
    assert zero.latency_us("nccl", 8, 5000) == 0.0


def test_duplicate_sizes_average_and_modes_and_envs_are_chosen():
    t = _table(
        [
            _row(1024, 10.0),
            _row(1024, 20.0),
            _row(1024, 99.0, mode="eager"),
            _row(1024, 5.0, env="NCCL_PROTO=LL"),
            _row(2048, 30.0),
            _row(2048, 99.0, mode="eager"),
        ]
    )
    assert t.latency_us("nccl", 8, 1024, mode="graph") == pytest.approx(15.0)  # the default environment, averaged
    assert t.latency_us("nccl", 8, 1024, mode="eager") == 99.0
    only_eager = _table([_row(1024, 7.0, mode="eager"), _row(2048, 7.0, mode="eager")])
    assert only_eager.latency_us("nccl", 8, 1500, mode="graph") == pytest.approx(7.0)  # the other mode where the table lacks the run's


def test_outside_the_measured_sizes_is_an_error_naming_the_size():
    t = _table([_row(1024, 10.0), _row(4096, 40.0)], name="small")
    for size in (512, 8192):
        with pytest.raises(TableError, match=rf"message of {size} B is outside table 'small'.*1024 \.\. 4096 B"):
            t.latency_us("nccl", 8, size)


def test_backends_and_tp_sizes_the_table_lacks():
    t = _table([_row(1024, 10.0), _row(1024, 5.0, backend="symm_mem_ll", tp=2)], name="mixed")
    assert t.backends(8) == ("nccl",) and t.backends(2) == ("symm_mem_ll",) and t.tps() == (2, 8)
    with pytest.raises(TableError, match="no rows for gloo at TP 8"):
        t.latency_us("gloo", 8, 1024)
    assert emulation_refusal(t, "nccl", 8) is None
    assert "it times nccl" in emulation_refusal(t, "gloo", 8)
    assert "has no rows at TP 4 (it has TP 2, 8)" in emulation_refusal(t, "nccl", 4)
    assert emulation_refusal(t, "gloo", 1) is None  # TP 1 issues no collective
    several = _table([_row(1024, 1.0, env="A=1"), _row(1024, 2.0, env="B=1")], name="envs")
    with pytest.raises(TableError, match="several NCCL environments"):
        several.latency_us("nccl", 8, 1024)


def test_emulated_is_no_comm_backend_choice():
    assert "no comm.backend choice" in refusal("emulated", GangInfo(world_size=2, device_type="cpu"))


def test_files_that_are_not_tables(tmp_path):
    with pytest.raises(TableError, match="neither a preset .* nor a table file"):
        load_table("no-such-preset")
    bad = tmp_path / "bad.json"
    for text, msg in (
        ("not json", "not an allreduce table"),
        ("[]", "not an allreduce table"),
        ('[{"backend": "nccl", "tp": 2, "size_bytes": 8}]', "row 0 has no time_us"),
        ('[{"backend": "nccl", "tp": 2, "size_bytes": 8, "time_us": -1}]', "row 0 needs"),
        ('[{"backend": "nccl", "tp": "x", "size_bytes": 8, "time_us": 1}]', "row 0 has a value of the wrong type"),
    ):
        bad.write_text(text)
        with pytest.raises(TableError, match=msg):
            load_table(str(bad))


def test_bench_allreduce_json_is_a_table_as_it_stands(tmp_path):
    """`spectune bench-allreduce --json` prints a list of rows (orchestrator/bench.py), log lines go to stderr;
    a capture holding both is read from its last line."""
    rows = [{**_row(s, 30.0 + s / 1000, backend="gloo", tp=2, mode="eager"), "algbw_GBps": 0.1, "busbw_GBps": 0.1} for s in (4096, 8192)]
    path = tmp_path / "bench.json"
    path.write_text("spectune: bench-allreduce gloo tp=2 default env ...\n" + json.dumps(rows) + "\n")
    t = load_table(str(path))
    assert t.name == "bench" and t.backends(2) == ("gloo",) and len(t.sha256) == 64
    assert t.latency_us("gloo", 2, 4096, mode="eager") == pytest.approx(34.096)


def test_presets_state_source_and_date_and_cover_decode_sizes():
    assert {"pcie-8x-rtx-pro-6000", "seeds-tp8-pcie", "nvlink-h200"} <= set(presets())
    for name in presets():
        t = load_table(name)
        assert t.name == name and t.source and t.date
    pcie, seeds, nvlink = load_table("pcie-8x-rtx-pro-6000"), load_table("seeds-tp8-pcie"), load_table("nvlink-h200")
    assert pcie.latency_us("nccl", 8, 4096) == 24.0 and pcie.latency_us("nccl", 8, 256) == 24.0  # the published flat range
    assert seeds.latency_us("nccl", 8, 16384) == 200.0
    assert nvlink.latency_us("symm_mem_ll", 2, 8192) == pytest.approx(3.28, abs=0.01)  # measured, TP 2, in CUDA graphs
    assert nvlink.backends(8) == ("nccl", "symm_mem", "symm_mem_ll")
    for t in (pcie, seeds, nvlink):  # a Llama-3-70B rank: one token (16 KB) to a 17-token verify pass
        t.latency_us("nccl", 8, 8192 * 2)
        t.latency_us("nccl", 8, 17 * 8192 * 2)


@pytest.mark.parametrize(
    "parallel, where",
    [
        (
            {"tp": 2, "emulate_tp": 4, "allreduce_table": "nvlink-h200"},
            "parallel.emulate_tp: emulates TP 4 in one process: parallel.tp must be 1",
        ),
        ({"emulate_tp": 4}, "parallel.allreduce_table: parallel.emulate_tp needs a table"),
        ({"allreduce_table": "nvlink-h200"}, "parallel.allreduce_table: is read only with parallel.emulate_tp"),
        ({"emulate_tp": 0, "allreduce_table": "nvlink-h200"}, "parallel.emulate_tp:"),
    ],
)
def test_schema_rules_name_the_field(parallel, where):
    with pytest.raises(UserError) as e:
        validated({"name": "x", "parallel": parallel, "search": {"space": {"spec.num_draft_tokens": 0}}})
    assert str(e.value).startswith(where), str(e.value)


def test_the_console_and_report_line_names_the_deployment_the_table_and_the_acceptance():
    from orchestrator.config import emulation

    raw = {
        "name": "x",
        "parallel": {"tp": 1, "emulate_tp": 8, "allreduce_table": "seeds-tp8-pcie"},
        "search": {"space": {"spec.num_draft_tokens": 0}},
    }
    raw["workload"] = {"simulate_accept_len": 2.5}
    line = emulation.report_line(validated(raw))
    assert line.startswith("EMULATED: emulated TP 8 from table seeds-tp8-pcie") and "accepted length 2.5" in line, line
    assert emulation.report_line(validated({"name": "x", "search": {"space": {"spec.num_draft_tokens": 0}}})) is None


def test_the_tp_a_trials_figures_are_for():
    """`deployed_tp`: an emulated trial's (one rank of TP N, parallel.tp 1), a trial's searched TP over the
    experiment's, else the experiment's. Whether a trial times its step with and without its allreduces
    turns on it (a study searching parallel.tp once lost the split: it read the experiment's TP)."""
    from orchestrator.config.emulation import deployed_tp

    base = {
        "name": "t",
        "model": {"path": "random:tiny"},
        "parallel": {"tp": 1, "device": "cpu", "backend": "gloo"},
        "search": {"space": {"spec.num_draft_tokens": {"choices": [0, 2]}}},
    }
    real = validated(base)
    assert deployed_tp({}, real) == 1 and deployed_tp({"parallel.tp": 4}, real) == 4
    emulated = validated({**base, "parallel": {**base["parallel"], "emulate_tp": 8, "allreduce_table": "seeds-tp8-pcie"}})
    assert deployed_tp({}, emulated) == 8 and deployed_tp({"parallel.tp": 1}, emulated) == 8
    assert deployed_tp({"parallel.emulate_tp": 4, "parallel.tp": 1}) == 4 and deployed_tp({"parallel.tp": 2}) == 2  # params alone (exports)
