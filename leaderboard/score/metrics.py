"""Per-phase error statistics of a run, from a registry of metrics (as lm-eval registers them).

A ``Metric`` names itself, says whether higher is better, how it aggregates the signed
percentage errors of a phase, the levels (``families.LEVELS``) it applies to and its column
label. ``summarize``, ``by_phase``, the CLI table (``cli.print_metrics``) and ``metrics.json``
are generated from the registry in registration order; ``n`` always comes first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from leaderboard.cells.families import COLD, LEVELS, PHASES, REPLAYED, TRAFFIC
from leaderboard_core.naming import Registry


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    aggregate: Callable[[np.ndarray], float]  # signed percentage errors -> one number
    higher_is_better: bool = False
    levels: tuple[str, ...] = LEVELS


# ``n`` (the row count) is written beside every metric, so no metric may take that name.
_METRICS: Registry[Metric] = Registry("metric", reserved=("n",))


def register_metric(metric: Metric) -> Metric:
    """Add a metric; a second one of the same name is refused."""
    return _METRICS.add(metric.name, metric)


def unregister_metric(name: str) -> None:
    _METRICS.drop(name)


def registered(level: str = "step") -> list[Metric]:
    """The metrics that apply at ``level``, in registration order."""
    return [m for m in _METRICS if level in m.levels]


for _metric in (
    Metric("mape", "MAPE %", lambda s: float(np.abs(s).mean())),
    Metric("median_ape", "median APE %", lambda s: float(np.median(np.abs(s)))),
    Metric("p90_ape", "P90 APE %", lambda s: float(np.percentile(np.abs(s), 90))),
    Metric("bias", "bias %", lambda s: float(s.mean())),
):
    register_metric(_metric)


def errors(pred_ms, gt_ms):
    """Signed percentage error of each prediction against its ground truth (arrays or polars
    expressions)."""
    return (pred_ms - gt_ms) / gt_ms * 100.0


def summarize(signed_pct: np.ndarray, level: str = "step") -> dict[str, float | int | None]:
    """``n`` and every metric that applies at ``level``; None for each metric when ``n`` is 0."""
    empty = len(signed_pct) == 0
    return {"n": int(len(signed_pct)),
            **{m.name: None if empty else m.aggregate(signed_pct) for m in registered(level)}}


def in_all(predictions: pl.DataFrame) -> pl.Series:
    """Which rows "all" and "all_cold" count: every row not labelled ``composed`` (a frame
    without the column, as op and serving runs have, counts every row)."""
    if "composed" not in predictions.columns:
        return pl.Series("in_all", [True] * len(predictions), dtype=pl.Boolean)
    return (~predictions["composed"].fill_null(False)).alias("in_all")


def by_phase(predictions: pl.DataFrame, groups: tuple[str, ...] = PHASES,
             level: str = "step") -> dict[str, dict]:
    """Statistics over every row not labelled ``composed`` (when ``groups`` names "all"), over
    the cold ones of those where the rows carry ``warm_share``, over the replayed ones of those
    and their traffic where the rows carry ``weight``, and over every row of each value of
    ``phase`` (in ``groups`` order, then any other)."""
    signed = predictions["signed_pct"].to_numpy()
    phase = predictions["phase"].to_numpy()
    present = [g for g in groups if g not in ("all", COLD, REPLAYED, TRAFFIC)] + sorted(
        set(phase) - set(groups))
    measured = in_all(predictions).to_numpy()
    out = {"all": summarize(signed[measured], level)} if "all" in groups else {}
    warm = predictions.get_column("warm_share") if "warm_share" in predictions.columns else None
    if COLD in groups and warm is not None and warm.null_count() < len(warm):
        out[COLD] = summarize(signed[measured & (warm == 0).fill_null(False).to_numpy()], level)
    weight = predictions.get_column("weight") if "weight" in predictions.columns else None
    if weight is not None and weight.null_count() < len(weight):
        weight = weight.fill_null(0).to_numpy().astype(np.int64)
        replayed = measured & (weight > 0)
        if REPLAYED in groups:
            out[REPLAYED] = summarize(signed[replayed], level)
        if TRAFFIC in groups:
            out[TRAFFIC] = summarize(np.repeat(signed[replayed], weight[replayed]), level)
    for g in present:
        out[g] = summarize(signed[phase == g], level)
    return out
