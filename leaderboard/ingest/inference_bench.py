"""LLM-Inference-Bench (argonne-lcf): end-to-end latency of one static batch, across vendors.

Each row is one offline run: ``Batch Size`` prompts of ``Input Output Length`` random tokens,
each generating exactly as many tokens, on ``Num of Hardware`` devices of ``Hardware`` with one
``Framework``; ``Latency`` is the whole batch's wall time in seconds. ``Plots/All_results.csv``
is the full set; several figure files repeat its rows (the figure CSVs are subsets with extra
columns), so every copy of a run enters ``e2e_runs`` and the store's duplicate rule settles
them: copies within ``quarantine.DUPLICATE_TOLERANCE`` collapse to their median and are
counted, copies that disagree are quarantined. ``Fig_21`` times the same runs with one output
token (time to first token). Figure files that vary another setting (KV cache off, block size,
speculative decoding, pipeline or expert parallelism, FP8) or give another measure are not
read; the build lists each with its reason. Every framework's rows are kept: the ``e2e``
family reads vLLM's (``leaderboard.cells.static_batches``).
"""

from __future__ import annotations

import polars as pl

from leaderboard.ingest.base import Adapter, IngestContext, provenance, read_table
from leaderboard.ingest.sources import SourceFile
from leaderboard_core.specs import model_by_alias

SOURCE = "inference_bench"
ROOT = "argonne-lcf__LLM-Inference-Bench/Plots/"
RUNS = ("All_results.csv", "Fig_10/All_results.csv", "Fig_29/All_results.csv",
        "Fig_16_a/power_results.csv", "Fig_16_b/power_results.csv",
        "Fig_16_a_b/power_results.csv")
FIRST_TOKEN = "Fig_21/all_results_TTFT.csv"
NOT_READ = {
    "Fig_1_b/": "TensorRT-LLM input-by-output heatmap of one GPU, no hardware column",
    "Fig_2_a/": "KV cache on and off (a setting the other rows leave at its default)",
    "Fig_2_b/": "KV cache block sizes (a setting the other rows leave at its default)",
    "Fig_3/": "FP8 weights and KV caches: checkpoints and dtypes the e2e family does not replay",
    "Fig_4_b/": "speculative decoding",
    "Fig_5_a/": "pipeline against tensor parallelism",
    "Fig_5_b/": "expert and pipeline parallelism",
    "Fig_18/": "SambaNova SN40L, another measure",
    "Fig_22/": "repeats Fig_21's TTFT and All_results' 1024-token batch-16 latencies",
}
# A Hardware label names the GPU whose spec lists it (``upstream_labels.inference_bench`` in
# conf/gpu). "Intel PVC GPU" rows run about 9x slower than the "Intel Max 1550" rows of the same
# models at batch 1: another setup, which no spec lists.
# vLLM's version per platform, from the upstream READMEs; the NVIDIA ones pin none.
VLLM_VERSION = {"AMD MI300X GPU": "0.6.1", "AMD MI250 GPU": "0.6.1", "Intel Max 1550": "0.5.2"}
# What a row's latency is, per platform, where its script was read: the A100's times one run
# after three warm-ups, the MI300X's averages 30 after 10; the others are unstated here.
STATISTIC = {"Nvidia A100 GPU": "single", "AMD MI300X GPU": "mean"}
BASE = ["Hardware", "Num of Hardware", "Framework", "Model", "Batch Size", "Latency"]


def labels(gpus: dict) -> dict[str, str]:
    """Each Hardware label of this source and the GPU whose spec lists it."""
    return {g.data["upstream_labels"][SOURCE]: sku for sku, g in gpus.items()
            if SOURCE in g.data.get("upstream_labels", {})}


NUMBERS = ("devices", "isl", "osl", "batch_size", "latency_ms")


def _number(frame: pl.DataFrame, column: str, dtype) -> pl.Expr:
    """``column`` as ``dtype``; a column the CSV reader took for text (a cell in it is not a
    number) is parsed cell by cell as a float, null where a cell is blank, does not read as a
    number or (for a count) is not a whole one: such rows are quarantined, never a crash of the
    build."""
    if frame.schema[column].is_numeric():
        return pl.col(column).cast(dtype)
    value = pl.col(column).str.strip_chars().cast(pl.Float64, strict=False)
    if dtype == pl.Float64:
        return value
    return pl.when(value == value.round()).then(value).cast(dtype, strict=False)


def _rows(frame: pl.DataFrame, isl: str, osl: str, aliases: dict[str, str],
          sku_of: dict[str, str]) -> pl.DataFrame:
    frame = frame.drop_nulls(BASE)  # the figure files separate their groups by blank lines
    return frame.select(
        hardware="Hardware", devices=_number(frame, "Num of Hardware", pl.Int64),
        framework="Framework", model_path="Model",
        model=pl.col("Model").str.to_lowercase().replace_strict(aliases, default=None),
        isl=_number(frame, isl, pl.Int64), osl=_number(frame, osl, pl.Int64),
        batch_size=_number(frame, "Batch Size", pl.Int64),
        latency_ms=_number(frame, "Latency", pl.Float64) * 1e3,
        sku=pl.col("Hardware").replace_strict(sku_of, default=None),
        statistic=pl.col("Hardware").replace_strict(STATISTIC, default="unstated"),
        backend=pl.col("Framework").str.to_lowercase(),
        backend_version=pl.when(pl.col("Framework") == "vLLM").then(
            pl.col("Hardware").replace_strict(VLLM_VERSION, default="unknown"))
        .otherwise(pl.lit("unknown")))


def ingest(files: list[SourceFile], ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    aliases, sku_of = model_by_alias(ctx.models), labels(ctx.gpus)
    out = []
    for file in files:
        name = file.rel.removeprefix(ROOT)
        if name in RUNS:
            frame = _rows(read_table(file, [*BASE, "Input Output Length"]),
                          "Input Output Length", "Input Output Length", aliases, sku_of)
        elif name == FIRST_TOKEN:
            frame = _rows(read_table(file, [*BASE, "Input Length", "Output Length"]),
                          "Input Length", "Output Length", aliases, sku_of)
        else:
            why = next((w for prefix, w in NOT_READ.items() if name.startswith(prefix)), None)
            ctx.skipped.append((file.rel, why or "not a file of end-to-end runs"))
            continue
        for sku in frame["sku"].drop_nulls().unique().sort():
            ctx.gpu(sku, file)
        per_row = frame.select("sku", "backend", "backend_version", "statistic")
        rows = provenance(frame.drop(per_row.columns), file, SOURCE, None, "", "", ""
                          ).with_columns(per_row)
        unread = pl.any_horizontal(pl.col(c).is_null() for c in NUMBERS)
        ctx.quarantine.add("e2e_runs", rows.filter(unread), "invalid", "unparsed_number",
                           f"a cell of {', '.join(NUMBERS)} is blank or not a number in "
                           f"{file.rel}")
        out.append(("e2e_runs", rows.filter(~unread)))
    return out


ADAPTER = Adapter(SOURCE, (f"{ROOT}*.csv",), ingest)
