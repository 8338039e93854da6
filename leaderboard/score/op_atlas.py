"""The per-op atlas: where a predictor's step error comes from, op by op and GPU by GPU.

A predictor that splits its step prediction (``Predictor.predict_by_op``) has each part filed
beside the step prediction as a ``op_ms_<op>`` column of the run's predictions. Where a part
carries a lineage op name, it is set against the measured time of that op in the same cell: the
sum of ``latency_ms x count`` of the cell's lineage rows of that op, which is what the step's
ground truth sums. Per (predictor, dataset, op): the op's share of the measured step time, the
median and the 10th/90th percentile of predicted / measured over the cells holding the op, and
its MAPE. A part with no lineage op of its name (light kernels, a host term) is not placed.
Per phase, each op's error in units of its step (``by_phase``): which ops carry a phase's error.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from leaderboard.score.atlas import annotate, signed_heatmap  # noqa: E402
from leaderboard.store.catalog import StoreCatalog  # noqa: E402
from leaderboard_core.contract import BY_OP_PREFIX  # noqa: E402
from leaderboard_core.report_tables import table as markdown_table  # noqa: E402

KEYS = ("predictor", "dataset", "split")
PHASES = ("prefill", "decode")  # the phases with targets; mixed cells are composed (design.md)


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


def _paired(predictions: pl.DataFrame, measured: pl.DataFrame, keys: tuple[str, ...]):
    """(the valid scored rows, one row per (cell, placed op) with its predicted and measured
    ms beside the cell's ``keys`` and step ``gt_ms``), or None for runs with no per-op parts."""
    parts = [c for c in predictions.columns if c.startswith(BY_OP_PREFIX)]
    if not parts:
        return None
    valid = pl.col("valid") if "valid" in predictions.columns else pl.lit(True)
    scored = predictions.filter(pl.col("pred_ms").is_finite() & valid)
    long = (scored.select(*keys, "cell_id", "gt_ms", *parts)
            .unpivot(index=[*keys, "cell_id", "gt_ms"], on=parts, variable_name="op",
                     value_name="pred_ms")
            .drop_nulls("pred_ms")
            .with_columns(pl.col("op").str.strip_prefix(BY_OP_PREFIX))
            .join(measured, on=["dataset", "cell_id", "op"], how="inner"))
    return scored, long


def table(predictions: pl.DataFrame, measured: pl.DataFrame) -> pl.DataFrame:
    """Per (predictor, dataset, split, op): n cells, share % of the measured step time, the
    ratio predicted / measured (median, p10, p90) and MAPE %, for runs with per-op parts."""
    paired = _paired(predictions, measured, KEYS)
    if paired is None:
        return pl.DataFrame()
    scored, long = paired
    total = scored.group_by(*KEYS).agg(step_ms=pl.col("gt_ms").sum())
    ratio = pl.col("pred_ms") / pl.col("measured_ms")
    return (long.group_by(*KEYS, "op")
            .agg(n=pl.len(), op_ms=pl.col("measured_ms").sum(),
                 ratio_median=ratio.median(),
                 ratio_p10=ratio.quantile(0.1, "linear"),
                 ratio_p90=ratio.quantile(0.9, "linear"),
                 mape=((ratio - 1).abs().mean() * 100))
            .join(total, on=list(KEYS))
            .with_columns(share_pct=pl.col("op_ms") / pl.col("step_ms") * 100)
            .drop("op_ms", "step_ms").sort(*KEYS, "op"))


def by_phase(predictions: pl.DataFrame, measured: pl.DataFrame) -> pl.DataFrame:
    """Per (predictor, dataset, split, phase, op): each op's error in units of its step, the
    scale of the step's MAPE. Over the phase's cells (a cell without the op adds 0): the mean of
    |predicted - measured| of the op over the step's measured time (``abs_pct``; a step's APE is
    at most the sum over its ops, plus its unplaced parts) and the same signed (``signed_pct``)."""
    keys = (*KEYS, "phase")
    paired = _paired(predictions, measured, keys)
    if paired is None:
        return pl.DataFrame()
    scored, long = paired
    cells = scored.group_by(*keys).agg(cells=pl.len())
    error = (pl.col("pred_ms") - pl.col("measured_ms")) / pl.col("gt_ms") * 100
    return (long.group_by(*keys, "op")
            .agg(abs_sum=error.abs().sum(), signed_sum=error.sum())
            .join(cells, on=list(keys))
            .select(*keys, "op", abs_pct=pl.col("abs_sum") / pl.col("cells"),
                    signed_pct=pl.col("signed_sum") / pl.col("cells"))
            .sort(*keys, "op"))


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
    annotate(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _op_rows(rows: pl.DataFrame, datasets: list[str], entry, label=str) -> list[list[str]]:
    """One markdown row per op of ``rows``: ``label(op)``, then ``entry(row)`` per dataset."""
    out = []
    for op in sorted(set(rows["op"])):
        cells = {r["dataset"]: r for r in rows.filter(pl.col("op") == op).iter_rows(named=True)}
        out.append([label(op), *(entry(cells[d]) if d in cells else "—" for d in datasets)])
    return out


def _phase_rows(phases: pl.DataFrame, predictor: str, datasets: list[str]) -> list[list[str]]:
    mine = phases.filter(pl.col("predictor") == predictor)
    return [row for phase in PHASES for row in _op_rows(
        mine.filter(pl.col("phase") == phase), datasets,
        lambda r: f"{r['abs_pct']:.1f} ({r['signed_pct']:+.1f})", lambda op, phase=phase: f"{phase}: {op}")]


def section(mine: pl.DataFrame, family: str, images: dict[str, Path], relative,
            phases: pl.DataFrame) -> list[str]:
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
        body = _op_rows(rows, datasets, lambda r: f"×{r['ratio_median']:.2f} ({r['mape']:.0f} %, "
                                                  f"share {r['share_pct']:.0f} %)")
        lines += [f"### {predictor}", "", *markdown_table(header, body, "l" + "r" * len(datasets))]
        if predictor in images:
            lines += [f"![per-op error of {predictor}]({relative(images[predictor])})", ""]
        by_phase_rows = _phase_rows(phases, predictor, datasets)
        if by_phase_rows:
            lines += [f"Which ops carry {predictor}'s error, by phase: each op's mean |predicted "
                      "- measured| in % of its step's measured time (signed in brackets); a "
                      "step's error is at most the sum over its ops.", "",
                      *markdown_table(["phase: op", *header[1:]], by_phase_rows,
                                      "l" + "r" * len(datasets))]
    return lines


def write(predictions: pl.DataFrame, family: str, atlas_dir: Path, relative) -> list[str]:
    """Compute the per-op table of ``predictions`` (all datasets to parquet), draw one picture
    per predictor on ``family``'s datasets, and return the report section."""
    parts = [c for c in predictions.columns if c.startswith(BY_OP_PREFIX)]
    if not parts:
        return []
    split = predictions.filter(pl.any_horizontal(pl.col(parts).is_not_null()))
    measured = measured_by_op(sorted(set(split["dataset"])))
    tbl, phases = table(split, measured), by_phase(split, measured)
    if tbl.is_empty():
        return []
    atlas_dir.mkdir(parents=True, exist_ok=True)
    tbl.write_parquet(atlas_dir / "op_atlas.parquet")
    phases.write_parquet(atlas_dir / "op_by_phase.parquet")
    in_family = pl.col("dataset").str.ends_with(f"_{family}")
    mine = tbl.filter(in_family)
    for stale in (atlas_dir / "ops").glob("*.png"):
        stale.unlink()
    images = {p: draw(mine, p, atlas_dir / "ops" / f"{p}.png") for p in sorted(set(mine["predictor"]))}
    return section(mine, family, images, relative, phases.filter(in_family))

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
