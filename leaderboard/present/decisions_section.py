"""RESULTS.md's decisions section: what each predictor decides on the unseen GPUs of the main
step family, scored by measured outcomes (``leaderboard.score.decisions``), beside its MAPE order."""

from __future__ import annotations

import statistics

import numpy as np
import polars as pl

from leaderboard.score import decisions, ranking
from leaderboard_core.report_tables import fmt, phase_stat, table

FAMILY = "vidur"


def _ci(pair) -> str:
    return f"{fmt(pair[0])} – {fmt(pair[1])}"


def _gpu_mean_mape(runs: pl.DataFrame) -> dict[str, float]:
    """Per predictor, its GPU-mean all-phase MAPE over the family's unseen GPUs (complete
    ones)."""
    unseen = runs.filter((pl.col("family") == FAMILY) & (pl.col("split") == "unseen")
                         & pl.col("valid"))
    gpus = set(unseen["dataset"])
    means = {}
    for (predictor,), mine in unseen.group_by("predictor"):
        values = {r["dataset"]: phase_stat(r, "all") for r in mine.iter_rows(named=True)}
        if set(values) == gpus and None not in values.values():
            means[predictor] = statistics.fmean(values.values())
    return means


def _settled(scores: pl.DataFrame, by: str, descending: bool = False) -> pl.DataFrame:
    """``scores`` in ``by`` order, ties by predictor name: the scoring's own order of tied rows
    follows a group-by's, which differs from one render to the next, and so do the last bits of
    their sums (hence the rounding)."""
    if not len(scores):
        return scores
    return scores.sort([pl.col(by).round(9), pl.col("predictor")],
                       descending=[descending, False])


def _budget_table(scores: pl.DataFrame) -> list[str]:
    return table(["predictor", "decisions", "groups", "no pick", "violation %", "95% CI",
                  "regret %", "95% CI"], [
        [r["predictor"], f"{r['decisions']:,}", str(r["groups"]), str(r["no_pick"]),
         fmt(r["violation_pct"]), _ci(r["violation_ci"]), fmt(r["regret_pct"]),
         _ci(r["regret_ci"])] for r in scores.iter_rows(named=True)], "lrrrrrrr") + [""]


def tied_picks(predictions: pl.DataFrame, prices: dict[str, float] | None = None) -> dict:
    """Per predictor, the share (%) of workloads whose predicted best GPU (fastest, or cheapest
    at ``prices``) is tied, within ``ranking.TOLERANCE``, with another: there the choice falls
    to the GPUs' order by name (``decisions.gpu_choices``), not to the prediction. A predictor
    that carries the home's times to every GPU unchanged ties on every workload."""
    usable = predictions.filter(pl.col("pred_ms").is_not_null())
    if prices is not None:
        usable = usable.filter(pl.col("sku").is_in(list(prices)))
    per = usable.group_by("predictor", "workload_id", "sku").agg(pl.col("pred_ms").median(),
                                                                 pl.col("tp").first())
    if prices is not None:
        per = per.with_columns(pl.col("pred_ms") * pl.col("sku").replace_strict(prices)
                               * pl.col("tp"))
    best = per.group_by("predictor", "workload_id").agg(
        tied=((pl.col("pred_ms") <= pl.col("pred_ms").min() * (1 + ranking.TOLERANCE)).sum()
              > 1))
    return dict(best.group_by("predictor").agg(pl.col("tied").mean() * 100).iter_rows())


def _gpu_table(scores: pl.DataFrame, tied: dict) -> list[str]:
    return table(["predictor", "workloads", "right %", "regret %", "95% CI", "P90 regret %",
                  "tied picks %"],
                 [[r["predictor"], f"{r['workloads']:,}", fmt(r["right_pct"]),
                   fmt(r["regret_pct"]), _ci(r["regret_ci"]), fmt(r["p90_pct"]),
                   fmt(tied.get(r["predictor"]))]
                  for r in scores.iter_rows(named=True)], "lrrrrrr") + [""]


def _per_gpu(choices: pl.DataFrame) -> list[str]:
    """Capacity per predictor and unseen GPU: regret % (violation %)."""
    gpus = sorted(set(choices["dataset"]))
    cell = {(r["predictor"], r["dataset"]): f"{fmt(r['regret'] * 100)} ({fmt(r['violation'] * 100)})"
            for r in choices.group_by("predictor", "dataset").agg(
                pl.col("regret").mean(), pl.col("violation").mean()).iter_rows(named=True)}
    names = sorted({p for p, _ in cell})
    return table(["predictor", *gpus], [[n, *(cell.get((n, g), "–") for g in gpus)]
                                        for n in names], "l" + "r" * len(gpus)) + [""]


