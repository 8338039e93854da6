"""A full rerun's cost, measured on a systematic sample of its runs: every ``--every``-th
leaderboard run (the rerun's own order, so every kind is drawn: step, op, serving, two homes,
leave one out, held-out shapes), run as the rerun runs them (``--jobs`` spawned workers) into
a fresh runs folder, from cold work caches (``--cold``: this code's kept closed-loop plans and
fits are removed first). Run it in a checkout of older code beside this one (a git worktree
next to ../shared, with the same LEADERBOARD_HOME) to compare back to back; the script uses
only what the rerun had before it kept any work.

    .venv/bin/python benchmarks/rerun_sample.py [--every 10] [--jobs 2] [--cold] [--json F]
    .venv/bin/python benchmarks/rerun_sample.py --every 70 --cold --compare results/runs

``--compare RUNS_DIR``: hold each sampled run's numbers (``phases``, ``valid``, ``decisions``)
against the current run of the same spec in RUNS_DIR (a full rerun's, made with the work kept):
the sample, run cold, must give the same numbers.

``--warm-vs-cold``: the sample three ways, each timed, their numbers held against each other:
*cold*, each run alone in a fresh process with nothing kept (no plan, fit, forest or predictor
cache: all removed before each run); then *first*, as a rerun runs it from nothing kept
(``--jobs`` workers, each keeping its homes and step cells, the work kept on disk as it goes);
then *warm*, again, with every plan and fit kept on disk (its workers start afresh, as each
rerun's do). With ``--compare``, the cold pass is held against that folder too.

    .venv/bin/python benchmarks/rerun_sample.py --every 70 --also ours_reading:h100_vidur \
        --warm-vs-cold --json benchmarks/rerun_sample.json

A sample reuses less than a full rerun (fewer runs share a home or a serving load), so its
speed-up understates the full one's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from leaderboard import rerun
from leaderboard.run import roster
from leaderboard_core import paths


def _clear_kept_work(everything: bool = False) -> None:
    """Kept plans and fits; ``everything``: every predictor cache too (where a sealed child
    keeps its own files: the forests keep their fitted models there) and the harness's own
    fitted models."""
    shutil.rmtree(paths.home() / "replay-plans", ignore_errors=True)
    if everything:
        for folder in ("predictor-cache", "models"):
            shutil.rmtree(paths.home() / folder, ignore_errors=True)
        return
    for kept in (paths.home() / "predictor-cache").glob("*/fitted-*"):
        kept.unlink()


def _kind(metrics: dict) -> str:
    """What a run exercises: its level, and the protocol or reading that sets it apart."""
    homes = metrics["home_datasets"] or []
    return (metrics["level"] + (" (held-out shapes)" if metrics["home_points"] == "held_out_shapes"
                                else f" ({len(homes)} homes)" if len(homes) > 1 else "")
            + (" reading" if metrics.get("profiled_rows") else ""))


def compare(sample_dir: Path, reference_dir: Path) -> dict:
    """How many sampled runs equal the reference's current run of the same (predictor, dataset,
    homes, home points) in every one of ``NUMBERS``; the differing, absent and missing ones
    named, and how many runs of each kind (``_kind``) the sample holds."""
    from leaderboard.score import results  # noqa: PLC0415

    def keyed(folder: Path) -> dict:
        runs = results.current(results.load_runs(folder)).pl()
        return {(r["predictor"], r["dataset"], tuple(r["home_datasets"] or ()), r["home_points"]):
                json.loads((Path(r["folder"]) / "metrics.json").read_text())
                for r in runs.iter_rows(named=True)}

    sample, reference = keyed(sample_dir), keyed(reference_dir)
    same, differ, absent = 0, [], []
    # a run the reference has and the sample lacks (it failed before writing its folder)
    missing = ["/".join(map(str, key[:2])) for key in reference if key not in sample]
    for key, metrics in sample.items():
        other = reference.get(key)
        if other is None:
            absent.append("/".join(map(str, key[:2])))
        elif all(metrics.get(k) == other.get(k) for k in NUMBERS):
            same += 1
        else:
            differ.append("/".join(map(str, key[:2])))
    kinds = Counter(_kind(metrics) for metrics in sample.values())
    return {"same": same, "differ": differ, "absent": absent, "missing": missing,
            "kinds": dict(sorted(kinds.items()))}


NUMBERS = ("phases", "valid", "decisions", "invalid_reasons", "profiled_rows")


def _timed(specs: list, jobs: int, alone: bool = False) -> tuple[float, list]:
    """The specs run as the rerun runs them, or each ``alone`` in a fresh process after the
    kept work is cleared; seconds and outcomes."""
    def each_alone():  # the kept work cleared just before each run, as it is reached
        for spec in specs:
            _clear_kept_work(everything=True)
            yield from rerun.in_workers(rerun._run_one, [spec], 1)

    started, outcomes = time.perf_counter(), []
    runs = each_alone() if alone else rerun.in_workers(rerun._run_one, specs, jobs)
    for o in runs:  # a line per run as it ends: a pass takes minutes
        outcomes.append(o)
        print(f"{len(outcomes)}/{len(specs)} {o.predictor} on {o.dataset}: {o.status} "
              f"({o.seconds:.1f} s)", file=sys.stderr, flush=True)
    return time.perf_counter() - started, outcomes


def warm_vs_cold(specs: list, jobs: int, tmp: Path) -> dict:
    """``--warm-vs-cold``: the seconds of each pass and how many runs of the first and warm
    passes equal the cold one's."""
    seconds, statuses = {}, {}
    for name in ("cold", "first", "warm"):
        if name == "first":
            _clear_kept_work(everything=True)  # what the last cold run kept
        seconds[name], outcomes = _timed([replace(s, runs_dir=tmp / name) for s in specs], jobs,
                                         alone=name == "cold")
        statuses[name] = _statuses(outcomes)
    return {"seconds": {k: round(v, 1) for k, v in seconds.items()}, "statuses": statuses,
            "first_vs_cold": compare(tmp / "first", tmp / "cold"),
            "warm_vs_cold": compare(tmp / "warm", tmp / "cold")}


