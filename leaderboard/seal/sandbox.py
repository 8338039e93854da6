"""Fit and predict in a child process that holds no ground truth.

The parent writes what the contract allows into a fresh job folder: the home bundle, the blind
target cells and the target's datasheet (frames as Arrow IPC, the rest as JSON). The child
(``leaderboard.seal.child``) starts with an environment stripped of ``LEADERBOARD_*``, source
roots and cache paths, confines itself with Landlock where the kernel has it (reads: the Python
installation, the project's code and conf, its input folder; writes: its output folder and the
predictor cache), constructs the predictor, fits, asks the parent for its deploy reading if it
wants one, predicts and writes the predictions. The parent keeps the ground truth and scores.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard.ingest import sources
from leaderboard.seal import child_files, landlock, walls
from leaderboard.seal.bundle import gpu_json, tree_digest, write_frame, write_home
from leaderboard.seal.talk import serve, talk
from leaderboard_core import guard, paths, progress
from leaderboard_core.contract import Home, Reading, ReadingRequest
from leaderboard_core.specs import GpuSpec
from leaderboard_core.versioning import harness_hash

# Passed through to the child: locale, terminal and thread-count settings, nothing that names a
# path of the suite.
KEPT_ENV = ("PATH", "LANG", "LANGUAGE", "TERM", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR",
            "TZ", "OMP_NUM_THREADS", "POLARS_MAX_THREADS", "OPENBLAS_NUM_THREADS")
PREDICTOR_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# What the harness takes from the child's facts.json, and of which type; the rest is dropped
FACT_TYPES = {"fit_seconds": (int, float, type(None)), "fit_reused": bool,
              "predict_seconds": (int, float, type(None)),
              "invalid_reasons": list, "home_profiled_rows": int, "not_supported": str,
              "by_op_names": list, "by_op_error": str, "sandbox": str, "explained": dict}
MAX_FACTS = 16 << 20
# A predictor cache unused this long is removed: each (predictor, parameters, home bundle) has
# its own, so a rebuilt store or a new home leaves the old ones behind for good (4.8 GB on one
# machine before this bound).
UNUSED_CACHE_DAYS = 14
MAX_OP_PARTS = 64  # a step's per-op split: its op kinds, many times over
PSEUDO_FS = ("/proc", "/sys", "/dev")  # kernel files: no one can put a measurement there
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/etc", "/dev/urandom", "/sys/fs/cgroup",
               "/sys/devices/system/cpu", "/proc/cpuinfo", "/proc/meminfo", "/proc/self/cgroup")


def jobs_dir() -> Path:
    return paths.home() / "sandbox"


def predictor_cache(name: str, params: dict, home_folder: Path) -> Path:
    """The one folder a predictor may keep files in across runs (fitted models), its own for one
    fit input: only the same predictor, with the same parameters, fitted on the same home bundle
    ever sees it again. A fit that stashed a home's rows there can thus never hand them to a run
    on another home, where that home's GPU is an unseen target."""
    if not PREDICTOR_NAME.fullmatch(name):
        raise ValueError(f"predictor name {name!r} is not a plain name (letters, digits, '_', "
                         "'-' and '.' only); it names its cache folder")
    digest = hashlib.sha256(json.dumps([name, params], sort_keys=True, default=str).encode())
    root = paths.home() / "predictor-cache"
    cache = root / f"{name}-{tree_digest(home_folder, digest)[:16]}"
    if not cache.is_symlink():
        cache.mkdir(parents=True, exist_ok=True)
    if cache.is_symlink() or os.path.realpath(cache) != os.path.join(os.path.realpath(root),
                                                                       cache.name):
        raise ValueError(f"the predictor cache {cache} is a link or lies under one; remove it "
                         f"(the cache must be a folder of its own under {root})")
    os.utime(cache)  # in use: kept by prune_unused_caches
    prune_unused_caches(root)
    return cache


@functools.cache
def prune_unused_caches(root: Path) -> int:
    """Remove, once per process, the predictor caches under ``root`` unused for
    ``UNUSED_CACHE_DAYS`` (a cache is touched each time a run takes it); how many went."""
    cutoff, removed = time.time() - UNUSED_CACHE_DAYS * 86400, 0
    for folder in root.iterdir():
        if folder.is_dir() and not folder.is_symlink() and folder.stat().st_mtime < cutoff:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


