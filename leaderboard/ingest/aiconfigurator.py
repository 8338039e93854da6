"""aiconfigurator (ai-dynamo): per-kernel GPU time on every SKU folder found.

Layout: ``systems/data/<sku>/{gemm,attention,comm,moe}/<backend>/<version>/<table>.parquet``. The sku
folder name is the spec id, so a new folder is ingested with no code change once
``conf/gpu/<sku>.yaml`` (or a file under ``$LEADERBOARD_GPU_SPECS``) describes it.
"""

from __future__ import annotations

import polars as pl

from leaderboard.ingest.base import Adapter, BuildError, IngestContext, provenance, read_table
from leaderboard.ingest.sources import SourceFile
from leaderboard_core.specs import KV_CACHE_BYTES

ROOT = "ai-dynamo__aiconfigurator/aic-core/src/aiconfigurator_core/systems/data"
SOURCE = "aiconfigurator"

# Bytes per element read by a GEMM's inputs (a fused-MoE layer's: its weights); outputs are
# written in bf16. A 4-bit weight format counts half a byte whatever its activations' width.
GEMM_INPUT_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int8": 1.0,
                    "int4_wo": 0.5, "nvfp4": 0.5, "w4a8_awq": 0.5,
                    "w4a16_mxfp4": 0.5, "w4a8_mxfp4_mxfp8": 0.5}
COMM_DTYPE_BYTES = {"bfloat16": 2, "half": 2, "float16": 2, "int8": 1, "fp8": 1, "float": 4}
# A point faster than DRAM can stream its working set once: its operands stayed in L2 between
# the timed repeats (a forward pass reads them cold). Real; kept, flagged.
WARM_FLAG = "faster_than_dram"
# The frameworks whose files this adapter reads, per op family folder; any other framework's
# folder (trtllm, sglang...) has other columns and is skipped and listed, never half-read.
READ_BACKENDS = {"gemm": {"vllm"}, "attention": {"vllm"}, "comm": {"vllm", "nccl"},
                 "moe": {"vllm"}}


def _place(file: SourceFile) -> tuple[str, str, str]:
    """(sku, backend, version) from ``.../data/<sku>/<family>/<backend>/<version>/<file>``."""
    parts = file.rel.split("/")
    return parts[-5], parts[-3], parts[-2]


def _bytes_of(df: pl.DataFrame, column: str, sizes: dict[str, float], file: SourceFile) -> pl.Expr:
    """``column``'s dtype names as bytes per element. A name ``sizes`` lacks, or none, stops
    the build: a guessed size would misplace the warm flag's DRAM floor or, for a collective,
    its message size, the key it is looked up by."""
    unknown = sorted(set(df[column].drop_nulls().unique()) - set(sizes))
    if df[column].null_count():
        unknown.append(None)
    if unknown:
        raise BuildError(f"{file.path}: {column} {', '.join(map(repr, unknown))} has no size in "
                         f"bytes; add it to the dtype sizes in {__name__} (source {file.rel})")
    return pl.col(column).replace_strict(sizes, return_dtype=pl.Float64)


def _gemm(file: SourceFile, ctx: IngestContext) -> tuple[str, pl.DataFrame]:
    sku, backend, version = _place(file)
    gpu = ctx.gpu(sku, file)
    df = read_table(file, ["m", "n", "k", "gemm_dtype", "latency"])
    in_bytes = _bytes_of(df, "gemm_dtype", GEMM_INPUT_BYTES, file)
    moved = in_bytes * (pl.col("m") * pl.col("k") + pl.col("k") * pl.col("n")) + 2.0 * pl.col(
        "m") * pl.col("n")
    df = df.select(
        op=pl.lit("gemm"), dtype=pl.col("gemm_dtype"), batch=pl.lit(1), m="m", n="n", k="k",
        latency_ms="latency", flags=_warm(moved, gpu),
    )
    return "gemm", provenance(df, file, SOURCE, sku, backend, version, "median")


def _warm(bytes_moved: pl.Expr, gpu) -> pl.Expr:
    dram_floor_ms = bytes_moved / gpu.mem_bw_bytes_per_s * 1e3
    return pl.when(pl.col("latency") < dram_floor_ms).then(pl.lit(WARM_FLAG))


def _attention_bytes(prefill: bool, columns: list[str], kv: pl.Expr) -> pl.Expr:
    """The cold working set: prefill reads Q, K, V and writes O of every prompt token; decode
    reads the KV cache (K and V) of every request, its last ``window_size`` tokens only under
    sliding-window attention. ``kv``: the KV cache's bytes per element."""
    heads, kv_heads, d = pl.col("num_heads"), pl.col("num_key_value_heads"), pl.col("head_dim")
    kv_heads = pl.when(kv_heads == 0).then(heads).otherwise(kv_heads)
    if prefill:
        return pl.col("batch_size") * pl.col("isl") * d * (2.0 * 2 * heads + 2 * kv * kv_heads)
    window = pl.col("window_size") if "window_size" in columns else pl.lit(0)
    read = pl.when(window > 0).then(pl.min_horizontal(pl.col("step"), window)).otherwise(pl.col("step"))
    return pl.col("batch_size") * read * d * 2 * kv * kv_heads


