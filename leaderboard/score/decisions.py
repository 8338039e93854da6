"""Decisions: what a predictor's step times decide, scored by what was measured.

A step-time prediction exists to decide something. Three decisions are scored here, on the
unseen GPUs, every outcome a measured one:

- **Capacity at a step-time SLO.** Per (dataset, model, TP, context) with at least
  ``MIN_BATCHES`` measured decode batch sizes, and per SLO taken from those measured steps (so
  each SLO has a true answer), the predictor picks the largest batch whose predicted step fits.
  A *violation*: the pick's measured step exceeds the SLO. *Regret*: one minus the pick's
  measured decode throughput (batch / measured step) over the best measured batch that fits,
  at least 0; a pick that violates the SLO serves nothing within it (regret 1), and so does no
  pick, when a predictor predicts no batch fits (counted). An optimistic predictor therefore
  cannot buy a low regret with violations.
- **Prefill chunk budget.** Sarathi's question, how many prompt tokens one step may take at a
  step-time SLO, asked of the measured single-request prefill steps (16 to 8,192 tokens in the
  ``_vidur`` sets) per (dataset, model, TP): the largest chunk whose predicted step fits; violation and regret
  (tokens per ms) as for capacity. The ``_vidur`` sets' mixed cells are composed from parts,
  never measured whole, so chunks with decodes riding along are not scored.
- **GPU choice.** Per workload measured on every unseen GPU of a family, the predictor picks
  the GPU that serves it cheapest: measured step time x GPUs x price per GPU-hour
  (``conf/prices.yaml``, each price with its source), and, price-free, the fastest. *Regret*:
  the pick's measured cost over the cheapest measured one, minus one. Beside it, the GPU
  order's *decisive pairs*: pairs of GPUs whose measured steps differ by at least
  ``DECISIVE_GAP``, each weighted by its gap, the share ordered right.

A constant bias that keeps the order of the GPUs picks them perfectly; at an absolute SLO it
does not: a predictor 20 % slow picks smaller batches than fit. That is why the two differ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from leaderboard.score.ranking import BOOTSTRAP_SAMPLES, CONFIDENCE
from leaderboard_core import paths, yaml_io

MIN_BATCHES = 3
DECISIVE_GAP = 0.10  # a measured gap a buyer would act on, well above the runs' noise
PRICES = paths.CONF_DIR / "prices.yaml"


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


# What each budget decision varies, within which group of measured steps.
BUDGETS = {
    "capacity": {"phase": "decode", "size": "num_requests", "group": ("model", "tp", "ctx")},
    "chunk": {"phase": "prefill", "size": "total_tokens", "group": ("model", "tp")},
}


def capacity_choices(predictions: pl.DataFrame) -> pl.DataFrame:
    """The capacity decisions (``budget_choices``)."""
    return budget_choices(predictions, "capacity")


def chunk_choices(predictions: pl.DataFrame) -> pl.DataFrame:
    """The prefill chunk decisions: single-request prefill steps, whose size is the chunk."""
    return budget_choices(predictions.filter(pl.col("num_requests") == 1), "chunk")


def budget_choices(predictions: pl.DataFrame, kind: str) -> pl.DataFrame:
    """One row per (predictor, dataset, group, SLO) of a ``BUDGETS`` kind: the pick, the best
    measured size that fits, whether the pick violates the SLO and its throughput regret.
    ``predictions`` holds ``predictor``, ``dataset``, ``model``, ``tp``, ``phase``,
    ``num_requests``, ``num_decode``, ``total_tokens``, ``decode_ctx_sum``, ``gt_ms`` and
    ``pred_ms`` per cell; composed cells (``composed``, where present) are never scored."""
    budget = BUDGETS[kind]
    steps = predictions.filter((pl.col("phase") == budget["phase"])
                               & pl.col("pred_ms").is_not_null())
    if "composed" in steps.columns:  # a cell that does not say is not composed (metrics.in_all)
        steps = steps.filter(~pl.col("composed").fill_null(False))
    if kind == "capacity":
        steps = steps.filter(pl.col("num_decode") > 0).with_columns(
            ctx=pl.col("decode_ctx_sum") // pl.col("num_decode"))
    keys = ["predictor", "dataset", *budget["group"]]
    # One sort, then each group as a slice: selecting the groups one by one from the frame
    # (``group_by`` iteration) was a third of a cheap step run; the rows come in key order.
    per_size = (steps.group_by(*keys, size=budget["size"])
                .agg(pl.col("gt_ms").median(), pl.col("pred_ms").median())
                .sort(*keys, "size").with_columns(group_id=pl.struct(keys).rle_id()))
    size, measured, predicted = (per_size[c].to_numpy().astype(float)
                                 for c in ("size", "gt_ms", "pred_ms"))
    bounds = np.flatnonzero(np.diff(per_size["group_id"].to_numpy(), prepend=-1, append=-1))
    rows = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end - start < MIN_BATCHES:
            continue
        key = per_size.row(int(start))[:len(keys)]
        label = " ".join(f"{k} {v}" for k, v in zip(budget["group"], key[2:], strict=True))
        here = size[start:end], measured[start:end], predicted[start:end]
        for slo in np.unique(here[1]):
            rows.append(_choose(key[0], key[1], label, *here, float(slo)))
    return pl.DataFrame(rows, schema={
        "predictor": pl.String, "dataset": pl.String, "group": pl.String, "slo_ms": pl.Float64,
        "pick": pl.Float64, "best": pl.Float64, "violation": pl.Boolean, "regret": pl.Float64})


def _choose(predictor: str, dataset: str, group: str, size: np.ndarray, measured: np.ndarray,
            predicted: np.ndarray, slo: float) -> dict:
    fits = measured <= slo
    throughput = size / measured
    best = int(np.argmax(np.where(fits, throughput, -np.inf)))
    picked = np.flatnonzero(predicted <= slo)
    row = {"predictor": predictor, "dataset": dataset, "group": group, "slo_ms": slo,
           "best": float(size[best])}
    if not len(picked):
        return {**row, "pick": None, "violation": False, "regret": 1.0}
    pick = int(picked[np.argmax(size[picked])])
    violation = bool(measured[pick] > slo)
    # a pick that breaks the SLO serves nothing within it: its throughput does not count
    regret = 1.0 if violation else max(0.0, 1.0 - throughput[pick] / throughput[best])
    return {**row, "pick": float(size[pick]), "violation": violation, "regret": regret}


def budget_scores(choices: pl.DataFrame) -> pl.DataFrame:
    """Per predictor: decisions, groups, violation % and regret % with bootstrap CIs over the
    groups, and how many SLOs it found no size for."""
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


def run_capacity(predictions: pl.DataFrame) -> dict | None:
    """A step run's own capacity decisions, for its ``metrics.json`` (``decisions.capacity``):
    n, violation % and regret %; None where its cells hold no group of enough batch sizes."""
    choices = capacity_choices(predictions.with_columns(predictor=pl.lit("run"),
                                                        dataset=pl.lit("run")))
    if choices.is_empty():
        return None
    return {"n": choices.height, "groups": choices["group"].n_unique(),
            "violation_pct": float(choices["violation"].mean() * 100),
            "regret_pct": float(choices["regret"].mean() * 100)}


def gpu_choices(predictions: pl.DataFrame, prices: dict[str, float] | None = None
                ) -> pl.DataFrame:
    """Per (predictor, workload) measured on every GPU the predictor was scored on (every
    priced one, given ``prices`` per GPU-hour by sku): the GPU it picks (the smallest predicted
    step, or cost: step x TP x price), the best measured one, and the regret (the pick's
    measured step, or cost, over the best's, minus one)."""
    rows = []
    usable = predictions.filter(pl.col("pred_ms").is_not_null())
    if prices is not None:
        usable = usable.filter(pl.col("sku").is_in(list(prices)))
    # every predictor chooses among the same GPUs: one that has no run on a GPU (NotSupported
    # there) is not scored on an easier choice among the rest
    gpus = usable["sku"].n_unique()
    if gpus < 2:
        return pl.DataFrame(schema={"predictor": pl.String, "workload_id": pl.String,
                                    "pick": pl.String, "regret": pl.Float64})
    for (predictor,), mine in usable.group_by("predictor"):
        per = mine.group_by("workload_id", "sku").agg(pl.col("gt_ms").median(),
                                                       pl.col("pred_ms").median(),
                                                       pl.col("tp").first())
        if prices is not None:
            rate = pl.col("sku").replace_strict(prices) * pl.col("tp")
            per = per.with_columns(pl.col("gt_ms") * rate, pl.col("pred_ms") * rate)
        complete = per.group_by("workload_id").agg(pl.len()).filter(pl.col("len") == gpus)
        per = per.join(complete.select("workload_id"), on="workload_id")
        for (workload,), options in per.group_by("workload_id"):
            options = options.sort("sku")  # a predicted tie goes to the first GPU by name
            pick = options.row(int(np.argmin(options["pred_ms"].to_numpy())), named=True)
            best = options["gt_ms"].min()
            rows.append({"predictor": predictor, "workload_id": workload, "pick": pick["sku"],
                         "regret": pick["gt_ms"] / best - 1.0})
    return pl.DataFrame(rows, schema={"predictor": pl.String, "workload_id": pl.String,
                                      "pick": pl.String, "regret": pl.Float64})


def load_prices(path: Path = PRICES) -> dict[str, float]:
    """sku -> price per GPU-hour (USD) from ``conf/prices.yaml``."""
    return {sku: float(entry["usd_per_gpu_hour"])
            for sku, entry in yaml_io.safe_load(path.read_text())["prices"].items()}


def decisive_pairs(predictions: pl.DataFrame, min_gap: float | None = None) -> pl.DataFrame:
    """Per predictor: the GPU pairs of a workload whose measured steps differ by at least
    ``min_gap`` (``DECISIVE_GAP``), and the share it orders right, each pair weighted by its
    measured gap (a predicted tie counts as wrong): the pairs a buyer's choice turns on."""
    gap_needed = DECISIVE_GAP if min_gap is None else min_gap
    scored = (predictions.filter(pl.col("pred_ms").is_finite() & (pl.col("pred_ms") > 0))
              .group_by("predictor", "workload_id", "sku")
              .agg(pl.col("gt_ms").median(), pl.col("pred_ms").median()))
    pairs = scored.join(scored, on=["predictor", "workload_id"], suffix="_b").filter(
        pl.col("sku") < pl.col("sku_b")).with_columns(
        gap=(pl.col("gt_ms") - pl.col("gt_ms_b")).abs()
        / pl.min_horizontal("gt_ms", "gt_ms_b")).filter(pl.col("gap") >= gap_needed)
    right = ((pl.col("gt_ms") - pl.col("gt_ms_b")).sign()
             == (pl.col("pred_ms") - pl.col("pred_ms_b")).sign())
    return (pairs.group_by("predictor")
            .agg(pairs=pl.len(), weighted_right_pct=(right * pl.col("gap")).sum()
                 / pl.col("gap").sum() * 100)
            .sort("weighted_right_pct", descending=True))


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


def kendall_tau(first: dict[str, float], second: dict[str, float]) -> float | None:
    """Kendall's tau-b between two scores of the same names (lower first in both), over the
    names they share: a tie in either score (values equal to 9 decimals, as shown) orders a pair
    neither way, rather than by the names; None under two names in common or where one score
    ties every pair."""
    common = sorted(set(first) & set(second))
    if len(common) < 2:
        return None
    a = np.array([round(first[n], 9) for n in common])
    b = np.array([round(second[n], 9) for n in common])
    upper = np.triu_indices(len(common), 1)
    da, db = np.sign(a[:, None] - a[None, :])[upper], np.sign(b[:, None] - b[None, :])[upper]
    untied_a, untied_b = np.count_nonzero(da), np.count_nonzero(db)
    if not untied_a or not untied_b:
        return None
    return float((da * db).sum() / np.sqrt(untied_a * untied_b))
