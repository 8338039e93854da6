"""Validation of ingested rows: nothing is dropped silently.

Rows with a NaN, zero or negative measured value, and every copy of a duplicate key whose copies
disagree, go to the ``quarantine`` table with a reason. Known bad rows (e.g. splitwise's synthetic
power-capped H100) go there too, with kind ``known_bad``. Duplicate copies that agree within
``DUPLICATE_TOLERANCE`` collapse to one row holding their median, and are counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import polars as pl

from leaderboard.ingest.tables import TABLES

# Largest max/min ratio between copies of one key still treated as timing noise. aiconfigurator's
# v0.14 MHA prefill copies agree within 1.07x at the 99th percentile; 1.25x keeps that noise and
# quarantines the clear conflicts (up to 2.2x on H100, batch 32, isl 2048, 8/8 heads).
DUPLICATE_TOLERANCE = 1.25

QUARANTINE_SCHEMA = {
    "source": pl.String, "sku": pl.String, "table_name": pl.String, "file": pl.String,
    "kind": pl.String, "reason": pl.String, "detail": pl.String, "row": pl.String,
}


@dataclass
class Quarantine:
    frames: list[pl.DataFrame] = field(default_factory=list)
    merged_duplicates: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def add(self, table: str, rows: pl.DataFrame, kind: str, reason: str, detail=None) -> None:
        if rows.is_empty():
            return
        details = detail if isinstance(detail, pl.Series) else pl.repeat(detail, len(rows), eager=True)
        self.frames.append(
            pl.DataFrame({
                "source": rows["source"], "sku": rows["sku"],
                "table_name": pl.repeat(table, len(rows), eager=True),
                "file": rows["file"], "kind": pl.repeat(kind, len(rows), eager=True),
                "reason": pl.repeat(reason, len(rows), eager=True),
                "detail": details.cast(pl.String),
                "row": pl.Series([json.dumps(r, default=str) for r in rows.to_dicts()]),
            }, schema=QUARANTINE_SCHEMA)
        )

    def table(self) -> pl.DataFrame:
        if not self.frames:
            return pl.DataFrame(schema=QUARANTINE_SCHEMA)
        return pl.concat(self.frames)


def validate(df: pl.DataFrame, table: str, quarantine: Quarantine) -> pl.DataFrame:
    """Return the rows fit for the store; everything else goes to ``quarantine``."""
    spec = TABLES[table]
    for col in spec.measured:
        value = pl.col(col).cast(pl.Float64)
        not_finite = value.is_null() | value.is_nan() | value.is_infinite()
        quarantine.add(table, df.filter(not_finite), "invalid", "nan_latency",
                       f"{col} is NaN, null or infinite")
        df = df.filter(~not_finite)
        quarantine.add(table, df.filter(value <= 0), "invalid", "nonpositive_latency", f"{col} <= 0")
        df = df.filter(value > 0)
    return _merge_duplicates(df, table, quarantine) if spec.measured else df


def _merge_duplicates(df: pl.DataFrame, table: str, quarantine: Quarantine) -> pl.DataFrame:
    spec = TABLES[table]
    key, first = spec.key, spec.measured[0]
    # A row hash finds candidate duplicates cheaply; exact grouping below settles any collision.
    candidate = df.select(pl.struct(key).hash()).to_series().is_duplicated()
    single, dup = df.filter(~candidate), df.filter(candidate)
    if dup.is_empty():
        return single
    dup = dup.with_columns(
        _n=pl.len().over(key), _ratio=(pl.col(first).max() / pl.col(first).min()).over(key))
    conflict = dup.filter((pl.col("_n") > 1) & (pl.col("_ratio") > DUPLICATE_TOLERANCE))
    if not conflict.is_empty():
        detail = conflict.select(pl.format("{} copies of one key disagree: max/min = {}",
                                           pl.col("_n"), pl.col("_ratio").round(3))).to_series()
        quarantine.add(table, conflict.drop("_n", "_ratio"), "conflict", "duplicate_conflict",
                       detail)
    agree = dup.filter((pl.col("_n") > 1) & (pl.col("_ratio") <= DUPLICATE_TOLERANCE))
    for src, sku, n in agree.group_by("source", "sku").agg(pl.len()).iter_rows():
        merged = quarantine.merged_duplicates
        merged[(table, src, sku)] = merged.get((table, src, sku), 0) + n
    values = [*spec.measured, *spec.informational]
    others = [c for c in df.columns if c not in {*key, *values}]
    agree = agree.group_by(key, maintain_order=True).agg(
        *[pl.col(c).median() for c in values], *[pl.col(c).first() for c in others]
    ).with_columns(statistic=pl.lit("median_of_duplicates", dtype=pl.Categorical))
    collided = dup.filter(pl.col("_n") == 1).drop("_n", "_ratio")
    return pl.concat([single, collided, agree.select(df.columns)])
