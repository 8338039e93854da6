"""The registered predictors as the harness knows them, described by a sealed child.

A predictor module is code the harness does not trust: importing it runs it. The process that
scores a run holds the ground truth and can open the store, so it never imports a predictor
module. It asks a child instead (``python -m leaderboard.sandbox_child --describe``), confined
like a run's child before it imports anything: the child registers every predictor (those of
``predictors_path`` folders too) and answers ``predictors.registry.describe`` for each, as JSON.
Names, parameters, defaults, cards and whether a predictor times single kernels all come from
that answer; the predictor's code runs again only in the sealed child of each run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from leaderboard import sandbox, seal_walls
from leaderboard_core.naming import suggestion
from predictors import registry
from predictors.registry import UnknownPredictor, check_fields, describe

_FOLDERS: list[str] = []


def include(folder: str | Path) -> None:
    """Add a ``predictors_path`` folder, without importing it here: its modules are registered in
    the describing child and in every run's child, which inherit this process's ``sys.path``.
    A folder that holds, or sits in, a folder where measurements lie is refused: the children
    may read it."""
    resolved = Path(folder).expanduser().resolve()
    for data in map(Path, sandbox.watched()):
        if resolved.is_relative_to(data) or data.is_relative_to(resolved):
            where = "is inside" if resolved.is_relative_to(data) else "holds"
            raise ValueError(f"predictors_path={resolved} {where} {data}, where measurements "
                             "lie; a run's child may read its predictor folder, so put the "
                             "predictor modules in a folder of their own")
    folder = str(registry.add_to_path(folder))
    if folder not in _FOLDERS:
        _FOLDERS.append(folder)
        _described.cache_clear()


def folders() -> tuple[str, ...]:
    """With the suite's code, all the predictor code a run's child may read, as this process
    knows it (never a folder a child reported): the ``predictors_path`` folders it was given
    and the folders of predictor modules it imported itself (the tests' probes)."""
    imported = (Path(sys.modules[cls.__module__].__file__).resolve().parent
                for cls in registry.imported().values())
    return tuple(dict.fromkeys([*_FOLDERS, *map(str, imported)]))


def index() -> dict[str, dict[str, Any]]:
    """Every registered predictor's description, by name. A predictor registered by a module
    this process already imported (the tests register their probes so) is described here,
    over the child's answer: its code has run here already. The command-line entry points
    import none."""
    imported = {name: describe(name, cls) for name, cls in registry.imported().items()}
    return {**_described(tuple(_FOLDERS)), **imported}


def names() -> list[str]:
    return sorted(index())


def get(name: str) -> dict[str, Any]:
    found = index()
    if name not in found:
        raise UnknownPredictor(f"unknown predictor '{name}'; {suggestion(name, sorted(found))}")
    if found[name].get("name") != name:  # the describing child's answer is not trusted
        raise ValueError(f"the description of predictor '{name}' names another predictor "
                         f"({found[name].get('name')!r}); a predictor module rewrote it")
    return found[name]


def check_params(name: str, fields) -> None:
    check_fields(get(name), fields)


@lru_cache(maxsize=4)
def _described(folders: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    # A scratch folder of its own, not under the suite's home: describing writes nothing there.
    with tempfile.TemporaryDirectory(prefix="leaderboard-describe-") as scratch:
        # checked too: a module could read a bundled table at import and answer it as defaults
        read, write = sandbox.checked_code(folders), [scratch, "/dev/null"]
        request = {"folders": list(folders), "write": write, "read": read,
                   "list": sandbox.listable(), **sandbox.seal_request(read, write)}
        answer_r, answer_w = os.pipe()
        command = seal_walls.child_command(["-m", "leaderboard.sandbox_child", "--describe",
                                            json.dumps(request), str(answer_w)], [scratch])
        child = subprocess.Popen(command, env=sandbox.scratch_env(scratch), cwd=scratch,
                                 pass_fds=(answer_w,))
        os.close(answer_w)
        with os.fdopen(answer_r) as answer:
            text = answer.read()
        child.wait()
    if not text:
        raise RuntimeError("the predictor-describing child died before answering "
                           f"(exit {child.returncode}); its error is printed above")
    answer = json.loads(text)
    if "error" in answer:
        raise ValueError(answer["error"])
    return _checked(answer.get("predictors"))


# The shape of ``registry.describe``'s answer, field by field: the describing child imports
# predictor modules, so its answer is checked before the harness reads any of it
DESCRIPTION = {"name": str, "module": str, "qualname": str, "defaults": dict, "annotations": dict,
               "choices": dict, "bounds": dict, "card": dict, "predicts_ops": bool}
CARD = {"kind": str, "reference": str, "needs_profiled_rows": bool, "precisions": list,
        "layers": list}


def _checked(described) -> dict[str, dict[str, Any]]:
    if not isinstance(described, dict):
        raise ValueError("the predictor-describing child answered no table of predictors")
    for name, entry in described.items():
        bad = [f for f, kind in DESCRIPTION.items()
               if not isinstance(entry, dict) or not isinstance(entry.get(f), kind)]
        bad += [f"card.{f}" for f, kind in CARD.items()
                if not bad and not isinstance(entry["card"].get(f), kind)]
        if not bad and not all(isinstance(v, list) for v in entry["choices"].values()):
            bad = ["choices"]
        if not bad and not all(isinstance(v, list) and len(v) == 2 and all(
                b is None or (isinstance(b, (int, float)) and not isinstance(b, bool)) for b in v)
                for v in entry["bounds"].values()):
            bad = ["bounds"]
        if bad:
            raise ValueError(f"the description of predictor {name!r} is malformed "
                             f"({', '.join(bad)}); a predictor module rewrote it")
    return described
