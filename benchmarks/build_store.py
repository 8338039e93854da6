"""Full store build: wall time and peak memory of ``python -m leaderboard.data build``.

Each run is a fresh child process building into a fresh temporary ``LEADERBOARD_HOME`` (sources
are read from ``$LEADERBOARD_SOURCES`` or ../shared as usual, never downloaded). Peak RSS is the
child's own ``ru_maxrss`` from ``os.wait4``. Prints the result as JSON; ``--json`` also writes it
where ``python -m leaderboard.report`` reads it (``benchmarks/build_store.json``):

    .venv/bin/python benchmarks/build_store.py [--runs 3] [--json benchmarks/build_store.json]

Targets (issue 2): at most 60 s and at most 2 GB peak RSS on the project's 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "leaderboard.data", "build"]
TARGET_S = 60.0
TARGET_RSS_MB = 2048.0


def run_once(home: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one build into ``home``."""
    env = {**os.environ, "LEADERBOARD_HOME": str(home)}
    started = time.perf_counter()
    child = subprocess.Popen(COMMAND, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    stderr = child.stderr.read()
    child.stderr.close()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit(f"build failed (exit {child.returncode}):\n{stderr}")
    return seconds, usage.ru_maxrss / 1024  # Linux reports KiB


def store_counts(home: Path) -> tuple[list[tuple], list[tuple], dict[str, str]]:
    path = home / "store" / "leaderboard.duckdb"
    with duckdb.connect(str(path), read_only=True) as con:
        tables = con.execute("SELECT table_name, rows, version FROM table_versions").fetchall()
        quarantine = con.execute("SELECT kind, reason, source, count(*) FROM quarantine "
                                 "GROUP BY ALL ORDER BY 1, 2, 3").fetchall()
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    return tables, quarantine, meta


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def result(runs: list[tuple[float, float]], tables, quarantine, meta) -> dict:
    """What ``python -m leaderboard.report`` renders as the store build benchmark."""
    return {"runs": [{"seconds": s, "rss_mib": r} for s, r in runs],
            "target_s": TARGET_S, "target_rss_mib": TARGET_RSS_MB,
            "tables": {t: n for t, n, _ in tables},
            "quarantine": [list(q) for q in quarantine],
            "machine": f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} "
                       f"{platform.release()}, Python {platform.python_version()}, "
                       f"duckdb {duckdb.__version__}",
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "code_version": meta.get("code_version", "?"),
            "store_version": meta.get("store_version", "?")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the result here (the report reads "
                                                  "benchmarks/build_store.json)")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="leaderboard-bench-") as tmp:
        for i in range(args.runs):
            home = Path(tmp) / f"home{i}"
            runs.append(run_once(home))
            print(f"run {i + 1}: {runs[-1][0]:.2f} s, {runs[-1][1]:.0f} MiB", file=sys.stderr)
        tables, quarantine, meta = store_counts(home)
    found = result(runs, tables, quarantine, meta)
    print(json.dumps(found, indent=1))
    if args.json:
        args.json.write_text(json.dumps(found, indent=1) + "\n")
    met = max(s for s, _ in runs) <= TARGET_S and max(r for _, r in runs) <= TARGET_RSS_MB
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
