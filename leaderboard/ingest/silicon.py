"""aiconfigurator's ``silicon_sample.csv``: measured serving runs, one row each.

Each row is one deployment (backend and version, model, precision, aggregated or disaggregated,
TP/PP/EP) under one closed-loop load (isl, osl, concurrency) and its measured mean TTFT and TPOT.
Every row enters ``serving_runs`` with its provenance; which rows a ``<sku>_silicon`` dataset can
score is decided later (``leaderboard.cells.serving_targets``), so nothing is dropped here.

A row that cannot be read (a missing or non-numeric field the row needs) stops the build with
its line number and id: a silently skipped run would bias the coverage table.
"""

from __future__ import annotations

import math
import re

import polars as pl

from leaderboard.ingest.base import Adapter, BuildError, IngestContext, provenance, read_table
from leaderboard.ingest.sources import SourceFile
from leaderboard_core.specs import model_by_alias

SOURCE = "aiconfigurator_silicon"
PATTERN = "ai-dynamo__aiconfigurator/aic-core/src/aiconfigurator_core/systems/silicon_sample.csv"
TEXT = ("id", "silicon_data_source", "backend", "backend_version", "model_path", "system",
        "precision", "mode", "gemm_quant_mode")
POSITIVE_INT = ("isl", "osl")
POSITIVE_FLOAT = ("silicon_ttft_ms", "silicon_tpot_ms")
AGG_INT = ("batch_size", "tp_size")  # an aggregated run needs its load and TP
OPTIONAL_INT = ("pp_size", "attention_dp_size", "moe_ep_size", "moe_tp_size")
CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")
MEASURED_ON = re.compile(r"measured=([0-9T:.\-Z]+)")


class MalformedRow(BuildError):
    """One row of the silicon sample cannot be read; the message names it."""


def _number(raw: str | None, kind, field: str, where: str, positive: bool):
    if raw is None or raw == "":
        raise MalformedRow(f"{where}: field '{field}' is empty")
    try:
        value = kind(float(raw)) if kind is int else float(raw)
    except (TypeError, ValueError):
        raise MalformedRow(f"{where}: field '{field}' is {raw!r}, not a number") from None
    if kind is int and float(raw) != value:
        raise MalformedRow(f"{where}: field '{field}' is {raw!r}, not a whole number")
    if positive and not (math.isfinite(value) and value > 0):
        raise MalformedRow(f"{where}: field '{field}' is {raw!r}; it must be finite and > 0")
    return value


def parse_row(row: dict, line: int, file: str, aliases: dict[str, str]) -> dict:
    """One CSV row (line numbers count the header as line 1) as a ``serving_runs`` record."""
    where = f"{file} line {line} (id {row.get('id') or '?'})"
    for name in ("id", "backend", "model_path", "system", "mode"):
        if not row.get(name):
            raise MalformedRow(f"{where}: field '{name}' is empty")
    if row["mode"] not in ("agg", "disagg"):
        raise MalformedRow(f"{where}: mode is {row['mode']!r}, expected 'agg' or 'disagg'")
    out = {k: _number(row.get(k), int, k, where, True) for k in POSITIVE_INT}
    out |= {k: _number(row.get(k), float, k, where, True) for k in POSITIVE_FLOAT}
    agg = row["mode"] == "agg"
    for k in (*AGG_INT, *OPTIONAL_INT):
        required = agg and k in AGG_INT
        out[k] = _number(row[k], int, k, where, required) if (row.get(k) or required) else None
    source = row.get("silicon_data_source") or ""
    stated = CONCURRENCY.search(source)
    measured = MEASURED_ON.search(source)
    # Unquantized runs leave precision and gemm_quant_mode empty: the checkpoint's BF16.
    precision = row.get("precision") or ("bf16" if not row.get("gemm_quant_mode") else "")
    return {
        "run_id": row["id"], "row": line, "model": aliases.get(row["model_path"].lower()),
        "model_path": row["model_path"], "precision": precision, "mode": row["mode"],
        "isl": out["isl"], "osl": out["osl"],
        "concurrency": int(stated.group(1)) if stated else None, "batch_size": out["batch_size"],
        "tp": out["tp_size"], "pp": out["pp_size"], "attention_dp": out["attention_dp_size"],
        "moe_ep": out["moe_ep_size"], "moe_tp": out["moe_tp_size"],
        "measured_on": measured.group(1) if measured else None,
        "ttft_ms": out["silicon_ttft_ms"], "tpot_ms": out["silicon_tpot_ms"],
        "sku": row["system"], "backend": row["backend"],
        "backend_version": row.get("backend_version") or "unknown",
    }


def ingest(files: list[SourceFile], ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    aliases = model_by_alias(ctx.models)
    out = []
    for file in files:
        # All text: parse_row checks each field, so a bad one is reported with its row.
        raw = read_table(file, [*TEXT, *POSITIVE_INT, *POSITIVE_FLOAT, *AGG_INT, *OPTIONAL_INT])
        raw = raw.select(pl.all().cast(pl.String))
        records = [parse_row(r, i + 2, file.rel, aliases) for i, r in enumerate(raw.iter_rows(named=True))]
        df = pl.DataFrame(records, infer_schema_length=None)
        # provenance() takes one sku/backend per file; this file mixes them, so set them per row.
        per_row = df.select("sku", "backend", "backend_version")
        df = provenance(df.drop("sku", "backend", "backend_version"), file, SOURCE, None, "", "",
                        "mean").with_columns(per_row)
        out.append(("serving_runs", df))
    return out


ADAPTER = Adapter(SOURCE, (PATTERN,), ingest)
