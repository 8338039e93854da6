"""The first screen of RESULTS.md, and the sections the report keeps in step with the store.

``headline``: per step family, the best predictor of each kind (datasheet only, with a deploy
reading, profiled on the home) by its GPU-mean MAPE over the family's unseen GPUs, with a
bootstrap CI over workloads. ``cell_datasets``: the cells per phase of every dataset, read from
the store the runs were scored on. ``store_build``: the store build benchmark, from the JSON
``benchmarks/build_store.py`` writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard.cells import families
from leaderboard.ingest import BuildError
from leaderboard.ingest.sources import SourceError
from leaderboard.score import metrics, ranking
from leaderboard.store import database
from leaderboard_core import paths
from leaderboard_core.report_tables import datasets_of, fmt, table

BUILD_JSON = paths.REPO_ROOT / "benchmarks" / "build_store.json"
# What a predictor takes beyond the target's datasheet, as the headline groups them.
KINDS = ("datasheet only", "with a deploy reading", "profiled on the home")


def kind_of(run: dict) -> str:
    """``datasheet only`` (reads no measurement of the home or the target), ``with a deploy
    reading`` (reads a capped few of the target's rows) or ``profiled on the home`` (fits the
    home's measured rows)."""
    if (run["profiled_rows"] or 0) > 0:
        return KINDS[1]
    return KINDS[2] if json.loads(run["card"])["needs_profiled_rows"] else KINDS[0]


def gpu_mean_ci(predictions: pl.DataFrame, samples: int = ranking.BOOTSTRAP_SAMPLES,
                seed: int = 0) -> tuple[float, float, float]:
    """The mean over GPUs of each GPU's MAPE, and its percentile bootstrap CI over workloads
    (one draw of workloads per resample, applied to every GPU). Needs dataset, workload_id and
    signed_pct."""
    ape = (predictions.filter(pl.col("signed_pct").is_finite())
           .group_by("dataset", "workload_id")
           .agg(ape_sum=pl.col("signed_pct").abs().sum(), cells=pl.len()))
    workloads = ape["workload_id"].unique().sort().to_list()
    index = {w: i for i, w in enumerate(workloads)}
    weights = np.random.default_rng(seed).multinomial(
        len(workloads), np.full(len(workloads), 1 / len(workloads)), size=samples).astype(float)
    point, resampled = [], []
    for (_,), group in ape.group_by("dataset", maintain_order=True):
        sums, cells = np.zeros(len(workloads)), np.zeros(len(workloads))
        at = [index[w] for w in group["workload_id"]]
        sums[at], cells[at] = group["ape_sum"].to_numpy(), group["cells"].to_numpy()
        point.append(sums.sum() / cells.sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            resampled.append((weights @ sums) / (weights @ cells))
    tail = (1 - ranking.CONFIDENCE) / 2 * 100
    low, high = np.nanpercentile(np.mean(resampled, axis=0), [tail, 100 - tail])
    return float(np.mean(point)), float(low), float(high)


def headline(runs: pl.DataFrame, predictions: pl.DataFrame,
             serving_rows: list[list[str]] = ()) -> list[str]:
    """Per step family and kind, the predictor with the lowest GPU-mean unseen MAPE over
    ``all`` among those with a VALID run on every unseen GPU of the family; ``serving_rows``
    (a serving family's, in the same columns: ``e2e_section.headline_rows``) follow."""
    rows = []
    if predictions.is_empty() and not serving_rows:
        return ["## Headline", "", "No current sealed step runs to rank yet.", ""]
    for fam in families.where(level="step", leaderboard=True) if len(predictions) else ():
        homes, unseen = datasets_of(runs, fam.suffix)
        scored = predictions.filter(pl.col("dataset").is_in(unseen) & metrics.in_all(predictions))
        rows += family_rows(fam.suffix, runs, unseen, scored, ", ".join(homes))
    rows += serving_rows
    return ["## Headline", "",
            "Per dataset family, the best predictor of each kind by its **GPU-mean MAPE**: the "
            "mean over the family's unseen GPUs of each GPU's MAPE over `all` (the same number "
            "as the `GPU-mean MAPE` column below; for `e2e (across vendors)` over end-to-end "
            "latency), with a "
            f"{ranking.CONFIDENCE:.0%} percentile bootstrap CI over workloads "
            f"({ranking.BOOTSTRAP_SAMPLES} resamples, seed 0). `datasheet only`: reads no "
            "measurement of the target and fits nothing on the home's rows; `with a deploy "
            "reading`: reads a capped few target rows (never scored); `profiled on the home`: "
            "fits the home GPU's measured rows. Sealed runs only.", "",
            *table(["family", "kind", "best predictor", "GPU-mean MAPE %", "95% CI",
                    "unseen GPUs", "cells", "home"], rows, "lllrrrrl")]


def family_rows(label: str, runs: pl.DataFrame, unseen: list[str], scored: pl.DataFrame,
                homes: str) -> list[list[str]]:
    """The headline rows of one family, one per kind: among the predictors with a VALID run
    on every ``unseen`` GPU, the one with the lowest GPU-mean MAPE over ``scored`` (their
    predictions on those GPUs, in the phase the family ranks by)."""
    mine = runs.filter(pl.col("dataset").is_in(unseen))
    complete = mine.group_by("predictor").agg(pl.col("valid").all(), pl.len()).filter(
        pl.col("valid") & (pl.col("len") == len(unseen)))["predictor"]
    best: dict[str, tuple] = {}
    for predictor in sorted(complete):
        run = mine.filter(pl.col("predictor") == predictor).row(0, named=True)
        cells = scored.filter(pl.col("predictor") == predictor)
        if cells.is_empty():
            continue
        mean, low, high = gpu_mean_ci(cells)
        kind = kind_of(run)
        # a tie (a ladder rung equal to ``ours``, summed in another order) keeps the
        # first by name, so the table does not flip on the last bits of a float
        if kind not in best or mean < best[kind][1] * (1 - 1e-9):
            best[kind] = (predictor, mean, low, high, len(cells))
    rows = []
    for kind in KINDS:
        if kind in best:
            p, mean, low, high, n = best[kind]
            rows.append([label, kind, p, fmt(mean), f"{fmt(low)} – {fmt(high)}",
                         str(len(unseen)), f"{n:,}", homes])
        else:
            rows.append([label, kind, "none with a VALID run on every unseen GPU",
                         "—", "—", str(len(unseen)), "—", homes])
    return rows


def cell_datasets() -> list[str]:
    """Every cell and serving dataset of the store: its rows per phase and, for cells, how many
    of those ``all`` scores are measured uniform filler rather than replayed steps."""
    try:
        with database.connect() as con:
            found = con.execute("SELECT name, kind, sku, rows, phases FROM datasets WHERE kind "
                                "IN ('cells', 'serving') ORDER BY kind, name").fetchall()
            filler = {d: (n, uniform, steps) for d, n, uniform, steps in con.execute(
                "SELECT dataset, count(*), count(*) FILTER (WHERE coalesce(weight, 0) = 0), "
                "sum(coalesce(weight, 0)) FROM cells WHERE NOT coalesce(composed, false) "
                "GROUP BY dataset").fetchall()}
    except (SourceError, BuildError) as exc:  # a report over copied runs, with no store here
        return ["## Cell datasets", "", f"No store to read: {str(exc).splitlines()[0]}", ""]
    rows = []
    for name, kind, sku, n, phases in found:
        by_phase = json.loads(phases) if phases else {}
        in_all, uniform, steps = filler.get(name, (None, None, None))
        rows.append([name, kind, sku, f"{n:,}",
                     ", ".join(f"{p} {c:,}" for p, c in by_phase.items()) or "—",
                     "—" if in_all is None else f"{in_all:,}",
                     "—" if not in_all else f"{uniform:,} ({uniform / in_all:.0%})",
                     "—" if not steps else f"{steps:,}"])
    return ["## Cell datasets", "",
            "Read from the store these runs were scored on (`python -m leaderboard.data list` "
            "prints the same, with each dataset's home; `data card NAME` its card). `in all`: "
            "the cells `all` scores (not `composed`); `filler`: those of them that are measured "
            "uniform batches (weight 0) rather than replayed steps; `replayed steps`: how many "
            "steps the trace replays produced, which `traffic` weighs by. A family without "
            "replay weights (Vidur's profiles) has no filler column.", "",
            *table(["dataset", "kind", "GPU", "rows", "per phase", "in all", "filler in all",
                    "replayed steps"], rows, "lllrlrrr")]


def store_build(path: Path = BUILD_JSON) -> list[str]:
    if not path.exists():
        return ["## Store build benchmark", "", f"No benchmark result at `{path.name}` yet "
                "(`python benchmarks/build_store.py --json benchmarks/build_store.json`).", ""]
    bench = json.loads(path.read_text())
    secs, rss = [r["seconds"] for r in bench["runs"]], [r["rss_mib"] for r in bench["runs"]]
    met = lambda ok: "met" if ok else "**MISSED**"  # noqa: E731
    return ["## Store build benchmark", "",
            f"`python benchmarks/build_store.py --json benchmarks/build_store.json`: "
            f"`python -m leaderboard.data build`, {len(secs)} runs, each a fresh process into "
            f"a fresh temporary `LEADERBOARD_HOME`; {bench['machine']}; code "
            f"{bench['code_version']}, store version {bench['store_version']}, {bench['date']}.",
            "",
            *table(["run", "wall time s", "peak RSS MiB"],
                   [[str(i), fmt(r["seconds"], 2), fmt(r["rss_mib"], 0)]
                    for i, r in enumerate(bench["runs"], 1)]),
            f"Median {np.median(secs):.1f} s, max {max(secs):.1f} s against a target of "
            f"{bench['target_s']:.0f} s ({met(max(secs) <= bench['target_s'])}); peak RSS max "
            f"{max(rss):.0f} MiB against {bench['target_rss_mib']:.0f} MiB "
            f"({met(max(rss) <= bench['target_rss_mib'])}).", "",
            *table(["table", "rows"], [[t, f"{n:,}"] for t, n in bench["tables"].items()], "lr"),
            *table(["quarantined: kind", "reason", "source", "rows"],
                   [[k, r, s, f"{n:,}"] for k, r, s, n in bench["quarantine"]], "lllr")]

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
