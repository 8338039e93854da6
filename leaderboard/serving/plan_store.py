"""Closed-loop plans, kept on disk: scheduled once per (policy, load), priced by every predictor.

A closed loop's step sequence does not depend on any step's time (``replay.closed_loop``), yet
scheduling it is most of a serving run: about 15 of the 21 s of ``ours`` on
``h200_silicon_moe``, the same for each of the two dozen predictors. A plan is a pure function
of its key and the harness code, so plans live in a folder named by the harness hash (a change
to the scheduler starts a new folder and removes the old ones) under the suite's home, which
no sealed child can read. Files are written whole and renamed, so concurrent workers at worst
schedule the same loop twice; two checkouts of different harness code sharing one home remove
each other's plans, and each plans again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable

import numpy as np

from leaderboard_core import paths
from leaderboard_core.versioning import harness_hash

FOLDER = "replay-plans"


def _folder():
    return paths.home() / FOLDER / harness_hash()


def kept(key: list, make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``make()``, read back from disk when a plan of the same ``key`` (JSON-able) was kept. A
    plan that does not read back, or cannot be written, is made here: keeping is a saving,
    never a condition of the run. A plan is a folder of ``.npy`` files, read back mapped
    (read-only, no copy): the zip of ``np.savez`` copied and checksummed every array on each
    read, about 2 s of a large serving run."""
    folder = _folder()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    path = folder / digest[:32]
    if path.is_dir():  # a kept plan's folder is renamed into place whole
        try:
            return {f.stem: np.load(f, mmap_mode="r") for f in path.glob("*.npy")}
        except (OSError, ValueError, EOFError):  # unreadable: plan it again
            shutil.rmtree(path, ignore_errors=True)
    arrays = make()
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.parent.iterdir():  # plans of other harness code are never read again
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        partial.mkdir()
        for name, array in arrays.items():
            np.save(partial / f"{name}.npy", array, allow_pickle=False)
        os.rename(partial, path)  # whole or not at all; a plan another worker kept first stays
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    return arrays
