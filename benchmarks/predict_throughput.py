"""Predict throughput (cells/s) and fit time of every registered predictor, on one core.

Each predictor is fitted on the real home (the ``a100_vidur`` training split, built the way
``leaderboard.run.evaluate.run`` builds it), takes its deploy reading if it asks for one, then predicts
the ``h200_vidur`` cells replicated to about 1M cells (fewer for a predictor too slow to finish
that in ``--max-predict-s``; the table says how many). Fit and predict are each best of
``--repeats``. Prints a markdown table; ``--json PATH`` also writes the numbers:

    .venv/bin/python benchmarks/predict_throughput.py [--cells 1000000] [--json FILE]

Targets: analytical predictors and DistServe's polynomial >= 1M cells/s; Vidur's random forests
(and any learned predictor) >= 100k cells/s; no target for others. The machine is shared, so
the load average at the start and end is recorded beside the numbers.
"""

from __future__ import annotations

import os

# One core: the thread pools of numpy's BLAS and polars size themselves when first imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
             "POLARS_MAX_THREADS", "RAYON_NUM_THREADS"):
    os.environ[_var] = "1"
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from build_store import cpu_model  # noqa: E402 - the sibling benchmark, on sys.path as a script

from leaderboard.run import readings, run_inputs  # noqa: E402
from leaderboard.run.evaluate import RunSpec  # noqa: E402
from leaderboard.store import database  # noqa: E402
from leaderboard_core import guard  # noqa: E402
from leaderboard_core.contract import GROUND_TRUTH_COLUMNS  # noqa: E402
from leaderboard_core.versioning import code_hash, code_version  # noqa: E402
from predictors import registry  # noqa: E402

TARGET_CELLS_PER_S = {"analytical": 1e6, "learned": 1e5}
# A card's kind does not give the cost class: "profiled" covers DistServe's closed-form
# polynomial (held to the analytical target) and Vidur's random forests (held to the RF target).
TARGET_BY_NAME = {"distserve": 1e6, "distserve_scaled": 1e6, "rf_verbatim": 1e5, "rf_scaled": 1e5}


def load_inputs(target: str):
    """(home, target cells with ground truth, their lineage, target GPU spec), exactly as a
    default run loads them."""
    database.ensure()
    inputs = run_inputs.load_inputs(RunSpec(predictor="", dataset=target, params={}))
    return inputs.home, inputs.target, inputs.target_lineage, inputs.gpu


def best_of(repeats: int, action) -> tuple[float, object]:
    """(fastest wall seconds, the result of the last call)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - started)
    return best, result


def measure(name: str, home, cells: pl.DataFrame, lineage, gpu, n_cells: int, repeats: int,
            max_predict_s: float) -> dict:
    estimator = registry.build(name)
    kind = estimator.card.kind
    row = {"predictor": name, "kind": kind,
           "target_cells_per_s": TARGET_BY_NAME.get(name, TARGET_CELLS_PER_S.get(kind))}

    def fit():
        with guard.sealed("fit"):
            return estimator.fit(home)

    row["fit_s"], _ = best_of(repeats, fit)
    cells, _ = readings.take_in_process(estimator, cells, lineage, gpu)
    blind = cells.drop(GROUND_TRUTH_COLUMNS)

    def predict(frame):
        with guard.sealed("predict"):
            return np.asarray(estimator.predict(frame, gpu), dtype=np.float64)

    # A probe on the unreplicated cells sizes the run for a slow predictor.
    probe_s, _ = best_of(1, lambda: predict(blind))
    affordable = int(max_predict_s / max(probe_s, 1e-9))
    copies = max(1, min(round(n_cells / len(blind)), affordable))
    frame = pl.concat([blind] * copies, rechunk=True)
    row["predict_s"], pred = best_of(repeats, lambda: predict(frame))
    row["cells"] = len(frame)
    row["cells_per_s"] = len(frame) / row["predict_s"]
    row["output_ok"] = bool(pred.shape == (len(frame),) and np.isfinite(pred).all()
                            and (pred > 0).all())
    target = row["target_cells_per_s"]
    row["target_met"] = None if target is None else row["cells_per_s"] >= target
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["| predictor | kind | fit (s) | predicted cells | cells/s | target | met? |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['predictor']} | {r.get('kind', '?')} | | | | | error: {r['error']} |")
            continue
        target = f"{r['target_cells_per_s']:,.0f}" if r["target_cells_per_s"] else "-"
        met = {True: "yes", False: "**NO**", None: "-"}[r["target_met"]]
        if not r["output_ok"]:
            met += " (output not finite and positive)"
        lines.append(f"| {r['predictor']} | {r['kind']} | {r['fit_s']:.3f} | {r['cells']:,} | "
                     f"{r['cells_per_s']:,.0f} | {target} | {met} |")
    lines += ["", f"- Fit on {meta['home']} training split; predict on {meta['target']} cells "
                  f"replicated; best of {meta['repeats']}; one core "
                  f"(affinity {meta['cpu_affinity']}, BLAS/polars threads = 1); 1-min load "
                  "average {:.1f} at start, {:.1f} at end".format(*meta["load_average_1min"]),
              f"- Machine: {meta['machine']}; Python {meta['python']}; code {meta['code_version']}; "
              f"{meta['date']}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=1_000_000, help="cells per predict call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", default="h200_vidur")
    parser.add_argument("--max-predict-s", type=float, default=10.0,
                        help="replicate fewer cells for a predictor slower than this per call")
    parser.add_argument("--predictors", help="comma-separated subset (default: every registered)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    names = args.predictors.split(",") if args.predictors else registry.names()
    load_before = os.getloadavg()[0]
    home, cells, lineage, gpu = load_inputs(args.target)
    rows = []
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(measure(name, home, cells, lineage, gpu, args.cells, args.repeats,
                                args.max_predict_s))
        except Exception as exc:  # noqa: BLE001 - one failing predictor must not hide the others
            rows.append({"predictor": name, "error": f"{type(exc).__name__}: {exc}"[:200]})
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    meta = {"home": home.dataset, "target": args.target, "repeats": args.repeats,
            "cpu_affinity": affinity, "load_average_1min": [load_before, os.getloadavg()[0]],
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()} "
                       f"{platform.release()}",
            "python": platform.python_version(), "code_version": code_version(),
            "code_hash": code_hash(), "date": datetime.now(UTC).isoformat(timespec="seconds")}
    sys.stdout.write(markdown(rows, meta))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**meta, "results": rows}, indent=1) + "\n")
    return 0 if all(r.get("target_met") is not False and "error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
