"""Full store build: wall time and peak memory of ``python -m leaderboard.data build``.

Each run is a fresh child process building into a fresh temporary ``LEADERBOARD_HOME`` (sources
are read from ``$LEADERBOARD_SOURCES`` or ../shared as usual, never downloaded). Peak RSS is the
child's own ``ru_maxrss`` from ``os.wait4``. Prints a markdown report to stdout:

    .venv/bin/python benchmarks/build_store.py [--runs 3] [--output FILE]

Targets (issue 2): at most 60 s and at most 2 GB peak RSS on the project's 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
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


def report(runs: list[tuple[float, float]], tables, quarantine, meta) -> str:
    secs = [s for s, _ in runs]
    rss = [r for _, r in runs]
    ok_time = max(secs) <= TARGET_S
    ok_rss = max(rss) <= TARGET_RSS_MB
    lines = [
        "| run | wall time (s) | peak RSS (MiB) |",
        "|---|---:|---:|",
        *[f"| {i} | {s:.2f} | {r:.0f} |" for i, (s, r) in enumerate(runs, 1)],
        f"| **median** | **{statistics.median(secs):.2f}** | **{statistics.median(rss):.0f}** |",
        f"| **max** | **{max(secs):.2f}** | **{max(rss):.0f}** |",
        "",
        f"Targets: wall time <= {TARGET_S:.0f} s ({'met' if ok_time else 'MISSED'}), "
        f"peak RSS <= 2 GB = {TARGET_RSS_MB:.0f} MiB ({'met' if ok_rss else 'MISSED'}).",
        "",
        f"- Command: `{Path(sys.executable).name} -m leaderboard.data build`, {len(runs)} runs, "
        "each a fresh process into a fresh temporary `LEADERBOARD_HOME` "
        "(`python benchmarks/build_store.py`)",
        f"- Machine: {os.cpu_count()} cores ({cpu_model()}), {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, duckdb {duckdb.__version__}",
        f"- Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}; code "
        f"{meta.get('code_version', '?')}; store version {meta.get('store_version', '?')}",
        "",
        "Rows per table (last run):",
        "",
        "| table | rows | version |",
        "|---|---:|---|",
        *[f"| {t} | {n:,} | {v} |" for t, n, v in tables],
        f"| **total** | **{sum(n for _, n, _ in tables):,}** | |",
        "",
        "Quarantined rows (last run):",
        "",
        "| kind | reason | source | rows |",
        "|---|---|---|---:|",
        *[f"| {k} | {r} | {s} | {n:,} |" for k, r, s, n in quarantine],
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path, help="also write the markdown report here")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="leaderboard-bench-") as tmp:
        for i in range(args.runs):
            home = Path(tmp) / f"home{i}"
            runs.append(run_once(home))
            print(f"run {i + 1}: {runs[-1][0]:.2f} s, {runs[-1][1]:.0f} MiB", file=sys.stderr)
        tables, quarantine, meta = store_counts(home)
    text = report(runs, tables, quarantine, meta)
    sys.stdout.write(text)
    if args.output:
        args.output.write_text(text)
    met = max(s for s, _ in runs) <= TARGET_S and max(r for _, r in runs) <= TARGET_RSS_MB
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
