"""Replay plans, kept on disk: scheduled once per (policy, load), priced by every predictor.

A closed loop's step sequence does not depend on any step's time (``replay.closed_loop``), nor
does a static batch's (``static_batch``), yet scheduling them was most of a serving run: about
15 of the 21 s of ``ours`` on ``h200_silicon_moe``, the same for each of the two dozen
predictors. A plan is a pure function of its key and the harness code, so plans live in a
folder named by the harness hash (a change to the scheduler starts a new folder and removes the
old ones) under the suite's home, which no sealed child can read. A plan is a folder of
``.npy`` files and the list of their names, written under a name of its own and renamed into
place whole; it is read back mapped (no copy). Concurrent workers at worst schedule the same
plan twice; a folder that is being removed, or reads back incomplete, is scheduled again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from leaderboard_core import paths
from leaderboard_core.versioning import harness_hash

FOLDER = "replay-plans"
NAMES = "names.json"  # written last: a plan without it, or without one of its arrays, is unread


def _folder():
    return paths.home() / FOLDER / harness_hash()


def kept(key: list, make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``make()``, read back from disk when a plan of the same ``key`` (JSON-able) was kept. A
    plan that does not read back, or cannot be written, is made here: keeping is a saving,
    never a condition of the run. (The zip of ``np.savez`` this replaced was copied and
    checksummed on every read, about 2 s of a large serving run.)"""
    folder = _folder()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    path = folder / digest[:32]
    if (arrays := _read(path)) is not None:
        return arrays
    arrays = make()
    partial = folder / f".{path.name}.{uuid.uuid4().hex}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.parent.iterdir():  # plans of other harness code are never read again
            if old != folder:
                _remove(old)
        partial.mkdir()
        for name, array in arrays.items():
            np.save(partial / f"{name}.npy", array, allow_pickle=False)
        (partial / NAMES).write_text(json.dumps(sorted(arrays)))
        if path.exists() and _read(path) is None:  # a damaged plan is replaced
            _remove(path)
        os.rename(partial, path)  # whole or not at all; a plan another worker kept first stays
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)  # this process's own folder only
    return arrays


def _read(path: Path) -> dict[str, np.ndarray] | None:
    """The kept plan at ``path``, or None (none kept, being removed, or incomplete)."""
    try:
        names = json.loads((path / NAMES).read_text())
        return {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in names}
    except (OSError, ValueError, EOFError):
        return None


def _remove(folder: Path) -> None:
    """Out of reach at once (renamed to a hidden name), then deleted."""
    trash = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}.trash")
    try:
        os.rename(folder, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)