def _attention(file: SourceFile, ctx: IngestContext) -> tuple[str, pl.DataFrame]:
    sku, backend, version = _place(file)
    gpu = ctx.gpu(sku, file)
    prefill = file.path.name.startswith("context")
    df = read_table(file, ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
                           "step", "attn_dtype", "kv_cache_dtype", "latency"])
    optional = {c: pl.col(c) for c in ("window_size", "power", "power_limit") if c in df.columns}
    df = df.select(
        phase=pl.lit("prefill" if prefill else "decode"), dtype="attn_dtype",
        kv_dtype="kv_cache_dtype", batch="batch_size", q_len="isl", kv_len="step",
        num_heads="num_heads",
        # A key listed with 0 KV heads means "same as query heads" (MHA): normalize it.
        num_kv_heads=pl.when(pl.col("num_key_value_heads") == 0).then(pl.col("num_heads"))
        .otherwise(pl.col("num_key_value_heads")),
        head_dim="head_dim", latency_ms="latency", flags=_warm(_attention_bytes(
            prefill, df.columns, _bytes_of(df, "kv_cache_dtype", KV_CACHE_BYTES, file)), gpu),
        window_size=optional.get("window_size", pl.lit(0)),
        power_w=optional.get("power", pl.lit(None)),
        power_limit_w=optional.get("power_limit", pl.lit(None)),
    )
    return "attention", provenance(df, file, SOURCE, sku, backend, version, "median")


def _collective(file: SourceFile, ctx: IngestContext) -> tuple[str, pl.DataFrame]:
    sku, _, version = _place(file)
    ctx.gpu(sku, file)
    nccl = file.path.name.startswith("nccl")
    dtype_col = "nccl_dtype" if nccl else "allreduce_dtype"
    df = read_table(file, ["num_gpus", "message_size", "latency", dtype_col]
                    + ([] if nccl else ["backend"]))
    # message_size counts elements: int8 runs take half the time of half at equal size.
    df = df.select(
        collective=pl.col("op_name") if nccl else pl.lit("all_reduce"),
        backend=pl.lit("nccl") if nccl else pl.col("backend"),
        num_gpus="num_gpus", devices_per_node="num_gpus", dtype=pl.col(dtype_col),
        message_bytes=pl.col("message_size")
        * _bytes_of(df, dtype_col, COMM_DTYPE_BYTES, file).cast(pl.Int64),
        latency_ms="latency",
    )
    df = provenance(df.drop("backend"), file, SOURCE, sku, "nccl", version, "median").with_columns(
        backend=df["backend"])
    return "collective", df


def _moe(file: SourceFile, ctx: IngestContext) -> tuple[str, pl.DataFrame]:
    """One fused-MoE layer per row. Its cold working set is the weights of the experts the
    tokens surely touch plus the tokens' activations in and out; a point faster than DRAM
    streams that is flagged warm."""
    sku, backend, version = _place(file)
    gpu = ctx.gpu(sku, file)
    df = read_table(file, ["moe_dtype", "kernel_source", "num_tokens", "hidden_size", "inter_size",
                           "topk", "num_experts", "moe_tp_size", "moe_ep_size", "distribution",
                           "latency"])
    w_bytes = _bytes_of(df, "moe_dtype", GEMM_INPUT_BYTES, file)
    local = pl.col("num_experts") / pl.col("moe_ep_size")
    # Balanced routing touches every expert it can (on one GPU of an expert-parallel group, its
    # share of the routed rows: tokens x top-k / EP); skewed routing may pile the tokens onto a
    # few, so only one token's top-k is sure to be read: a lower bound keeps the flag honest.
    spread = pl.when(pl.col("distribution") == "balanced").then(
        pl.col("num_tokens") * pl.col("topk") / pl.col("moe_ep_size")).otherwise(pl.col("topk"))
    touched = pl.min_horizontal(local, spread)
    # 3: the gate, up and down projections (every model these tables cover gates its experts)
    weights = touched * 3 * pl.col("hidden_size") * pl.col("inter_size") / pl.col("moe_tp_size")
    moved = w_bytes * weights + 2.0 * 2 * pl.col("num_tokens") * pl.col("hidden_size")
    optional = {c: pl.col(c) for c in ("power", "power_limit") if c in df.columns}
    df = df.select(
        dtype="moe_dtype", kernel="kernel_source", num_tokens="num_tokens",
        hidden_size="hidden_size", inter_size="inter_size", topk="topk",
        num_experts="num_experts", moe_tp="moe_tp_size", moe_ep="moe_ep_size",
        distribution="distribution", latency_ms="latency", flags=_warm(moved, gpu),
        power_w=optional.get("power", pl.lit(None)),
        power_limit_w=optional.get("power_limit", pl.lit(None)),
    )
    return "moe", provenance(df, file, SOURCE, sku, backend, version, "median")


READERS = {
    "gemm_perf.parquet": _gemm,
    "context_attention_perf.parquet": _attention,
    "generation_attention_perf.parquet": _attention,
    "custom_allreduce_perf.parquet": _collective,
    "nccl_perf.parquet": _collective,
    "moe_perf.parquet": _moe,
}


def _read(file: SourceFile) -> bool:
    parts = file.rel.split("/")
    return file.path.name in READERS and parts[-3] in READ_BACKENDS.get(parts[-4], set())


def ingest(files: list[SourceFile], ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    ctx.skipped += [(f.rel, "framework or format not read by the aiconfigurator adapter")
                    for f in files if not _read(f)]
    return [READERS[f.path.name](f, ctx) for f in files if _read(f)]


ADAPTER = Adapter(SOURCE, tuple(f"{ROOT}/*/*/*/*/{name}" for name in READERS), ingest)
