"""The walls around a predictor's child that the parent builds before any predictor code runs.

- **Namespaces** (``child_command``): the child runs under bubblewrap (``bwrap``) in its own
  user, network, IPC, PID, UTS and mount namespaces, with no capability. Its whole file system
  is mounted read-only except its write roots (so neither a file's bytes nor its metadata, an
  xattr, a mode or a time, can carry anything from one run to the next outside them). It has no
  network at all (a loopback of its own), no SysV IPC or abstract unix socket shared with
  anything outside, a session of its own, and it is PID 1 of its namespace, so every process it
  starts dies with it; it dies with the harness.
- **No measurement in the readable roots** (``check_readable``): no file the child may read is
  a copy of a pinned upstream file or of the suite's store, or a table derived from it
  (``leaderboard.seal.scan``), no installed distribution is one known to bundle measurements,
  and no folder where measurements lie (the suite's home, a sources root, a runs folder, a
  cache) sits inside a readable root.

Landlock (``leaderboard.seal.landlock``), applied by the child itself, is the wall inside these.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from leaderboard.seal import scan

SEALED = "namespaces+landlock"  # the only sandbox a ranked run may have
NAMESPACE_FLAGS = ("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
                   "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
                   "--new-session", "--as-pid-1")
INSTALL_HINT = ("install bubblewrap (apt-get install bubblewrap; `make` does it where it can) and "
                "allow unprivileged user namespaces")
# Distributions that ship measured kernel tables (the aiconfigurator wheels carry the pinned
# parquet files byte for byte); a predictor's dependencies may carry no GPU's measurements.
BUNDLING_DISTRIBUTIONS = frozenset({"aiconfigurator", "aiconfigurator-core", "aiconfigurator_core"})


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


@lru_cache(maxsize=1)
def bundling_distributions() -> list[str]:
    """The installed distributions of ``BUNDLING_DISTRIBUTIONS``, read once per process: reading
    every distribution's metadata took 80 ms a run, and a child cannot install a package (its
    file system is read-only outside its job folder and predictor cache)."""
    return sorted({d.metadata["Name"] for d in importlib.metadata.distributions()
                   if (d.metadata["Name"] or "").lower() in BUNDLING_DISTRIBUTIONS})


def check_readable(read_roots: list[str], data_roots: list[str], inspect=()) -> None:
    """Refuse, before the child starts, a readable root that holds measurements (``inspect``:
    the roots whose every file is opened to tell a derived table, ``scan``)."""
    for data in map(Path, data_roots):
        for root in map(Path, read_roots):
            if data.is_relative_to(root):
                raise SealRefused(
                    f"{data}, where measurements lie, is inside {root}, which a predictor's child "
                    f"may read; move it out (LEADERBOARD_HOME, sources.root, runs_dir and the HF "
                    f"caches must lie outside the Python installation, the suite's code and the "
                    f"system folders)")
    if bundling := bundling_distributions():
        raise SealRefused(f"installed package(s) {bundling} bundle measured kernel tables, which "
                          f"a predictor's child could read; uninstall them (pip uninstall "
                          f"{' '.join(bundling)}): a predictor's dependencies may carry no GPU's "
                          f"measurements")
    found = scan.measurement_copies(tuple(sorted(read_roots)), scan.store_identity(),
                                         tuple(sorted(inspect)))
    if found:
        path, why = found[0]
        raise SealRefused(f"{len(found)} file(s) a predictor's child may read hold measurements "
                          f"(first: {why}: {path}); remove them or the package that installed "
                          "them")
