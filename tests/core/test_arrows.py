"""The import arrows: predictors -> leaderboard_core <- leaderboard, and the harness reaches the
predictors only through the registry (and the contract types, which live in leaderboard_core).

The harness is in stages (``STAGES``), each importing only its own and those below. Read from
the source with ``ast`` (every import, those inside functions too, ``from x import y`` resolved with
``importlib`` to tell a submodule from a name), so a new import that breaks an arrow fails here.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from leaderboard_core import paths
from leaderboard_core.versioning import imported_modules

PACKAGES = paths.CODE_PACKAGES  # leaderboard, leaderboard_core, predictors
# predictors.checks: the public contract check, imported only by the sealed checking child
HARNESS_MAY_IMPORT = {"predictors", "predictors.registry", "predictors.base", "predictors.checks"}


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


def all_imports(path: Path, name: str) -> set[str]:
    """Every import of the suite's modules in ``path`` (module ``name``), those made inside
    functions included, ``from pkg import sub`` resolved to the submodule and relative imports
    made absolute (``versioning.imported_modules``): the arrows a cycle can run through."""
    found = {n for n in imported_modules(path, name) if n in modules() and n != name}
    # ``from pkg import sub`` names the package too; the arrow is to the submodule
    return {n for n in found if not any(m.startswith(f"{n}.") for m in found)}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import circles of ``graph``: its strongly connected components of two modules or
    more (Tarjan's algorithm, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


# The harness's stages, bottom to top: a module may import its own stage and those below, never
# one above (imports inside functions counted). The commands (``python -m leaderboard.X``, and
# ``cli``, the main command's Hydra task) stand at the top, in ``leaderboard/`` itself.
STAGES = ("leaderboard_core", "leaderboard.ingest", "leaderboard.cells", "leaderboard.store",
          "leaderboard.serving", "leaderboard.seal", "leaderboard.score", "leaderboard.run",
          "leaderboard.present", "leaderboard")
COMMAND_SUPPORT = {"leaderboard", "leaderboard.__main__", "leaderboard.cli"}


def stage_of(module: str) -> int:
    """The index in ``STAGES`` of the innermost stage that holds ``module``."""
    holding = [s for s in STAGES if module == s or module.startswith(f"{s}.")]
    return STAGES.index(max(holding, key=len))


def upward_imports(name: str, path: Path) -> list[str]:
    """``path`` (module ``name``)'s imports of a module in a higher stage, as ``file: name``."""
    return [f"{path.relative_to(paths.REPO_ROOT) if path.is_relative_to(paths.REPO_ROOT) else path}"
            f" imports {target} (stage {STAGES[stage_of(target)]}, above {STAGES[stage_of(name)]})"
            for target in sorted(all_imports(path, name))
            if target.split(".")[0] in ("leaderboard", "leaderboard_core")
            and stage_of(target) > stage_of(name)] if name.split(".")[0] in (
        "leaderboard", "leaderboard_core") else []


def test_every_harness_module_stands_in_a_stage_and_the_top_holds_only_commands():
    for name, path in modules().items():
        if (name.split(".")[0] != "leaderboard" or name.count(".") != 1 or name in COMMAND_SUPPORT
                or path.name == "__init__.py"):  # a stage package
            continue
        assert 'if __name__ == "__main__":' in path.read_text(), (
            f"{path.relative_to(paths.REPO_ROOT)} stands at the top of leaderboard/ but is no "
            "command: move it into the stage that matches what it imports (tests/core/test_arrows.py "
            "STAGES)")


def test_no_import_runs_up_a_stage_imports_inside_functions_counted():
    found = [line for name, path in modules().items() for line in upward_imports(name, path)]
    assert not found, "imports from a lower stage to a higher one:\n" + "\n".join(found)


def test_no_import_circle_imports_inside_functions_counted():
    graph = {name: all_imports(path, name) for name, path in modules().items()}
    assert not circles(graph), f"import circles: {[sorted(c) for c in circles(graph)]}"


def test_a_planted_upward_import_inside_a_function_fails_with_its_file_and_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def late():\n    from leaderboard.present import sections\n")
    assert upward_imports("leaderboard.store.planted", planted) == [
        f"{planted} imports leaderboard.present.sections (stage leaderboard.present, above "
        "leaderboard.store)"]
    assert upward_imports("leaderboard.present.planted", planted) == []


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert circles(graph) == []
    planted = tmp_path / "c.py"
    planted.write_text("def late():\n    from leaderboard.run import evaluate\n")
    graph["c"] = {n.removeprefix("leaderboard.run.").replace("evaluate", "a")
                  for n in all_imports(planted, "leaderboard.c")}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
