"""The import arrows: predictors -> leaderboard_core <- leaderboard, and the harness reaches the
predictors only through the registry (and the contract types, which live in leaderboard_core).

Read from the source with ``ast`` (every module-level import, ``from x import y`` resolved with
``importlib`` to tell a submodule from a name), so a new import that breaks an arrow fails here.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from leaderboard_core import paths

PACKAGES = paths.CODE_PACKAGES  # leaderboard, leaderboard_core, predictors
HARNESS_MAY_IMPORT = {"predictors", "predictors.registry", "predictors.base"}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (paths.REPO_ROOT / package).rglob("*.py"):
            parts = path.relative_to(paths.REPO_ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def module_imports(path: Path) -> set[str]:
    """The suite's modules imported at module level (not inside a function: those are the
    deferred imports that cannot make a cycle at import time)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}")
                      else node.module for a in node.names}
    return {n for n in names if n.split(".")[0] in PACKAGES}


def every_import(path: Path) -> set[str]:
    """Every import of the suite's modules, deferred ones included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n.split(".")[0] in PACKAGES}


def test_the_core_imports_neither_side():
    for name, path in modules().items():
        if name.startswith("leaderboard_core"):
            assert {n.split(".")[0] for n in every_import(path)} <= {"leaderboard_core"}, name


def test_predictors_never_import_the_harness():
    for name, path in modules().items():
        if name.startswith("predictors"):
            bad = {n for n in every_import(path) if n.split(".")[0] == "leaderboard"}
            assert not bad, f"{name} imports the harness: {sorted(bad)}"


def test_the_harness_reaches_predictors_only_through_the_registry():
    for name, path in modules().items():
        if name.split(".")[0] == "leaderboard":
            bad = {n for n in every_import(path)
                   if n.split(".")[0] == "predictors" and n not in HARNESS_MAY_IMPORT}
            assert not bad, f"{name} imports a predictor's internals: {sorted(bad)}"


def test_no_import_cycle_at_module_level():
    graph = {name: {m for m in module_imports(path) if m in modules()} for name, path in
             modules().items()}
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(nxt):]
                                                                    + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_checker_sees_a_forbidden_import(tmp_path):
    """The walk above would catch a harness module importing ours's internals."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from predictors.ours import ops\n")
    assert every_import(probe) == {"predictors.ours"}
    assert not every_import(probe) <= HARNESS_MAY_IMPORT
