"""The pictures of a predictor's site page (``leaderboard.present.site_pages``): predicted against
measured, its error against batch size and context length, and each GPU's own atlas.

All of them from its runs on the main step family (``MAIN``), where every predictor has runs
on the same unseen GPUs: the pages compare like with like. matplotlib draws at 72 to 110 dpi,
small files for a page that opens from ``file://``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from leaderboard.cells.families import MAIN

PHASES = (("prefill", "o"), ("decode", "s"), ("mixed", "^"))


def _plt():
    import matplotlib  # noqa: PLC0415 - only where a picture is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _unseen(name: str, predictions: pl.DataFrame) -> pl.DataFrame:
    return predictions.filter((pl.col("predictor") == name) & (pl.col("split") == "unseen")
                              & pl.col("dataset").str.ends_with(f"_{MAIN}")
                              & pl.col("valid") & pl.col("pred_ms").is_finite())


def scatter(out: Path, name: str, predictions: pl.DataFrame) -> list[str]:
    """Predicted against measured (log-log), one panel per unseen GPU, marked by phase."""
    plt = _plt()
    mine = _unseen(name, predictions)
    if mine.is_empty():
        return []
    datasets = sorted(set(mine["dataset"]))
    # fixed margins: a constrained layout of log axes was most of the site's build time
    figure, axes = plt.subplots(1, len(datasets), figsize=(max(3.2 * len(datasets), 6.4), 3.4),
                                squeeze=False)
    figure.subplots_adjust(left=0.06, right=0.99, bottom=0.16, top=0.84, wspace=0.35)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        cells = mine.filter(pl.col("dataset") == dataset)
        for phase, marker in PHASES:
            part = cells.filter(pl.col("phase") == phase)
            ax.scatter(part["gt_ms"], part["pred_ms"], s=4, marker=marker, label=phase, alpha=.5)
        low, high = float(cells["gt_ms"].min()), float(cells["gt_ms"].max())
        ax.plot([low, high], [low, high], color="black", linewidth=.8)
        ax.set(xscale="log", yscale="log", title=dataset, xlabel="measured ms",
               ylabel="predicted ms")
        ax.legend(fontsize=7, markerscale=2)
    errors = (mine["pred_ms"] / mine["gt_ms"] - 1).abs() * 100
    figure.suptitle(f"{name}: predicted against measured, unseen _{MAIN} GPUs (median |error| "
                    f"{errors.median():.1f} %)", fontsize=9)
    path = out / f"scatter-{name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return [path.name]


def error_profile(out: Path, name: str, predictions: pl.DataFrame) -> list[str]:
    """Median signed error (%) against batch size and against mean context per request (log2
    buckets), one panel per phase, one line per unseen GPU: where along each axis the error
    grows, which one number per phase hides."""
    plt = _plt()
    mine = _unseen(name, predictions)
    if mine.is_empty():
        return []
    context = (pl.when(pl.col("num_decode") > 0)
               .then(pl.col("decode_ctx_sum") / pl.col("num_decode"))
               .otherwise(pl.col("total_tokens") / pl.col("num_requests")))
    cells = mine.with_columns(
        batch=(2 ** pl.col("num_requests").log(2).floor()).cast(pl.Int64),
        context=(2 ** context.log(2).floor()).cast(pl.Int64),
        signed=(pl.col("pred_ms") / pl.col("gt_ms") - 1) * 100)
    figure, axes = plt.subplots(2, len(PHASES), figsize=(12, 6), squeeze=False)
    figure.subplots_adjust(left=0.06, right=0.99, bottom=0.09, top=0.9, wspace=0.25,
                           hspace=0.45)
    datasets = sorted(set(cells["dataset"]))
    for row, axis in enumerate(("batch", "context")):
        for col, (phase, marker) in enumerate(PHASES):
            ax = axes[row][col]
            part = cells.filter((pl.col("phase") == phase) & (pl.col(axis) > 0))
            if part.is_empty():
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"no {phase} cells", ha="center", va="center",
                        transform=ax.transAxes, color="gray")
                continue
            for dataset in datasets:
                line = (part.filter(pl.col("dataset") == dataset).group_by(axis)
                        .agg(pl.col("signed").median()).sort(axis))
                if len(line):
                    ax.plot(line[axis], line["signed"], marker=marker, markersize=3,
                            linewidth=1, label=dataset.removesuffix(f"_{MAIN}"))
            ax.axhline(0, color="black", linewidth=.6)
            ax.set(xscale="log", title=f"{phase}: against {axis}",
                   xlabel="batch (requests)" if axis == "batch" else "context per request "
                   "(tokens)", ylabel="median signed error %")
            ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
            if row == col == 0:
                ax.legend(fontsize=7)
    figure.suptitle(f"{name}: where the error grows, unseen _{MAIN} GPUs (above 0: predicted "
                    "too slow)", fontsize=10)
    path = out / f"profile-{name}.png"
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return [path.name]


def run_atlases(out: Path, name: str, runs: pl.DataFrame) -> list[str]:
    """Each of its main-family runs' own atlas (``atlas.png`` in the run folder, drawn with the
    run: one GPU, its phases one under another, every box numbered), home first."""
    mine = runs.filter((pl.col("predictor") == name) & (pl.col("family") == MAIN))
    images = []
    for dataset, folder in mine.sort(pl.col("split") != "home_heldout", "dataset").select(
            "dataset", "folder").iter_rows():
        source = Path(folder) / "atlas.png"
        if source.is_file():
            target = out / f"atlas-{name}-{dataset}.png"
            shutil.copy(source, target)
            images.append(target.name)
    return images


# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
