"""The normalized tables of the store: their columns, keys and measured-value columns.

Every op table row carries its provenance (source, sku, backend and version, the file and its
sha256, whether the file is pinned) and the statistic its latency is (median, mean or single).
Latencies are milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

# Categorical: a few distinct values over millions of rows. The store holds them as VARCHAR.
_C = pl.Categorical
PROVENANCE = {
    "source": _C, "sku": _C, "backend": _C, "backend_version": _C, "file": _C,
    "file_sha256": _C, "pinned": pl.Boolean, "statistic": _C, "flags": _C,
}


@dataclass(frozen=True)
class TableSpec:
    name: str
    kind: str  # ops | traces | coefficients
    columns: dict[str, pl.DataType]
    measured: tuple[str, ...]  # must be finite and > 0; never part of the duplicate key
    informational: tuple[str, ...] = ()  # measured alongside, neither key nor validated

    @property
    def schema(self) -> dict[str, pl.DataType]:
        return {**PROVENANCE, **self.columns, **{c: pl.Float64 for c in self.informational}}

    @property
    def key(self) -> list[str]:
        skip = {*self.measured, *self.informational, "file", "file_sha256", "pinned", "flags"}
        return [c for c in self.schema if c not in skip]


INT, F, S = pl.Int64, pl.Float64, pl.String

TABLES = {
    t.name: t
    for t in [
        TableSpec("gemm", "ops", {"op": S, "model": S, "dtype": S, "batch": INT, "m": INT, "n": INT,
                                  "k": INT, "latency_ms": F}, ("latency_ms",)),
        TableSpec("attention", "ops", {
            "phase": S, "model": S, "tp": INT, "dtype": S, "kv_dtype": S, "batch": INT, "q_len": INT,
            "kv_len": INT, "n_decode": INT, "kv_decode": INT, "num_heads": INT, "num_kv_heads": INT,
            "head_dim": INT, "window_size": INT, "latency_ms": F}, ("latency_ms",),
            ("power_w", "power_limit_w")),
        TableSpec("collective", "ops", {
            "collective": S, "topology": S, "num_gpus": INT, "devices_per_node": INT,
            "message_bytes": INT, "dtype": S, "latency_ms": F}, ("latency_ms",)),
        # One fused-MoE layer (aiconfigurator's moe_perf): the routed experts' two grouped GEMMs
        # and the activation between them, for ``num_tokens`` tokens routed ``topk`` ways.
        TableSpec("moe", "ops", {
            "dtype": S, "kernel": S, "num_tokens": INT, "hidden_size": INT, "inter_size": INT,
            "topk": INT, "num_experts": INT, "moe_tp": INT, "moe_ep": INT, "distribution": S,
            "latency_ms": F}, ("latency_ms",), ("power_w", "power_limit_w")),
        TableSpec("model_ops", "ops", {
            "model": S, "tp": INT, "op": S, "op_family": S, "num_tokens": INT, "kv_len": INT,
            "latency_ms": F}, ("latency_ms",),
            ("latency_mean_ms", "latency_min_ms", "latency_max_ms", "latency_std_ms")),
        TableSpec("step_wallclock", "ops", {
            "model": S, "tp": INT, "batch_size": INT, "prompt_size": INT, "token_size": INT, "repeat": INT,
            "prompt_time_ms": F, "token_time_ms": F}, ("prompt_time_ms", "token_time_ms"),
            ("e2e_time_ms", "peak_power", "average_power")),
        TableSpec("cpu_overheads", "ops", {
            "model": S, "tp": INT, "batch_size": INT, "op": S, "latency_ms": F}, ("latency_ms",),
            ("latency_mean_ms",)),
        TableSpec("serving_requests", "ops", {
            "run": S, "model": S, "request_id": S, "input_toks": INT, "output_toks": INT,
            "arrival_time": F, "queued_ts": F, "scheduled_ts": F, "first_token_ts": F,
            "last_token_ts": F}, ()),
        TableSpec("serving_timeseries", "ops", {
            "run": S, "model": S, "t_s": F, "prompt_throughput": F, "gen_throughput": F,
            "running": INT, "waiting": INT, "kv_cache_pct": F}, ()),
        # One measured serving run (aiconfigurator's silicon sample): the load and its means.
        TableSpec("serving_runs", "ops", {
            "run_id": S, "row": INT, "model": S, "model_path": S, "precision": S, "mode": S,
            "isl": INT, "osl": INT, "concurrency": INT, "batch_size": INT, "tp": INT, "pp": INT,
            "attention_dp": INT, "moe_ep": INT, "moe_tp": INT, "measured_on": S, "ttft_ms": F, "tpot_ms": F},
            ("ttft_ms", "tpot_ms")),
        # One static batch run end to end (LLM-Inference-Bench): its shape and whole wall time.
        TableSpec("e2e_runs", "ops", {
            "hardware": S, "devices": INT, "framework": S, "model_path": S, "model": S, "isl": INT,
            "osl": INT, "batch_size": INT, "latency_ms": F}, ("latency_ms",)),
        TableSpec("request_traces", "traces", {
            "trace": S, "request_idx": INT, "arrived_at_s": F, "prefill_tokens": INT,
            "decode_tokens": INT}, ("prefill_tokens", "decode_tokens")),
        TableSpec("coefficients", "coefficients", {
            "model": S, "tp": INT, "pp": INT, "engine": S, "term": S, "coefficients": S,
            "threshold": INT}, ()),
    ]
}


def conform(df: pl.DataFrame, table: str) -> pl.DataFrame:
    """Cast to the table's schema, adding any missing optional column as null."""
    schema = TABLES[table].schema
    if df.width == 0:
        return pl.DataFrame(schema=schema)
    return df.select(
        [(pl.col(c) if c in df.columns else pl.lit(None)).cast(t).alias(c) for c, t in schema.items()]
    )
