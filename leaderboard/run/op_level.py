"""Op-level scoring: ``<sku>_ops`` datasets, one measured kernel per row, scored like cells.

Each point gets a ``cell_id`` (its shape) and an op ``phase`` (``gemm``,
``attn_prefill`` or ``attn_decode``) that plays the role a cell's phase plays in the metrics.
The home split is by point (``cell_id``); fit sees the home's training points in ``Home.ops`` under those
three names, and a predictor scores op datasets through ``predict_ops(points, gpu)``.
"""

from __future__ import annotations

import polars as pl

from leaderboard.cells import families
from leaderboard.cells.schema import CELL_SCHEMA
from leaderboard.run.split import split
from leaderboard_core.contract import Home, NotSupported

OP_PHASES = families.get("ops").phases
SHAPE = ("op_family", "phase", "dtype", "kv_dtype", "m", "n", "k", "batch", "q_len", "kv_len",
         "num_heads", "num_kv_heads", "head_dim", "window_size")
# Not shown to predict_ops: the latency, and the flag derived from it.
MEASURED = ("gt_ms", "flags")
PREDICTION_COLUMNS = ("cell_id", "phase", "m", "n", "k", "batch", "q_len", "kv_len", "num_heads",
                      "num_kv_heads", "gt_ms")


def with_ids(points: pl.DataFrame) -> pl.DataFrame:
    """Add ``cell_id`` (the point's shape, spelled out: the same id on every GPU) and the op
    phase."""
    return points.with_columns(
        cell_id=pl.concat_str([pl.col(c).cast(pl.String).fill_null("-") for c in SHAPE],
                              separator="|"),
        phase=pl.when(pl.col("op_family") == "gemm").then(pl.lit("gemm"))
        .otherwise(pl.lit("attn_") + pl.col("phase")),
    )


def require_op_predictor(described: dict) -> None:
    """NotSupported unless the predictor (its ``predictor_index`` entry) times single kernels."""
    if not described["predicts_ops"]:
        raise NotSupported(f"predictor '{described['name']}' predicts steps only; op-level "
                           "datasets need a predict_ops(points, gpu) method")


def home_and_target(catalog, home_row: dict, target_name: str, gpu, models, seed: int,
                    test_fraction: float) -> tuple[Home, pl.DataFrame]:
    home_points = with_ids(catalog.op_points(home_row["name"]))
    train, heldout = split(home_points, "cell_id", seed, test_fraction)
    ops = {phase: train.filter(pl.col("phase") == phase) for phase in OP_PHASES[1:]}
    home = Home(sku=home_row["sku"], gpu=gpu, dataset=home_row["name"],
                cells=pl.DataFrame(schema=CELL_SCHEMA), ops=ops, models=models)
    target = heldout if target_name == home_row["name"] else with_ids(catalog.op_points(target_name))
    return home, target.rename({"latency_ms": "gt_ms"})
