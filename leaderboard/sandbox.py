"""Fit and predict in a child process that holds no ground truth.

The parent writes what the contract allows into a fresh job folder: the home bundle, the blind
target cells and the target's datasheet (frames as Arrow IPC, the rest as JSON). The child
(``leaderboard.sandbox_child``) starts with an environment stripped of ``LEADERBOARD_*``, source
roots and cache paths, confines itself with Landlock where the kernel has it (reads: the Python
installation, the project's code and conf, its input folder; writes: its output folder and the
predictor cache), constructs the predictor, fits, asks the parent for its deploy reading if it
wants one, predicts and writes the predictions. The parent keeps the ground truth and scores.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard import landlock, sources
from leaderboard.readings import ReadingRefused
from leaderboard.sandbox_bundle import (
    gpu_json,
    gpu_of,
    read_frame,
    read_home,
    read_reading,
    write_frame,
    write_home,
    write_reading,
)
from leaderboard.serving.scoring import simulate
from leaderboard_core import guard, paths, progress
from leaderboard_core.contract import Home, NotSupported, Reading, ReadingRequest
from leaderboard_core.specs import GpuSpec

# Passed through to the child: locale, terminal and thread-count settings, nothing that names a
# path of the suite.
KEPT_ENV = ("PATH", "LANG", "LANGUAGE", "TERM", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR",
            "TZ", "OMP_NUM_THREADS", "POLARS_MAX_THREADS", "OPENBLAS_NUM_THREADS")
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/etc", "/dev/urandom", "/sys/fs/cgroup",
               "/sys/devices/system/cpu", "/proc/cpuinfo", "/proc/meminfo", "/proc/self/cgroup")


def jobs_dir() -> Path:
    return paths.home() / "sandbox"


def predictor_cache(name: str, params: dict, home_folder: Path) -> Path:
    """The one folder a predictor may keep files in across runs (fitted models), its own for one
    fit input: only the same predictor, with the same parameters, fitted on the same home bundle
    ever sees it again. A fit that stashed a home's rows there can thus never hand them to a run
    on another home, where that home's GPU is an unseen target."""
    digest = hashlib.sha256(json.dumps([name, params], sort_keys=True, default=str).encode())
    return paths.home() / "predictor-cache" / f"{name}-{_files_digest(home_folder, digest)[:16]}"


