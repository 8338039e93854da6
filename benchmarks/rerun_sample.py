"""A full rerun's cost, measured on a systematic sample of its runs: every ``--every``-th
leaderboard run (the rerun's own order, so every kind is drawn: step, op, serving, two homes,
leave one out, held-out shapes), run as the rerun runs them (``--jobs`` spawned workers) into
a fresh runs folder, from cold work caches (``--cold``: this code's kept closed-loop plans and
fits are removed first). Run it in a checkout of older code beside this one (a git worktree
next to ../shared, with the same LEADERBOARD_HOME) to compare back to back; the script uses
only what the rerun had before it kept any work.

    .venv/bin/python benchmarks/rerun_sample.py [--every 10] [--jobs 2] [--cold] [--json F]
    .venv/bin/python benchmarks/rerun_sample.py --every 70 --cold --compare results/runs

``--compare RUNS_DIR``: hold each sampled run's numbers (``phases``, ``valid``) against the
current run of the same spec in RUNS_DIR (a full rerun's, made with the work kept): the sample,
run cold, must give the same numbers.

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
from leaderboard.run import roster
from leaderboard_core import paths


def _clear_kept_work() -> None:
    shutil.rmtree(paths.home() / "replay-plans", ignore_errors=True)
    for kept in (paths.home() / "predictor-cache").glob("*/fitted-*"):
        kept.unlink()


def compare(sample_dir: Path, reference_dir: Path) -> dict:
    """How many sampled runs equal the reference's current run of the same (predictor, dataset,
    homes, home points), in ``valid`` and every ``phases`` number; the differing ones named."""
    from leaderboard.score import results  # noqa: PLC0415

    def keyed(folder: Path) -> dict:
        runs = results.current(results.load_runs(folder)).pl()
        return {(r["predictor"], r["dataset"], tuple(r["home_datasets"] or ()), r["home_points"]):
                json.loads((Path(r["folder"]) / "metrics.json").read_text())
                for r in runs.iter_rows(named=True)}

    sample, reference = keyed(sample_dir), keyed(reference_dir)
    same, differ, absent = 0, [], []
    for key, metrics in sample.items():
        other = reference.get(key)
        if other is None:
            absent.append("/".join(map(str, key[:2])))
        elif (metrics["phases"], metrics["valid"]) == (other["phases"], other["valid"]):
            same += 1
        else:
            differ.append("/".join(map(str, key[:2])))
    return {"same": same, "differ": differ, "absent": absent,
            "kinds": sorted({m["level"] for m in sample.values()})}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--compare", help="a runs folder whose current runs the sample must equal")
    args = parser.parse_args()
    if args.cold:
        _clear_kept_work()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=paths.REPO_ROOT,
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp) / "runs"
        specs = roster.run_specs(runs_dir)[::args.every]
        started = time.perf_counter()
        outcomes = list(rerun.in_workers(rerun._run_one, specs, args.jobs))
        seconds = time.perf_counter() - started
        compared = compare(runs_dir, Path(args.compare)) if args.compare else None
    statuses = {}
    for o in outcomes:
        key = o.status.split(":")[0]
        statuses[key] = statuses.get(key, 0) + 1
    result = {"commit": commit, "runs": len(specs), "of": len(roster.run_specs(runs_dir)),
              "every": args.every, "jobs": args.jobs, "cores": os.cpu_count(),
              "seconds": round(seconds, 1), "per_run_s": round(seconds * args.jobs / len(specs), 2),
              "statuses": statuses, "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
              **({"compared": compared} if compared else {})}
    print(json.dumps(result))
    if args.json:
        path = Path(args.json)
        kept = json.loads(path.read_text()) if path.is_file() else []
        path.write_text(json.dumps([*kept, result], indent=1) + "\n")


if __name__ == "__main__":
    main()
