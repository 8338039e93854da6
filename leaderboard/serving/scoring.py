"""Serving-level scoring: ``serving`` datasets, scored on TTFT, TPOT (and the closed loop's
steady-state TTFT, or a recorded run's service time) like cells on phases.

The predictor is fitted on its home's training cells exactly as for a step-level run, then
times every step the replay schedules (``predict(cells, gpu)``). Fit runs in the sandboxed
child (``leaderboard.seal.sandbox``); the replay runs in the harness, which sends the child each
batch of steps to price, so a predictor can neither see the measured TTFT/TPOT nor replace the
replay.
Each target gives one ``ttft`` and one ``tpot`` prediction row (and, for a closed loop, a
``ttft_steady`` row: the loop's steady-state TTFT, scored against the same measured TTFT, the
bracket's other side; for a static batch, an ``e2e`` row: its end-to-end latency); these play
the role phases play for cells. A predictor that answers
NotSupported for these steps is reported as such, not as INVALID.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from leaderboard.cells import families
from leaderboard.serving.simulate import predict_targets

# What the replay predicts, in predict_targets' order.
METRICS = ("ttft", "tpot", "service", "ttft_steady", "e2e")
MEASURED_AS = {"ttft_steady": "ttft"}  # a metric scored against another's measurement
# What the sandboxed replay never receives.
GROUND_TRUTH = tuple(f"gt_{m}_ms" for m in METRICS if m not in MEASURED_AS)
PREDICTION_COLUMNS = ("cell_id", "workload_id", "model", "precision", "tp", "moe_ep", "phase",
                      "backend", "isl", "osl", "concurrency", "gt_kind", "gt_ms")


StepPricer = Callable[[pl.DataFrame], tuple[np.ndarray, float]]  # ms per step, seconds taken


def phases_of(dataset: str) -> tuple[str, ...]:
    """The metrics a serving dataset scores (its family's phases)."""
    return families.of(dataset).phases


def replay_priced(targets: pl.DataFrame, models, gpu, price: StepPricer, facts: dict,
                  host_in_steps: bool = False) -> tuple[np.ndarray, ...]:
    """Predicted TTFT, TPOT, service time, steady-state TTFT and end-to-end latency per
    target (``METRICS``). The
    replay (scheduling, timing) runs here, in the harness; ``price`` asks the predictor's
    sandboxed child for the time of each step it schedules, and nothing else. ``facts`` gains
    ``predict_seconds`` (the child's) and ``steps``. ``host_in_steps``: ``home_times_host``."""
    facts.update(predict_seconds=0.0, steps=0)

    def timer(cells: pl.DataFrame) -> np.ndarray:
        ms, seconds = price(cells)
        facts["predict_seconds"] += seconds
        facts["steps"] += len(cells)
        if ms.shape != (len(cells),):
            raise ValueError(f"predict returned shape {ms.shape}, expected ({len(cells)},)")
        if not (np.isfinite(ms) & (ms > 0)).all():
            raise ValueError(f"{int((~(np.isfinite(ms) & (ms > 0))).sum())} of {len(ms)} step "
                             "predictions are not finite and positive")
        return ms

    return predict_targets(targets, models, gpu, timer, host_in_steps=host_in_steps)


def home_times_host(cells: pl.DataFrame) -> bool:
    """Whether a home's step times hold the host's own time: every cell wall-clock ground truth
    (a predictor fitted on them predicts it, so the replay adds no host time of its own)."""
    return len(cells) > 0 and "gt_kind" in cells.columns and bool(
        (cells["gt_kind"] == "wall_clock").all())


def prediction_rows(targets: pl.DataFrame, predicted: dict[str, np.ndarray]) -> pl.DataFrame:
    """One row per (target, metric of ``predicted``) with a measured value: cell_id is
    ``<target>:<metric>``."""
    placement = pl.col("moe_ep") if "moe_ep" in targets.columns else pl.lit(None, pl.Int64)
    base = targets.select(workload_id="target_id", model="model", precision="precision", tp="tp",
                          moe_ep=placement, backend="backend",
                          isl="isl", osl="osl", concurrency="concurrency", gt_kind="gt_kind")
    rows = pl.concat([
        base.with_columns(phase=pl.lit(metric), gt_ms=targets[f"gt_{measured}_ms"],
                          pred_ms=pl.Series(pred, dtype=pl.Float64))
        for metric, pred in predicted.items()
        if f"gt_{(measured := MEASURED_AS.get(metric, metric))}_ms" in targets.columns])
    rows = rows.filter(pl.col("gt_ms").is_not_null()).with_columns(
        cell_id=pl.col("workload_id") + ":" + pl.col("phase"))
    return rows.select(*PREDICTION_COLUMNS, "pred_ms")
