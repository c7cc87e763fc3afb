"""The code's shape, as the design asks: no import cycles (any import, module or function level),
between modules and between packages (orchestrator.study -> orchestrator.search is one edge of the
package graph, whichever modules import each other), orchestrator/ and workers/ grouped by concern (packages, not size splits: a module may grow where one
concern needs it), one direction of flow (workers/ never imports the driver; the driver <-> worker
contract stays free of torch), no Optuna internals, and no engine switch read from the environment.

    .venv/bin/python -m pytest tests/unit/test_layout.py
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "workers")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


def _imports(path: Path, name: str, mods: dict[str, Path]) -> set[str]:
    """Every project module `path` imports, wherever the import statement stands."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{a.name}"
                out.add(sub if sub in mods else target)
    return {m for m in out if m in mods and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_cycles():
    mods = _modules()
    graph = {n: _imports(p, n, mods) for n, p in mods.items()}
    # a package's own __init__ importing its submodules is how packages work, not a cycle
    for n in graph:
        graph[n] = {m for m in graph[n] if not (n.startswith(m + ".") and mods[m].name == "__init__.py")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def _package(name: str) -> str:
    """The package a module belongs to, one level below the top: orchestrator.study.loop ->
    orchestrator.study; a top-level module (orchestrator.record, workers.spec) is a node of its own."""
    return ".".join(name.split(".")[:2])


def test_no_package_cycles():
    """Packages layered, each importing only those below it (any import, module or function level):
    orchestrator: record, errors < config < tracking, execution < search < study, export < explain;
    workers: spec, errors < model < comm < kernels < engine < drafters < checks, runtime."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for n, p in mods.items():
        graph.setdefault(_package(n), set()).update(_package(m) for m in _imports(p, n, mods) if _package(m) != _package(n))
    assert _cycle(graph) is None, "package cycle: " + " -> ".join(_cycle(graph))


def test_the_layout_test_finds_a_package_cycle():
    """The check above, on a graph with a loop two modules deep: it must name it."""
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": set()}
    assert _cycle(graph) == ["a.x", "a.y", "a.z", "a.x"]
    assert _cycle({"a.x": {"a.y"}, "a.y": set()}) is None


def test_comm_does_not_import_kernels_or_engine():
    mods = _modules()
    for n, p in mods.items():
        if n.startswith("workers.comm"):
            bad = {m for m in _imports(p, n, mods) if m.startswith(("workers.kernels.gemv", "workers.engine"))}
            assert not bad, f"{n} imports {bad}"


def test_workers_grouped_by_concern():
    top = [p.name for p in (ROOT / "workers").glob("*.py")]
    assert len(top) <= 6, top
    for pkg in ("spec", "model", "kernels", "comm", "engine", "drafters", "checks", "runtime"):
        assert (ROOT / "workers" / pkg / "__init__.py").exists(), pkg
    # workers/ is PyTorch: no Optuna or MLflow anywhere in it, and Ray only where a worker process
    # becomes a Ray actor (workers/runtime/: the actor wrapper and the gang that places them)
    mods = _modules()
    for n, p in mods.items():
        if n.startswith("workers"):
            text = p.read_text()
            assert not re.search(r"^\s*(import|from) (optuna|mlflow)\b", text, re.M), n
            if not n.startswith("workers.runtime"):
                assert not re.search(r"^\s*(import|from) ray\b", text, re.M), f"{n} imports ray outside workers/runtime/"


def test_orchestrator_grouped_by_concern():
    top = sorted(p.name for p in (ROOT / "orchestrator").glob("*.py"))
    assert len(top) <= 8, top
    for pkg in ("config", "search", "study", "execution", "tracking", "explain", "export", "prompts"):
        assert (ROOT / "orchestrator" / pkg / "__init__.py").exists(), pkg


def test_one_direction_of_flow():
    mods = _modules()
    for n, p in mods.items():
        if n.startswith("workers"):
            up = {m for m in _imports(p, n, mods) if m.startswith("orchestrator")}
            assert not up, f"{n} imports the driver: {up}"
    # the contract the driver pickles to the workers: importable without torch
    import subprocess
    import sys

    probe = "import sys, workers.spec; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:3]"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]


def test_no_optuna_internals():
    for n, p in _modules().items():
        if n.startswith("orchestrator"):
            assert not re.search(r"\._storage\b|\._trial_id\b", p.read_text()), n


def test_no_engine_switches_in_the_environment_and_no_diary_in_code():
    switches = ("SPECTUNE_GEMV", "SPECTUNE_GEMV_PUSH", "SPECTUNE_FUSED_ADD_NORM", "SPECTUNE_OVERLAP")
    for p in _modules().values():
        text = p.read_text()
        assert not any(s in text for s in switches), p
        assert not re.search(r"\b(session|lease) \d", text, re.I), p