SERVING_GROUP = ("dataset", "model", "backend", "isl", "osl")


def serving_choices(predictions: pl.DataFrame) -> pl.DataFrame:
    """Per (predictor, serving set, model, backend, input and output length) with at least
    ``MIN_BATCHES`` measured (TP, concurrency) configurations, at each measured TPOT as the SLO:
    the configuration with the most predicted output tokens per second per GPU (concurrency /
    TPOT / TP) among those predicted to fit; violation when its measured TPOT exceeds the SLO,
    regret 1 − its measured tokens/s/GPU over the best measured configuration that fits (a
    violation, or no pick, regrets 1). ``gap``: the best measured choice over the runner-up
    that fits, − 1: how much the decision turns on."""
    tpot = predictions.filter((pl.col("phase") == "tpot") & pl.col("pred_ms").is_not_null())
    per = tpot.group_by("predictor", *SERVING_GROUP, "tp", "concurrency").agg(
        pl.col("gt_ms").median(), pl.col("pred_ms").median())
    rows = []
    for key, group in per.group_by("predictor", *SERVING_GROUP):
        if group.height < decisions.MIN_BATCHES:
            continue
        conc, tp = group["concurrency"].to_numpy(), group["tp"].to_numpy()
        measured, predicted = group["gt_ms"].to_numpy(), group["pred_ms"].to_numpy()
        speed, promised = conc * 1e3 / measured / tp, conc * 1e3 / predicted / tp
        for slo in np.unique(measured):
            fits = np.sort(speed[measured <= slo])[::-1]
            best = fits[0]
            row = {"predictor": key[0], "dataset": key[1], "group": " ".join(map(str, key[2:])),
                   "slo_ms": float(slo), "gap": fits[0] / fits[1] - 1 if len(fits) > 1 else None}
            feasible = predicted <= slo
            if not feasible.any():
                rows.append({**row, "pick": None, "violation": False, "regret": 1.0})
                continue
            pick = int(np.argmax(np.where(feasible, promised, -np.inf)))
            violation = bool(measured[pick] > slo)
            rows.append({**row, "pick": float(pick), "violation": violation,
                         "regret": 1.0 if violation else max(0.0, 1 - speed[pick] / best)})
    return pl.DataFrame(rows, schema={
        "predictor": pl.String, "dataset": pl.String, "group": pl.String, "slo_ms": pl.Float64,
        "gap": pl.Float64, "pick": pl.Float64, "violation": pl.Boolean, "regret": pl.Float64})


