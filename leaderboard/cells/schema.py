"""The columns of a cell and of its lineage.

A cell is one forward step: a batch of requests (per request: new tokens ``q`` this step and
``ctx`` tokens already in the KV cache), on one GPU, model and TP degree, with its measured
ground truth. ``gpu_block`` ground truth is a sum of measured kernel points (lineage lists them);
``wall_clock`` is a measured end-to-end step. ``warm_share`` is the share of a ``gpu_block``
ground truth from points faster than DRAM streams their cold working set (L2 stayed warm).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import polars as pl

CELL_SCHEMA = {
    "dataset": pl.String, "cell_id": pl.String, "workload_id": pl.String, "sku": pl.String,
    "model": pl.String, "tp": pl.Int64, "phase": pl.String,
    "q_lens": pl.List(pl.Int64), "ctx_lens": pl.List(pl.Int64),
    "num_requests": pl.Int64, "num_prefill": pl.Int64, "num_decode": pl.Int64,
    "total_tokens": pl.Int64, "prefill_tokens": pl.Int64, "decode_ctx_sum": pl.Int64,
    "gt_ms": pl.Float64, "gt_kind": pl.String, "gt_spread_ms": pl.Float64,
    "source": pl.String, "backend": pl.String, "backend_version": pl.String,
    "composed": pl.Boolean, "warm_share": pl.Float64, "weight": pl.Int64, "trace": pl.String,
    "scheduler": pl.String, "gemm_dtype": pl.String,
    # how an MoE cell's tokens were spread over the experts when its MoE kernels were timed
    # (``balanced``, ``power_law_1.01``); null for a dense model
    "moe_routing": pl.String,
    # expert parallelism: the GPUs an MoE cell's experts are spread over, whole (vLLM's
    # --enable-expert-parallel, the TP group); null where each expert is split over the TP group
    "moe_ep": pl.Int64,
}
# A column a builder leaves out is null, except the GEMM precision: every family but the FP8 one
# runs bf16 GEMMs, and predictors read the column to refuse a precision they cannot price.
CELL_DEFAULTS = {"gemm_dtype": "bf16"}
LINEAGE_SCHEMA = {
    "dataset": pl.String, "cell_id": pl.String, "op": pl.String, "table_name": pl.String,
    "key": pl.String, "latency_ms": pl.Float64, "count": pl.Int64,
}


@dataclass
class CellSet:
    """What a dataset builder returns: its cells, their lineage and its card text."""

    name: str
    sku: str
    cells: pl.DataFrame
    lineage: pl.DataFrame
    card: str


def workload_id(model: str, tp: int, q_lens: list[int], ctx_lens: list[int]) -> str:
    """The same step on any GPU has the same id: it hashes the model, TP and composition."""
    blob = json.dumps([model, tp, sorted(zip(q_lens, ctx_lens, strict=True))])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_decode(q: int, ctx: int) -> bool:
    """A decode request adds one token on top of a non-empty cache."""
    return q == 1 and ctx > 0


def phase_of(q_lens: list[int], ctx_lens: list[int]) -> str:
    decode = [is_decode(q, c) for q, c in zip(q_lens, ctx_lens, strict=True)]
    return "decode" if all(decode) else "prefill" if not any(decode) else "mixed"


def derive(cells: pl.DataFrame) -> pl.DataFrame:
    """Fill the derived scalar columns from ``q_lens`` and ``ctx_lens`` and order the schema."""
    cells = cells.with_columns(
        num_requests=pl.col("q_lens").list.len(),
        num_decode=pl.struct("q_lens", "ctx_lens").map_elements(
            lambda r: sum(is_decode(q, c) for q, c in zip(r["q_lens"], r["ctx_lens"], strict=True)),
            return_dtype=pl.Int64),
        total_tokens=pl.col("q_lens").list.sum(),
        decode_ctx_sum=pl.struct("q_lens", "ctx_lens").map_elements(
            lambda r: sum(c for q, c in zip(r["q_lens"], r["ctx_lens"], strict=True)
                          if is_decode(q, c)), return_dtype=pl.Int64),
    ).with_columns(
        num_prefill=pl.col("num_requests") - pl.col("num_decode"),
        prefill_tokens=pl.col("total_tokens") - pl.col("num_decode"),
        phase=pl.struct("q_lens", "ctx_lens").map_elements(
            lambda r: phase_of(r["q_lens"], r["ctx_lens"]), return_dtype=pl.String),
    )
    return cells.select(typed_columns(cells.columns))


def typed_columns(present: list[str], skip: tuple[str, ...] = ()) -> list[pl.Expr]:
    """Every CELL_SCHEMA column but ``skip``, cast to its type; one not ``present`` takes its
    default (``CELL_DEFAULTS``, else null)."""
    return [(pl.col(c) if c in present else pl.lit(CELL_DEFAULTS.get(c))).cast(t).alias(c)
            for c, t in CELL_SCHEMA.items() if c not in skip]