def _files_digest(folder: Path, digest=None) -> str:
    """``digest`` (a fresh SHA-256 by default) updated with every file's relative path and bytes
    under ``folder``, in path order."""
    digest = digest or hashlib.sha256()
    for file in sorted(f for f in folder.rglob("*") if f.is_file()):
        digest.update(file.relative_to(folder).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- the parent


@contextmanager
def job_folder():
    """A fresh folder named by this process's id (so ``debris`` can tell a dead run's), removed
    afterwards."""
    folder = jobs_dir() / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    (folder / "in").mkdir(parents=True)
    (folder / "out").mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def scratch_env(scratch: str) -> dict[str, str]:
    """A child's environment: ``KEPT_ENV`` and the locale, no suite path, ``scratch`` for its
    home and temporary files, and the suite's code from the tree this process runs: a virtual
    environment installed from another checkout would otherwise hand the child that checkout,
    which Landlock does not let it read."""
    env = {k: v for k, v in os.environ.items() if k in KEPT_ENV or k.startswith("LC_")}
    # No /dev/shm in the child (runs could leave each other notes there): joblib runs serial.
    return {**env, "HOME": scratch, "TMPDIR": scratch, "JOBLIB_TEMP_FOLDER": scratch,
            "JOBLIB_MULTIPROCESSING": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": str(paths.REPO_ROOT)}


def child_env(folder: Path, cache: Path) -> dict[str, str]:
    cache.mkdir(parents=True, exist_ok=True)
    return {**scratch_env(str(folder / "out")), "XDG_CACHE_HOME": str(cache)}


def readable_code(predictor_dirs) -> list[str]:
    """What a child may read: the Python installation, the suite's code and conf, the given
    predictor folders. Of ``sys.path`` only the entries inside the Python installation: the
    working folder and ``PYTHONPATH`` may hold the store."""
    install = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
    roots = {*map(str, install), *(p for p in sys.path if p and any(
        Path(p).resolve().is_relative_to(root) for root in install))}
    code = [*(paths.REPO_ROOT / package for package in paths.CODE_PACKAGES), paths.CONF_DIR,
            *predictor_dirs]
    return sorted({str(Path(p).resolve()) for p in [*roots, *code]}) + list(SYSTEM_READ)


def listable() -> list[str]:
    """The repository root, as a listing only (it also holds results/ and datasets/)."""
    return [str(paths.REPO_ROOT)]


def watched(data_roots=()) -> list[str]:
    """Where measurements lie, so where the child's opens are recorded (``guard``): the suite's
    home (store, downloaded sources, other runs' folders), the runs and pins in the repository,
    the upstream copies, the Hugging Face caches, and the run's own ``data_roots`` (its sources
    root, runs folder, hub export)."""
    hf = [os.environ.get(k) for k in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                                      "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE")]
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    roots = [paths.home(), paths.REPO_ROOT / "results", paths.DATASETS_DIR, paths.SHARED_UPSTREAM,
             sources.explicit_root(), *hf, f"{cache}/huggingface", *data_roots]
    return sorted({str(Path(os.path.expandvars(str(r))).expanduser().resolve())
                   for r in roots if r})


def seal_request(read: list[str], write: list[str], data_roots=()) -> dict:
    """What a child needs to record its opens (``guard.watch_opens``): ``watch``, less the
    folders it may read or write, less the repository (``quiet``: libraries scan package
    metadata there); and its ``sys.path``, without any entry inside a watched folder, which a
    metadata scan would open."""
    watch, quiet = watched(data_roots), [str(paths.REPO_ROOT)]
    roots = guard.watch_roots(watch, [*read, *write], quiet)
    return {"watch": watch, "quiet": quiet,
            "sys_path": [p for p in sys.path if p and not guard.recorded(p, roots)]}


def job(described: dict, params: dict, level: str, budget: int, folder: Path,
        cache: Path, data_roots=()) -> dict:
    """The child's instructions; ``described`` is the predictor's ``predictor_index`` entry,
    whose own module folder the child may read."""
    read = [*readable_code([Path(described["file"]).parent]), str(folder / "in")]
    write = [str(folder / "out"), str(cache), "/dev/null"]
    return {"predictor": {k: described[k] for k in ("module", "qualname", "name")},
            "params": params, "level": level, "budget": budget,
            "progress": progress.shown(), "read": read, "list": listable(), "write": write,
            **seal_request(read, write, data_roots)}


def fit_and_predict(described: dict, params: dict, home: Home, blind: pl.DataFrame, gpu: GpuSpec,
                    level: str, budget: int, supply: Callable[[ReadingRequest], Reading],
                    data_roots=()) -> tuple[np.ndarray | None, list[str], dict]:
    """The child's predictions (None if it failed), the cells its reading took out of the score,
    and the facts it measured (fit seconds, predict seconds, sandbox, INVALID reasons, and the
    per-op split ``by_op`` of the predictions where the predictor offers one)."""
    with job_folder() as folder:
        write_home(home, folder / "in" / "home")
        write_frame(blind, folder / "in" / "blind.arrow")
        (folder / "in" / "gpu.json").write_text(json.dumps(gpu_json(gpu), default=str))
        cache = predictor_cache(described["name"], params, folder / "in" / "home")
        (folder / "in" / "job.json").write_text(json.dumps(
            job(described, params, level, budget, folder, cache, data_roots), default=str))
        unscored, reasons = _talk(folder, cache, supply)
        facts_file = folder / "out" / "facts.json"
        if not facts_file.is_file():
            return None, unscored, {"invalid_reasons": reasons or [
                "the predictor's process died before writing its results"]}
        facts = json.loads(facts_file.read_text())
        facts["invalid_reasons"][:0] = reasons
        if not landlock.abi_version():  # the child says how it ran; it cannot have had Landlock
            facts["sandbox"] = "process"
        pred_file = folder / "out" / "pred.npy"
        pred = np.load(pred_file, allow_pickle=False) if pred_file.is_file() else None
        by_op_file = folder / "out" / "by_op.npy"
        if pred is not None and by_op_file.is_file():
            _load_by_op(by_op_file, len(pred), facts)
    return pred, unscored, facts


def _talk(folder: Path, cache: Path, supply) -> tuple[list[str], list[str]]:
    """Run the child, answering its reading requests; the cells taken out, and the reasons the
    run is INVALID: a refused reading, or a predictor cache changed after the child asked for
    target rows. The cache outlives the run, so a reading kept there would reach the next run
    on this target beyond its cap: such a cache is removed (it only ever holds what fit derived
    from the home, which a later run fits again)."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    command = [sys.executable, "-m", "leaderboard.sandbox_child", str(folder), str(to_child_r),
               str(from_child_w)]
    # stdout and stderr are inherited, so a long fit's progress reaches the user's terminal.
    child = subprocess.Popen(command, env=child_env(folder, cache), cwd=folder / "out",
                             pass_fds=(to_child_r, from_child_w))
    os.close(to_child_r)
    os.close(from_child_w)
    unscored, reasons, cache_before = [], [], None
    with os.fdopen(from_child_r) as inbox, os.fdopen(to_child_w, "w") as outbox:
        for line in inbox:
            request = ReadingRequest(**json.loads(line))
            if cache_before is None:
                cache_before = _files_digest(cache)
            try:
                reading = supply(request)
                write_reading(reading, folder / "in" / "reading")
                unscored = list(supply.unscored)
                answer = {"unscored": unscored}
            except ReadingRefused as exc:
                reasons.append(str(exc))
                answer = {"refused": str(exc)}
            outbox.write(json.dumps(answer) + "\n")
            outbox.flush()
    child.wait()
    if cache_before is not None and _files_digest(cache) != cache_before:
        shutil.rmtree(cache, ignore_errors=True)
        reasons.append("the predictor wrote to its cache after it asked for target rows; the "
                       "cache is removed (it may hold what fit derives from the home, never a "
                       "reading)")
    return unscored, reasons


# ------------------------------------------------------------------------------ the child


def _resolve(ref: dict) -> type:
    """The predictor class, by module and name (ladder rungs are made by a factory, so they are
    found through the registry)."""
    import importlib

    from predictors import registry

    found = importlib.import_module(ref["module"])
    for part in ref["qualname"].split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else registry.get(ref["name"])


def _save_by_op(estimator, blind: pl.DataFrame, gpu, rows: int, out: Path, facts: dict) -> None:
    """The predictor's per-op split of its step predictions, if it offers one: one row per part
    in ``by_op.npy``, the part names in ``facts["by_op_names"]``. It is a diagnostic beside the
    score: a failing or misshapen split is noted, the score stands."""
    try:
        parts = estimator.predict_by_op(blind, gpu)
        if parts:
            arrays = [np.asarray(v, dtype=np.float64) for v in parts.values()]
            bad = sorted(k for k, v in zip(parts, arrays, strict=True) if v.shape != (rows,))
            if bad:
                raise ValueError(f"parts {bad} are not one value per cell ({rows})")
            np.save(out / "by_op.npy", np.stack(arrays), allow_pickle=False)
            facts["by_op_names"] = [str(k) for k in parts]
    except Exception as exc:  # noqa: BLE001 - reported, never fatal to the run
        facts["by_op_error"] = f"{type(exc).__name__}: {exc}"


def _load_by_op(path: Path, rows: int, facts: dict) -> None:
    """The child's per-op split into ``facts["by_op"]``; the file is the child's output, so a
    malformed one is noted as ``by_op_error`` and dropped, never raised in the harness."""
    try:
        names = [str(n) for n in facts.pop("by_op_names")]
        stacked = np.load(path, allow_pickle=False)
        if stacked.shape != (len(names), rows) or stacked.dtype != np.float64:
            raise ValueError(f"not one float per cell ({rows}) for each of {len(names)} parts")
        facts["by_op"] = dict(zip(names, stacked, strict=True))
    except Exception as exc:  # noqa: BLE001 - whatever the child wrote
        facts["by_op_error"] = f"unreadable per-op split: {type(exc).__name__}: {exc}"


def child_run(job: dict, folder: Path, ask: Callable[[dict], dict]) -> dict:
    """Construct, fit, read, predict: everything the predictor does, as facts for the parent."""
    guard.seal_process("the sandboxed fit and predict")
    progress.show(job["progress"])  # the child draws on the parent's terminal, if it may
    facts = {"fit_seconds": None, "predict_seconds": None, "invalid_reasons": [],
             "home_profiled_rows": 0}
    inputs, out = folder / "in", folder / "out"
    try:
        estimator = _resolve(job["predictor"])(**job["params"])
        home, blind = read_home(inputs / "home"), read_frame(inputs / "blind.arrow")
        gpu = gpu_of(json.loads((inputs / "gpu.json").read_text()))
        started = time.perf_counter()
        fitted = estimator.fit(home)
        facts["fit_seconds"] = time.perf_counter() - started
        if fitted is not estimator:
            facts["invalid_reasons"].append("fit did not return self")
        facts["home_profiled_rows"] = int(getattr(estimator, "profiled_rows_", 0))
        if job["level"] == "serving":
            np.save(out / "pred.npy", np.stack(simulate(estimator, blind, gpu, home.models, facts)),
                    allow_pickle=False)
            return facts
        request = (estimator.request_reading(blind, gpu, job["budget"]) if job["level"] == "step"
                   else None)
        if request is not None and request.size:
            answer = ask({"cells": list(request.cells), "op_points": list(request.op_points)})
            if "refused" in answer:
                return facts
            estimator.take_reading(read_reading(inputs / "reading"), gpu)
            blind = blind.filter(~pl.col("cell_id").is_in(answer["unscored"]))
        predict = estimator.predict_ops if job["level"] == "op" else estimator.predict
        predict(blind.head(8), gpu)  # warm caches, so the timing below is throughput
        started = time.perf_counter()
        pred = np.asarray(predict(blind, gpu), dtype=np.float64)
        facts["predict_seconds"] = time.perf_counter() - started
        np.save(out / "pred.npy", pred, allow_pickle=False)
        if job["level"] == "step":
            _save_by_op(estimator, blind, gpu, len(pred), out, facts)
    except NotSupported as exc:  # a stated limit of the predictor, reported as such on serving
        facts["not_supported"] = str(exc)
        facts["invalid_reasons"].append(f"NotSupported: {exc}")
    except Exception as exc:  # noqa: BLE001 - any failure of a predictor makes the run INVALID
        last = traceback.extract_tb(exc.__traceback__)[-1]
        facts["invalid_reasons"].append(
            f"{type(exc).__name__}: {exc} (at {Path(last.filename).name}:{last.lineno})")
    return facts


def attempt_reasons() -> list[str]:
    """The INVALID reason for what this child tried and the seal refused or watched."""
    tried = guard.attempts()
    return [f"the predictor reached for sealed data ({len(tried)} attempt(s); first: "
            f"{tried[0]}); a run that tries is INVALID, whether or not it caught the refusal"
            ] if tried else []
