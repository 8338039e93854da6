"""NeuSight (sitar-lab): PyTorch FP32 GEMM and batched GEMM latency on eight GPUs.

``scripts/asplos/data/dataset/test/{linear,bmm}.csv``: one row per shape and device. NeuSight's
``collect.py`` times 25 calls with CUDA events and keeps the mean of the 5 fastest, in ms; TF32 is
off, so these are true FP32 SGEMMs. ``linear`` is ``torch.nn.Linear`` with its bias add.
"""

from __future__ import annotations

import polars as pl

from leaderboard.ingest.base import Adapter, BuildError, IngestContext, provenance, read_table
from leaderboard.ingest.sources import SourceFile

ROOT = "sitar-lab__NeuSight/scripts/asplos/data/dataset/test"
SOURCE = "neusight"
DEVICE_SKU = {
    "NVIDIA L4": "l4", "Tesla V100-PCIE-32GB": "v100", "NVIDIA A100-PCIE-40GB": "a100_40gb_pcie",
    "Tesla P100-PCIE-16GB": "p100", "Tesla T4": "t4", "Tesla P4": "p4",
    "NVIDIA H100 80GB HBM3": "h100_sxm", "NVIDIA A100 80GB PCIe": "a100_80gb_pcie",
}


def _gemm(file: SourceFile, ctx: IngestContext) -> tuple[str, pl.DataFrame]:
    df = read_table(file, ["OPName", "Latency", "Device", "Torch Version", "B", "M", "N", "K"])
    unknown = sorted(set(df["Device"].unique()) - set(DEVICE_SKU))
    if unknown:
        raise BuildError(f"{file.path}: unknown device(s) {unknown}; map them in "
                         f"leaderboard/ingest/neusight.py DEVICE_SKU")
    for device in df["Device"].unique():
        ctx.gpu(DEVICE_SKU[device], file)
    linear = pl.col("OPName") == "linear"
    # NeuSight multiplies (B, M, N) by (B, N, K), or applies Linear(N, K) to (B, M, N): N is the
    # reduction. A linear folds B into its rows: one (B*M) x N x K GEMM, not a batched one.
    gemm = df.select(
        op="OPName", dtype=pl.lit("float32"),
        batch=pl.when(linear).then(pl.lit(1)).otherwise(pl.col("B")),
        m=pl.when(linear).then(pl.col("B") * pl.col("M")).otherwise(pl.col("M")),
        n="K", k="N", latency_ms="Latency",
    )
    # Device and torch version vary by row: provenance sets literals, then each row gets its own.
    gemm = provenance(gemm, file, SOURCE, None, "pytorch", "unknown", "mean").with_columns(
        sku=df["Device"].replace_strict(DEVICE_SKU),
        backend_version=df["Torch Version"].str.strip_prefix("p"),  # NeuSight writes "p2.1.0"
    )
    return "gemm", gemm


def ingest(files: list[SourceFile], ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    return [_gemm(f, ctx) for f in files]


ADAPTER = Adapter(SOURCE, (f"{ROOT}/linear.csv", f"{ROOT}/bmm.csv"), ingest)