def section(predictions: pl.DataFrame, runs: pl.DataFrame,
            serving: pl.DataFrame | None = None) -> list[str]:
    """The decisions tables, from the leaderboard runs' stored predictions (``serving``: the
    serving runs' rows, for the configuration choice)."""
    unseen = predictions.filter((pl.col("split") == "unseen") & pl.col("valid")
                                & pl.col("dataset").str.ends_with(f"_{FAMILY}"))
    if unseen.is_empty():
        return []
    capacity_choices = decisions.capacity_choices(unseen)
    capacity = _settled(decisions.budget_scores(capacity_choices), "regret_pct")
    chunk = _settled(decisions.budget_scores(decisions.chunk_choices(unseen)), "regret_pct")
    prices = decisions.load_prices()
    cost = _settled(decisions.gpu_scores(decisions.gpu_choices(unseen, prices)), "regret_pct")
    fastest = _settled(decisions.gpu_scores(decisions.gpu_choices(unseen)), "regret_pct")
    pairs = _settled(decisions.decisive_pairs(unseen), "weighted_right_pct", descending=True)
    lines = ["## Decisions", "",
             f"What the predictions decide on the unseen `_{FAMILY}` GPUs, every outcome a "
             "measured one (`leaderboard/score/decisions.py`; 95 % bootstrap CIs over the groups or "
             "workloads). *Violation*: the pick's measured step exceeds the SLO; *regret*: 1 − "
             "its measured throughput over the best measured choice that fits (a violating "
             "pick, or none when nothing is predicted to fit: regret 1, counted as *no pick*).",
             "", "### Capacity at a step-time SLO", "",
             f"Per (GPU, model, TP, context) with at least {decisions.MIN_BATCHES} measured "
             "decode batch sizes, at each measured step time as the SLO, the largest batch "
             "whose predicted step fits.", ""]
    if len(capacity):
        lines += _budget_table(capacity)
        lines += ["Per unseen GPU: regret % (violation %).", "", *_per_gpu(capacity_choices)]
    lines += ["### Prefill chunk budget at a step-time SLO", "",
              "Per (GPU, model, TP), the measured single-request prefill steps (16 to 8,192 "
              "tokens): the largest chunk whose predicted step fits each measured step time; "
              "regret in prompt tokens per ms. The sets' mixed cells are composed, never "
              "measured whole, so chunks with decodes riding along are not scored.", ""]
    if len(chunk):
        lines += _budget_table(chunk)
    lines += ["### GPU choice", "",
              "Per workload measured on every unseen GPU: the GPU that serves it cheapest by "
              "predicted step × TP × price per GPU-hour (`conf/prices.yaml`: "
              + ", ".join(f"{k} ${v:.2f}" for k, v in sorted(prices.items()))
              + "; each with its source), regret: its measured cost over the cheapest, − 1.",
              ""]
    if len(cost):
        lines += _gpu_table(cost, tied_picks(unseen, prices))
    lines += ["Price-free: the fastest GPU; regret: its measured step over the fastest, − 1. "
              "*Tied picks*: workloads whose predicted best GPU ties (within 1 %) with another, "
              "where the pick falls to the GPUs' order by name, not to the prediction: a "
              "predictor that carries its home's times to every GPU unchanged (`distserve`, "
              "`rf_verbatim`) ties everywhere, and its price-free 'right %' is the name order's "
              "(the first GPU by name is often the fastest); the decisive pairs below count "
              "such ties as wrong.", ""]
    if len(fastest):
        lines += _gpu_table(fastest, tied_picks(unseen))
    if len(pairs):
        lines += [f"Decisive pairs: GPU pairs of a workload whose measured steps differ by at "
                  f"least {decisions.DECISIVE_GAP:.0%}, weighted by the gap; the share ordered "
                  "right (a predicted tie is wrong).", ""]
        lines += table(["predictor", "pairs", "gap-weighted right %"],
                       [[r["predictor"], f"{r['pairs']:,}", fmt(r["weighted_right_pct"])]
                        for r in pairs.iter_rows(named=True)], "lrr") + [""]
    configs = serving_choices(serving) if serving is not None and len(serving) else None
    config = _settled(decisions.budget_scores(configs), "regret_pct") \
        if configs is not None and len(configs) else pl.DataFrame()
    if len(config):
        gaps = configs["gap"].drop_nulls()
        lines += ["### Serving configuration at a TPOT SLO", "",
                  "Per serving set, model, backend and input/output length with at least "
                  f"{decisions.MIN_BATCHES} measured (TP, concurrency) configurations, at each "
                  "measured TPOT as the SLO: the configuration with the most predicted output "
                  "tokens per second per GPU among those predicted to fit (what aiconfigurator "
                  "answers its users); violation and regret by the measured TPOT and tokens/s/GPU. "
                  "Every serving set, the home GPU's included: the replay prices the steps, so the "
                  "replay's own error (the serving section's oracle) is part of every pick. The "
                  f"best measured choice beats the runner-up by a median {fmt(gaps.median() * 100)} "
                  f"% ({fmt((gaps < 0.1).mean() * 100)} % of decisions turn on a gap under 10 %): "
                  "where the oracle's TPOT error is larger than that, a pick is within the "
                  "replay's own noise.", ""]
        lines += _budget_table(config)
    mape = _gpu_mean_mape(runs)
    for name, scores in (("capacity regret", capacity), ("chunk regret", chunk),
                         ("GPU-cost regret", cost), ("fastest-GPU regret", fastest),
                         ("serving-configuration regret", config)):
        if len(scores):
            tau = decisions.kendall_tau(mape, dict(zip(scores["predictor"], scores["regret_pct"],
                                                       strict=True)))
            lines.append(f"- Kendall's τ-b between the GPU-mean MAPE and the {name} (ties "
                         f"count neither way): {fmt(tau, 2)} (1: the same order; lower: MAPE "
                         "misranks deciders).")
    return [*lines, ""]

# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
