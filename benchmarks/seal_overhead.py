"""What the seal's walls cost a run: a child started inside the namespaces against a bare one,
and the scan of the readable roots for pinned measurements, cold and from its cache.

``python benchmarks/seal_overhead.py [--json benchmarks/seal_overhead.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from leaderboard import sandbox, seal_walls
from leaderboard_core import paths


def _start_seconds(command: list[str], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args(argv)
    bare = _start_seconds([sys.executable, "-S", "-c", "pass"])
    walled = _start_seconds(seal_walls.child_command(["-c", "pass"]))
    read = [r for r in sandbox.readable_code(()) if not r.startswith(sandbox.PSEUDO_FS)]
    with tempfile.TemporaryDirectory() as home:
        paths.home = lambda: __import__("pathlib").Path(home)  # a cold scan cache
        started = time.perf_counter()
        seal_walls.pinned_copies(tuple(sorted(read)))
        cold = time.perf_counter() - started
        seal_walls.pinned_copies.cache_clear()
        started = time.perf_counter()
        seal_walls.pinned_copies(tuple(sorted(read)))
        cached = time.perf_counter() - started
    numbers = {"namespaces": seal_walls.namespaces_available(),
               "child_start_bare_s": round(bare, 4), "child_start_namespaces_s": round(walled, 4),
               "scan_cold_s": round(cold, 3), "scan_cached_s": round(cached, 3),
               "read_roots": len(read)}
    print(json.dumps(numbers, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(numbers, out, indent=1)


if __name__ == "__main__":
    main()
