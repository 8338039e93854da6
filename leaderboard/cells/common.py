"""What every cell family shares: store rows with their lineage keys, assembling a CellSet,
phase counts, and card rendering with each source file's repository and commit."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import duckdb
import polars as pl

from leaderboard.cells.schema import LINEAGE_SCHEMA, CellSet, derive
from leaderboard.ingest.tables import TABLES
from leaderboard_core import paths, yaml_io

PHASES = ("prefill", "decode", "mixed")
# Each serving backend's scheduler limits and the replay's settings: read by the serving
# families (which backends have offline defaults) and by the replay.
SCHEDULERS = paths.CONF_DIR / "serving" / "schedulers.yaml"


@lru_cache(maxsize=1)
def schedulers_conf() -> dict:
    return yaml_io.safe_load(SCHEDULERS.read_text())


def fetch(con: duckdb.DuckDBPyConnection, table: str, where: str, params: list,
          order: str) -> list[dict]:
    """Rows of a store table as dicts, each with ``lineage_key``: the JSON of the table's key
    columns (its identifying columns), enough to find the row again in the store."""
    key = ", ".join(f'"{c}" := "{c}"' for c in TABLES[table].key)
    cursor = con.execute(f'SELECT *, to_json(struct_pack({key}))::VARCHAR AS lineage_key '
                         f'FROM "{table}" WHERE {where} ORDER BY {order}', params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def cell_set(name: str, sku: str, cells: list[dict], lineage: list[dict], card: str) -> CellSet:
    frame = derive(pl.DataFrame(cells, infer_schema_length=None)
                   .with_columns(dataset=pl.lit(name))).sort("cell_id")
    if frame["cell_id"].n_unique() != len(frame):
        raise ValueError(f"{name}: duplicate cell ids")
    body = {k: v for k, v in LINEAGE_SCHEMA.items() if k != "dataset"}
    lineage_frame = pl.DataFrame(lineage, schema=body).with_columns(
        dataset=pl.lit(name)).select(list(LINEAGE_SCHEMA)).sort("cell_id", maintain_order=True)
    return CellSet(name, sku, frame, lineage_frame, card)


def phase_counts(cells: list[dict]) -> dict[str, int]:
    return {p: sum(c["phase"] == p for c in cells) for p in PHASES}


def source_lines(con: duckdb.DuckDBPyConnection, files: Iterable[tuple[str, str]]) -> str:
    """Markdown list of (file, sha256) with the repository and commit the store pinned it at."""
    pinned = {rel: f"{repo}@{commit[:7]}" if commit else "local, unpinned"
              for rel, repo, commit in con.execute(
        "SELECT rel, repo, commit FROM sources").fetchall()}
    return "\n".join(f"- `{rel}` ({pinned.get(rel, 'not pinned')}), sha256 `{sha}`"
                     for rel, sha in sorted(set(files)))


def render_card(template: str, **fields) -> str:
    return (paths.DATASETS_DIR / "cards" / f"{template}.md").read_text().format(**fields)


def family_configs(cfg: dict, fam: dict) -> list[dict]:
    """A ``conf/cells/vidur.yaml`` family's own model x TP configurations, else the file's."""
    return fam.get("configs", cfg["configs"])


def coverage_table(runs: pl.DataFrame, columns: dict[str, str], kept: str) -> str:
    """A card's account of every source row: the rows counted by ``columns`` (heading: column)
    and their status, ``kept`` or why they were left out (the ``why`` column, null when kept),
    sorted by the first column, then the status, then the others."""
    keys = list(columns.values())
    lines = ["| " + " | ".join([*columns, "rows", "status"]) + " |", "|" + "---|" * (len(keys) + 2)]
    counted = runs.group_by(*keys, "why").len().sort(keys[0], "why", *keys[1:], nulls_last=False)
    for *values, why, n in counted.iter_rows():
        status = kept if why is None else f"left out: {why}"
        lines.append("| " + " | ".join(map(str, values)) + f" | {n} | {status} |")
    return "\n".join(lines)
