"""What interrupted work leaves behind: temporary stores, ``.partial`` run folders, sandbox jobs.

Each such name carries the id of the process that made it. ``sweep`` removes those whose process
is gone (a live one may still be writing) and says how many it removed.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from rich.console import Console

from leaderboard_core import paths

# .leaderboard.duckdb.<pid>.tmp(.wal), .<run_id>.<pid>.partial, sandbox/<pid>-<hex>
PATTERNS = (re.compile(r"^\..*\.(\d+)\.tmp(\.wal)?$"), re.compile(r"^\..*\.(\d+)\.partial$"),
            re.compile(r"^(\d+)-[0-9a-f]+$"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def stale(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = next((m for p in PATTERNS if (m := p.match(path.name))), None)
        if match and not alive(int(match.group(1))):
            found.append(path)
    return found


def sweep(runs_dir: str | Path | None = None) -> int:
    """Remove the debris of dead processes from the store folder, the sandbox jobs folder and
    ``runs_dir``; return how many entries went."""
    folders = [paths.home() / "store", paths.home() / "sandbox"]
    folders += [Path(runs_dir)] if runs_dir is not None else []
    gone = [p for folder in folders for p in stale(folder)]
    for path in gone:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if gone:
        Console(stderr=True).print(f"removed {len(gone)} leftover(s) of interrupted work: "
                                   + ", ".join(p.name for p in gone[:5]), highlight=False)
    return len(gone)
