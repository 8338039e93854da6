"""The registered predictors as the harness knows them, described by a sealed child.

A predictor module is code the harness does not trust: importing it runs it. The process that
scores a run holds the ground truth and can open the store, so it never imports a predictor
module. It asks a child instead (``python -m leaderboard.seal.child --describe``), confined
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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import polars as pl

from leaderboard.seal import sandbox, talk, walls
from leaderboard_core.naming import suggestion
from leaderboard_core.versioning import code_hash, predictor_code_hash
from predictors import registry
from predictors.registry import UnknownPredictor, check_fields, describe

_FOLDERS: list[str] = []
MAX_ANSWER = 16 << 20  # bytes: descriptions and report sections, many times over
# Importing every predictor module takes seconds; a module that sleeps at import must not hang
# every command that needs the predictors' names
DESCRIBE_SECONDS = 300


def include(folder: str | Path) -> None:
    """Add a ``predictors_path`` folder without importing it, or putting it on this process's
    ``sys.path``: Hydra's plugin scan and every other loader of the harness walks ``sys.path``,
    so a ``hydra_plugins`` package in the folder would run here, beside the ground truth. Only
    sealed children are handed the folder (``child_folders``). A folder that holds, or sits in,
    a folder where measurements lie is refused, and so is one this process already imports from
    (the working folder of ``python -m``): run from another folder."""
    resolved = Path(folder).expanduser().resolve()
    for data in map(Path, sandbox.watched()):
        if resolved.is_relative_to(data) or data.is_relative_to(resolved):
            where = "is inside" if resolved.is_relative_to(data) else "holds"
            raise ValueError(f"predictors_path={resolved} {where} {data}, where measurements "
                             "lie; a run's child may read its predictor folder, so put the "
                             "predictor modules in a folder of their own")
    if not resolved.is_dir():
        raise ValueError(f"predictors_path={resolved} is not a directory; pass a folder of "
                         "predictor modules (*.py files that @register a Predictor)")
    on_path = [p for p in sys.path if Path(p or ".").resolve() == resolved]
    if on_path:
        raise ValueError(f"predictors_path={resolved} is on the harness's own import path (it is "
                         "the working folder, or in PYTHONPATH), so its code would run unsealed "
                         "here; run the command from another folder")
    if str(resolved) not in _FOLDERS:
        print(f"predictors_path: {resolved}", file=sys.stderr)
        _FOLDERS.append(str(resolved))
        _described.cache_clear()


def included() -> list[str]:
    """The ``predictors_path`` folders this process was given, in order."""
    return list(_FOLDERS)


def folders(described: dict[str, Any]) -> tuple[str, ...]:
    """With the suite's code, all the predictor code a run's child may read, as this process
    knows it (never a folder a child reported): the ``predictors_path`` folders of its
    predictor (``child_folders``) and the folders of predictor modules it imported itself (the
    tests' probes)."""
    imported = (Path(sys.modules[cls.__module__].__file__).resolve().parent
                for cls in registry.imported().values())
    return tuple(dict.fromkeys([*child_folders(described), *map(str, imported)]))


def index() -> dict[str, dict[str, Any]]:
    """Every registered predictor's description, by name. A predictor registered by a module
    this process already imported (the tests register their probes so) is described here,
    over the child's answer: its code has run here already. The command-line entry points
    import none. A name of the suite's own ``predictors/`` is never taken by a folder's module
    (``_own_names``)."""
    imported = {name: describe(name, cls) for name, cls in registry.imported().items()}
    built_in = _described(())
    found = _described(tuple(_FOLDERS)) if _FOLDERS else built_in
    return {**_own_names(built_in, found), **imported}


def _own_names(built_in: dict[str, dict], found: dict[str, dict]) -> dict[str, dict]:
    """``found`` (with the ``predictors_path`` modules), checked: a built-in name keeps its
    built-in class, and every other name's module is a file of one of the folders. A folder's
    module runs in the describing child beside the registry, so it could re-point any name;
    what it answered is held against what this process knows."""
    for name, entry in found.items():
        if name in built_in:
            own = built_in[name]
            if (entry["module"], entry["qualname"]) != (own["module"], own["qualname"]):
                raise ValueError(
                    f"predictor name '{name}' is registered by the suite "
                    f"({own['module']}.{own['qualname']}) and again by "
                    f"{entry['module']}.{entry['qualname']} from predictors_path "
                    f"{', '.join(_FOLDERS)}; a folder cannot take a built-in name: pick another")
        elif not folder_of(entry["module"]):
            raise ValueError(f"predictor '{name}' is described as {entry['module']}."
                             f"{entry['qualname']}, which is not a module of predictors_path "
                             f"{', '.join(_FOLDERS) or '(none given)'}; a predictor module "
                             "rewrote the registry")
    return {**found, **{name: entry for name, entry in built_in.items()}}


def folder_of(module: str) -> str | None:
    """The ``predictors_path`` folder that holds ``module`` as a file or package, or None."""
    top = module.partition(".")[0]
    for folder in _FOLDERS:
        if (Path(folder) / f"{top}.py").is_file() or (Path(folder) / top / "__init__.py").is_file():
            return folder
    return None


def code_hash_of(name: str) -> str:
    """The code hash a current run of predictor ``name`` carries
    (``versioning.predictor_code_hash``); ``versioning.code_hash`` for a name not registered."""
    described = index().get(name)
    if described is None:
        return code_hash()
    return predictor_code_hash(described["module"], folder_of(described["module"]))


@dataclass(frozen=True)
class PredictorCode:
    """Where a predictor's code lives, as a run needs it: the folders its child may read
    (``folders``) and register (``child_folders``), its code hash, and the name of its
    ``predictors_path`` folder (None: the suite's own)."""

    readable: tuple[str, ...]
    registered: tuple[str, ...]
    code_hash: str
    folder_name: str | None


def code_of(described: dict[str, Any]) -> PredictorCode:
    """The described predictor's ``PredictorCode``, found in one pass."""
    folder = folder_of(described["module"])
    return PredictorCode(folders(described), child_folders(described),
                         predictor_code_hash(described["module"], folder),
                         Path(folder).name if folder else None)


def child_folders(described: dict[str, Any]) -> tuple[str, ...]:
    """The ``predictors_path`` folders a run's child registers and may read: all of them for a
    predictor of a folder (its module may import its siblings), none for the suite's own, whose
    child then never runs a folder's code."""
    return tuple(_FOLDERS) if folder_of(described["module"]) else ()


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
    return _checked(_ask(folders, {}).get("predictors"))


def report_sections(runs: pl.DataFrame) -> list[str]:
    """The sections each registered predictor offers of its own for RESULTS.md (its
    ``report_sections`` hook, from the current leaderboard ``runs``), made in a sealed child: a
    predictor module never runs in the report's process."""
    with tempfile.TemporaryDirectory(prefix="leaderboard-sections-") as inbox:
        runs.write_ipc(Path(inbox) / "runs.arrow")
        answer = _ask(tuple(_FOLDERS), {"sections_of": str(Path(inbox) / "runs.arrow")},
                      readable=[inbox])
    lines = answer.get("sections")
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise ValueError("the child that gathers the predictors' report sections answered no "
                         "list of lines; a predictor module rewrote it")
    return lines


def check(name: str) -> dict:
    """``predictors.checks.check_predictor`` of ``name``, run in a sealed child: ``passed`` (the
    checks) or ``failed`` (the rule broken). A predictor that reaches for sealed data while it is
    checked raises ``ValueError`` naming the first attempt, as it stops a run."""
    get(name)  # an unknown name: the valid ones and the closest
    answer = _ask(tuple(_FOLDERS), {"check": name}).get("check")
    if not isinstance(answer, dict) or not ({"passed", "failed"} & set(answer)):
        raise ValueError("the checking child answered no result; a predictor module rewrote it")
    return answer


def _ask(folders: tuple[str, ...], extra: dict, readable=()) -> dict:
    """One sealed child's answer (``child --describe``): it registers every predictor
    (those of ``folders`` too) confined and watched as a run's child is, then answers as one
    JSON object, read here within ``MAX_ANSWER`` bytes and ``DESCRIBE_SECONDS``."""
    # A scratch folder of its own, not under the suite's home: describing writes nothing there.
    with tempfile.TemporaryDirectory(prefix="leaderboard-describe-") as scratch:
        # checked too: a module could read a bundled table at import and answer it as defaults
        read, write = [*sandbox.checked_code(folders), *readable], [scratch, "/dev/null"]
        request = {"folders": list(folders), "write": write, "read": read,
                   "list": sandbox.listable(), **sandbox.seal_request(read, write), **extra}
        answer_r, answer_w = os.pipe()
        command = walls.child_command(["-m", "leaderboard.seal.child", "--describe",
                                            json.dumps(request), str(answer_w)], [scratch])
        child = subprocess.Popen(command, env=sandbox.scratch_env(scratch), cwd=scratch,
                                 pass_fds=(answer_w,), start_new_session=True)
        os.close(answer_w)
        text, why = talk.read_answer(answer_r, MAX_ANSWER, DESCRIBE_SECONDS, child)
    if why:
        raise ValueError(f"the predictor-describing child {why}")
    if not text:
        raise RuntimeError("the predictor-describing child died before answering "
                           f"(exit {child.returncode}); its error is printed above")
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the predictor-describing child answered no JSON object "
                         f"({type(exc).__name__}); a predictor module rewrote it") from None
    if not isinstance(answer, dict):
        raise ValueError("the predictor-describing child answered no JSON object; a predictor "
                         "module rewrote it")
    if "error" in answer:
        raise ValueError(str(answer["error"]))
    return answer


# The shape of ``registry.describe``'s answer, field by field: the describing child imports
# predictor modules, so its answer is checked before the harness reads any of it
DESCRIPTION = {"name": str, "module": str, "qualname": str, "defaults": dict, "annotations": dict,
               "choices": dict, "bounds": dict, "card": dict, "predicts_ops": bool,
               "explains": str}
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
