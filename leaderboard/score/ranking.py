"""Tie-aware SKU ranking and bootstrap places (docs/design.md, Protocol).

**SKU ranking.** For each workload, every pair of GPUs that both have a finite prediction of it
is one comparison: the measured order of the pair against the predicted order. Two times count
as equal when they differ by at most ``tolerance`` relative to the smaller one (default 1%):

* measured equal: the pair has no right answer and is left out (counted as ``measured_ties``);
* predicted equal: an unbroken tie, no credit (``ties``). A pure roofline predicts H100 and H200
  the same compute time, and that tie shows here instead of being broken by sort order;
* otherwise ``correct`` when the predicted order matches the measured one, else ``wrong``.

``decisive_accuracy`` = correct / (correct + wrong); ``tie_aware_accuracy`` = correct / all
scored pairs (correct + wrong + ties).

Which GPUs are compared: the home GPU has predictions only for its held-out workloads, the
unseen GPUs for all of them. Each workload is ranked over every GPU that has it: the unseen GPUs
on every workload, and the home GPU too on the held-out ones. ``home_pairs`` counts the scored
pairs that involve the home GPU, so both parts stay visible.

**Places.** Each predictor's unseen MAPE gets a percentile bootstrap CI over workloads (seeded;
the same resamples for every predictor, so the comparison is paired). A predictor's place is 1 +
the number of predictors whose CI lies entirely below its own, so predictors whose CIs overlap
share a place.
"""

from __future__ import annotations

import numpy as np
import polars as pl

TOLERANCE = 0.01
BOOTSTRAP_SAMPLES = 1000
CONFIDENCE = 0.95


def _relative_gap(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    return (a - b).abs() / pl.min_horizontal(a, b)


def sku_pairs(predictions: pl.DataFrame, tolerance: float = TOLERANCE) -> pl.DataFrame:
    """One row per (predictor, workload, GPU pair) with its ``outcome``: correct, wrong, tie or
    measured_tie. Needs predictor, workload_id, sku, split, gt_ms, pred_ms."""
    scored = (predictions.filter(pl.col("pred_ms").is_finite() & (pl.col("pred_ms") > 0))
              .select("predictor", "workload_id", "sku", "split", "gt_ms", "pred_ms"))
    pairs = scored.join(scored, on=["predictor", "workload_id"], suffix="_b").filter(
        pl.col("sku") < pl.col("sku_b"))
    measured_order = (pl.col("gt_ms") - pl.col("gt_ms_b")).sign()
    predicted_order = (pl.col("pred_ms") - pl.col("pred_ms_b")).sign()
    outcome = (pl.when(_relative_gap(pl.col("gt_ms"), pl.col("gt_ms_b")) <= tolerance)
               .then(pl.lit("measured_tie"))
               .when(_relative_gap(pl.col("pred_ms"), pl.col("pred_ms_b")) <= tolerance)
               .then(pl.lit("tie"))
               .when(measured_order == predicted_order).then(pl.lit("correct"))
               .otherwise(pl.lit("wrong")))
    involves_home = (pl.col("split") == "home_heldout") | (pl.col("split_b") == "home_heldout")
    return pairs.select("predictor", "workload_id", "sku", "sku_b", outcome=outcome,
                        involves_home=involves_home)


def ranking_table(pairs: pl.DataFrame) -> pl.DataFrame:
    """Per predictor: pair counts, decisive and tie-aware accuracy, and the GPU pair with the
    most unbroken ties."""
    count = lambda what: (pl.col("outcome") == what).sum().alias(what)  # noqa: E731
    scored = pl.col("outcome") != "measured_tie"
    table = pairs.group_by("predictor").agg(
        count("correct"), count("wrong"), count("tie").alias("ties"),
        count("measured_tie").alias("measured_ties"),
        (scored & pl.col("involves_home")).sum().alias("home_pairs"),
        pl.col("workload_id").n_unique().alias("workloads"))
    most_tied = (pairs.filter(pl.col("outcome") == "tie")
                 .group_by("predictor", "sku", "sku_b").len()
                 .sort("len", "sku", "sku_b", descending=[True, False, False])
                 .unique("predictor", keep="first", maintain_order=True)
                 .select("predictor", most_tied_pair=pl.format("{}/{}: {}", "sku", "sku_b", "len")))
    decisive = pl.col("correct") + pl.col("wrong")
    return (table.join(most_tied, on="predictor", how="left")
            .with_columns(pairs=decisive + pl.col("ties"))
            # No decisive pairs (a predictor blind to the GPU ties everything): no accuracy.
            .with_columns(decisive_accuracy=pl.when(decisive > 0).then(pl.col("correct") / decisive),
                          tie_aware_accuracy=pl.col("correct") / pl.col("pairs"))
            .sort("tie_aware_accuracy", "predictor", descending=[True, False], nulls_last=True))


PLACES_SCHEMA = {"predictor": pl.String, "mape": pl.Float64, "ci_low": pl.Float64,
                 "ci_high": pl.Float64, "cells": pl.Int64, "workloads": pl.Int64,
                 "place": pl.Int64}


def bootstrap_places(predictions: pl.DataFrame, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0,
                     confidence: float = CONFIDENCE) -> pl.DataFrame:
    """Per predictor: unseen MAPE, its bootstrap CI over workloads, and its place. Needs
    predictor, workload_id, signed_pct of the predictions to score (e.g. the unseen GPUs)."""
    ape = (predictions.filter(pl.col("signed_pct").is_finite())
           .group_by("predictor", "workload_id")
           .agg(ape_sum=pl.col("signed_pct").abs().sum(), cells=pl.len()))
    workloads = ape["workload_id"].unique().sort()
    if workloads.is_empty():  # nothing to place (no predictor qualified)
        return pl.DataFrame(schema=PLACES_SCHEMA)
    index = {w: i for i, w in enumerate(workloads)}
    # One multinomial draw of workloads per resample, shared by all predictors (paired).
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(len(workloads), np.full(len(workloads), 1 / len(workloads)),
                              size=samples).astype(np.float64)
    rows = []
    for (predictor,), group in ape.group_by("predictor", maintain_order=True):
        sums, cells = np.zeros(len(workloads)), np.zeros(len(workloads))
        at = [index[w] for w in group["workload_id"]]
        sums[at], cells[at] = group["ape_sum"].to_numpy(), group["cells"].to_numpy()
        with np.errstate(invalid="ignore"):
            resampled = (weights @ sums) / (weights @ cells)
        tail = (1 - confidence) / 2 * 100
        low, high = np.nanpercentile(resampled, [tail, 100 - tail])
        rows.append({"predictor": predictor, "mape": sums.sum() / cells.sum(),
                     "ci_low": float(low), "ci_high": float(high), "cells": int(cells.sum()),
                     "workloads": int((cells > 0).sum())})
    table = pl.DataFrame(rows)
    highs = table["ci_high"].to_numpy()
    place = [1 + int((highs < low).sum()) for low in table["ci_low"]]
    return table.with_columns(place=pl.Series(place)).sort("place", "mape", "predictor")

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