@contextmanager
def cache_held(cache: Path):
    """The predictor cache for one run at a time. Runs on different targets of one home share
    the folder (it is keyed by the home), and the reading snapshot protects only the runs that
    start after a run is put back: two at once, one run's child could read what the other's
    wrote after it saw target rows, or a kept fit written by one would change the other's
    snapshot. An exclusive ``flock`` on a file beside the folder, which no child can reach,
    serialises them; runs of other predictors, parameters or homes never wait."""
    with open(cache.with_name(f".{cache.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield cache
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
    return sorted({str(Path(p).resolve()) for p in [*roots, *submitted_code(predictor_dirs)]}
                  ) + list(SYSTEM_READ)


def submitted_code(predictor_dirs) -> list[str]:
    """The readable folders whose files a submission may change: the suite's code and conf and
    the predictor folders (every file there is opened to tell a table derived from the store)."""
    return [str(Path(p).resolve()) for p in (
        *(paths.REPO_ROOT / package for package in paths.CODE_PACKAGES), paths.CONF_DIR,
        *predictor_dirs)]


def checked_code(predictor_dirs, data_roots=()) -> list[str]:
    """``readable_code``, refused (``walls.check_readable``) if a folder where measurements
    lie is inside it or a copy of measurements is in it. The job's own folder is not scanned: it
    changes every run (which would defeat the scan's cache) and holds only what the parent
    wrote."""
    read = readable_code(predictor_dirs)
    walls.check_readable([r for r in read if not r.startswith(PSEUDO_FS)],
                              watched(data_roots), submitted_code(predictor_dirs))
    return read


def refuse_inside_read_roots(target: Path, key: str) -> None:
    """Raise ``ValueError`` where ``target``, a folder the suite is about to write measurements
    to, lies inside a folder a predictor's child may read (``readable_code``)."""
    target = Path(target).expanduser().resolve()
    for root in readable_code([]):
        if not root.startswith(PSEUDO_FS) and target.is_relative_to(root):
            raise ValueError(f"{key}={target} is inside {root}, which a predictor's child may "
                             "read; write measurements outside the Python installation, the "
                             "suite's code and conf, and the system folders")


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


def fit_name(code_hash: str) -> str:
    """The file a fit is kept in, in its predictor cache: one per predictor code, harness code
    and installed libraries (an upgraded library may fit, or unpickle, differently)."""
    digest = hashlib.sha256(f"{code_hash} {harness_hash()} {_libraries()}".encode())
    return f"fitted-{digest.hexdigest()[:16]}.pickle"


@functools.cache
def _libraries() -> str:
    """Every installed distribution and its version, and the interpreter's."""
    from importlib import metadata  # noqa: PLC0415

    return " ".join([sys.version, *sorted(f"{d.metadata['Name']}=={d.version}"
                                          for d in metadata.distributions())])


def job(described: dict, params: dict, level: str, budget: int, folder: Path,
        cache: Path, predictor_dirs=(), data_roots=(), include=(), explain=(),
        fitted: str | None = None) -> dict:
    """The child's instructions. What it may read is decided here, from what this process
    knows (the suite's code, the ``predictors_path`` folders it was given, the job folder),
    never from what a child reported (``checked_code``). ``include``: the ``predictors_path``
    folders the child registers before it looks the predictor up by name."""
    read = [*checked_code(predictor_dirs, data_roots), str(folder / "in")]
    write = [str(folder / "out"), str(cache), "/dev/null"]
    namespaced = ["/proc"] if walls.namespaces_available() else []  # its own PIDs only
    return {"predictor": {k: described[k] for k in ("module", "qualname", "name")},
            "include": list(include), "explain": list(explain), "params": params,
            "level": level, "budget": budget, "fitted": fitted and str(cache / fitted),
            "progress": progress.shown(), "read": read, "list": [*listable(), *namespaced],
            "write": write, **seal_request(read, write, data_roots)}


def fit_and_predict(described: dict, params: dict, home: Home, blind: pl.DataFrame, gpu: GpuSpec,
                    level: str, budget: int, supply: Callable[[ReadingRequest], Reading],
                    data_roots=(), predictor_dirs=(), include=(), stage_seconds=None,
                    explain=(), code_hash: str = "") -> tuple[np.ndarray | None, list[str], dict]:
    """The child's predictions (None if it failed; on serving, TTFT and TPOT stacked, from the
    replay run here), the cells its reading took out of the score, and the facts it measured
    (fit seconds, predict seconds, sandbox, INVALID reasons, and the per-op split ``by_op`` of
    the predictions where the predictor offers one). ``code_hash``: the predictor's, which
    with the harness's names the fit a later run may reuse (``job._fitted``); none,
    no fit is kept or reused."""
    with job_folder() as folder:
        write_home(home, folder / "in" / "home")
        write_frame(blind, folder / "in" / "blind.arrow")
        (folder / "in" / "gpu.json").write_text(json.dumps(gpu_json(gpu), default=str))
        cache = predictor_cache(described["name"], params, folder / "in" / "home")
        (folder / "in" / "job.json").write_text(json.dumps(
            job(described, params, level, budget, folder, cache, predictor_dirs, data_roots,
                include, explain, fit_name(code_hash) if code_hash else None),
            default=str))
        served: dict = {}
        replay = (lambda channel: serve(channel, folder, blind, home, gpu, served)) if (
            level == "serving") else None
        with cache_held(cache):
            unscored, reasons = talk(folder, cache, child_env(folder, cache),
                                     [str(folder / "out"), str(cache)], supply, replay,
                                     stage_seconds)
        facts = _child_facts(folder / "out" / "facts.json")
        if facts is None:
            return None, unscored, {"invalid_reasons": reasons or [
                "the predictor's process died before writing its results"]}
        facts["invalid_reasons"][:0] = reasons + served.pop("invalid_reasons", [])
        facts.update(served)
        facts["sandbox"] = _sandbox_label(facts.get("sandbox"))
        if level == "serving":
            if "pred" not in facts and not facts.get("not_supported") and not facts[
                    "invalid_reasons"]:
                facts["invalid_reasons"].append("the predictor's process never let the harness "
                                                "replay the serving loads")
            return facts.pop("pred", None), unscored, facts
        try:
            pred = child_files.load_array(folder / "out" / "pred.npy", len(blind))
        except Exception:  # noqa: BLE001 - missing or malformed: the run has no predictions
            pred = None
        if pred is not None and "by_op_names" in facts:
            _load_by_op(folder / "out" / "by_op.npy", len(pred), facts)
    return pred, unscored, facts


def _child_facts(path: Path) -> dict | None:
    """The facts the child wrote, only the fields ``FACT_TYPES`` names and of their types (the
    timings of a serving run and its predictions come from this process, never from here)."""
    data = child_files.read_file(path, limit=MAX_FACTS)
    try:
        written = json.loads(data) if data is not None else None
    except Exception:  # noqa: BLE001 - whatever the child wrote
        return None
    if not isinstance(written, dict):
        return None
    facts = {k: v for k, v in written.items() if k in FACT_TYPES and isinstance(v, FACT_TYPES[k])}
    facts["invalid_reasons"] = [str(r) for r in facts.get("invalid_reasons", [])]
    return facts


def _sandbox_label(child_said) -> str:
    """How the child ran: the namespaces are this process's doing, Landlock the child's (which
    it cannot have had where the kernel has none)."""
    layers = [*(["namespaces"] if walls.namespaces_available() else []),
              *(["landlock"] if child_said == "landlock" and landlock.abi_version() else [])]
    return "+".join(layers) or "process"


def _load_by_op(path: Path, rows: int, facts: dict) -> None:
    """The child's per-op split into ``facts["by_op"]``; the file is the child's output, so a
    malformed one is noted as ``by_op_error`` and dropped, never raised in the harness."""
    try:
        names = [str(n) for n in facts.pop("by_op_names")]
        if len(names) > MAX_OP_PARTS:
            raise ValueError(f"{len(names)} parts, more than {MAX_OP_PARTS}")
        stacked = child_files.load_array(path, len(names) * rows)
        if stacked.shape != (len(names), rows) or stacked.dtype != np.float64:
            raise ValueError(f"not one float per cell ({rows}) for each of {len(names)} parts")
        facts["by_op"] = dict(zip(names, stacked, strict=True))
    except Exception as exc:  # noqa: BLE001 - whatever the child wrote
        facts["by_op_error"] = f"unreadable per-op split: {type(exc).__name__}: {exc}"
