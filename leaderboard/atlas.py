"""Error atlases: where a predictor is wrong, not only how wrong on average.

Two tables per predictor and dataset, each also drawn as a heatmap:

* **batch x context**, per phase: mean signed APE over log2 buckets of the batch size
  (``num_requests``) and of the mean context per request (decode requests' mean context when
  the step has any, else new tokens per request, i.e. the prompt length of a prefill);
* **op family**: predictions are whole steps, so there is no per-op error to show. Instead each
  cell is filed under the op family that takes the largest share of its *measured* time (from
  the store's ``cell_lineage``, which sums exactly to the ground truth): this shows whether a
  predictor fails on GEMM-bound, attention-bound or collective-bound steps. Wall-clock datasets
  (splitwise) have a single ``step`` lineage op and land in ``whole step``.

The colour scale is fixed and symmetric (``SIGNED_RANGE``), so images compare across predictors.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from leaderboard import store  # noqa: E402

PHASE_PANELS = ("prefill", "decode", "mixed")
SIGNED_RANGE = 50.0  # percent; colours saturate beyond, the annotated numbers do not
KEYS = ("predictor", "dataset", "sku", "split")
# Lineage op names of every source, mapped to the family they belong to; anything else is a
# light kernel (norms, activations, rotary embedding).
OP_FAMILIES = {"gemm": "gemm", "proj": "gemm", "attn_prefill": "attn_prefill",
               "attn_decode": "attn_decode", "attention": "attention", "attn": "attention",
               "allreduce": "collective", "step": "whole step"}
FAMILY_ORDER = ("gemm", "attn_prefill", "attn_decode", "attention", "collective", "light kernels",
                "whole step", "unknown")


def op_family(op: str) -> str:
    words = op.split("_")
    return (OP_FAMILIES.get(op) or OP_FAMILIES.get(words[0]) or OP_FAMILIES.get(words[-1])
            or "light kernels")


def dominant_op_families(datasets: list[str]) -> pl.DataFrame:
    """(dataset, cell_id, op_family): the family with the largest share of each cell's measured
    time."""
    with store.connect() as con:
        shares = con.sql("SELECT dataset, cell_id, op, sum(latency_ms * count) AS ms "
                         "FROM cell_lineage WHERE list_contains($datasets, dataset) GROUP BY ALL",
                         params={"datasets": datasets}).pl()
    return (shares.with_columns(op_family=pl.col("op").map_elements(op_family, pl.String))
            .group_by("dataset", "cell_id", "op_family").agg(pl.col("ms").sum())
            .sort("ms", descending=True).unique(["dataset", "cell_id"], keep="first")
            .select("dataset", "cell_id", "op_family"))


def _scored(predictions: pl.DataFrame) -> pl.DataFrame:
    # Cells without a finite prediction (INVALID runs) have no error to place.
    return predictions.filter(pl.col("signed_pct").is_finite())


def _error_stats() -> list[pl.Expr]:
    return [pl.len().alias("n"), pl.col("signed_pct").mean().alias("mean_signed_pct"),
            pl.col("signed_pct").abs().mean().alias("mape")]


def batch_context_table(predictions: pl.DataFrame) -> pl.DataFrame:
    """Per (predictor, dataset, phase, batch bucket, context bucket): n, mean signed APE, MAPE.
    A bucket ``k`` holds values in [2^k, 2^(k+1))."""
    context = (pl.when(pl.col("num_decode") > 0)
               .then(pl.col("decode_ctx_sum") / pl.col("num_decode"))
               .otherwise(pl.col("total_tokens") / pl.col("num_requests")))
    return (_scored(predictions)
            .with_columns(batch_bucket=pl.col("num_requests").log(2).floor().cast(pl.Int32),
                          context_bucket=context.log(2).floor().cast(pl.Int32))
            .group_by(*KEYS, "phase", "batch_bucket", "context_bucket").agg(_error_stats())
            .sort(*KEYS, "phase", "batch_bucket", "context_bucket"))


def op_family_table(predictions: pl.DataFrame, dominant: pl.DataFrame) -> pl.DataFrame:
    """Per (predictor, dataset, dominant op family): n, mean signed APE, MAPE (all phases)."""
    return (_scored(predictions).join(dominant, on=["dataset", "cell_id"], how="left")
            .with_columns(pl.col("op_family").fill_null("unknown"))
            .group_by(*KEYS, "op_family").agg(_error_stats()).sort(*KEYS, "op_family"))


def bucket_label(k: int) -> str:
    low = 2 ** k
    return str(low) if k == 0 else f"{low}-{2 * low - 1}"


def _annotated_heatmap(ax, values: np.ndarray, counts: np.ndarray, xlabels, ylabels, cmap):
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=-SIGNED_RANGE,
                      vmax=SIGNED_RANGE, aspect="auto", origin="lower")
    ax.set_xticks(range(len(xlabels)), xlabels, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=7)
    for (row, col), n in np.ndenumerate(counts):
        if n:
            value = values[row, col]
            dark = abs(value) > 0.6 * SIGNED_RANGE
            ax.text(col, row, f"{value:+.0f}\nn={n}", ha="center", va="center", fontsize=6,
                    color="white" if dark else "black", linespacing=0.9)
    return image


def _grid(table: pl.DataFrame, row_key: str, col_key: str, rows, cols):
    values = np.full((len(rows), len(cols)), np.nan)
    counts = np.zeros((len(rows), len(cols)), dtype=int)
    for rec in table.iter_rows(named=True):
        r, c = rows.index(rec[row_key]), cols.index(rec[col_key])
        values[r, c], counts[r, c] = rec["mean_signed_pct"], rec["n"]
    return values, counts


def draw(predictor: str, cells: pl.DataFrame, families: pl.DataFrame, datasets: list[str],
         path: Path) -> Path:
    """One figure per predictor: a row per dataset, a column per phase (batch x context), and
    below them the dataset x op-family heatmap."""
    cmap = plt.get_cmap("RdBu_r").copy()
    cmap.set_bad("#eeeeee")
    height_ratios = [2.2] * len(datasets) + [0.45 * len(datasets) + 1.2]
    fig = plt.figure(figsize=(14, sum(height_ratios) + 1.0), dpi=72, layout="constrained")
    grid = fig.add_gridspec(len(datasets) + 1, len(PHASE_PANELS), height_ratios=height_ratios)
    split_of = dict(cells.select("dataset", "split").unique().iter_rows())
    image = None
    for col, phase in enumerate(PHASE_PANELS):
        panel = cells.filter(pl.col("phase") == phase)
        batches = sorted(panel["batch_bucket"].unique())
        contexts = sorted(panel["context_bucket"].unique())
        for row, dataset in enumerate(datasets):
            ax = fig.add_subplot(grid[row, col])
            here = panel.filter(pl.col("dataset") == dataset)
            if here.is_empty():
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{dataset}: no {phase} cells", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8, color="gray")
                continue
            values, counts = _grid(here, "batch_bucket", "context_bucket", batches, contexts)
            image = _annotated_heatmap(ax, values, counts, [bucket_label(k) for k in contexts],
                                       [bucket_label(k) for k in batches], cmap)
            split = "home held-out" if split_of.get(dataset) == "home_heldout" else "unseen"
            ax.set_title(f"{dataset} ({split}) - {phase}", fontsize=9)
            ax.set_ylabel("batch (requests)", fontsize=7)
            ax.set_xlabel("mean context per request (tokens)", fontsize=7)
    ax = fig.add_subplot(grid[len(datasets), :])
    present = set(families["op_family"])
    order = [f for f in FAMILY_ORDER if f in present]
    values, counts = _grid(families, "dataset", "op_family", datasets, order)
    image = _annotated_heatmap(ax, values, counts, order, datasets, cmap)
    ax.set_title("by the op family dominating each cell's measured time (all phases)", fontsize=9)
    fig.colorbar(image, ax=fig.axes, shrink=0.4, extend="both",
                 label=f"mean signed APE %, (pred - measured) / measured; colour clipped at "
                       f"±{SIGNED_RANGE:.0f}%")
    fig.suptitle(f"Error atlas: {predictor} (blue: predicts too fast, red: too slow)",
                 fontsize=12)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write(predictions: pl.DataFrame, dominant: pl.DataFrame, datasets: list[str],
          out_dir: Path) -> dict[str, Path]:
    """Both tables as parquet (all predictors) and one PNG per predictor; returns the PNGs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cells = batch_context_table(predictions)
    families = op_family_table(predictions, dominant)
    cells.write_parquet(out_dir / "batch_context.parquet")
    families.write_parquet(out_dir / "op_family.parquet")
    images = {}
    for predictor in sorted(cells["predictor"].unique()):
        mine = [d for d in datasets if d in set(cells.filter(pl.col("predictor") == predictor)
                                                ["dataset"])]
        images[predictor] = draw(predictor, cells.filter(pl.col("predictor") == predictor),
                                 families.filter(pl.col("predictor") == predictor), mine,
                                 out_dir / f"{predictor}.png")
    for stale in set(out_dir.glob("*.png")) - set(images.values()):
        stale.unlink()  # a predictor no longer in the results must not linger in RESULTS.md
    return images