def _statuses(outcomes: list) -> dict[str, int]:
    return dict(Counter(o.status.split(":")[0] for o in outcomes))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--compare", help="a runs folder whose current runs the sample must equal")
    parser.add_argument("--warm-vs-cold", action="store_true")
    parser.add_argument("--also", action="append", default=[], metavar="PREDICTOR:DATASET",
                        help="add that default run to the sample (a kind the systematic sample "
                             "misses: a predictor that reads target rows, say)")
    args = parser.parse_args()
    if args.cold:
        _clear_kept_work()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=paths.REPO_ROOT,
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp) / "runs"
        every = roster.run_specs(runs_dir)
        specs = every[::args.every]
        for wanted in args.also:
            predictor, _, dataset = wanted.partition(":")
            found = [s for s in every if (s.predictor, s.dataset) == (predictor, dataset)
                     and s.home is None and s.home_points == "full_grid"]
            if not found:
                parser.error(f"--also {wanted}: no default run of that predictor on that dataset")
            specs += [s for s in found if s not in specs]
        result = {"commit": commit, "runs": len(specs), "of": len(every),
                  "every": args.every, "jobs": args.jobs, "cores": os.cpu_count()}
        if args.warm_vs_cold:
            result["warm_vs_cold"] = warm_vs_cold(specs, args.jobs, Path(tmp))
            runs_dir = Path(tmp) / "cold"  # what --compare holds against its folder
        else:
            seconds, outcomes = _timed(specs, args.jobs)
            result.update(seconds=round(seconds, 1),
                          per_run_s=round(seconds * args.jobs / len(specs), 2),
                          statuses=_statuses(outcomes))
        if args.compare:
            result["compared"] = compare(runs_dir, Path(args.compare))
    result["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    print(json.dumps(result))
    if args.json:
        path = Path(args.json)
        kept = json.loads(path.read_text()) if path.is_file() else []
        path.write_text(json.dumps([*kept, result], indent=1) + "\n")


if __name__ == "__main__":
    main()
