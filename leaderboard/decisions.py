"""Decisions: what a predictor's step times decide, scored by what was measured.

A step-time prediction exists to decide something. Two decisions are scored here, on the
unseen GPUs, every outcome a measured one:

- **Capacity at a step-time SLO.** Per (dataset, model, TP, context) with at least
  ``MIN_BATCHES`` measured decode batch sizes, and per SLO taken from those measured steps (so
  each SLO has a true answer), the predictor picks the largest batch whose predicted step fits.
  A *violation*: the pick's measured step exceeds the SLO. *Regret*: one minus the pick's
  measured decode throughput (batch / measured step) over the best measured batch that fits,
  at least 0; a pick that violates the SLO serves nothing within it (regret 1), and so does no
  pick, when a predictor predicts no batch fits (counted). An optimistic predictor therefore
  cannot buy a low regret with violations.
- **GPU choice.** Per workload measured on every unseen GPU of a family, the predictor picks
  the GPU with the smallest predicted step. *Regret*: the pick's measured step over the fastest
  measured one, minus one. (A price per GPU-hour would weigh the same way; no sourced price
  table is in the suite yet, so this is the price-free variant: the fastest.)

A constant bias that keeps the order of the GPUs picks them perfectly; at an absolute SLO it
does not: a predictor 20 % slow picks smaller batches than fit. That is why the two differ.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard.ranking import BOOTSTRAP_SAMPLES, CONFIDENCE

MIN_BATCHES = 3


def _ci(values: np.ndarray, groups: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap CI of the mean of ``values``, resampling whole ``groups``."""
    keys, inverse = np.unique(groups, return_inverse=True)
    sums = np.bincount(inverse, weights=values, minlength=len(keys))
    counts = np.bincount(inverse, minlength=len(keys))
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(keys), size=(BOOTSTRAP_SAMPLES, len(keys)))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def capacity_choices(predictions: pl.DataFrame) -> pl.DataFrame:
    """One row per (predictor, dataset, group, SLO): the pick, the best measured batch that fits,
    whether the pick violates the SLO and its throughput regret. ``predictions`` holds
    ``predictor``, ``dataset``, ``model``, ``tp``, ``phase``, ``num_requests``, ``num_decode``,
    ``decode_ctx_sum``, ``gt_ms`` and ``pred_ms`` per cell."""
    decode = predictions.filter((pl.col("phase") == "decode") & (pl.col("num_decode") > 0)
                                & pl.col("pred_ms").is_not_null())
    per_batch = decode.with_columns(
        ctx=pl.col("decode_ctx_sum") // pl.col("num_decode")).group_by(
        "predictor", "dataset", "model", "tp", "ctx", "num_requests").agg(
        pl.col("gt_ms").median(), pl.col("pred_ms").median())
    rows = []
    for key, group in per_batch.group_by("predictor", "dataset", "model", "tp", "ctx"):
        if group.height < MIN_BATCHES:
            continue
        group = group.sort("num_requests")
        batch, measured, predicted = (group[c].to_numpy().astype(float)
                                      for c in ("num_requests", "gt_ms", "pred_ms"))
        for slo in np.unique(measured):
            rows.append(_choose(key, batch, measured, predicted, float(slo)))
    return pl.DataFrame(rows, schema={
        "predictor": pl.String, "dataset": pl.String, "group": pl.String, "slo_ms": pl.Float64,
        "pick": pl.Float64, "best": pl.Float64, "violation": pl.Boolean, "regret": pl.Float64})


def _choose(key: tuple, batch: np.ndarray, measured: np.ndarray, predicted: np.ndarray,
            slo: float) -> dict:
    predictor, dataset, model, tp, ctx = key
    fits = measured <= slo
    throughput = batch / measured
    best = int(np.argmax(np.where(fits, throughput, -np.inf)))
    picked = np.flatnonzero(predicted <= slo)
    row = {"predictor": predictor, "dataset": dataset, "group": f"{model} TP{tp} ctx {ctx}",
           "slo_ms": slo, "best": float(batch[best])}
    if not len(picked):
        return {**row, "pick": None, "violation": False, "regret": 1.0}
    pick = int(picked[np.argmax(batch[picked])])
    violation = bool(measured[pick] > slo)
    # a pick that breaks the SLO serves nothing within it: its throughput does not count
    regret = 1.0 if violation else max(0.0, 1.0 - throughput[pick] / throughput[best])
    return {**row, "pick": float(batch[pick]), "violation": violation, "regret": regret}


