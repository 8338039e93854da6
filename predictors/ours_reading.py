"""``ours_reading``: ``ours`` plus a deploy reading of the target's smallest kernels.

What ``ours`` cannot derive from a datasheet is how long an almost empty kernel takes on the
target: its launch and latency floor follows architecture and software (driver, attention
backend), not the clock alone. ``ours_reading`` asks the harness for a few of the target's
smallest decode-attention points (one request or a few, short contexts: floor-dominated),
through the capped reading interface, and rescales the attention kernels' floors by one factor,
the median over those points of (measured - modelled work) / modelled floor. All other
constants stay frozen from the home. The points read, and every cell that contains one, are
left out of the score and counted in the run's ``profiled_rows``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from leaderboard_core.contract import PredictorCard, Reading, ReadingRequest
from leaderboard_core.specs import GpuSpec
from predictors.ours import Ours
from predictors.registry import register
from predictors.steps import Steps

ATTENTION_FLOORS = ("decode_floor_s", "decode_split_floor_s", "prefill_floor_s")
# A reading that says the floors are 4x off is a broken reading, not a GPU: clip to this range.
FLOOR_SCALE_RANGE = (0.25, 4.0)


@register("ours_reading")
class OursReading(Ours):
    card = PredictorCard(
        kind="analytical", reference="docs/ours.md (deploy reading)",
        description="ours with its attention-kernel floors rescaled from a capped deploy reading of the "
                    "target's smallest decode-attention kernels; every other constant frozen "
                    "from the home",
        needs_profiled_rows=False)

    def __init__(self, reading_points: int = 4):
        super().__init__()
        self.reading_points = reading_points

    def fit(self, home) -> OursReading:
        super().fit(home)
        self.floor_scale_ = 1.0  # until the reading: the clock-scaled floors of ``ours``
        return self

    def request_reading(self, cells: pl.DataFrame, gpu: GpuSpec, budget: int
                        ) -> ReadingRequest | None:
        """The wall-clock sweep of ``ours`` where the targets are wall-clock steps; otherwise
        the decode-attention points of the pure decode cells with the least KV to stream."""
        if "gt_kind" in cells.columns and (cells["gt_kind"] == "wall_clock").any():
            return super().request_reading(cells, gpu, budget)
        decode = cells.filter(pl.col("phase") == "decode")
        if decode.is_empty() or budget < 1:
            return None
        s = Steps.from_cells(decode)
        heads, kv_heads = s.sharded()["heads"], s.sharded()["kv_heads"]
        points = pl.DataFrame({
            "batch": s.num_decode.astype(np.int64), "kv_len": (s.decode_ctx / s.num_decode).astype(np.int64),
            "num_heads": heads.astype(np.int64), "num_kv_heads": kv_heads.astype(np.int64),
            "head_dim": s.head_dim.astype(np.int64),
            "work": s.decode_ctx * kv_heads}).unique(["batch", "kv_len", "num_heads", "num_kv_heads",
                                                      "head_dim"])
        smallest = points.sort("work", "batch", "kv_len", "num_heads").head(
            min(self.reading_points, budget)).drop("work")
        return ReadingRequest(op_points=tuple({"op": "attn_decode", **row}
                                              for row in smallest.iter_rows(named=True)))

    def take_reading(self, reading: Reading, gpu: GpuSpec) -> None:
        if not reading.cells.is_empty():
            super().take_reading(reading, gpu)
            return
        points = reading.ops["attn_decode"].with_columns(
            op_family=pl.lit("attention"), phase=pl.lit("attn_decode"),
            **{c: pl.lit(None, pl.Int64) for c in ("m", "n", "k")})
        dev = self.device(gpu)
        work = self.op_seconds(points, replace(dev, floor_scale=0.0))
        floor = self.op_seconds(points, dev) - work
        measured = points["latency_ms"].to_numpy() * 1e-3
        self.floor_scale_ = float(np.clip(np.median((measured - work) / floor), *FLOOR_SCALE_RANGE))
        attention = self.constants_["attention"]
        for key in ATTENTION_FLOORS:
            attention[key] *= self.floor_scale_
