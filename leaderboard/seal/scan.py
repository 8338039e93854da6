"""Which files a predictor's child could read that hold measurements.

The child may read the Python installation, the suite's code and conf and its predictor folders.
None of them may hold a copy of what the child is sealed from:

- a pinned upstream measurement file, by sha256 (whatever its name);
- the suite's store, or any file of the store's folder: a hard link by inode, a copy by sha256;
- a table derived from the store: any DuckDB database, and any Parquet or Arrow file with a
  column of measured time (``TRUTH_COLUMNS``: the cells' ground truth, the lineage's and the op
  tables' latencies), whatever its name or suffix (files are told by their first bytes).

A walk of site-packages takes seconds, so its answer is kept in the suite's home with the mtime of
every folder walked and the store's identity: while none changed, no entry was added, renamed or
removed anywhere below (how pip and apt install) and the store is the same, so the next run skips
the walk.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

import polars as pl

from leaderboard.ingest import sources
from leaderboard_core import paths
from leaderboard_core.contract import GROUND_TRUTH_COLUMNS

# The pinned files that hold measurements (licences, metadata yaml and figures are texts anyone
# may ship; a LICENSE file matches half of site-packages)
MEASUREMENT_SUFFIXES = (".parquet", ".csv", ".json", ".jsonl", ".log", ".txt")
TRUTH_COLUMNS = frozenset({*GROUND_TRUTH_COLUMNS, "latency_ms", "ttft_ms", "tpot_ms"})
DUCKDB_MAGIC = (8, b"DUCK")  # offset and bytes of a DuckDB database's header
PARQUET_MAGIC, ARROW_MAGIC = b"PAR1", b"ARROW1"
# Elsewhere than the ``inspect`` roots, the files whose first bytes are read: tables by name
TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc", ".duckdb", ".db")
SCAN_VERSION = 3  # a cached answer of another version of these rules is walked again


def store_identity() -> tuple:
    """Every file of the store's folder as (path, device, inode, size, mtime): what a hard link or
    a copy of the store is told by."""
    folder = paths.home() / "store"
    found = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
        if entry.is_file() and ".duckdb" in entry.name and entry.stat().st_size:
            info = entry.stat()
            found.append((str(entry), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(found)


@lru_cache(maxsize=4)
def measurement_copies(read_roots: tuple[str, ...], store: tuple = (), inspect: tuple[str, ...] = ()
                       ) -> list[tuple[str, str]]:
    """(path, why) of every file under ``read_roots`` that holds measurements (see the module
    docstring); ``store`` is ``store_identity()``. Files are told by their first bytes under the
    ``inspect`` roots (the suite's code and the predictor folders, what a submitter controls);
    in the system folders and the Python installation only files named as tables are (reading
    every file's head there makes a walk of half a minute); every file is checked by inode,
    size and sha256."""
    store = [list(s) for s in store]
    cache_file = paths.home() / "seal-scan.json"
    key = {"roots": list(read_roots), "inspect": list(inspect), "store": store,
           "version": SCAN_VERSION}
    try:
        cached = json.loads(cache_file.read_text())
        if cached["key"] == key and all(
                os.stat(d).st_mtime_ns == m for d, m in cached["folders"].items()):
            return [tuple(f) for f in cached["found"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    targets, folders, found = _Targets(store), {}, []
    _walk(inspect, targets, True, folders, found)
    _walk(read_roots, targets, False, folders, found)
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        partial = cache_file.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"key": key, "folders": folders, "found": found}))
        partial.replace(cache_file)
    except OSError:
        pass  # no cache: the next run walks again
    return [tuple(f) for f in found]


class _Targets:
    """What a file is held against: pinned sha256s by size, the store's inodes and sha256s."""

    def __init__(self, store: list):
        self.pinned: dict[int, set[str]] = {}
        for pin in sources.load_pins():
            if pin.path.endswith(MEASUREMENT_SUFFIXES):
                self.pinned.setdefault(pin.bytes, set()).add(pin.sha256)
        self.inodes = {(dev, ino): path for path, dev, ino, _, _ in store}
        self.store_sizes = {size: path for path, _, _, size, _ in store}
        self._store_shas: dict[int, str] = {}

    def why(self, path: str, info: os.stat_result, inspect: bool) -> str | None:
        if (info.st_dev, info.st_ino) in self.inodes:
            return f"a hard link of {self.inodes[(info.st_dev, info.st_ino)]}"
        if info.st_size in self.pinned and sources.sha256_of(Path(path)) in self.pinned[
                info.st_size]:
            return "byte-identical to a pinned upstream measurement"
        if info.st_size in self.store_sizes and sources.sha256_of(Path(path)) == self._store_sha(
                info.st_size):
            return f"a copy of {self.store_sizes[info.st_size]}"
        if info.st_size < 12 or not (inspect or path.endswith(TABLE_SUFFIXES)):
            return None
        return _derived(path)

    def _store_sha(self, size: int) -> str:
        if size not in self._store_shas:
            self._store_shas[size] = sources.sha256_of(Path(self.store_sizes[size]))
        return self._store_shas[size]


def _derived(path: str) -> str | None:
    """Why a file is a table derived from measurements, told by its first bytes, or None."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(12)
    except OSError:
        return None
    offset, magic = DUCKDB_MAGIC
    if head[offset:offset + len(magic)] == magic:
        return "a DuckDB database (a predictor's child may read none)"
    try:
        if head.startswith(PARQUET_MAGIC):
            columns = set(pl.read_parquet_schema(path))
        elif head.startswith(ARROW_MAGIC):
            columns = set(pl.read_ipc_schema(path))
        else:
            return None
    except Exception:  # noqa: BLE001 - a file that only starts like one is not a table
        return None
    truth = sorted(columns & TRUTH_COLUMNS)
    return f"a table with measured times ({', '.join(truth)})" if truth else None


def _walk(read_roots, targets: _Targets, inspect: bool, folders: dict, found: list) -> None:
    """Every file below ``read_roots`` (a folder walked already is passed over) held against
    ``targets``; the folders walked (with their mtimes) and the findings are added to."""
    stack = sorted({os.path.realpath(r) for r in read_roots if os.path.isdir(r)})
    while stack:
        folder = stack.pop()
        if folder in folders:
            continue
        try:
            folders[folder] = os.stat(folder).st_mtime_ns
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False) and (
                        why := targets.why(entry.path, entry.stat(follow_symlinks=False), inspect)):
                    found.append([entry.path, why])
            except OSError:
                continue
