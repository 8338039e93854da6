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

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from PIL import Image  # noqa: E402

from leaderboard.cells.families import suffix_of as family  # noqa: E402
from leaderboard.store.catalog import StoreCatalog  # noqa: E402

PHASE_PANELS = ("prefill", "decode", "mixed")
SIGNED_RANGE = 50.0  # percent; colours saturate beyond, the annotated numbers do not
KEYS = ("predictor", "dataset", "sku", "split")
# Lineage op names of every source, mapped to the family they belong to; anything else is a
# light kernel (norms, activations, rotary embedding).
OP_FAMILIES = {"gemm": "gemm", "proj": "gemm", "attn_prefill": "attn_prefill",
               "attn_decode": "attn_decode", "attention": "attention", "attn": "attention",
               "allreduce": "collective", "moe": "moe", "step": "whole step"}
FAMILY_ORDER = ("gemm", "moe", "attn_prefill", "attn_decode", "attention", "collective",
                "light kernels", "whole step", "unknown")


def op_family(op: str) -> str:
    words = op.split("_")
    return (OP_FAMILIES.get(op) or OP_FAMILIES.get(words[0]) or OP_FAMILIES.get(words[-1])
            or "light kernels")


def dominant_op_families(datasets: list[str]) -> pl.DataFrame:
    """(dataset, cell_id, op_family) for the store's cells of ``datasets``."""
    if not datasets:
        return pl.DataFrame(schema={"dataset": pl.String, "cell_id": pl.String,
                                    "op_family": pl.String})
    with StoreCatalog() as catalog:
        return dominant_of(pl.concat([catalog.lineage(d) for d in datasets]))


def dominant_of(lineage: pl.DataFrame) -> pl.DataFrame:
    """(dataset, cell_id, op_family): the family with the largest share of each cell's measured
    time."""
    shares = lineage.group_by("dataset", "cell_id", "op").agg(
        ms=(pl.col("latency_ms") * pl.col("count")).sum())
    return (shares.with_columns(op_family=pl.col("op").map_elements(op_family, pl.String))
            .group_by("dataset", "cell_id", "op_family").agg(pl.col("ms").sum())
            .sort("ms", "op_family", descending=True).unique(["dataset", "cell_id"], keep="first")
            .select("dataset", "cell_id", "op_family"))


def _scored(predictions: pl.DataFrame) -> pl.DataFrame:
    # Cells without a finite prediction (INVALID runs) have no error to place.
    return predictions.filter(pl.col("signed_pct").is_finite())


def _error_stats() -> list[pl.Expr]:
    return [pl.len().alias("n"), pl.col("signed_pct").mean().alias("mean_signed_pct"),
            pl.col("signed_pct").abs().mean().alias("mape")]


def batch_context_table(predictions: pl.DataFrame, keys=KEYS) -> pl.DataFrame:
    """Per (keys, phase, batch bucket, context bucket): n, mean signed APE, MAPE. A bucket ``k``
    holds values in [2^k, 2^(k+1))."""
    context = (pl.when(pl.col("num_decode") > 0)
               .then(pl.col("decode_ctx_sum") / pl.col("num_decode"))
               .otherwise(pl.col("total_tokens") / pl.col("num_requests")))
    return (_scored(predictions)
            .with_columns(batch_bucket=pl.col("num_requests").log(2).floor().cast(pl.Int32),
                          context_bucket=context.log(2).floor().cast(pl.Int32))
            .group_by(*keys, "phase", "batch_bucket", "context_bucket").agg(_error_stats())
            .sort(*keys, "phase", "batch_bucket", "context_bucket"))


def op_family_table(predictions: pl.DataFrame, dominant: pl.DataFrame, keys=KEYS
                    ) -> pl.DataFrame:
    """Per (keys, dominant op family): n, mean signed APE, MAPE (all phases together)."""
    return (_scored(predictions).join(dominant, on=["dataset", "cell_id"], how="left")
            .with_columns(pl.col("op_family").fill_null("unknown"))
            .group_by(*keys, "op_family").agg(_error_stats()).sort(*keys, "op_family"))


def bucket_label(k: int) -> str:
    low = 2 ** k
    return str(low) if k == 0 else f"{low}-{2 * low - 1}"


