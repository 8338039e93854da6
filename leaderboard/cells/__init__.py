"""Ground truth: cells (one forward step each) built from the store's op tables, the dataset families
that name them, and the serving targets."""

from __future__ import annotations

import json

import duckdb
import polars as pl

from leaderboard.cells import families
from leaderboard.cells.ops import op_datasets
from leaderboard.cells.schema import CELL_SCHEMA, LINEAGE_SCHEMA, CellSet
from leaderboard.cells.vidur_method import CONFIG
from leaderboard_core import progress
from leaderboard_core.specs import GpuSpec
from leaderboard_core.versioning import content_hash


def build_all(con: duckdb.DuckDBPyConnection, gpus: dict[str, GpuSpec], builder_version: str,
              bar: progress.Tracker | None = None) -> tuple[list[CellSet], list[dict]]:
    """Every cell dataset (one run of each registered family builder), and the datasets-table
    entries for them and for ``<sku>_ops``; ``bar`` is told of each builder as it runs."""
    sets = []
    for fam in families.builders():
        if bar is not None:
            bar.note(f"composing {fam.suffix} cells")
        sets += fam.build(con, gpus)
        if bar is not None:
            bar.advance()
    names = [s.name for s in sets]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate cell dataset names: {sorted(names)}")
    config_text = CONFIG.read_text()
    entries = []
    for s in sets:
        phases = dict(s.cells.group_by("phase").len().iter_rows())
        # what a cell scores as: its time, whether it counts in "all", its L2-warm share
        digest = s.cells.select("cell_id", "gt_ms", "composed", "warm_share").sort(
            "cell_id").write_csv()
        entries.append({
            "name": s.name, "kind": "cells", "source": s.cells["source"][0] if len(s.cells) else None,
            "sku": s.sku, "rows": len(s.cells),
            "version": content_hash(builder_version, digest, config_text),
            "tables": json.dumps({"cells": len(s.cells), "cell_lineage": len(s.lineage)}),
            "backend_versions": json.dumps(sorted(set(s.cells["backend_version"].drop_nulls()))),
            "files": json.dumps([]), "pinned": True,
            "phases": json.dumps({p: phases.get(p, 0) for p in ("prefill", "decode", "mixed")}),
            "card": s.card or families.of(s.name).card(s.name, s.sku),
        })
    for op in op_datasets(con):
        entries.append({
            "name": op["name"], "kind": "ops", "source": "aiconfigurator", "sku": op["sku"],
            "rows": op["rows"], "version": content_hash(builder_version, op["version"], op["rows"]),
            "tables": json.dumps(op["tables"]), "backend_versions": json.dumps([op["version"]]),
            "files": json.dumps([]), "pinned": True, "phases": None, "card": op["card"],
        })
    return sets, entries


def frames(sets: list[CellSet]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """All cells and all lineage, empty but typed when a partial store yields none."""
    return (pl.concat([pl.DataFrame(schema=CELL_SCHEMA), *[s.cells for s in sets]]),
            pl.concat([pl.DataFrame(schema=LINEAGE_SCHEMA), *[s.lineage for s in sets]]))
