"""The main leaderboard of RESULTS.md: per step and op family, MAPE per phase on the home's
held-out cells and on every unseen GPU, the GPU-mean over those, and the all / replayed /
traffic table that sets the ranking without the uniform filler beside the headline one.

A leaderboard entry is a registered predictor with its default parameters on the default split;
runs with other parameters stay queryable (``leaderboard.score.results``) but are not tabled.
"""

from __future__ import annotations

import json

import polars as pl

from leaderboard.cells import families
from leaderboard.run.homes import home_of, with_family
from leaderboard.run.oracle import is_oracle
from leaderboard.run.split import default_split
from leaderboard.seal import predictor_index
from leaderboard_core.report_tables import (
    GPU_MEAN,
    PhaseMapes,
    datasets_of,
    fmt,
    seal_columns,
    table,
)

IN_SAMPLE = " †"  # a home MAPE of a predictor that fitted the home's measured kernels


def _default_runs(current: pl.DataFrame, datasets: list[str], oracle: bool = False
                  ) -> list[bool]:
    """Per run: a registered predictor, default parameters, default split and home points, one
    home and the dataset's default one (a run with ``dataset.home=`` another set is not a second
    leaderboard row), one of ``datasets``. ``oracle``: any home points and any one home (the
    oracle's are the target GPU's own set, on every shape)."""
    split = default_split()
    defaults = {name: d["defaults"] for name, d in predictor_index.index().items()}
    default_home = _default_homes(datasets)
    return [name in defaults and json.loads(params) == defaults[name] and seed == split["seed"]
            and fraction == split["test_fraction"] and dataset in datasets
            and (oracle or points == split["home_points"]) and len(homes or []) == 1
            and (oracle or default_home.get(dataset, home) == home)
            for name, params, seed, fraction, dataset, points, homes, home in current.select(
                "predictor", "params", "split_seed", "test_fraction", "dataset", "home_points",
                "home_datasets", "home_dataset").iter_rows()]


def _default_homes(datasets: list[str]) -> dict[str, str]:
    """Each dataset's default home (``homes.home_of`` with no override); a dataset whose home
    cannot be named from ``datasets`` alone is left out (its runs are not filtered by home)."""
    rows = {n: {"name": n} for n in datasets}
    out = {}
    for name in datasets:
        try:
            out[name] = home_of(name, None, rows)
        except ValueError:
            continue
    return out


def oracle_flags(current: pl.DataFrame) -> list[bool]:
    """Per run: is it the serving oracle (``leaderboard.run.oracle.is_oracle``)."""
    return [is_oracle(*row) for row in current.select(
        "predictor", "home_points", "dataset", "sku", "home_sku").iter_rows()]


def leaderboard_runs(current: pl.DataFrame, datasets: list[str]) -> pl.DataFrame:
    """The current runs that make the leaderboard: registered predictors, default parameters,
    default split and home points, one home, the leaderboard ``datasets``; never the serving
    oracle (``leaderboard.run.oracle``)."""
    keep = [default and not oracle for default, oracle in
            zip(_default_runs(current, datasets), oracle_flags(current), strict=True)]
    return with_family(current.filter(pl.Series(keep, dtype=pl.Boolean)))


def oracle_runs(current: pl.DataFrame, datasets: list[str]) -> pl.DataFrame:
    """The serving oracle's current runs (default parameters, one of ``datasets``)."""
    keep = [default and oracle for default, oracle in
            zip(_default_runs(current, datasets, oracle=True), oracle_flags(current),
                strict=True)]
    return with_family(current.filter(pl.Series(keep, dtype=pl.Boolean)))


