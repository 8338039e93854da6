"""``<sku>_ops``: every measured GEMM and attention point of one GPU, for op-level scoring.

These are not cells: a point is one kernel at one shape, scored against a predictor's kernel
time. They come from aiconfigurator's vLLM tables at the same version the GPU's ``_vidur``
dataset uses, so op-level and step-level scores read the same measurements.
"""

from __future__ import annotations

import duckdb
import polars as pl

from leaderboard.cells.common import render_card, source_lines
from leaderboard.ingest.aiconfigurator import WARM_FLAG
from leaderboard_core.specs import tp_shapes
from leaderboard_core.versioning import release

SOURCE = "aiconfigurator"
SUFFIX = "_ops"
S, INT = pl.String, pl.Int64
SCHEMA = {"op_family": S, "phase": S, "dtype": S, "kv_dtype": S, "m": INT, "n": INT, "k": INT,
          "batch": INT, "q_len": INT, "kv_len": INT, "num_heads": INT, "num_kv_heads": INT,
          "head_dim": INT, "window_size": INT, "latency_ms": pl.Float64, "flags": S, "sku": S,
          "backend_version": S}
# Per table: its columns in SCHEMA order, null where the table has no such column.
SELECT = {
    "gemm": "'gemm' AS op_family, NULL AS phase, dtype, NULL AS kv_dtype, m, n, k, batch, "
            "NULL AS q_len, NULL AS kv_len, NULL AS num_heads, NULL AS num_kv_heads, "
            "NULL AS head_dim, NULL AS window_size, latency_ms, flags, sku, backend_version",
    "attention": "'attention' AS op_family, phase, dtype, kv_dtype, NULL AS m, NULL AS n, "
                 "NULL AS k, batch, q_len, kv_len, num_heads, num_kv_heads, head_dim, "
                 "window_size, latency_ms, flags, sku, backend_version",
}


MOE_SCHEMA = {"dtype": S, "num_tokens": INT, "hidden_size": INT, "inter_size": INT, "topk": INT,
              "num_experts": INT, "moe_tp": INT, "moe_ep": INT, "sku": S, "version": S,
              "latency_ms": pl.Float64}
MOE_DISTRIBUTION = "balanced"  # the routing the MoE step family's headline reads


def moe_points_at(con: duckdb.DuckDBPyConnection, sku: str, version: str) -> pl.DataFrame:
    """Every fused-MoE kernel ``sku`` timed at ``version`` with tokens spread evenly over the
    experts, at every precision and expert placement: what the serving oracle's ``every_shape``
    home reads for an MoE layer's routed experts."""
    return _frame(
        con, f"SELECT {', '.join(c if c != 'version' else 'backend_version' for c in MOE_SCHEMA)} "
        "FROM moe WHERE source = ? AND sku = ? AND backend_version = ? AND backend = 'vllm' "
        "AND distribution = ? ORDER BY ALL", [SOURCE, sku, version, MOE_DISTRIBUTION], MOE_SCHEMA)


def _frame(con: duckdb.DuckDBPyConnection, sql: str, params: list, schema: dict
           ) -> pl.DataFrame:
    """The query's rows as ``schema`` (its columns named by position): through Arrow, about
    three times faster than building the frame from Python rows, as every run's home does."""
    frame = con.sql(sql, params=params).pl()
    return frame.rename(dict(zip(frame.columns, schema, strict=True))).cast(schema)


