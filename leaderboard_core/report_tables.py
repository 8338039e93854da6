"""Markdown building blocks of the report: number formatting, tables, MAPE lookups per family.

Shared by the harness's report and the sections a predictor offers (``report_sections``); the
runs frame they read carries each run's dataset ``family``, added by the harness.
"""

from __future__ import annotations

import json
import statistics

import polars as pl


def fmt(value, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def table(header: list[str], rows: list[list[str]], align: str = "l" + "r" * 20) -> list[str]:
    rule = ["---:" if a == "r" else "---" for a in align[:len(header)]]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |",
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def phase_stat(run: dict | None, phase: str, stat: str = "mape") -> float | None:
    """One statistic of one phase of a run row (its ``phases`` JSON); None without it."""
    return (json.loads(run["phases"]).get(phase) or {}).get(stat) if run else None


def datasets_of(runs: pl.DataFrame, fam: str) -> tuple[list[str], list[str]]:
    """(home datasets, unseen datasets) of a family, in a stable order."""
    mine = runs.filter(pl.col("family") == fam)
    home = sorted(set(mine.filter(pl.col("split") == "home_heldout")["dataset"]))
    return home, sorted(set(mine["dataset"]) - set(home))


# One name for the mean over a family's unseen GPUs of each GPU's MAPE, wherever it is tabled.
GPU_MEAN = "GPU-mean MAPE"


class PhaseMapes:
    """MAPE lookups over the leaderboard runs of one dataset family."""

    def __init__(self, runs: pl.DataFrame, unseen: list[str]):
        self.by = {(r["predictor"], r["dataset"]): r for r in runs.iter_rows(named=True)}
        self.unseen = unseen

    def mape(self, predictor: str, dataset: str, phase: str) -> float | None:
        return phase_stat(self.by.get((predictor, dataset)), phase)

    def unseen_mean(self, predictor: str, phase: str) -> float | None:
        """Mean over the unseen GPUs; None unless every one of them has a number."""
        values = [self.mape(predictor, d, phase) for d in self.unseen]
        return None if not values or None in values else statistics.fmean(values)

    def cell(self, predictor: str, dataset: str, phase: str) -> str:
        """The MAPE; ``n/s`` for a run whose predictor answered NotSupported (and nothing else
        went wrong), ``INVALID`` for any other run that is not VALID."""
        run = self.by.get((predictor, dataset))
        if run and not run["valid"]:
            reasons = run["invalid_reasons"] or []
            return "n/s" if reasons and all(r.startswith("NotSupported") for r in reasons) \
                else "INVALID"
        return fmt(self.mape(predictor, dataset, phase))

    def header(self, dataset: str, phase: str, home: bool = False) -> str:
        """``dataset`` with the cells its runs scored in ``phase`` (the most of any run: a
        deploy reading leaves out the few cells it read)."""
        counts = [phase_stat(r, phase, "n") for (_, d), r in self.by.items() if d == dataset]
        n = max((c for c in counts if c is not None), default=None)
        parts = [*(["home"] if home else []), *([f"n={n:,}"] if n is not None else [])]
        return f"{dataset} ({', '.join(parts)})" if parts else dataset


def seal_columns(runs: pl.DataFrame, predictor: str) -> list[str]:
    """The most target rows ``predictor`` read in any of ``runs``, and the sandboxes they ran in."""
    mine = runs.filter(pl.col("predictor") == predictor)
    target_rows = mine["profiled_rows"].fill_null(0).max() or 0
    sandboxes = sorted(set(mine["sandbox"].fill_null("—")))
    return [f"{target_rows:,}", "/".join(sandboxes)]

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
