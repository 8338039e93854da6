"""Where a run reads cells from: the local store, or a Hugging Face export (``leaderboard.hub``).

Both give the same things: the dataset list (name, kind, sku, version), a dataset's cells,
its lineage (the measured points behind each cell), an op dataset's points, a GPU's measured
all-reduce and fused-MoE points (the rest of a home's full grid; an export holds no MoE tables
and no LLMServingSim profile), and the published coefficient table that some baselines ship
with. A run scores the same way whichever catalog it reads.
"""

from __future__ import annotations

import json

import duckdb
import polars as pl

from leaderboard.cells.ops import collective_points, moe_points_at, op_points, points_at, profile_points_at
from leaderboard.store import database


class StoreCatalog:
    """The local DuckDB store, opened read-only for the life of the catalog."""

    def __init__(self, sources_root: str | None = None, gpu_specs: str | None = None):
        self._con: duckdb.DuckDBPyConnection = database.connect(sources_root, gpu_specs)

    @classmethod
    def current(cls, sources_root: str | None = None, gpu_specs: str | None = None
                ) -> StoreCatalog:
        """The store as it stands, never built here: ``StaleStore`` where it is missing or
        stale (a run's reads; its command built the store first)."""
        catalog = cls.__new__(cls)
        catalog._con = database.connect_current(sources_root, gpu_specs)
        return catalog

    def __enter__(self) -> StoreCatalog:
        return self

    def __exit__(self, *exc) -> None:
        self._con.close()

    def cards(self) -> dict[str, str | None]:
        """Every dataset's card, by name (those ``datasets`` leaves out included)."""
        return dict(self._con.execute("SELECT name, card FROM datasets").fetchall())

    def datasets(self) -> dict[str, dict]:
        rows = self._con.execute(
            "SELECT name, kind, sku, version, backend_versions FROM datasets "
            "WHERE kind IN ('cells', 'serving') OR (kind = 'ops' AND name LIKE '%\\_ops' ESCAPE '\\')"
        ).fetchall()
        return {n: {"name": n, "kind": k, "sku": s, "version": v, "backend_versions": json.loads(b)}
                for n, k, s, v, b in rows}

    def cells(self, name: str) -> pl.DataFrame:
        return self._con.sql("SELECT * FROM cells WHERE dataset = ? ORDER BY cell_id",
                             params=[name]).pl()

    def lineage(self, name: str) -> pl.DataFrame:
        return self._con.sql("SELECT * FROM cell_lineage WHERE dataset = ? ORDER BY cell_id, op, key",
                             params=[name]).pl()

    def op_points(self, name: str) -> pl.DataFrame:
        return op_points(self._con, name)

    def op_points_at(self, sku: str, version: str) -> pl.DataFrame:
        return points_at(self._con, sku, version)

    def profile_points_at(self, sku: str, version: str, models: dict) -> pl.DataFrame:
        return profile_points_at(self._con, sku, version, models)

    def collective_points(self, sku: str, version: str) -> pl.DataFrame:
        return collective_points(self._con, sku, version)

    def moe_points_at(self, sku: str, version: str) -> pl.DataFrame:
        return moe_points_at(self._con, sku, version)

    def serving_targets(self, name: str) -> pl.DataFrame:
        return self._con.sql("SELECT * FROM serving_targets WHERE dataset = ? ORDER BY run, target_id",
                             params=[name]).pl()

    def coefficients(self) -> pl.DataFrame:
        return self._con.sql("SELECT * FROM coefficients ORDER BY ALL").pl()
