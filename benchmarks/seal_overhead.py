"""What the seal's walls cost a run: the same run with every wall, and with the parent's walls
taken down (no namespaces, no scan of the readable roots; Landlock stays, the child confines
itself). Median wall time of ``--repeats`` runs each, in this process (the predictor-describing
child, started once per process, is outside the timing). Target: walled / bare <= 1.3.

    .venv/bin/python benchmarks/seal_overhead.py [--repeats 3] [--json benchmarks/seal_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import UTC, datetime

from leaderboard.run.evaluate import RunSpec, run
from leaderboard.seal import predictor_index, walls
from leaderboard_core.versioning import code_version

CASES = (("ours", "h100_vidur"), ("rf_scaled", "h200_vidur"), ("llm_viewer", "h200_sxm_ops"),
         ("ours", "h100_silicon"))
TARGET_RATIO = 1.3


@contextmanager
def bare():
    """The parent's walls down: a plain ``python -S`` child and no readable-root scan."""
    saved = walls.child_command, walls.check_readable, walls.namespaces_available
    walls.child_command = lambda args, writable: [sys.executable, "-S", *args]
    walls.check_readable = lambda read, data, inspect=(): None
    walls.namespaces_available = lambda: False
    try:
        yield
    finally:
        walls.child_command, walls.check_readable, walls.namespaces_available = saved


def _median_seconds(predictor: str, dataset: str, repeats: int, runs_dir: str) -> tuple[float, str]:
    times, sandbox = [], ""
    for _ in range(repeats):
        started = time.perf_counter()
        result = run(RunSpec(predictor, dataset, {}, runs_dir=runs_dir))
        times.append(time.perf_counter() - started)
        sandbox = result.metrics["sandbox"]
    return statistics.median(times), sandbox


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args(argv)
    predictor_index.index()  # the describing child, once, before any timing
    rows = []
    with tempfile.TemporaryDirectory() as runs_dir:
        for predictor, dataset in CASES:
            _median_seconds(predictor, dataset, 1, runs_dir)  # warm: caches, the scan's cache
            walled, sandbox = _median_seconds(predictor, dataset, args.repeats, runs_dir)
            with bare():
                plain, plain_sandbox = _median_seconds(predictor, dataset, args.repeats, runs_dir)
            rows.append({"predictor": predictor, "dataset": dataset, "walled_s": round(walled, 2),
                         "walled_sandbox": sandbox, "bare_s": round(plain, 2),
                         "bare_sandbox": plain_sandbox, "ratio": round(walled / plain, 3),
                         "met": walled / plain <= TARGET_RATIO})
            print(f"{predictor} on {dataset}: {walled:.2f} s walled ({sandbox}), {plain:.2f} s "
                  f"bare ({plain_sandbox}), x{walled / plain:.2f}", flush=True)
    bench = {"repeats": args.repeats, "target_ratio": TARGET_RATIO, "results": rows,
             "code_version": code_version(), "date": datetime.now(UTC).date().isoformat()}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(bench, out, indent=1)


if __name__ == "__main__":
    main()
