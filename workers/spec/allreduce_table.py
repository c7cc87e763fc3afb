"""Allreduce latency tables: what an emulated rank waits for each collective (torch-free).

    table = load_table("pcie-8x-rtx-pro-6000")          # a bundled preset (workers/spec/allreduce_tables/), or a file path
    table.latency_us("nccl", tp=8, size_bytes=16384, mode="graph")   # -> 24.0; TableError outside the measured sizes

A table is what `spectune bench-allreduce --json` prints, as it stands (a JSON list of rows, each
with backend, tp, mode, size_bytes, time_us and env), or a JSON object {"name", "source", "date",
"assumes", "rows": [...]} that also says where its figures come from (the bundled presets). The
backends a table lists at a TP size are the `comm.backend` choices an emulated study may search on it.
The table's content hash (sha256 of the file's bytes) goes into the record with its name.

Choosing rows: the run's mode ("graph": steps replayed as CUDA graphs; "eager": CPU or CUDA
without graphs) where the table has it for that backend and TP size, else the other mode; the
NCCL environment "default" where the table has several, else the only one it has.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

PRESET_DIR = Path(__file__).resolve().parent / "allreduce_tables"
MODES = ("graph", "eager")


class TableError(ValueError):
    """A table that cannot be read, or a lookup it cannot answer (one line, no field name)."""


@dataclass(frozen=True)
class TableRow:
    backend: str
    tp: int
    size_bytes: int
    time_us: float
    mode: str = "graph"  # graph | eager
    env: str = "default"  # the NCCL environment label bench-allreduce gives it


@dataclass(frozen=True)
class AllreduceTable:
    """One table's rows and where they come from (a picklable value: it travels in the GangSpec)."""

    name: str
    sha256: str  # of the file's bytes: two tables of one name are told apart in the record
    rows: tuple[TableRow, ...]
    source: str = ""
    date: str = ""

    @property
    def label(self) -> str:
        return table_label(self.name, self.sha256)

    def tps(self) -> tuple[int, ...]:
        return tuple(sorted({r.tp for r in self.rows}))

    def backends(self, tp: int) -> tuple[str, ...]:
        """The backends the table times at `tp` ranks: the comm.backend choices it allows."""
        return tuple(sorted({r.backend for r in self.rows if r.tp == tp}))

    def curve(self, backend: str, tp: int, mode: str) -> tuple[tuple[int, float], ...]:
        """(size_bytes, time_us) of the rows that time `backend` at `tp` ranks, sorted by size (a size
        timed twice: the mean), in `mode` where the table has it, else in the other mode."""
        rows = [r for r in self.rows if r.backend == backend and r.tp == tp]
        if not rows:
            have = ", ".join(f"{b} at TP {t}" for t in self.tps() for b in self.backends(t)) or "no rows"
            raise TableError(f"table {self.name!r} has no rows for {backend} at TP {tp} (it has {have})")
        modes = {r.mode for r in rows}
        use = mode if mode in modes else sorted(modes)[0]
        rows = [r for r in rows if r.mode == use]
        envs = sorted({r.env for r in rows})
        if len(envs) > 1:
            if "default" not in envs:
                raise TableError(
                    f"table {self.name!r} times {backend} at TP {tp} in several NCCL environments ({', '.join(envs)}) and none is 'default'"
                )
            rows = [r for r in rows if r.env == "default"]
        by_size: dict[int, list[float]] = {}
        for r in rows:
            by_size.setdefault(r.size_bytes, []).append(r.time_us)
        return tuple((s, sum(ts) / len(ts)) for s, ts in sorted(by_size.items()))

    def latency_us(self, backend: str, tp: int, size_bytes: int, mode: str = "graph") -> float:
        """One allreduce of `size_bytes` on `tp` ranks, interpolated between the two measured sizes
        around it: log-log (a power law between them, as the performance model reads tables) where
        both times are positive, linear where one is 0 (an all-zero table stays 0). A size outside
        the measured range is an error naming it: the table says nothing there."""
        pts = self.curve(backend, tp, mode)
        sizes = [s for s, _ in pts]
        if not sizes[0] <= size_bytes <= sizes[-1]:
            raise TableError(
                f"a message of {size_bytes} B is outside table {self.name!r}'s measured sizes for {backend} at TP {tp} "
                f"({sizes[0]} .. {sizes[-1]} B)"
            )
        i = bisect.bisect_left(sizes, size_bytes)
        if sizes[i] == size_bytes:
            return pts[i][1]
        (s0, t0), (s1, t1) = pts[i - 1], pts[i]
        if t0 > 0 and t1 > 0:
            f = (math.log(size_bytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
        return t0 + (size_bytes - s0) / (s1 - s0) * (t1 - t0)


def presets() -> tuple[str, ...]:
    """The bundled tables' names (their file names without .json)."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.json")))


def load_table(ref: str) -> AllreduceTable:
    """A bundled preset by name, else a table file (bench-allreduce --json output, or a preset-style
    object). TableError, in one line, for an unknown name, an unreadable file or a malformed row."""
    path = PRESET_DIR / f"{ref}.json" if ref in presets() else Path(ref).expanduser()
    if not path.is_file():
        raise TableError(f"{ref!r} is neither a preset ({', '.join(presets())}) nor a table file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TableError(f"{str(path)!r} cannot be read ({e.strerror or e})") from None
    try:
        return parse_table(data, default_name=path.stem)
    except TableError as e:
        raise TableError(f"{ref}: {e}") from None


def parse_table(data: bytes, default_name: str) -> AllreduceTable:
    """The table in a file's bytes (its name: the file's own "name", else `default_name`)."""
    text = data.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        try:  # a captured `bench-allreduce --json` with log lines before the JSON
            doc = json.loads(text.splitlines()[-1]) if text else None
        except json.JSONDecodeError:
            doc = None
    if isinstance(doc, dict):
        meta, raw = doc, doc.get("rows")
    else:
        meta, raw = {}, doc
    if not isinstance(raw, list) or not raw:
        raise TableError("not an allreduce table (a `spectune bench-allreduce --json` list of rows, or an object with rows)")
    rows = tuple(_row(r, i) for i, r in enumerate(raw))
    return AllreduceTable(
        name=str(meta.get("name") or default_name),
        sha256=hashlib.sha256(data).hexdigest(),
        rows=rows,
        source=str(meta.get("source", "")),
        date=str(meta.get("date", "")),
    )


def _row(r, i: int) -> TableRow:
    if not isinstance(r, dict):
        raise TableError(f"row {i} is not an object")
    try:
        row = TableRow(
            backend=str(r["backend"]),
            tp=int(r["tp"]),
            size_bytes=int(r["size_bytes"]),
            time_us=float(r["time_us"]),
            mode=str(r.get("mode", "graph")),
            env=str(r.get("env", "default")),
        )
    except KeyError as e:
        raise TableError(f"row {i} has no {e.args[0]}") from None
    except (TypeError, ValueError):
        raise TableError(f"row {i} has a value of the wrong type") from None
    if row.tp < 1 or row.size_bytes < 1 or not math.isfinite(row.time_us) or row.time_us < 0 or row.mode not in MODES:
        raise TableError(f"row {i} needs tp >= 1, size_bytes >= 1, a finite time_us >= 0 and mode graph or eager")
    return row


def table_label(name: str, sha256: str) -> str:
    """How the record, the console, the report and the exports name a table: "NAME (sha256 0123456789ab)"."""
    return f"{name} (sha256 {sha256[:12]})"


def emulated_words(tp: int, table: str) -> str:
    """What an emulated figure is, in the words every output uses: "emulated TP 8 from table NAME (sha256 ...)"."""
    return f"emulated TP {tp} from table {table}"