PROFILE_SOURCE = "llmservingsim"
# The vLLM profiler's projections, by the tp_shapes GEMM each one is.
PROFILE_GEMMS = {"qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "gate_up", "down_proj": "down"}


def profile_points_at(con: duckdb.DuckDBPyConnection, sku: str, version: str,
                      models: dict) -> pl.DataFrame:
    """LLMServingSim's vLLM profile of ``sku`` at ``version``, as points of ``SCHEMA``: its
    projections and LM head as GEMMs (m = the tokens it ran, or the sequences for the LM head;
    n and k from the profiled model's shapes at its TP; the dtype its attention rows record,
    the profiler running one model in one dtype), and its prefill and decode attention rows.
    Left out: its mixed attention rows (a prefill and decodes in one kernel, which a table of
    one phase cannot key) and its norms, rotary and activation (no GEMM or attention shape)."""
    attention = _frame(
        con, f"SELECT {SELECT['attention']} FROM attention WHERE source = ? AND sku = ? "
        "AND backend_version = ? AND phase IN ('prefill', 'decode') ORDER BY ALL",
        [PROFILE_SOURCE, sku, version], SCHEMA)
    ops = con.execute(
        "SELECT model, tp, op, num_tokens, latency_ms, flags FROM model_ops WHERE source = ? "
        "AND sku = ? AND backend_version = ? AND backend = 'vllm' AND op IN "
        f"({', '.join('?' * (len(PROFILE_GEMMS) + 1))}) ORDER BY ALL",
        [PROFILE_SOURCE, sku, version, *PROFILE_GEMMS, "lm_head"]).fetchall()
    dtypes = set(attention["dtype"])
    if not ops and attention.is_empty():
        return attention
    if len(dtypes) != 1:
        found = f"dtypes {sorted(dtypes)}" if dtypes else "no prefill or decode attention rows"
        raise ValueError(f"{PROFILE_SOURCE}'s {sku} profile at {version} has {found}; its GEMMs' "
                         "dtype is read from its attention rows, so exactly one is needed")
    dtype, gemm = dtypes.pop(), []
    for model, tp, op, tokens, latency, flags in ops:
        if model not in models:
            raise ValueError(f"{PROFILE_SOURCE}'s {sku} profile times model '{model}', which "
                             "conf/model does not describe; add it there")
        shapes = tp_shapes(models[model], tp)
        n, k = ((models[model]["vocab_size"] // tp, shapes["hidden"]) if op == "lm_head"
                else shapes[PROFILE_GEMMS[op]])
        gemm.append({"op_family": "gemm", "dtype": dtype, "m": tokens, "n": n, "k": k,
                     "latency_ms": latency, "flags": flags, "sku": sku, "backend_version": version})
    return pl.concat([pl.DataFrame(gemm, schema=SCHEMA), attention]) if gemm else attention


def op_versions(con: duckdb.DuckDBPyConnection,
                versions: dict[str, str] | None = None) -> dict[str, str]:
    """The version each GPU's op dataset reads: ``versions[sku]`` where given, else the lowest
    version with both GEMM and attention points (the home's 0.14.0 where it exists)."""
    found: dict[str, dict[str, set[str]]] = {t: {} for t in SELECT}
    for table, by_sku in found.items():
        for sku, version in con.execute(f"SELECT DISTINCT sku, backend_version FROM {table} "
                                        "WHERE source = ?", [SOURCE]).fetchall():
            by_sku.setdefault(sku, set()).add(version)
    out = {}
    for sku in sorted(set.intersection(*(set(by_sku) for by_sku in found.values()))):
        both = set.intersection(*(by_sku[sku] for by_sku in found.values()))
        wanted = (versions or {}).get(sku)
        if wanted is not None and wanted not in both:
            raise ValueError(f"{sku}: no {SOURCE} GEMM and attention points at version {wanted}; "
                             f"versions with both: {sorted(both, key=release)}")
        if both:
            out[sku] = wanted or min(both, key=release)
    return out


def points_at(con: duckdb.DuckDBPyConnection, sku: str, version: str) -> pl.DataFrame:
    """Every measured GEMM and attention point of ``sku`` at one backend version, whichever
    version its ``<sku>_ops`` dataset reads."""
    where = "source = ? AND sku = ? AND backend_version = ?"
    union = " UNION ALL ".join(f"SELECT {cols} FROM {t} WHERE {where}" for t, cols in SELECT.items())
    return _frame(con, f"SELECT * FROM ({union}) ORDER BY ALL", [SOURCE, sku, version] * 2, SCHEMA)


def op_points(con: duckdb.DuckDBPyConnection, name: str,
              versions: dict[str, str] | None = None) -> pl.DataFrame:
    """The measured points of ``<sku>_ops``: one row per GEMM or attention shape."""
    sku = name.removesuffix(SUFFIX)
    chosen = op_versions(con, versions)
    if not name.endswith(SUFFIX) or sku not in chosen:
        raise ValueError(f"unknown op dataset '{name}'; valid: "
                         f"{', '.join(s + SUFFIX for s in chosen)}")
    return points_at(con, sku, chosen[sku])


COLLECTIVE_SCHEMA = {"backend": S, "message_bytes": INT, "num_gpus": INT, "sku": S, "version": S,
                     "latency_ms": pl.Float64}


def collective_points(con: duckdb.DuckDBPyConnection, sku: str, version: str) -> pl.DataFrame:
    """A GPU's measured all-reduce points: vLLM's graph-mode custom all-reduce on bf16, the one
    the cells compose (``leaderboard.cells.grid``)."""
    return _frame(
        con, "SELECT backend, message_bytes, num_gpus, sku, backend_version, latency_ms FROM "
        "collective WHERE source = ? AND sku = ? AND backend_version = ? AND backend = "
        "'vllm_graph' AND collective = 'all_reduce' AND dtype = 'bfloat16' ORDER BY ALL",
        [SOURCE, sku, version], COLLECTIVE_SCHEMA)


def op_datasets(con: duckdb.DuckDBPyConnection,
                versions: dict[str, str] | None = None) -> list[dict]:
    out = []
    for sku, version in op_versions(con, versions).items():
        points = points_at(con, sku, version)
        counts = dict(points.group_by("op_family").len().iter_rows())
        by_dtype = points.group_by("op_family", "phase", "dtype", "kv_dtype").len().sort(
            "op_family", "phase", "dtype", "kv_dtype", nulls_last=True)
        files = con.execute(
            " UNION ".join(f"SELECT DISTINCT file, file_sha256 FROM {t} WHERE source = ? "
                           "AND sku = ? AND backend_version = ?" for t in SELECT),
            [SOURCE, sku, version] * 2).fetchall()
        card = render_card(
            "ops", name=f"{sku}{SUFFIX}", sku=sku, version=version, rows=len(points),
            gemm=counts.get("gemm", 0), attention=counts.get("attention", 0),
            flagged=(points["flags"] == WARM_FLAG).sum(), sources=source_lines(con, files),
            breakdown="\n".join(f"| {f} | {p or '-'} | {d} | {kv or '-'} | {n} |"
                                for f, p, d, kv, n in by_dtype.iter_rows()))
        out.append({"name": f"{sku}{SUFFIX}", "kind": "ops", "sku": sku, "version": version,
                    "rows": len(points), "tables": {t: counts.get(t, 0) for t in SELECT},
                    "card": card})
    return out
