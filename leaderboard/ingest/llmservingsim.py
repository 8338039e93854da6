"""LLMServingSim (casys-kaist): per-layer GPU profiles and real vLLM serving runs.

- ``profiler/v0/perf_models/<hw>/<org>/<model>/tp<N>/layers.csv``: the archived PyTorch profiler
  (its own HF-style Llama modules, fp16, one layer deep, prefill sweep only so ``kv_cache`` is 0).
  Each row is the median of 30 timed forwards. TP > 1 runs one rank's shard shapes on one GPU.
- ``.../tp1/attention.csv`` beside it (A6000 only): the v0 Vidur-format attention sweep, medians.
- ``profiler/perf/<hw>/<org>/<model>/<variant>/tp<N>/``: the vLLM profiler (eager, one layer);
  each time is the mean of ``measurement_iterations`` forwards. ``meta.yaml`` names vLLM's version.
- ``bench/examples/<hw>/<model>/vllm/``: real vLLM serving runs; ``meta.json`` names the version.

Not ingested: ``skew_fit.csv`` (a fitted alpha table) and ``outputs/`` (simulator output). Nor is
``skew.csv``: it is measured, but its skewed shots mix two decode KV lengths in one batch, which
the attention table cannot key, and its uniform reference shots repeat the attention grid.
"""

from __future__ import annotations

import posixpath
from fnmatch import fnmatch
from functools import partial

import polars as pl
import yaml

from leaderboard.ingest.base import (
    Adapter,
    BuildError,
    IngestContext,
    provenance,
    read_json,
    read_table,
)
from leaderboard.ingest.sources import SourceFile
from leaderboard_core import yaml_io

ROOT = "casys-kaist__LLMServingSim"
SOURCE = "llmservingsim"
# Upstream does not name the H100 board it profiled; SXM is an assumption, not a stated fact.
HW_SKU = {"H100": "h100_sxm", "A6000": "rtx_a6000", "RTX3090": "rtx3090", "RTX4090": "rtx4090"}
OP_FAMILY = {
    "embedding": "embedding", "lm_head": "lm_head", "sampler": "sampler", "attn": "attention",
    **dict.fromkeys(["q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj",
                     "gate_up_proj", "down_proj"], "linear"),
    **dict.fromkeys(["input_layernorm", "post_layernorm", "final_layernorm", "layernorm", "rope",
                     "rotary_emb", "act_fn"], "light"),
}
VARIANT_DTYPES = {"bf16": ("bfloat16", "bfloat16")}  # (weights/activations, KV cache)
V0_DTYPE = "float16"  # the v0 profiler casts the model to fp16


def _sku(hw: str, file: SourceFile, ctx: IngestContext) -> str:
    if hw not in HW_SKU:
        raise BuildError(f"{file.path}: unknown hardware folder '{hw}'; map it in "
                         f"leaderboard/ingest/llmservingsim.py HW_SKU")
    ctx.gpu(HW_SKU[hw], file)
    return HW_SKU[hw]


def _family(column: str) -> pl.Expr:
    return pl.col(column).replace_strict(OP_FAMILY, default="other", return_dtype=pl.String)


