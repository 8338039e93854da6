"""Per-phase error statistics of a run: n, MAPE, median and P90 APE, signed bias (percent)."""

from __future__ import annotations

import numpy as np
import polars as pl

PHASES = ("all", "all_cold", "prefill", "decode", "mixed")
# Beside "all": the cells none of whose ground truth came from an L2-warm point (warm_share 0).
COLD = "all_cold"


def errors(pred_ms, gt_ms):
    """Signed percentage error of each prediction against its ground truth (arrays or polars
    expressions)."""
    return (pred_ms - gt_ms) / gt_ms * 100.0


def summarize(signed_pct: np.ndarray) -> dict[str, float | int | None]:
    if len(signed_pct) == 0:
        return {"n": 0, "mape": None, "median_ape": None, "p90_ape": None, "bias": None}
    ape = np.abs(signed_pct)
    return {"n": int(len(ape)), "mape": float(ape.mean()), "median_ape": float(np.median(ape)),
            "p90_ape": float(np.percentile(ape, 90)), "bias": float(signed_pct.mean())}


def by_phase(predictions: pl.DataFrame, groups: tuple[str, ...] = PHASES) -> dict[str, dict]:
    """Statistics over all rows (when ``groups`` names "all"), over the cold cells where the rows
    carry ``warm_share``, and per value of ``phase`` (in ``groups`` order, then any other)."""
    signed = predictions["signed_pct"].to_numpy()
    phase = predictions["phase"].to_numpy()
    present = [g for g in groups if g not in ("all", COLD)] + sorted(set(phase) - set(groups))
    out = {"all": summarize(signed)} if "all" in groups else {}
    warm = predictions.get_column("warm_share") if "warm_share" in predictions.columns else None
    if COLD in groups and warm is not None and warm.null_count() < len(warm):
        out[COLD] = summarize(signed[(warm == 0).fill_null(False).to_numpy()])
    for g in present:
        out[g] = summarize(signed[phase == g])
    return out
