"""The per-op atlas: where a predictor's step error comes from, op by op and GPU by GPU.

A predictor that splits its step prediction (``Predictor.predict_by_op``) has each part filed
beside the step prediction as a ``op_ms_<op>`` column of the run's predictions. Where a part
carries a lineage op name, it is set against the measured time of that op in the same cell: the
sum of ``latency_ms x count`` of the cell's lineage rows of that op, which is what the step's
ground truth sums. Per (predictor, dataset, op): the op's share of the measured step time, the
median and the 10th/90th percentile of predicted / measured over the cells holding the op, and
its MAPE. A part with no lineage op of its name (light kernels, a host term) is not placed.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from leaderboard.atlas import signed_heatmap  # noqa: E402
from leaderboard.catalog import StoreCatalog  # noqa: E402
from leaderboard_core.contract import BY_OP_PREFIX  # noqa: E402
from leaderboard_core.report_tables import table as markdown_table  # noqa: E402

KEYS = ("predictor", "dataset", "split")


def measured_by_op(datasets: list[str]) -> pl.DataFrame:
    """(dataset, cell_id, op, measured_ms) from the store's lineage of ``datasets``."""
    if not datasets:
        return pl.DataFrame(schema={"dataset": pl.String, "cell_id": pl.String, "op": pl.String,
                                    "measured_ms": pl.Float64})
    with StoreCatalog() as catalog:
        lineage = pl.concat([catalog.lineage(d) for d in datasets])
    return of_lineage(lineage)


def of_lineage(lineage: pl.DataFrame) -> pl.DataFrame:
    return lineage.group_by("dataset", "cell_id", "op").agg(
        measured_ms=(pl.col("latency_ms") * pl.col("count")).sum())


def table(predictions: pl.DataFrame, measured: pl.DataFrame) -> pl.DataFrame:
    """Per (predictor, dataset, split, op): n cells, share % of the measured step time, the
    ratio predicted / measured (median, p10, p90) and MAPE %, for runs with per-op parts."""
    parts = [c for c in predictions.columns if c.startswith(BY_OP_PREFIX)]
    if not parts:
        return pl.DataFrame()
    valid = pl.col("valid") if "valid" in predictions.columns else pl.lit(True)
    scored = predictions.filter(pl.col("pred_ms").is_finite() & valid)
    total = scored.group_by(*KEYS).agg(step_ms=pl.col("gt_ms").sum())
    long = (scored.select(*KEYS, "cell_id", *parts)
            .unpivot(index=[*KEYS, "cell_id"], on=parts, variable_name="op", value_name="pred_ms")
            .drop_nulls("pred_ms")
            .with_columns(pl.col("op").str.strip_prefix(BY_OP_PREFIX))
            .join(measured, on=["dataset", "cell_id", "op"], how="inner")
            .with_columns(ratio=pl.col("pred_ms") / pl.col("measured_ms")))
    return (long.group_by(*KEYS, "op")
            .agg(n=pl.len(), op_ms=pl.col("measured_ms").sum(),
                 ratio_median=pl.col("ratio").median(),
                 ratio_p10=pl.col("ratio").quantile(0.1, "linear"),
                 ratio_p90=pl.col("ratio").quantile(0.9, "linear"),
                 mape=((pl.col("ratio") - 1).abs().mean() * 100))
            .join(total, on=list(KEYS))
            .with_columns(share_pct=pl.col("op_ms") / pl.col("step_ms") * 100)
            .drop("op_ms", "step_ms").sort(*KEYS, "op"))


def draw(tbl: pl.DataFrame, predictor: str, path: Path) -> Path:
    """Op x dataset heatmap of the median signed error (ratio - 1), annotated with it and the
    op's MAPE, on the step atlas' fixed colour scale."""
    mine = tbl.filter(pl.col("predictor") == predictor)
    ops, datasets = sorted(set(mine["op"])), sorted(set(mine["dataset"]))
    values = np.full((len(ops), len(datasets)), np.nan)
    notes = {}
    for r in mine.iter_rows(named=True):
        i, j = ops.index(r["op"]), datasets.index(r["dataset"])
        values[i, j] = (r["ratio_median"] - 1) * 100
        notes[i, j] = f"{values[i, j]:+.0f}\n{r['mape']:.0f}"
    fig, ax = plt.subplots(figsize=(1.3 * len(datasets) + 3, 0.55 * len(ops) + 1.8), dpi=72,
                           layout="constrained")
    image = signed_heatmap(ax, values, notes, ops, datasets)
    ax.set_title(f"Per-op error: {predictor} (median predicted / measured - 1, %; below: MAPE %)",
                 fontsize=10)
    fig.colorbar(image, ax=ax, shrink=0.8, label="median signed error %")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def section(mine: pl.DataFrame, family: str, images: dict[str, Path], relative) -> list[str]:
    """The report's per-op section for ``family``'s datasets (``mine``, the per-op table of
    them): one table per predictor (rows: op; columns: dataset; each entry median ratio and
    MAPE) and its picture."""
    lines = ["## Where the error is, per op", "",
             f"For predictors that split their step prediction by op, on the `{family}` datasets: "
             "each part against the measured time of the same op in the same cell (the cell's "
             "lineage). Entry: median predicted / measured (×), the op's MAPE %, and its share of "
             "the measured step time. All predictors' and datasets' "
             "numbers: `op_atlas.parquet` beside the atlas images.", ""]
    for (predictor,), rows in mine.group_by("predictor", maintain_order=True):
        datasets = sorted(set(rows["dataset"]))
        header = ["op", *(f"{d} (home)" if rows.filter(
            (pl.col("dataset") == d) & (pl.col("split") == "home_heldout")).height else d
                          for d in datasets)]
        body = []
        for op in sorted(set(rows["op"])):
            cells = {r["dataset"]: r for r in rows.filter(pl.col("op") == op).iter_rows(named=True)}
            body.append([op, *(f"×{cells[d]['ratio_median']:.2f} ({cells[d]['mape']:.0f} %, "
                               f"share {cells[d]['share_pct']:.0f} %)" if d in cells else "—"
                               for d in datasets)])
        lines += [f"### {predictor}", "", *markdown_table(header, body, "l" + "r" * len(datasets))]
        if predictor in images:
            lines += [f"![per-op error of {predictor}]({relative(images[predictor])})", ""]
    return lines


def write(predictions: pl.DataFrame, family: str, atlas_dir: Path, relative) -> list[str]:
    """Compute the per-op table of ``predictions`` (all datasets to parquet), draw one picture
    per predictor on ``family``'s datasets, and return the report section."""
    parts = [c for c in predictions.columns if c.startswith(BY_OP_PREFIX)]
    if not parts:
        return []
    split = predictions.filter(pl.any_horizontal(pl.col(parts).is_not_null()))
    tbl = table(split, measured_by_op(sorted(set(split["dataset"]))))
    if tbl.is_empty():
        return []
    atlas_dir.mkdir(parents=True, exist_ok=True)
    tbl.write_parquet(atlas_dir / "op_atlas.parquet")
    mine = tbl.filter(pl.col("dataset").str.ends_with(f"_{family}"))
    for stale in (atlas_dir / "ops").glob("*.png"):
        stale.unlink()
    images = {p: draw(mine, p, atlas_dir / "ops" / f"{p}.png") for p in sorted(set(mine["predictor"]))}
    return section(mine, family, images, relative)

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
