"""The walls around a predictor's child that the parent builds before any predictor code runs.

- **Namespaces** (``child_command``): the child runs under bubblewrap (``bwrap``) in its own
  user, network, IPC, PID, UTS and mount namespaces, with no capability. Its whole file system
  is mounted read-only except its write roots (so neither a file's bytes nor its metadata, an
  xattr, a mode or a time, can carry anything from one run to the next outside them). It has no
  network at all (a loopback of its own), no SysV IPC or abstract unix socket shared with
  anything outside, a session of its own, and it is PID 1 of its namespace, so every process it
  starts dies with it; it dies with the harness.
- **No measurement in the readable roots** (``check_readable``): no file the child may read has
  the sha256 of a pinned upstream file, no installed distribution is one known to bundle
  measurements, and no folder where measurements lie (the suite's home, a sources root, a runs
  folder, a cache) sits inside a readable root.

Landlock (``leaderboard.landlock``), applied by the child itself, is the wall inside these.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from leaderboard import sources
from leaderboard_core import paths

SEALED = "namespaces+landlock"  # the only sandbox a ranked run may have
NAMESPACE_FLAGS = ("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
                   "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
                   "--new-session", "--as-pid-1")
INSTALL_HINT = ("install bubblewrap (apt-get install bubblewrap; `make` does it where it can) and "
                "allow unprivileged user namespaces")
# Distributions that ship measured kernel tables (the aiconfigurator wheels carry the pinned
# parquet files byte for byte); a predictor's dependencies may carry no GPU's measurements.
BUNDLING_DISTRIBUTIONS = frozenset({"aiconfigurator", "aiconfigurator-core", "aiconfigurator_core"})
# The pinned files that hold measurements (licences, metadata yaml and figures are texts anyone
# may ship; a LICENSE file matches half of site-packages)
MEASUREMENT_SUFFIXES = (".parquet", ".csv", ".json", ".jsonl", ".log", ".txt")


class SealRefused(ValueError):
    """The environment would let a child read measurements; the message says what and the fix."""


@lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """Whether bubblewrap can make the child's namespaces here."""
    tool = shutil.which("bwrap")
    if tool is None:
        return False
    probe = subprocess.run([tool, *NAMESPACE_FLAGS, "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def child_command(python_args: list[str], writable: list[str]) -> list[str]:
    """The command that starts a child: Python without site processing (``-S``: no ``.pth``
    line runs before the child confines itself; it adds the site folders after), inside the
    namespaces where they are available, ``writable`` the only folders it can write."""
    command = [sys.executable, "-S", *python_args]
    if not namespaces_available():
        return command
    binds = [arg for path in writable if os.path.exists(path) and path != "/dev/null"
             for arg in ("--bind", path, path)]
    return [shutil.which("bwrap"), *NAMESPACE_FLAGS, *binds, *command]


def leftover_processes() -> list[int]:
    """Run by the child as PID 1 of its namespace, after the predictor is done: the other
    processes still alive there (it started them; they die with it, and the run is INVALID)."""
    if os.getpid() != 1:
        return []
    try:
        return sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and p != "1")
    except OSError:
        return []


# ------------------------------------------------------------------- nothing readable measures


def check_readable(read_roots: list[str], data_roots: list[str]) -> None:
    """Refuse, before the child starts, a readable root that holds measurements."""
    for data in map(Path, data_roots):
        for root in map(Path, read_roots):
            if data.is_relative_to(root):
                raise SealRefused(
                    f"{data}, where measurements lie, is inside {root}, which a predictor's child "
                    f"may read; move it out (LEADERBOARD_HOME, sources.root, runs_dir and the HF "
                    f"caches must lie outside the Python installation, the suite's code and the "
                    f"system folders)")
    bundling = sorted({d.metadata["Name"] for d in importlib.metadata.distributions()
                       if (d.metadata["Name"] or "").lower() in BUNDLING_DISTRIBUTIONS})
    if bundling:
        raise SealRefused(f"installed package(s) {bundling} bundle measured kernel tables, which "
                          f"a predictor's child could read; uninstall them (pip uninstall "
                          f"{' '.join(bundling)}): a predictor's dependencies may carry no GPU's "
                          f"measurements")
    found = pinned_copies(tuple(sorted(read_roots)))
    if found:
        raise SealRefused(f"{len(found)} file(s) a predictor's child may read are byte-identical "
                          f"to pinned upstream measurements (first: {found[0]}); remove them or "
                          f"the package that installed them")


@lru_cache(maxsize=4)
def pinned_copies(read_roots: tuple[str, ...]) -> list[str]:
    """Files under ``read_roots`` whose sha256 is a pinned file's. Only files of a pinned size
    are hashed. The answer is kept in the suite's home with the mtime of every folder walked:
    while none changed, no entry was added, renamed or removed anywhere below (how pip and apt
    install), so the next run skips the walk."""
    cache_file = paths.home() / "seal-scan.json"
    key = list(read_roots)
    try:
        cached = json.loads(cache_file.read_text())
        if cached["roots"] == key and all(
                os.stat(d).st_mtime_ns == m for d, m in cached["folders"].items()):
            return cached["found"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    pins = sources.load_pins()
    by_size: dict[int, set[str]] = {}
    for pin in pins:
        if not pin.path.endswith(MEASUREMENT_SUFFIXES):
            continue
        by_size.setdefault(pin.bytes, set()).add(pin.sha256)
    folders, found = {}, []
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
                elif entry.is_file(follow_symlinks=False):
                    shas = by_size.get(entry.stat(follow_symlinks=False).st_size)
                    if shas and sources.sha256_of(Path(entry.path)) in shas:
                        found.append(entry.path)
            except OSError:
                continue
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        partial = cache_file.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"roots": key, "folders": folders, "found": found}))
        partial.replace(cache_file)
    except OSError:
        pass  # no cache: the next run walks again
    return found
