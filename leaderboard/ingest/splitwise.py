"""splitwise-sim: real per-step wall-clock of Llama-2-70B and BLOOM-176B on DGX A100 and H100.

``prompt_time`` is one whole-batch prefill step, ``token_time`` one decode iteration, both ms,
about five repeats per point; every repeat is kept with its index. The ``h100-80gb-pcap`` rows are
synthetic (prompt_time exactly 1.30 x H100, token_time identical) and are excluded as known bad.
"""

from __future__ import annotations

import polars as pl

from leaderboard.ingest.base import Adapter, BuildError, IngestContext, provenance, read_table
from leaderboard.ingest.sources import SourceFile

SOURCE = "splitwise"
PATTERN = "Mutinifni__splitwise-sim/data/perf_model.csv"
HARDWARE_SKU = {"a100-80gb": "a100_sxm", "h100-80gb": "h100_sxm"}  # DGX boards: SXM
SYNTHETIC = {"h100-80gb-pcap": "synthetic power-capped rows: prompt_time = 1.30 x H100 exactly, "
                               "token_time identical to H100; not a measurement"}
SHAPE = ["model", "hardware", "tensor_parallel", "batch_size", "prompt_size", "token_size"]


def ingest(files: list[SourceFile], ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    out = []
    for file in files:
        df = read_table(file, [*SHAPE, "prompt_time", "token_time", "e2e_time"])
        unknown = set(df["hardware"].unique()) - set(HARDWARE_SKU) - set(SYNTHETIC)
        if unknown:
            raise BuildError(f"{file.path}: unknown hardware {sorted(unknown)}; map it in "
                             f"leaderboard/ingest/splitwise.py HARDWARE_SKU")
        models = {m: ctx.model(m, file) for m in df["model"].unique()}
        df = df.with_columns(repeat=pl.int_range(pl.len()).over(SHAPE)).select(
            model=pl.col("model").replace_strict(models), hardware="hardware",
            tp="tensor_parallel", batch_size="batch_size", prompt_size="prompt_size",
            token_size="token_size", repeat="repeat", prompt_time_ms="prompt_time",
            token_time_ms="token_time", e2e_time_ms="e2e_time", peak_power="peak_power",
            average_power="average_power",
        )
        for hardware, reason in SYNTHETIC.items():
            bad = provenance(df.filter(pl.col("hardware") == hardware), file, SOURCE, hardware,
                             "vllm", "unknown", "single")
            ctx.quarantine.add("step_wallclock", bad, "known_bad", "synthetic_rows", reason)
        for hardware, sku in HARDWARE_SKU.items():
            ctx.gpu(sku, file)
            rows = df.filter(pl.col("hardware") == hardware).drop("hardware")
            out.append(("step_wallclock",
                        provenance(rows, file, SOURCE, sku, "vllm", "unknown", "single")))
    return out


ADAPTER = Adapter(SOURCE, (PATTERN,), ingest)