def capacity_scores(choices: pl.DataFrame) -> pl.DataFrame:
    """Per predictor: decisions, groups, violation % and regret % with bootstrap CIs over the
    groups, and how many SLOs it found no batch for."""
    rows = []
    for (predictor,), mine in choices.group_by("predictor"):
        groups = (mine["dataset"] + "/" + mine["group"]).to_numpy()
        violation = mine["violation"].to_numpy().astype(float)
        regret = mine["regret"].to_numpy()
        v_low, v_high = _ci(violation, groups)
        r_low, r_high = _ci(regret, groups)
        rows.append({"predictor": predictor, "decisions": mine.height,
                     "groups": len(set(groups)), "no_pick": int(mine["pick"].is_null().sum()),
                     "violation_pct": violation.mean() * 100, "violation_ci": (v_low * 100,
                                                                               v_high * 100),
                     "regret_pct": regret.mean() * 100, "regret_ci": (r_low * 100, r_high * 100)})
    return pl.DataFrame(rows).sort("regret_pct") if rows else pl.DataFrame()


def gpu_choices(predictions: pl.DataFrame) -> pl.DataFrame:
    """Per (predictor, workload) measured on every GPU the predictor was scored on: the GPU it
    picks (smallest predicted step), the fastest measured one, and the regret."""
    rows = []
    usable = predictions.filter(pl.col("pred_ms").is_not_null())
    for (predictor,), mine in usable.group_by("predictor"):
        gpus = mine["sku"].n_unique()
        if gpus < 2:
            continue
        per = mine.group_by("workload_id", "sku").agg(pl.col("gt_ms").median(),
                                                       pl.col("pred_ms").median())
        complete = per.group_by("workload_id").agg(pl.len()).filter(pl.col("len") == gpus)
        per = per.join(complete.select("workload_id"), on="workload_id")
        for (workload,), options in per.group_by("workload_id"):
            pick = options.row(int(np.argmin(options["pred_ms"].to_numpy())), named=True)
            best = options["gt_ms"].min()
            rows.append({"predictor": predictor, "workload_id": workload, "pick": pick["sku"],
                         "regret": pick["gt_ms"] / best - 1.0})
    return pl.DataFrame(rows, schema={"predictor": pl.String, "workload_id": pl.String,
                                      "pick": pl.String, "regret": pl.Float64})


def gpu_scores(choices: pl.DataFrame) -> pl.DataFrame:
    """Per predictor: workloads, the share picked right, mean and P90 regret % with a CI."""
    rows = []
    for (predictor,), mine in choices.group_by("predictor"):
        regret = mine["regret"].to_numpy()
        low, high = _ci(regret, mine["workload_id"].to_numpy())
        rows.append({"predictor": predictor, "workloads": mine.height,
                     "right_pct": float((regret <= 1e-12).mean() * 100),
                     "regret_pct": regret.mean() * 100, "regret_ci": (low * 100, high * 100),
                     "p90_pct": float(np.percentile(regret, 90) * 100)})
    return pl.DataFrame(rows).sort("regret_pct") if rows else pl.DataFrame()


def kendall_tau(first: list[str], second: list[str]) -> float | None:
    """Kendall's tau between two orders of the same names (None under two names in common)."""
    common = [n for n in first if n in second]
    if len(common) < 2:
        return None
    where = {n: i for i, n in enumerate(second)}
    pairs = [(a, b) for i, a in enumerate(common) for b in common[i + 1:]]
    agree = sum(1 if where[a] < where[b] else -1 for a, b in pairs)
    return agree / len(pairs)

# Presents results (decisions scored from the runs' stored predictions), never changes a run's
# numbers: versioning.code_hash skips this file.
PRESENTATION = True
