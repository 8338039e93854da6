"""RESULTS.md's decisions section: what each predictor decides on the unseen GPUs of the main
step family, scored by measured outcomes (``leaderboard.decisions``), beside its MAPE order."""

from __future__ import annotations

import statistics

import polars as pl

from leaderboard import decisions
from leaderboard_core.report_tables import fmt, phase_stat, table

FAMILY = "vidur"


def _ci(pair) -> str:
    return f"{fmt(pair[0])} – {fmt(pair[1])}"


def _mape_order(runs: pl.DataFrame) -> list[str]:
    """Predictors by GPU-mean all-phase MAPE over the family's unseen GPUs (complete ones)."""
    unseen = runs.filter((pl.col("family") == FAMILY) & (pl.col("split") == "unseen")
                         & pl.col("valid"))
    gpus = set(unseen["dataset"])
    means = {}
    for (predictor,), mine in unseen.group_by("predictor"):
        values = {r["dataset"]: phase_stat(r, "all") for r in mine.iter_rows(named=True)}
        if set(values) == gpus and None not in values.values():
            means[predictor] = statistics.fmean(values.values())
    return sorted(means, key=means.get)


def section(predictions: pl.DataFrame, runs: pl.DataFrame) -> list[str]:
    """The decisions tables, from the leaderboard runs' stored predictions."""
    unseen = predictions.filter((pl.col("split") == "unseen") & pl.col("valid")
                                & pl.col("dataset").str.ends_with(f"_{FAMILY}"))
    if unseen.is_empty():
        return []
    capacity = decisions.capacity_scores(decisions.capacity_choices(unseen))
    gpu = decisions.gpu_scores(decisions.gpu_choices(unseen))
    lines = ["## Decisions", "",
             f"What the predictions decide on the unseen `_{FAMILY}` GPUs, every outcome a "
             "measured one (`leaderboard/decisions.py`; 95 % bootstrap CIs over the groups or "
             "workloads). **Capacity at a step-time SLO**: per (GPU, model, TP, context) with at "
             f"least {decisions.MIN_BATCHES} measured decode batch sizes, at each measured step "
             "time as the SLO, the largest batch whose predicted step fits; *violation*: its "
             "measured step exceeds the SLO; *regret*: 1 − its measured throughput over the best "
             "measured batch that fits (a violating pick, or none when no batch is predicted to "
             "fit: regret 1, counted). **GPU "
             "choice**: per workload measured on every unseen GPU, the GPU with the smallest "
             "predicted step; regret: its measured step over the fastest, − 1 (the price-free "
             "variant: no sourced price table yet).", ""]
    if len(capacity):
        lines += table(["predictor", "decisions", "groups", "no pick", "violation %", "95% CI",
                        "regret %", "95% CI"], [
            [r["predictor"], f"{r['decisions']:,}", str(r["groups"]), str(r["no_pick"]),
             fmt(r["violation_pct"]), _ci(r["violation_ci"]), fmt(r["regret_pct"]),
             _ci(r["regret_ci"])] for r in capacity.iter_rows(named=True)], "lrrrrrrr") + [""]
    if len(gpu):
        lines += table(["predictor", "workloads", "right %", "regret %", "95% CI", "P90 regret %"],
                       [[r["predictor"], f"{r['workloads']:,}", fmt(r["right_pct"]),
                         fmt(r["regret_pct"]), _ci(r["regret_ci"]), fmt(r["p90_pct"])]
                        for r in gpu.iter_rows(named=True)], "lrrrrr") + [""]
    by_mape = _mape_order(runs)
    for name, scores in (("capacity regret", capacity), ("GPU-choice regret", gpu)):
        if len(scores):
            tau = decisions.kendall_tau(by_mape, scores["predictor"].to_list())
            lines.append(f"- Kendall's τ between the GPU-mean MAPE order and the {name} order: "
                         f"{fmt(tau, 2)} (1: the same order; lower: MAPE misranks deciders).")
    return [*lines, ""]

# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
