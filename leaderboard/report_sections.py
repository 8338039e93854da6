"""RESULTS.md sections the harness gathers from the predictors: the sections each predictor offers
of its own (``ours``: its ablation ladder, targets and wall-clock mode), one ``explain`` example
per predictor that offers one, and the predict-throughput benchmark of every predictor.

Every number is read from the current leaderboard runs, from a live ``explain`` of the committed
code, or from ``benchmarks/predict_throughput.json`` (written by
``python benchmarks/predict_throughput.py --json benchmarks/predict_throughput.json``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
from rich.console import Console

from leaderboard_core import paths
from leaderboard_core.report_tables import fmt, table
from predictors import registry
from predictors.base import Predictor

THROUGHPUT_JSON = paths.REPO_ROOT / "benchmarks" / "predict_throughput.json"
# The dataset of the report's explain examples: an unseen GPU of the main family.
EXPLAIN_DATASET = "h200_vidur"


def _distinct(names: list[str], hook: str) -> list[str]:
    """The first of ``names`` to carry each distinct override of a ``Predictor`` hook (the ladder
    rungs of ``ours`` share its hooks, so they are shown once)."""
    seen, chosen = {Predictor}, []
    for name in names:
        owner = next(k for k in registry.get(name).__mro__ if hook in vars(k))
        if owner not in seen:
            seen.add(owner)
            chosen.append(name)
    return chosen


def predictor_sections(runs: pl.DataFrame) -> list[str]:
    """The sections each registered predictor offers of its own (``report_sections``)."""
    return [line for name in _distinct(registry.names(), "report_sections")
            for line in registry.get(name).report_sections(runs)]


def explain_examples(runs: pl.DataFrame) -> list[str]:
    """One explained cell per predictor that offers ``explain`` and has a run on
    ``EXPLAIN_DATASET``: a live fit, so only when a report is made."""
    from leaderboard import explain  # reads the store and fits

    ran = set(runs.filter(pl.col("dataset") == EXPLAIN_DATASET)["predictor"])
    lines = []
    for predictor in _distinct(sorted(ran), "explain"):
        model, cells, gpu = explain.load(predictor, EXPLAIN_DATASET)
        console = Console(record=True, width=170, file=io.StringIO())
        explain.render(model, cells.head(1), gpu, console)
        lines += [f"## {predictor}: one cell explained", "",
                  f"`python -m leaderboard.explain predictor={predictor} dataset={EXPLAIN_DATASET}` "
                  "(its first cell):", "", "```", console.export_text().rstrip(), "```", ""]
    return lines


def throughput(path: Path = THROUGHPUT_JSON) -> list[str]:
    if not path.exists():
        return ["## Predict throughput benchmark", "",
                f"No benchmark result at `{path.relative_to(paths.REPO_ROOT)}` yet.", ""]
    bench = json.loads(path.read_text())
    rows = [[r["predictor"], r.get("kind", "?"), fmt(r.get("fit_s"), 3), f"{r.get('cells', 0):,}",
             fmt(r.get("cells_per_s"), 0), fmt(r.get("target_cells_per_s"), 0),
             {True: "yes", False: "**NO**", None: "—"}[r.get("target_met")]]
            for r in bench["results"]]
    return ["## Predict throughput benchmark", "",
            "`python benchmarks/predict_throughput.py --json benchmarks/predict_throughput.json`: "
            f"fit on {bench['home']}'s training split, predict {bench['target']} cells replicated, "
            f"one core, best of {bench['repeats']}; load average "
            f"{bench['load_average_1min'][0]:.1f} → {bench['load_average_1min'][1]:.1f}; code "
            f"{bench['code_version']}, {bench['date']}.", "",
            *table(["predictor", "kind", "fit s", "cells", "cells/s", "target", "met"], rows,
                   "llrrrrl")]

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
