"""Deploy readings: the few target rows a predictor may ask to read, capped and paid for.

A predictor names what it wants in a ``ReadingRequest`` (cells by id, or op points by op and
shape). The harness, which alone holds the target's ground truth, checks the request against the
cap, hands over those rows with their measured times, and takes every cell they touch out of the
score. The rows read are the run's ``profiled_rows``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import polars as pl

from leaderboard.run import homes
from leaderboard_core import guard
from leaderboard_core.contract import GROUND_TRUTH_COLUMNS, Reading, ReadingRefused, ReadingRequest

MAX_POINTS = 16  # defaults of conf/config.yaml's ``reading``
MAX_FRACTION = 0.01


def cap(n_cells: int, max_points: int = MAX_POINTS, max_fraction: float = MAX_FRACTION) -> int:
    """At most ``max_points`` rows, and at most ``max_fraction`` of the target's cells."""
    return min(max_points, math.floor(max_fraction * n_cells))


@dataclass
class Supplier:
    """Answers one run's reading requests from the target (ground truth included)."""

    target: pl.DataFrame
    lineage: pl.DataFrame  # the target's measured points per cell (empty for op-level targets)
    budget: int
    rows_used: int = 0
    unscored: list[str] = field(default_factory=list)

    def __call__(self, request: ReadingRequest) -> Reading:
        if self.rows_used + request.size > self.budget:
            raise ReadingRefused(
                f"the deploy reading asked for {self.rows_used + request.size} target rows; the "
                f"cap is {self.budget} (min of reading.max_points and reading.max_fraction of "
                f"the target's {len(self.target)} cells, conf/config.yaml)")
        cells = self._cells(list(request.cells))
        ops, touched = self._op_points(list(request.op_points))
        self.rows_used += request.size
        self.unscored += sorted(set(cells["cell_id"]) | touched)
        return Reading(cells, ops)

    def _cells(self, ids: list[str]) -> pl.DataFrame:
        found = self.target.filter(pl.col("cell_id").is_in(ids))
        missing = sorted(set(ids) - set(found["cell_id"]))
        if missing:
            raise ReadingRefused(f"the deploy reading names cells the target lacks: {missing[:3]}")
        return found

    def _op_points(self, wanted: list[dict]) -> tuple[dict[str, pl.DataFrame], set[str]]:
        """Each wanted point with its latency, and the cells whose sum contains that measured
        row, under any op name (one GEMM row can be one cell's QKV and another's O)."""
        ops, touched = {}, set()
        for want in wanted:
            shape = {k: v for k, v in want.items() if k != "op"}
            rows = self.lineage.filter(pl.col("op") == want.get("op"))
            points = homes.op_points(rows, rows["cell_id"].unique().to_list()).get(want.get("op"))
            hit = None if points is None or not set(shape) <= set(points.columns) else \
                points.filter(_matches(shape))
            if hit is None or len(hit) != 1:
                raise ReadingRefused(f"the deploy reading names op point {want}, which matches "
                                     f"{0 if hit is None else len(hit)} measured points, not 1")
            ops[want["op"]] = pl.concat([ops[want["op"]], hit]) if want["op"] in ops else hit
            keys = rows["key"].str.json_decode(infer_schema_length=None).struct.unnest()
            read = rows.filter(keys.select(_matches(shape)).to_series()).select(
                "table_name", "key").unique()
            touched |= set(self.lineage.join(read, on=["table_name", "key"])["cell_id"])
        return ops, touched

    def scored(self) -> pl.DataFrame:
        """The target rows left to score: those no reading touched."""
        return self.target.filter(~pl.col("cell_id").is_in(self.unscored))


def _matches(shape: dict) -> pl.Expr:
    """Rows whose key fields equal ``shape``'s; a null field (no model, no TP) matches null."""
    return pl.all_horizontal(pl.col(k).is_null() if v is None else pl.col(k) == v
                             for k, v in shape.items())


def take_in_process(estimator, target: pl.DataFrame, lineage: pl.DataFrame, gpu,
                    budget: int | None = None) -> tuple[pl.DataFrame, int]:
    """The reading of a fitted estimator outside a run (``explain``, the throughput benchmark):
    the target rows left to score and the rows read."""
    supplier = Supplier(target, lineage, cap(len(target)) if budget is None else budget)
    with guard.sealed("deploy reading"):  # the predictor's code runs sealed, as in a run
        request = estimator.request_reading(target.drop(GROUND_TRUTH_COLUMNS), gpu,
                                            supplier.budget)
    if request is not None and request.size:
        reading = supplier(request)
        with guard.sealed("deploy reading"):
            estimator.take_reading(reading, gpu)
    return supplier.scored(), supplier.rows_used
