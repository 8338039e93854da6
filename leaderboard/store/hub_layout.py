"""The layout of a hub dataset folder, shared by its writer (``hub_export``) and its reader
(``hub``) so neither imports the other's module for it."""

from __future__ import annotations

import polars as pl

CATALOG_SCHEMA = {"name": pl.String, "kind": pl.String, "sku": pl.String, "version": pl.String,
                  "backend_versions": pl.List(pl.String), "rows": pl.Int64}


def lineage_config(name: str) -> str:
    return f"{name}_lineage"


def collectives_config(sku: str) -> str:
    return f"{sku}_collectives"