def _vllm_version(file: SourceFile, files: dict[str, SourceFile], meta_name: str) -> str:
    """``vllm_version`` from the run's meta file, ``meta_name`` relative to ``file``'s folder."""
    rel = posixpath.normpath(posixpath.join(posixpath.dirname(file.rel), meta_name))
    if rel not in files:
        raise BuildError(f"{file.path}: {rel} is missing; it names the vLLM version measured")
    meta = files[rel]
    if rel.endswith(".json"):
        data = read_json(meta)
    else:
        try:
            data = yaml_io.safe_load(meta.path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise BuildError(f"{meta.path}: cannot read YAML ({exc})") from exc
    if not isinstance(data, dict) or "vllm_version" not in data:
        raise BuildError(f"{meta.path}: no vllm_version key")
    return str(data["vllm_version"])


def _v0_layers(file: SourceFile, ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    hw, org, name = file.rel.split("/")[-5:-2]
    sku = _sku(hw, file, ctx)
    df = read_table(file, ["layer_name", "input", "kv_cache", "tp_size", "latency(ns)"]).select(
        model=pl.lit(ctx.model(f"{org}/{name}", file)), tp="tp_size", op="layer_name",
        op_family=_family("layer_name"), num_tokens="input", kv_len="kv_cache",
        latency_ms=pl.col("latency(ns)") / 1e6,
    )
    return [("model_ops", provenance(df, file, SOURCE, sku, "pytorch", "unknown", "median"))]


def _v0_attention(file: SourceFile, ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    hw, org, name = file.rel.split("/")[-5:-2]
    sku = _sku(hw, file, ctx)
    model = ctx.model(f"{org}/{name}", file)
    df = read_table(file, ["n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers",
                           "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
                           "attention_backend", "time_stats.attn_prefill.median",
                           "time_stats.attn_decode.median"])
    shape = dict(model=pl.lit(model), tp="num_tensor_parallel_workers", dtype=pl.lit(V0_DTYPE),
                 kv_dtype=pl.lit(V0_DTYPE), batch="batch_size", kv_len="kv_cache_size",
                 num_heads="n_q_head", num_kv_heads="n_kv_head",
                 head_dim=pl.col("n_embd") // pl.col("n_q_head"), window_size=pl.lit(0))
    prefill = df.filter(pl.col("is_prefill")).select(
        phase=pl.lit("prefill"), q_len="prefill_chunk_size",
        latency_ms="time_stats.attn_prefill.median", **shape)
    decode = df.filter(~pl.col("is_prefill")).select(
        phase=pl.lit("decode"), q_len=pl.lit(1), latency_ms="time_stats.attn_decode.median",
        **shape)
    # Any other timed op (Vidur's KV-cache save, input reshape) is a light per-token kernel.
    others = sorted({c.split(".")[1] for c in df.columns if c.startswith("time_stats.")}
                    - {"attn_prefill", "attn_decode"})
    light = [df.select(model=pl.lit(model), tp="num_tensor_parallel_workers", op=pl.lit(op),
                       op_family=pl.lit("light"),
                       num_tokens=pl.max_horizontal("prefill_chunk_size", "batch_size"),
                       kv_len="kv_cache_size", latency_ms=f"time_stats.{op}.median")
             for op in others]
    backend = df["attention_backend"][0].split(".")[-1].lower()
    attention = pl.concat([prefill, decode], how="vertical_relaxed")
    out = [("attention", provenance(attention, file, SOURCE, sku, backend, "unknown", "median"))]
    if light:
        out.append(("model_ops", provenance(pl.concat(light), file, SOURCE, sku, backend,
                                            "unknown", "median")))
    return out


def _profile_place(file: SourceFile, ctx: IngestContext) -> tuple[str, str, str, int]:
    """(sku, model, variant, tp) from ``perf/<hw>/<org>/<model>/<variant>/tp<N>/<file>``."""
    hw, org, name, variant, tp = file.rel.split("/")[-6:-1]
    return _sku(hw, file, ctx), ctx.model(f"{org}/{name}", file), variant, int(tp[2:])


def _per_count(file: SourceFile, ctx: IngestContext, version: str,
               count: str) -> list[tuple[str, pl.DataFrame]]:
    """``dense.csv`` (cost per token) or ``per_sequence.csv`` (lm_head, sampler: per sequence)."""
    sku, model, _, tp = _profile_place(file, ctx)
    df = read_table(file, ["layer", count, "time_us"]).select(
        model=pl.lit(model), tp=pl.lit(tp), op="layer", op_family=_family("layer"),
        num_tokens=count, kv_len=pl.lit(0), latency_ms=pl.col("time_us") / 1e3,
    )
    return [("model_ops", provenance(df, file, SOURCE, sku, "vllm", version, "mean"))]


def _attention(file: SourceFile, ctx: IngestContext,
               version: str) -> list[tuple[str, pl.DataFrame]]:
    sku, model, variant, tp = _profile_place(file, ctx)
    if variant not in VARIANT_DTYPES:
        raise BuildError(f"{file.path}: unknown variant '{variant}'; map it in "
                         f"leaderboard/ingest/llmservingsim.py VARIANT_DTYPES")
    dtype, kv_dtype = VARIANT_DTYPES[variant]
    shape = ctx.models[model]
    df = read_table(file, ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"])
    decode = pl.col("prefill_chunk") == 0
    # A decode shot is n_decode sequences of one query token each. Otherwise batch counts the one
    # prefill sequence (q_len tokens after kv_prefill cached); decodes riding along in a mixed
    # shot are in n_decode / kv_decode.
    df = df.select(
        phase=pl.when(decode).then(pl.lit("decode"))
        .when(pl.col("n_decode") == 0).then(pl.lit("prefill")).otherwise(pl.lit("mixed")),
        model=pl.lit(model), tp=pl.lit(tp), dtype=pl.lit(dtype), kv_dtype=pl.lit(kv_dtype),
        batch=pl.when(decode).then(pl.col("n_decode")).otherwise(pl.lit(1)),
        q_len=pl.when(decode).then(pl.lit(1)).otherwise(pl.col("prefill_chunk")),
        kv_len=pl.when(decode).then(pl.col("kv_decode")).otherwise(pl.col("kv_prefill")),
        n_decode="n_decode", kv_decode="kv_decode", num_heads=pl.lit(shape["num_heads"]),
        num_kv_heads=pl.lit(shape["num_kv_heads"]), head_dim=pl.lit(shape["head_dim"]),
        window_size=pl.lit(0), latency_ms=pl.col("time_us") / 1e3,
    )
    return [("attention", provenance(df, file, SOURCE, sku, "vllm", version, "mean"))]


def _bench_place(file: SourceFile, ctx: IngestContext) -> tuple[str, str, str]:
    """(sku, run, model) from ``bench/examples/<hw>/<model>/vllm/<file>``."""
    hw, name = file.rel.split("/")[-4:-2]
    return _sku(hw, file, ctx), f"{hw}/{name}", ctx.model(name, file)


def _requests(file: SourceFile, ctx: IngestContext,
              version: str) -> list[tuple[str, pl.DataFrame]]:
    sku, run, model = _bench_place(file, ctx)
    times = ["arrival_time", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts"]
    df = read_table(file, ["request_id", "input_toks", "output_toks", *times]).select(
        "input_toks", "output_toks", *times, run=pl.lit(run), model=pl.lit(model),
        request_id=pl.col("request_id").cast(pl.String),
    )
    return [("serving_requests", provenance(df, file, SOURCE, sku, "vllm", version, "single"))]


def _timeseries(file: SourceFile, ctx: IngestContext,
                version: str) -> list[tuple[str, pl.DataFrame]]:
    sku, run, model = _bench_place(file, ctx)
    counters = ["prompt_throughput", "gen_throughput", "running", "waiting", "kv_cache_pct"]
    df = read_table(file, ["t", *counters]).select(
        *counters, run=pl.lit(run), model=pl.lit(model), t_s="t")
    return [("serving_timeseries", provenance(df, file, SOURCE, sku, "vllm", version, "single"))]


PROFILE = f"{ROOT}/profiler/perf/*/*/*/*/tp*"
BENCH = f"{ROOT}/bench/examples/*/*/vllm"
READERS = {
    f"{ROOT}/profiler/v0/perf_models/*/*/*/tp*/layers.csv": _v0_layers,
    f"{ROOT}/profiler/v0/perf_models/*/*/*/tp*/attention.csv": _v0_attention,
}
# Readers that need the vLLM version, with the meta file naming it (relative to the read file).
VERSIONED_READERS = {
    f"{PROFILE}/dense.csv": (partial(_per_count, count="tokens"), "../meta.yaml"),
    f"{PROFILE}/per_sequence.csv": (partial(_per_count, count="sequences"), "../meta.yaml"),
    f"{PROFILE}/attention.csv": (_attention, "../meta.yaml"),
    f"{BENCH}/requests.jsonl": (_requests, "meta.json"),
    f"{BENCH}/timeseries.csv": (_timeseries, "meta.json"),
}
META_PATTERNS = (f"{ROOT}/profiler/perf/*/*/*/*/meta.yaml", f"{BENCH}/meta.json")


def ingest(files: list[SourceFile], ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    by_rel = {f.rel: f for f in files}
    out = []
    for file in files:
        plain = next((r for p, r in READERS.items() if fnmatch(file.rel, p)), None)
        versioned = next((rv for p, rv in VERSIONED_READERS.items() if fnmatch(file.rel, p)), None)
        if plain is not None:
            out.extend(plain(file, ctx))
        elif versioned is not None:
            reader, meta_name = versioned
            out.extend(reader(file, ctx, _vllm_version(file, by_rel, meta_name)))
    return out


ADAPTER = Adapter(SOURCE, (*READERS, *VERSIONED_READERS, *META_PATTERNS), ingest)
