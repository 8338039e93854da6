"""Replay plans, kept on disk: scheduled once per (policy, load), priced by every predictor.

A closed loop's step sequence does not depend on any step's time (``replay.closed_loop``), nor
does a static batch's (``static_batch``), yet scheduling them was most of a serving run: about
15 of the 21 s of ``ours`` on ``h200_silicon_moe``, the same for each of the two dozen
predictors. A plan is a pure function of its key and the harness code, so plans live in a
folder named by the harness hash (a change to the scheduler starts a new folder and removes the
old ones) under the suite's home, which no sealed child can read. A plan is one file: a JSON
header that lists its arrays (name, dtype, shape), then their bytes; it is written under a name
of its own and renamed into place whole, and read back mapped (no copy). A file shorter or
longer than its header says is not read. Concurrent workers at worst schedule the same plan
twice.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from leaderboard_core import paths
from leaderboard_core.versioning import harness_hash

FOLDER = "replay-plans"
SUFFIX = ".plan"
ALIGN = 64  # each array starts on this boundary, so a mapped array is aligned for NumPy
HEADER_SIZE = struct.Struct("<Q")  # the header's length in bytes, before the header
KINDS = "biuf"  # the dtypes a plan holds: booleans, integers, floats


def _folder():
    return paths.home() / FOLDER / harness_hash()


def kept(key: list, make: Callable[[], dict[str, np.ndarray]]
         ) -> tuple[str, dict[str, np.ndarray]]:
    """The name a plan of ``key`` (JSON-able) is kept under, with the harness hash which plan
    it is; and ``make()``, read back from disk when that plan was kept. A plan that does not
    read back, or cannot be written, is made here: keeping is a saving, never a condition of the
    run. (A folder of ``.npy`` files, which this replaced, took 3 ms a plan to read, 10 headers
    parsed and paths resolved: a second of a large serving run.)"""
    folder = _folder()
    name = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]
    path = folder / f"{name}{SUFFIX}"
    if (arrays := _read(path)) is not None:
        return name, arrays
    arrays = make()
    partial = folder / f".{path.name}.{uuid.uuid4().hex}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.parent.iterdir():  # plans of other harness code are never read again
            if old != folder:
                _remove(old)
        _write(partial, arrays)
        os.replace(partial, path)  # whole or not at all, over a damaged one
    except (OSError, ValueError):
        partial.unlink(missing_ok=True)  # this process's own file only
    return name, arrays


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def _layout(header: list) -> tuple[list[int], int]:
    """Each array's offset after the header, and the file's whole length."""
    offsets, at = [], 0
    for _, dtype, shape in header:
        offsets.append(at)
        at += _aligned(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return offsets, at


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Numbers only, at least one dimension (ValueError otherwise: such a plan is not kept)."""
    if bad := sorted(n for n, a in arrays.items() if a.dtype.kind not in KINDS or a.ndim < 1):
        raise ValueError(f"plan arrays {bad} are not arrays of numbers")
    ordered = {name: np.ascontiguousarray(arrays[name]) for name in sorted(arrays)}
    header = [[name, a.dtype.str, list(a.shape)] for name, a in ordered.items()]
    encoded = json.dumps(header).encode()
    start = _aligned(HEADER_SIZE.size + len(encoded))
    offsets, size = _layout(header)
    with path.open("wb") as f:
        f.write(HEADER_SIZE.pack(len(encoded)) + encoded)
        for offset, a in zip(offsets, ordered.values(), strict=True):
            f.seek(start + offset)
            f.write(a.tobytes())
        f.truncate(start + size)


def _read(path: Path) -> dict[str, np.ndarray] | None:
    """The kept plan at ``path``, or None (none kept, or not the length its header says)."""
    try:
        with path.open("rb") as f:
            (length,) = HEADER_SIZE.unpack(f.read(HEADER_SIZE.size))
            whole = os.fstat(f.fileno()).st_size
            if length > whole:
                return None
            header = json.loads(f.read(length))
            if not _well_formed(header):
                return None
            start = _aligned(HEADER_SIZE.size + length)
            offsets, size = _layout(header)
            if whole != start + size:
                return None
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return {name: _mapped(mapped, np.dtype(dtype), shape, start + offset)
                for (name, dtype, shape), offset in zip(header, offsets, strict=True)}
    except Exception:  # noqa: BLE001 - whatever the file holds, it is made again
        return None


def _well_formed(header) -> bool:
    """A list of [name, dtype of numbers, shape of whole numbers >= 0], as ``_write`` writes."""
    return isinstance(header, list) and all(
        isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
        and isinstance(entry[1], str) and np.dtype(entry[1]).kind in KINDS
        and isinstance(entry[2], list) and len(entry[2]) >= 1
        and all(isinstance(n, int) and 0 <= n < 1 << 40 for n in entry[2])
        for entry in header)


def _mapped(mapped: mmap.mmap, dtype: np.dtype, shape: list, offset: int) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    if not count:  # an empty array may sit at the file's very end, past the last byte
        return np.empty(shape, dtype)
    return np.frombuffer(mapped, dtype, count, offset).reshape(shape)


def _remove(old: Path) -> None:
    """An older harness's folder (or a stray file beside them): out of reach at once (renamed
    to a hidden name), then deleted."""
    trash = old.with_name(f".{old.name}.{uuid.uuid4().hex}.trash")
    try:
        os.rename(old, trash)
    except OSError:
        return
    if trash.is_dir():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        trash.unlink(missing_ok=True)
