"""Does a GPU's FP8 GEMM table time FP8 as the engine runs it? A per-version sanity check.

On shapes where both precisions are compute-bound (m, n, k >= ``LARGE``: an arithmetic
intensity of thousands of FLOP per byte, far past every listed GPU's ridge point), an FP8 GEMM
should take about bf16 peak / FP8 peak of the bf16 time (0.5 on Hopper, Blackwell and Ada). A
table whose median ratio is more than ``TOLERANCE`` off that is a collector artefact, not FP8
(aiconfigurator's vLLM 0.14.0 collector built a static-scale FP8 layer by hand and skipped
``process_weights_after_loading``: its FP8 GEMMs run about twice as *slow* as bf16). The build
moves every FP8 row of a failing (GPU, version) table to ``quarantine`` with the ratio, so no
dataset is built on it; the ``_vidur_fp8`` card lists every table checked.
"""

from __future__ import annotations

import polars as pl

from leaderboard.cells.ops import MOE_DISTRIBUTION
from leaderboard_core.specs import FP8_BLOCK_TABLES, GpuSpec

LARGE = 8192
TOLERANCE = 0.20
SOURCE = "aiconfigurator"
REASON = "fp8_off_its_peak"
TABLE = "fp8_checks"  # the store's record of every check the build made
# The gemm table's dtype names of the two precisions compared.
BF16, FP8 = "bfloat16", "fp8"


def table_checks(gemm: pl.DataFrame, gpus: dict[str, GpuSpec]) -> pl.DataFrame:
    """One row per (sku, backend_version) holding both precisions at large shapes: the median
    FP8/bf16 time over those shapes, how many, the datasheet peak ratio and whether it passes.
    GPUs without an FP8 peak in their spec are not checked."""
    large = gemm.filter((pl.col("source") == SOURCE) & (pl.col("m") >= LARGE)
                        & (pl.col("n") >= LARGE) & (pl.col("k") >= LARGE))
    keys = ["sku", "backend_version", "m", "n", "k"]
    pairs = (large.filter(pl.col("dtype") == BF16).select(*keys, bf16="latency_ms")
             .join(large.filter(pl.col("dtype") == FP8).select(*keys, fp8="latency_ms"), on=keys))
    ratios = pairs.group_by("sku", "backend_version").agg(
        ratio=(pl.col("fp8") / pl.col("bf16")).median(), shapes=pl.len())
    peak = {sku: gpu.dense_tflops("bf16") / gpu.dense_tflops("fp8") for sku, gpu in gpus.items()
            if gpu.has_dense_peak("fp8") and gpu.has_dense_peak("bf16")}
    return (ratios.filter(pl.col("sku").is_in(list(peak)))
            .with_columns(peak_ratio=pl.col("sku").replace_strict(peak, return_dtype=pl.Float64))
            .with_columns(passes=(pl.col("ratio") / pl.col("peak_ratio") - 1).abs() <= TOLERANCE)
            .sort("sku", "backend_version"))


def detail(row: dict) -> str:
    return (f"median FP8/bf16 GEMM time {row['ratio']:.2f} over {row['shapes']} shapes with m, n, "
            f"k >= {LARGE}, against the datasheet peak ratio {row['peak_ratio']:.2f} (allowed "
            f"within {TOLERANCE:.0%})")


def quarantine_failing(gemm: pl.DataFrame, gpus: dict[str, GpuSpec], quarantine
                       ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``gemm`` without the FP8 rows of every table that fails the check (those go to
    ``quarantine`` with the measured ratio), and every table's check (``table_checks``), which
    the store keeps as ``TABLE`` for the cards."""
    checks = table_checks(gemm, gpus)
    for row in checks.filter(~pl.col("passes")).iter_rows(named=True):
        mine = ((pl.col("source") == SOURCE) & (pl.col("sku") == row["sku"])
                & (pl.col("backend_version") == row["backend_version"]) & (pl.col("dtype") == FP8))
        quarantine.add("gemm", gemm.filter(mine), "suspect", REASON, detail(row))
        gemm = gemm.filter(~mine)
    return gemm, checks


def block_ratios(con, sku: str) -> str:
    """Per backend version, the median block-scaled FP8 / bf16 time of ``sku``'s GEMMs (m, n,
    k >= ``LARGE``) and fused-MoE kernels (>= ``LARGE`` tokens, same expert shape and
    placement, balanced routing): a markdown table, for a card. Not a check: a block-scaled
    kernel also reads a scale per 128 x 128 block and no datasheet ratio bounds it."""
    rows = con.execute(f"""
        WITH g AS (SELECT backend_version v, dtype, m, n, k, latency_ms l FROM gemm
                   WHERE source = '{SOURCE}' AND sku = ? AND backend = 'vllm' AND m >= {LARGE}
                   AND n >= {LARGE} AND k >= {LARGE}),
             e AS (SELECT backend_version v, dtype, num_tokens, hidden_size, inter_size, topk,
                          num_experts, moe_tp, moe_ep, latency_ms l FROM moe
                   WHERE source = '{SOURCE}' AND sku = ? AND num_tokens >= {LARGE}
                   AND distribution = '{MOE_DISTRIBUTION}' AND backend = 'vllm'),
             gr AS (SELECT b.v, median(f.l / b.l) r, count(*) n FROM g b JOIN g f USING (v, m, n, k)
                    WHERE b.dtype = '{BF16}' AND f.dtype = '{FP8_BLOCK_TABLES}' GROUP BY b.v),
             er AS (SELECT b.v, median(f.l / b.l) r, count(*) n FROM e b
                    JOIN e f USING (v, num_tokens, hidden_size, inter_size, topk, num_experts,
                                    moe_tp, moe_ep)
                    WHERE b.dtype = '{BF16}' AND f.dtype = '{FP8_BLOCK_TABLES}' GROUP BY b.v)
        SELECT coalesce(gr.v, er.v) v, gr.r, gr.n, er.r, er.n FROM gr FULL JOIN er USING (v)
        ORDER BY v""", [sku, sku]).fetchall()
    if not rows:
        return f"(the store holds no block-scaled FP8 table of {sku} beside a bf16 one)"
    lines = ["| vLLM | GEMM block FP8 / bf16 (shapes) | fused MoE block FP8 / bf16 (points) |",
             "|---|---|---|"]
    for version, gemm, n_gemm, moe, n_moe in rows:
        lines.append(f"| {version} | " + " | ".join(
            "—" if r is None else f"{r:.2f} ({n:,})" for r, n in ((gemm, n_gemm), (moe, n_moe)))
            + " |")
    return "\n".join(lines)
