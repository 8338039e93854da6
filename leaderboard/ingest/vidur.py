"""Vidur (microsoft/vidur): its own per-op profiles, network collectives, CPU overheads, traces.

Vidur does not name the boards it profiled. Its ``a100`` compute folder is mapped to
``a100_80gb_pcie`` (Vidur's docs tie it to Azure NC A100 v4, 80 GB PCIe), ``h100`` to ``h100_sxm``
(implied by throughput, see docs/baselines.md §0.3). Network folders name their node type.
"""

from __future__ import annotations

from fnmatch import fnmatch

import polars as pl

from leaderboard.ingest.base import Adapter, IngestContext, provenance, read_table
from leaderboard.ingest.sources import SourceFile

ROOT = "microsoft__vidur/data"
SOURCE = "vidur"
DEVICE_SKU = {"a100": "a100_80gb_pcie", "a40": "a40", "h100": "h100_sxm"}
NODE_SKU = {"a100_dgx": "a100_sxm", "a100_pairwise_nvlink": "a100_80gb_pcie",
            "h100_dgx": "h100_sxm", "h100_pairwise_nvlink": "h100_sxm",
            "a40_pairwise_nvlink": "a40"}
OP_FAMILY = {"emb": "embedding", "attn_pre_proj": "linear", "attn_post_proj": "linear",
             "mlp_up_proj": "linear", "mlp_down_proj": "linear"}  # the rest are light kernels
STATS = {"median": "latency_ms", "mean": "latency_mean_ms", "min": "latency_min_ms",
         "max": "latency_max_ms", "std": "latency_std_ms"}
# Vidur's a100 and h100 pairwise send_recv.csv are byte-identical: at most one is an H100 reading.
IDENTICAL_TO_A100 = "network/h100_pairwise_nvlink/send_recv.csv"


def _ops(df: pl.DataFrame, prefix_ops: list[str], index: list[str]) -> pl.DataFrame:
    """Melt ``time_stats.<op>.<stat>`` columns into one row per (index, op)."""
    frames = []
    for op in prefix_ops:
        cols = {f"time_stats.{op}.{s}": name for s, name in STATS.items()
                if f"time_stats.{op}.{s}" in df.columns}
        frames.append(df.select(*index, *[pl.col(c).alias(n) for c, n in cols.items()],
                                op=pl.lit(op)))
    return pl.concat(frames, how="diagonal_relaxed")


def _op_names(df: pl.DataFrame) -> list[str]:
    return sorted({c.split(".")[1] for c in df.columns if c.startswith("time_stats.")})


