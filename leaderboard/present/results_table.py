"""The results as data: the current rankable runs of a runs folder (and of the published runs
unpacked beside it), and one tidy table of them, run x phase x statistic, with what made each
run. The site offers it for download; the hub export carries it.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from leaderboard.run.homes import with_family
from leaderboard.score import results


def tidy(runs: pl.DataFrame) -> pl.DataFrame:
    """One row per run, phase and statistic, with what made the run (its dataset version,
    code and harness hash, predictor kind): the results as data."""
    rows = []
    for r in runs.iter_rows(named=True):
        card = json.loads(r["card"] or "{}")
        for phase, stats in json.loads(r["phases"] or "{}").items():
            for metric, value in stats.items():
                if metric == "n":
                    continue
                rows.append({"run_id": r["run_id"], "predictor": r["predictor"],
                             "kind": card.get("kind"), "dataset": r["dataset"],
                             "family": r["family"], "sku": r["sku"], "split": r["split"],
                             "phase": phase, "metric": metric, "value": value,
                             "n": stats.get("n"), "rankable": r["rankable"],
                             "dataset_version": r["dataset_version"], "code_hash": r["code_hash"],
                             "harness_hash": r["harness_hash"]})
    schema = {"run_id": pl.String, "predictor": pl.String, "kind": pl.String,
              "dataset": pl.String, "family": pl.String, "sku": pl.String, "split": pl.String,
              "phase": pl.String, "metric": pl.String, "value": pl.Float64, "n": pl.Int64,
              "rankable": pl.Boolean, "dataset_version": pl.String, "code_hash": pl.String,
              "harness_hash": pl.String}
    return pl.DataFrame(rows, schema=schema)


def current_runs(runs_dir: Path, versions: dict[str, str] | None = None) -> pl.DataFrame:
    """The current rankable runs of ``runs_dir`` and of the published runs the report unpacked
    beside them (``report.unpack_published``), with their family."""
    published = Path(runs_dir) / ".published"
    held = [runs_dir, *([published] if published.is_dir() else [])]
    runs = results.current(results.load_runs(held), versions).pl()
    return with_family(runs.filter(pl.col("rankable").fill_null(False)))


PRESENTATION = True