def main_leaderboard(runs: pl.DataFrame, outcomes: dict[tuple[str, str], str] | None = None
                     ) -> list[str]:
    """The per-phase tables of every leaderboard step and op family. ``outcomes``: the last
    rerun's status per (predictor, dataset), so a NotSupported answer shows as ``n/s``."""
    outcomes = outcomes or {}
    profiled = {name for name, d in predictor_index.index().items()
                if d["card"]["needs_profiled_rows"]}
    lines = ["## Leaderboard: MAPE % per phase", "",
             "Home: the family's default home (the A100 dataset, or the one its registry entry "
             "names: `python -m leaderboard.data list` shows each dataset's), scored on its seeded "
             f"held-out workloads only. Home points: `{default_split()['home_points']}`; with "
             "`full_grid` the "
             "predictors that fit op points saw the home GPU's whole measured grid, so the "
             "held-out home cells are in-sample for them (as for Vidur); families without an "
             "op grid (vidurprof, splitwise) fit on the points behind their training cells. "
             "Unseen: every other GPU, predicted from its datasheet. These unseen GPUs are also "
             "the development set of `ours`: its form (which factors exist) was chosen looking "
             "at their errors, though no constant was fitted on them (docs/ours.md); GPUs kept "
             "outside this repository score it. `INVALID` marks a run "
             "with a non-finite or non-positive prediction, or whose predictor failed (reasons "
             "below); `n/s`: the predictor answered NotSupported, in its fit or before it "
             "(reasons below); `—`: no run. n: the cells scored (a deploy reading leaves out "
             f"the few it read). `{GPU_MEAN}`: the mean over the family's unseen GPUs of each "
             "GPU's MAPE (a predictor without a number on every one has none). Rows "
             f"are sorted by the {GPU_MEAN} over `all`. `all` and `all_cold` leave "
             "out the cells labelled `composed`: the mixed steps of the `_vidur` families, whose "
             "separately timed prefill and decode attention may stand in for one kernel "
             "(docs/design.md); their own `mixed` table still scores them. `target rows`: the most "
             "measured target rows the predictor read on any GPU of the family (its deploy "
             "reading, never scored; 0 for a zero-reading predictor). `sandbox`: how its fit "
             "and predict were confined (`namespaces+landlock`: sealed; a run without both walls is "
             "UNSEALED and appears only in the 'Unsealed runs' table). "
             f"`{IN_SAMPLE}` on a home column: the predictor fits measured rows of the home GPU, "
             "and its held-out home cells are made of kernels it read (every one under "
             "`full_grid`; the ones the training cells share under `behind_cells`), so that "
             "number is in-sample, not a test.", ""]
    for fam in families.where(leaderboard=True):
        if fam.level == "serving":
            continue  # tabled by leaderboard.present.serving_section
        homes, unseen = datasets_of(runs, fam.suffix)
        mapes = PhaseMapes(runs, unseen)
        mine = runs.filter(pl.col("dataset").is_in(homes + unseen))
        # By the mean as printed: rows equal to the shown digit keep their name order, where
        # the unrounded means, equal but for the last bit, swapped them between renders.
        predictors = sorted(set(mine["predictor"]), key=lambda p: (
            mapes.unseen_mean(p, "all") is None, round(mapes.unseen_mean(p, "all") or 0.0, 1), p))
        unsupported = {(p, d): why for (p, d), why in outcomes.items()
                       if d in homes + unseen and why.startswith("not supported")}
        predictors += sorted({p for p, _ in unsupported} - set(predictors))
        for phase in fam.phases:
            if all(mapes.mape(p, d, phase) is None for p in predictors for d in homes + unseen):
                continue  # the family has no cells of this phase (splitwise: no mixed steps)
            rows = [[p, *("n/s" if (p, d) in unsupported else mapes.cell(p, d, phase)
                          + (IN_SAMPLE if d in homes and p in profiled else "")
                          for d in homes + unseen),
                     fmt(mapes.unseen_mean(p, phase)), *seal_columns(mine, p)] for p in predictors]
            header = ["predictor", *(mapes.header(d, phase, home=True) for d in homes),
                      *(mapes.header(d, phase) for d in unseen), f"{GPU_MEAN} %",
                      "target rows", "sandbox"]
            title = fam.suffix if fam.level == "step" else fam.title
            lines += [f"### {title}: {phase}", "", *table(header, rows)]
        if any(mapes.mape(p, d, families.REPLAYED) is not None for p in predictors for d in unseen):
            lines += filler_table(title, mapes, predictors, homes)
        if unsupported:
            lines += [f"NotSupported on {title}:", ""]
            lines += [f"- {p} on {d}: {why.removeprefix('not supported: ')}"
                      for (p, d), why in sorted(unsupported.items())] + [""]
    invalid = runs.filter(~pl.col("valid"))
    if len(invalid):
        lines += ["INVALID runs:", ""]
        lines += [f"- {p} on {d}: {'; '.join(reasons)}" for p, d, reasons
                  in invalid.select("predictor", "dataset", "invalid_reasons").iter_rows()]
        lines.append("")
    return lines


def filler_table(title: str, mapes: PhaseMapes, predictors: list[str], homes: list[str]
                 ) -> list[str]:
    """One family's predictors over ``all``, over its replayed cells only and weighted by how
    often the replay produced each: the ranking without the measured uniform filler."""
    groups = ("all", families.REPLAYED, families.TRAFFIC)
    rows = [[p, *(fmt(mapes.mape(p, h, g)) for h in homes for g in groups),
             *(fmt(mapes.unseen_mean(p, g)) for g in groups)] for p in predictors]
    return [f"### {title}: all, replayed and traffic", "",
            "`replayed`: the cells of `all` that replayed request traces produced (the "
            "measured uniform batches that fill thin phases, `scheduler = uniform`, left out); "
            "`traffic`: those cells, each counted as often as the replay produced it. The "
            "headline stays `all`; the Cell datasets section gives each dataset's filler share.",
            "", *table(["predictor", *(f"{h} (home) {g}" for h in homes for g in groups),
                        *(f"{GPU_MEAN} {g} %" for g in groups)], rows)]



# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