def signed_heatmap(ax, values: np.ndarray, notes: dict[tuple[int, int], str],
                   row_labels: list[str], col_labels: list[str]):
    """``values`` (a signed error %, NaN where empty) coloured on the fixed scale; the image,
    for a colour bar. ``notes`` wait on the axes until ``annotate`` knows the laid-out box
    size. The step and per-op atlases share it, so their colours read the same."""
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#eeeeee")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=-SIGNED_RANGE,
                      vmax=SIGNED_RANGE, aspect="auto")
    step = max(1, -(-len(col_labels) // MAX_TICK_LABELS))  # every step-th label, so none overlap
    ax.set_xticks(range(len(col_labels)), [t if i % step == 0 else "" for i, t in
                                           enumerate(col_labels)], rotation=30, ha="right",
                  fontsize=9)
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=9)
    ax.atlas_notes = values, notes
    return image


def annotate(fig) -> None:
    """Each heatmap's notes, with as much of the text as fits a box once the figure is laid out
    (every line, the first only, or none: the colour still tells, and the atlas tables hold
    every number)."""
    if (engine := fig.get_layout_engine()) is not None:
        engine.execute(fig)  # each axes at its final size (no draw needed)
    # and kept, so the notes stay inside their boxes: no engine at all (not "none", a
    # placeholder for which savefig draws the whole figure once more before it renders), and
    # not one the user's matplotlib settings would put back in its place
    with matplotlib.rc_context({"figure.autolayout": False,
                                "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)
    for ax in fig.axes:
        values, notes = getattr(ax, "atlas_notes", (None, {}))
        if not notes:
            continue
        box = ax.get_window_extent()
        keep = _lines_that_fit(notes, box.width / values.shape[1], box.height / values.shape[0])
        for (r, c), text in notes.items():
            if keep:
                dark = abs(values[r, c]) > 0.6 * SIGNED_RANGE
                ax.text(c, r, "\n".join(text.split("\n")[:keep]), ha="center", va="center",
                        fontsize=NOTE_PT, color="white" if dark else "black", linespacing=0.95)


def _lines_that_fit(notes: dict, box_w: float, box_h: float) -> int:
    """How many leading lines of every note fit its box, the same for the whole panel (so a
    panel shows all its values or none, never a scattered few)."""
    split = [text.split("\n") for text in notes.values()]
    keep = max(map(len, split), default=0)
    while keep and (keep * LINE_PX > box_h or any(
            len(line) * CHAR_PX > box_w for lines in split for line in lines[:keep])):
        keep -= 1
    return keep


# Box annotations: 8 pt text at the figures' 72 dpi is about 5 px a character and 9 px a line,
# with a pixel of room either side.
NOTE_PT, CHAR_PX, LINE_PX, MAX_TICK_LABELS = 8, 6.0, 10.0, 9


def _heatmap(ax, table: pl.DataFrame, row_key: str, col_key: str, rows: list, cols: list,
             row_labels: list[str], col_labels: list[str]):
    """Mean signed APE coloured on the fixed scale, each filled box annotated with value and n."""
    values = np.full((len(rows), len(cols)), np.nan)
    notes = {}
    for rec in table.iter_rows(named=True):
        r, c = rows.index(rec[row_key]), cols.index(rec[col_key])
        values[r, c] = rec["mean_signed_pct"]
        notes[r, c] = f"{values[r, c]:+.0f}\nn={rec['n']}"
    return signed_heatmap(ax, values, notes, row_labels, col_labels)


def draw(title: str, cells: pl.DataFrame, families: pl.DataFrame, groups: list[str],
         family_groups: list[str], path: Path) -> Path:
    """A row of batch x context heatmaps (one per phase) for each of ``groups`` in ``cells``,
    and below them the heatmap of ``family_groups`` x op family from ``families``. One group
    (a run's GPU) gets its phases one under another, each the figure's width, so every box is
    wide enough to carry its number."""
    panels = ([(0, phase, row, slice(None)) for row, phase in enumerate(PHASE_PANELS)]
              if len(groups) == 1 else
              [(g, phase, g, col) for g in range(len(groups))
               for col, phase in enumerate(PHASE_PANELS)])
    rows = max(row for *_, row, _ in panels) + 1
    height_ratios = [3.0] * rows + [0.4 * len(family_groups) + 1.6]
    fig = plt.figure(figsize=(15, sum(height_ratios) + 1.2), dpi=72, layout="constrained")
    grid = fig.add_gridspec(rows + 1, 1 if len(groups) == 1 else len(PHASE_PANELS),
                            height_ratios=height_ratios)
    for g, phase, row, col in panels:
        group = groups[g]
        ax = fig.add_subplot(grid[row, col])
        panel = cells.filter((pl.col("group") == group) & (pl.col("phase") == phase))
        if panel.is_empty():
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"{group}\nno {phase} cells", ha="center", va="center",
                    transform=ax.transAxes, fontsize=10, color="gray")
            continue
        # Batch grows upwards: the first row is drawn at the top, so list buckets descending.
        batches = sorted(panel["batch_bucket"].unique(), reverse=True)
        contexts = sorted(panel["context_bucket"].unique())
        image = _heatmap(ax, panel, "batch_bucket", "context_bucket", batches, contexts,
                         [bucket_label(k) for k in batches],
                         [bucket_label(k) for k in contexts])
        ax.set_title(f"{group}: {phase}", fontsize=10)
        ax.set_ylabel("batch (requests)", fontsize=9)
        ax.set_xlabel("mean context per request (tokens)", fontsize=9)
    ax = fig.add_subplot(grid[rows, :])
    order = [f for f in FAMILY_ORDER if f in set(families["op_family"])]
    image = _heatmap(ax, families, "group", "op_family", family_groups, order, family_groups,
                     order)
    ax.set_title("by the op family that dominates each cell's measured time (all phases)",
                 fontsize=10)
    fig.colorbar(image, ax=fig.axes, shrink=0.35, extend="both",
                 label=f"mean signed APE %, colour clipped at ±{SIGNED_RANGE:.0f}%")
    fig.suptitle(f"{title}    (blue: predicted too fast, red: too slow; n = cells)",
                 fontsize=13)
    annotate(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    # A 256-colour palette keeps the committed images small (about a third of the RGBA size);
    # the figure uses far fewer colours than that.
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.open(buffer).convert("RGB").quantize(256).save(path, optimize=True)
    return path


def _display_order(item: tuple[str, str]) -> tuple:
    """(dataset, split) sort key: the vidur family (the main benchmark) first, home first."""
    dataset, split = item
    return family(dataset) != "vidur", family(dataset), split != "home_heldout", dataset


def _group_labels(predictions: pl.DataFrame) -> dict[str, str]:
    """dataset -> figure row: the home's held-out cells alone, the family's unseen GPUs pooled
    (their per-GPU tables are in the parquet files and the op-family panel)."""
    splits = dict(predictions.select("dataset", "split").unique().iter_rows())
    labels = {}
    for dataset, split in sorted(splits.items(), key=_display_order):
        if split == "home_heldout":
            labels[dataset] = f"{dataset} (home, held-out)"
        else:
            unseen = sorted(d.split("_")[0] for d, s in splits.items()
                            if s != "home_heldout" and family(d) == family(dataset))
            labels[dataset] = f"{family(dataset)} unseen ({', '.join(unseen)})"
    return labels


def write(predictions: pl.DataFrame, dominant: pl.DataFrame, out_dir: Path) -> dict[str, Path]:
    """Both tables per dataset as parquet (all predictors) and one PNG per predictor; returns the
    PNGs. PNGs of predictors no longer in the results are removed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, tbl in (("batch_context", batch_context_table(predictions)),
                      ("op_family", op_family_table(predictions, dominant))):
        # committed beside RESULTS.md: 0.01 pt is finer than any table shows, and keeps the
        # largest of them under 1 MB in git (full float64 noise made it 2.3 MB)
        tbl.with_columns(pl.col("mean_signed_pct", "mape").round(2)).write_parquet(
            out_dir / f"{name}.parquet", compression="zstd", compression_level=19)
    images = {}
    for (predictor,), mine in predictions.group_by("predictor", maintain_order=True):
        labels = _group_labels(mine)
        per_dataset = {d: f"{d} ({'home' if s == 'home_heldout' else 'unseen'})" for d, s in
                       sorted(mine.select("dataset", "split").unique().iter_rows(),
                              key=_display_order)}
        images[predictor] = draw(
            f"Error atlas: {predictor}",
            batch_context_table(mine.with_columns(group=pl.col("dataset").replace_strict(labels)),
                                ("group",)),
            op_family_table(mine.with_columns(group=pl.col("dataset").replace_strict(per_dataset)),
                            dominant, ("group",)),
            list(dict.fromkeys(labels.values())), list(per_dataset.values()),
            out_dir / f"{predictor}.png")
    for stale in set(out_dir.glob("*.png")) - set(images.values()):
        stale.unlink()
    return images


def write_run(predictions: pl.DataFrame, dominant: pl.DataFrame, dataset: str, path: Path
              ) -> Path:
    """The atlas of one run (one predictor on one GPU): for the run folder."""
    cells = predictions.with_columns(dataset=pl.lit(dataset), group=pl.lit(dataset))
    return draw(f"Error atlas: {dataset}", batch_context_table(cells, ("group",)),
                op_family_table(cells, dominant, ("group",)), [dataset], [dataset], path)

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