def _compute(file: SourceFile, ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    device, org, name = file.rel.split("/")[-4:-1]
    sku = DEVICE_SKU[device]
    ctx.gpu(sku, file)
    df = read_table(file, ["num_tokens", "num_tensor_parallel_workers", "n_embd"])
    ops = _ops(df, _op_names(df), ["num_tokens", "num_tensor_parallel_workers"]).select(
        *STATS.values(), model=pl.lit(ctx.model(f"{org}/{name}", file)),
        tp="num_tensor_parallel_workers", op="op",
        op_family=pl.col("op").replace_strict(OP_FAMILY, default="light"),
        num_tokens="num_tokens", kv_len=pl.lit(0),
    )
    return [("model_ops", provenance(ops, file, SOURCE, sku, "pytorch", "unknown", "median"))]


def _attention(file: SourceFile, ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    sku = DEVICE_SKU[file.rel.split("/")[-2]]
    ctx.gpu(sku, file)
    df = read_table(file, ["n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers",
                           "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
                           "attention_backend", "time_stats.attn_prefill.median",
                           "time_stats.attn_decode.median"])
    model = ctx.model("meta-llama/Llama-2-70b-hf", file)  # the one shape profiled (SOURCES.md)
    shape = dict(model=pl.lit(model), tp="num_tensor_parallel_workers", dtype=pl.lit("float16"),
                 kv_dtype=pl.lit("float16"), num_heads="n_q_head", num_kv_heads="n_kv_head",
                 head_dim=pl.col("n_embd") // pl.col("n_q_head"), window_size=pl.lit(0))
    prefill = df.filter(pl.col("is_prefill")).select(
        phase=pl.lit("prefill"), batch="batch_size", q_len="prefill_chunk_size",
        kv_len="kv_cache_size", latency_ms="time_stats.attn_prefill.median", **shape)
    decode = df.filter(~pl.col("is_prefill")).select(
        phase=pl.lit("decode"), batch="batch_size", q_len=pl.lit(1), kv_len="kv_cache_size",
        latency_ms="time_stats.attn_decode.median", **shape)
    backend = df["attention_backend"][0].split(".")[-1].lower()
    light_ops = [op for op in _op_names(df) if op not in ("attn_prefill", "attn_decode")]
    light = _ops(df.with_columns(num_tokens=pl.max_horizontal("prefill_chunk_size", "batch_size")),
                 light_ops, ["num_tokens", "kv_cache_size", "num_tensor_parallel_workers"]).select(
        *STATS.values(), model=pl.lit(model), tp="num_tensor_parallel_workers", op="op",
        op_family=pl.lit("light"), num_tokens="num_tokens", kv_len="kv_cache_size")
    return [
        ("attention", provenance(pl.concat([prefill, decode], how="vertical_relaxed"), file,
                                 SOURCE, sku, backend, "unknown", "median")),
        ("model_ops", provenance(light, file, SOURCE, sku, backend, "unknown", "median")),
    ]


def _network(file: SourceFile, ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    node = file.rel.split("/")[-2]
    sku = NODE_SKU[node]
    ctx.gpu(sku, file)
    collective = file.path.stem
    df = read_table(file, [f"time_stats.{collective}.median", "num_workers", "size",
                           "devices_per_node", "collective"])
    df = df.select(
        collective="collective", topology=pl.lit(node), num_gpus="num_workers",
        devices_per_node="devices_per_node", message_bytes="size", dtype=pl.lit("float16"),
        latency_ms=f"time_stats.{collective}.median",
    )
    df = provenance(df, file, SOURCE, sku, "nccl", "unknown", "median")
    if file.rel.endswith(IDENTICAL_TO_A100):
        ctx.quarantine.add("collective", df, "known_bad", "duplicated_file",
                           "byte-identical to a100_pairwise_nvlink/send_recv.csv upstream")
        return []
    return [("collective", df)]


def _cpu_overheads(file: SourceFile, ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    sku = DEVICE_SKU[file.rel.split("/")[-2]]
    ctx.gpu(sku, file)
    df = read_table(file, ["model_name", "batch_size", "tensor_parallel_degree"])
    ops = sorted(c[: -len("_median")] for c in df.columns if c.endswith("_median"))
    frames = [
        df.select(model=pl.col("model_name"), tp="tensor_parallel_degree",
                  batch_size="batch_size", op=pl.lit(op), latency_ms=f"{op}_median",
                  latency_mean_ms=pl.col(f"{op}_mean") if f"{op}_mean" in df.columns else None)
        for op in ops
    ]
    out = pl.concat(frames).with_columns(
        model=pl.col("model").map_elements(lambda m: ctx.model(m, file), return_dtype=pl.String))
    return [("cpu_overheads", provenance(out, file, SOURCE, sku, "vllm", "unknown", "median"))]


def _trace(file: SourceFile, ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    df = read_table(file, ["num_prefill_tokens", "num_decode_tokens"])
    df = df.select(
        trace=pl.lit(file.path.stem), request_idx=pl.int_range(pl.len()),
        arrived_at_s=pl.col("arrived_at") if "arrived_at" in df.columns else pl.lit(None),
        prefill_tokens="num_prefill_tokens", decode_tokens="num_decode_tokens",
    )
    return [("request_traces", provenance(df, file, SOURCE, None, "none", "none", "single"))]


PATTERNS = {
    f"{ROOT}/profiling/compute/*/*/*/mlp.csv": _compute,
    f"{ROOT}/profiling/*/attention.csv": _attention,
    f"{ROOT}/profiling/network/*/*.csv": _network,
    f"{ROOT}/profiling/*/cpu_overheads.csv": _cpu_overheads,
    f"{ROOT}/processed_traces/*.csv": _trace,
}


def ingest(files: list[SourceFile], ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    out = []
    for file in files:
        reader = next((r for p, r in PATTERNS.items() if fnmatch(file.rel, p)), None)
        if reader is not None:
            out.extend(reader(file, ctx))
    return out


ADAPTER = Adapter(SOURCE, tuple(PATTERNS), ingest)
