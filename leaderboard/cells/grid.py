"""The measured aiconfigurator grid of one GPU, as lookups keyed by exact shape.

Ground truth reads these lookups and nothing else: a shape that is not a key was not measured,
and the cell that needs it is not built. Only GEMMs of one precision (bf16, or fp8 per-tensor for the
``_vidur_fp8`` family), bf16 attention with a bf16 KV cache, head_dim 128, no sliding window, and
vLLM's graph-mode custom all-reduce of bf16 activations are loaded; for the MoE families, the bf16
fused-MoE layers at one token distribution, the experts split over the GPU group (tensor
parallel) or, for the expert-parallel family, spread whole over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import duckdb

from leaderboard.cells.common import fetch
from leaderboard.ingest.aiconfigurator import WARM_FLAG
from leaderboard_core.specs import DEFAULT_KV_DTYPE
from leaderboard_core.versioning import release

HOME_VERSION = "0.14.0"
# A cell's ``gemm_dtype`` -> aiconfigurator's ``gemm_dtype`` of the points it reads. ``fp8`` is
# per-tensor scaled FP8 (``fp8_block``, block-scaled, is another kernel and is not used).
GEMM_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}


@dataclass
class Point:
    table: str
    key: str  # JSON of every key column of the op table: it names exactly one measured row
    latency_ms: float
    warm: bool  # faster than DRAM streams its cold working set: L2 stayed warm between repeats


@dataclass
class Grid:
    sku: str
    version: str
    gemm: dict[tuple[int, int, int], Point] = field(default_factory=dict)
    prefill: dict[tuple[int, int, int, int], Point] = field(default_factory=dict)
    decode: dict[tuple[int, int, int, int], Point] = field(default_factory=dict)
    allreduce: dict[tuple[int, int], Point] = field(default_factory=dict)
    # (tokens, hidden, per-expert intermediate before TP, top-k, experts, GPUs of the group) -> one
    # MoE layer, its experts split over the group or (expert parallel) spread whole over it
    moe: dict[tuple[int, int, int, int, int, int], Point] = field(default_factory=dict)
    files: set[tuple[str, str]] = field(default_factory=set)


def measured_versions(con: duckdb.DuckDBPyConnection, sku: str) -> list[str]:
    """The vLLM versions at which this GPU has all three op families (GEMM, attention, graph-mode
    all-reduce) measured, oldest first."""
    rows = con.execute(
        """SELECT backend_version FROM gemm WHERE source = 'aiconfigurator' AND sku = ?
           INTERSECT SELECT backend_version FROM attention WHERE source = 'aiconfigurator' AND sku = ?
           INTERSECT SELECT backend_version FROM collective
                     WHERE source = 'aiconfigurator' AND sku = ? AND backend = 'vllm_graph'""",
        [sku, sku, sku]).fetchall()
    return sorted((v for (v,) in rows), key=release)


def vidur_version(con: duckdb.DuckDBPyConnection, sku: str) -> str | None:
    """The home's vLLM version where this GPU has it, else the nearest later one."""
    later = [v for v in measured_versions(con, sku)
             if release(v) >= release(HOME_VERSION)]
    return later[0] if later else None


def load_grid(con: duckdb.DuckDBPyConnection, sku: str, version: str,
              gemm_dtype: str = "bf16", moe_distribution: str | None = None,
              dense_memo: dict | None = None, expert_parallel: bool = False) -> Grid:
    """The GPU's points at ``version``, its GEMMs at ``gemm_dtype`` (a key of ``GEMM_DTYPES``);
    with ``moe_distribution``, its bf16 MoE layers with tokens spread over the experts so, keyed
    by the GPU group they run on: each expert split over the group (``moe_tp``, no expert
    parallelism), or with ``expert_parallel`` whole experts spread over it (``moe_ep``, each
    expert on one GPU). ``dense_memo`` keeps the dense points per (GPU, version, dtype) across
    calls, so families that share them (all but the MoE layers) read them once."""
    key = (sku, version, gemm_dtype)
    memo = {} if dense_memo is None else dense_memo
    if key not in memo:
        memo[key] = _dense(con, sku, version, gemm_dtype)
    dense = memo[key]
    if moe_distribution is None:
        return dense
    moe = Grid(sku, version)
    group, other = ("moe_ep", "moe_tp") if expert_parallel else ("moe_tp", "moe_ep")
    for r in _rows(con, "moe", sku, version, f"dtype = 'bfloat16' AND {other} = 1 AND distribution "
                                             f"= '{moe_distribution}'"):
        at = (r["num_tokens"], r["hidden_size"], r["inter_size"], r["topk"], r["num_experts"],
              r[group])
        if at in moe.moe:
            raise ValueError(f"{sku} vLLM {version}: two bf16 MoE kernels measured at {at} "
                             f"({moe.moe[at].key} and {r['lineage_key']}); name the one "
                             "the engine runs")
        moe.moe[at] = _point(moe, "moe", r)
    return replace(dense, moe=moe.moe, files=dense.files | moe.files)


def _rows(con, table: str, sku: str, version: str, extra: str):
    where = "source = 'aiconfigurator' AND sku = ? AND backend_version = ?"
    return fetch(con, table, f"{where} AND {extra}", [sku, version], "file")


def _point(grid: Grid, table: str, row: dict) -> Point:
    grid.files.add((row["file"], row["file_sha256"]))
    return Point(table, row["lineage_key"], row["latency_ms"], row["flags"] == WARM_FLAG)


def _dense(con, sku: str, version: str, gemm_dtype: str) -> Grid:
    grid = Grid(sku, version)
    for r in _rows(con, "gemm", sku, version, f"dtype = '{GEMM_DTYPES[gemm_dtype]}'"):
        grid.gemm[(r["m"], r["n"], r["k"])] = _point(grid, "gemm", r)
    for r in _rows(con, "attention", sku, version,
                   f"dtype = 'bfloat16' AND kv_dtype = '{DEFAULT_KV_DTYPE}' AND head_dim = 128 "
                   "AND coalesce(window_size, 0) = 0"):
        if r["phase"] == "prefill" and r["kv_len"] == 0:
            grid.prefill[(r["batch"], r["q_len"], r["num_heads"], r["num_kv_heads"])] = _point(
                grid, "attention", r)
        elif r["phase"] == "decode":
            grid.decode[(r["batch"], r["kv_len"], r["num_heads"], r["num_kv_heads"])] = _point(
                grid, "attention", r)
    for r in _rows(con, "collective", sku, version, "backend = 'vllm_graph' AND collective = "
                                                   "'all_reduce' AND dtype = 'bfloat16'"):
        grid.allreduce[(r["num_gpus"], r["message_bytes"])] = _point(grid, "collective", r)
    return grid


def common_axes(grids: list[Grid]) -> dict[str, list[int]]:
    """The grid values every GPU measured: the axes workloads are snapped onto."""
    def shared(values_of):
        sets = [set(values_of(g)) for g in grids]
        return sorted(set.intersection(*sets)) if sets else []

    return {
        "m": shared(lambda g: {m for m, _, _ in g.gemm}),
        "isl": shared(lambda g: {q for _, q, _, _ in g.prefill}),
        "prefill_batch": shared(lambda g: {b for b, _, _, _ in g.prefill}),
        "kv": shared(lambda g: {kv for _, kv, _, _ in g.decode}),
        "decode_batch": shared(lambda g: {b for b, _, _, _ in g.decode}),
        "allreduce_bytes": shared(lambda g: {s for _, s in g.allreduce}),
        "moe_tokens": shared(lambda g: {t for t, *_ in g.moe}),
    }
