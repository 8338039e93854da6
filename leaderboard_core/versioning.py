"""Content hashes for versions, and the code version results carry."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import subprocess
from functools import cache, lru_cache
from pathlib import Path

from leaderboard_core import paths


def content_hash(*parts: object, length: int = 16) -> str:
    """A short stable hash of JSON-serializable parts."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def release(version: str | None) -> tuple[int, ...] | None:
    """An engine version's release as numbers, to order versions: ``0.14.1`` -> (0, 14, 1),
    ``0.19.0rc1`` -> (0, 19, 0); None where the version does not start with dotted numbers
    (``unknown``, a commit hash such as ``82831f1``), which no comparison accepts."""
    found = re.match(r"(\d+(?:\.\d+)+)", version or "")
    return tuple(int(x) for x in found.group(1).split(".")) if found else None


@cache
def code_version() -> str:
    """The git commit of the working tree, with ``-dirty`` when it has uncommitted changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=paths.REPO_ROOT, capture_output=True,
                             text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=paths.REPO_ROOT, capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


# A module that presents or moves results but never changes a run's numbers says so with this
# line at module level; editing it must not make every stored run stale.
PRESENTATION_MARKER = "PRESENTATION = True"


def is_presentation(text: str) -> bool:
    return any(line.rstrip() == PRESENTATION_MARKER for line in text.splitlines())


def _hashed(files, root: Path) -> str:
    """The hash of ``files`` (relative names and texts), less the modules marked
    ``PRESENTATION = True``."""
    texts = [(p.relative_to(root).as_posix(), p.read_text()) for p in sorted(set(files))]
    return content_hash([(rel, text) for rel, text in texts
                         if not (rel.endswith(".py") and is_presentation(text))])


def _sources(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix in (".py", ".yaml")
            and "__pycache__" not in p.parts]


@cache
def code_hash() -> str:
    """A hash of all the code and configs (Python and YAML under the code packages and conf/,
    less the modules marked ``PRESENTATION = True``): what a benchmark ran at, and a run's
    code hash where its predictor's own files cannot be told (a class the harness registered
    in its own process)."""
    return _hashed([p for d in (*paths.CODE_PACKAGES, "conf") for p in _sources(
        paths.REPO_ROOT / d)], paths.REPO_ROOT)


def _owned_conf() -> set[Path]:
    """``conf/<name>/`` of each predictor package ``predictors/<name>/``: its frozen constants,
    read by that predictor only."""
    predictors = paths.REPO_ROOT / "predictors"
    return {folder for folder in (paths.REPO_ROOT / "conf").iterdir()
            if (predictors / folder.name / "__init__.py").is_file()}


@cache
def harness_hash() -> str:
    """A hash of the harness code and configs that decide every run's numbers: ``leaderboard/``,
    ``leaderboard_core/`` and ``conf/`` less the folders a predictor package owns."""
    owned = _owned_conf()
    files = [*_sources(paths.REPO_ROOT / "leaderboard"), *_sources(paths.REPO_ROOT /
                                                                    "leaderboard_core"),
             *(p for p in _sources(paths.CONF_DIR) if not any(p.is_relative_to(o) for o in owned))]
    return _hashed(files, paths.REPO_ROOT)


def _module_file(name: str, root: Path) -> Path | None:
    """The file of module ``name`` under ``root`` (a module or a package), or None."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path, name: str) -> frozenset[str]:
    """Every module ``path`` (module ``name``) imports, anywhere in it (inside functions too),
    relative imports made absolute; ``from a import b`` names both ``a`` and ``a.b``. Parsed
    once per process for each version of the file (a rerun worker asks for every run)."""
    stat = path.stat()
    return _imports(path, name, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4096)
def _imports(path: Path, name: str, mtime_ns: int, size: int) -> frozenset[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found |= {module, *(f"{module}.{alias.name}" for alias in node.names)}
    return frozenset(found)


def module_files(module: str, roots: list[Path]) -> list[Path]:
    """The files of ``module`` and of every module it imports, transitively, that lie under one
    of ``roots`` (each a folder on the import path), with their packages' ``__init__.py``."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for prefix in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if prefix in seen:
                continue
            path = next((f for r in roots if (f := _module_file(prefix, r))), None)
            if path is not None:
                seen[prefix] = path
                todo += sorted(imported_modules(path, prefix))
    return sorted(seen.values())


def predictor_code_hash(module: str, folder: str | None = None) -> str:
    """A run's code hash: the harness (``harness_hash``), the files the predictor's module
    imports from ``predictors/`` (and from its ``predictors_path`` ``folder``), and the conf
    folders its packages own. Editing one predictor makes only its runs stale; editing the
    harness, every run. A module outside both (the tests' probes) gets ``code_hash``."""
    if not module.startswith("predictors.") and folder is None:
        return code_hash()
    roots = [paths.REPO_ROOT, *([Path(folder)] if folder else [])]
    files = module_files(module, roots)
    owned = [c for c in _owned_conf() if any(
        f.is_relative_to(paths.REPO_ROOT / "predictors" / c.name) for f in files)]
    repo = [f for f in files if f.is_relative_to(paths.REPO_ROOT)] + [
        p for c in owned for p in _sources(c)]
    outside = [f for f in files if not f.is_relative_to(paths.REPO_ROOT)]
    return content_hash(harness_hash(), _hashed(repo, paths.REPO_ROOT),
                        _hashed(outside, Path(folder)) if folder else "")
