"""A full rerun's cost, measured on a systematic sample of its runs: every ``--every``-th
leaderboard run (the rerun's own order, so every kind is drawn: step, op, serving, two homes,
leave one out, held-out shapes), run as the rerun runs them (``--jobs`` spawned workers) into
a fresh runs folder, from cold work caches (``--cold``: this code's kept closed-loop plans and
fits are removed first). Run it in a checkout of older code beside this one (a git worktree
next to ../shared, with the same LEADERBOARD_HOME) to compare back to back; the script uses
only what the rerun had before it kept any work.

    .venv/bin/python benchmarks/rerun_sample.py [--every 10] [--jobs 2] [--cold] [--json F]

A sample reuses less than a full rerun (fewer runs share a home or a serving load), so its
speed-up understates the full one's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from leaderboard import rerun
from leaderboard_core import paths


def _clear_kept_work() -> None:
    shutil.rmtree(paths.home() / "replay-plans", ignore_errors=True)
    for kept in (paths.home() / "predictor-cache").glob("*/fitted-*"):
        kept.unlink()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.cold:
        _clear_kept_work()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=paths.REPO_ROOT,
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp) / "runs"
        specs = rerun.run_specs(runs_dir)[::args.every]
        started = time.perf_counter()
        outcomes = list(rerun.in_workers(rerun._run_one, specs, args.jobs))
        seconds = time.perf_counter() - started
    statuses = {}
    for o in outcomes:
        key = o.status.split(":")[0]
        statuses[key] = statuses.get(key, 0) + 1
    result = {"commit": commit, "runs": len(specs), "of": len(rerun.run_specs(runs_dir)),
              "every": args.every, "jobs": args.jobs, "cores": os.cpu_count(),
              "seconds": round(seconds, 1), "per_run_s": round(seconds * args.jobs / len(specs), 2),
              "statuses": statuses, "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}
    print(json.dumps(result))
    if args.json:
        path = Path(args.json)
        kept = json.loads(path.read_text()) if path.is_file() else []
        path.write_text(json.dumps([*kept, result], indent=1) + "\n")


if __name__ == "__main__":
    main()
