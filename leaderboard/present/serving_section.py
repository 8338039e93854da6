"""The serving section of RESULTS.md: the replay's own error (the oracle), TTFT/TPOT errors with
ties inside it, each predictor's coverage and distance from the oracle, step vs serving
disagreement, the serving-level SKU ranking and the error atlas by concurrency and prompt
length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from leaderboard.present import aiconfigurator_section
from leaderboard.present.serving_kv_write import kv_write
from leaderboard.present.serving_light import light_kernels
from leaderboard.present.serving_oracle import oracle_section
from leaderboard.present.serving_unknowns import closed_loop_lengths, engine_choices
from leaderboard.run.roster import last_rerun
from leaderboard.score import ranking, results
from leaderboard_core.report_tables import fmt, phase_stat, table

# Same deployment (model, precision, TP, expert placement, backend) and load: the serving
# analogue of a workload id.
LOAD_KEY = ("model", "precision", "tp", "moe_ep", "backend", "isl", "osl", "concurrency")
STEP_PAIR = ("h100_vidur", "h100_silicon")  # one GPU scored step by step and served


def ttft_ties(runs: pl.DataFrame, oracle: pl.DataFrame) -> dict[tuple[str, str], str]:
    """Per (predictor, dataset): ``tie`` when its TTFT MAPE is within the oracle's TTFT MAPE of
    the best predictor's on that dataset (the replay cannot tell them apart), else the points
    behind the best; nothing where the dataset has no oracle."""
    oracle_mape = {r["dataset"]: phase_stat(r, "ttft", "mape") for r in oracle.iter_rows(named=True)}
    valid = [(r["predictor"], r["dataset"], phase_stat(r, "ttft", "mape"))
             for r in runs.filter(pl.col("valid")).iter_rows(named=True)]
    best = {}
    for _, d, m in valid:
        if m is not None:
            best[d] = min(best.get(d, np.inf), m)
    out = {}
    for p, d, m in valid:
        if m is not None and oracle_mape.get(d) is not None:
            behind = m - best[d]
            out[(p, d)] = "tie" if behind < oracle_mape[d] else f"+{behind:.1f}"
    return out


def errors_table(runs: pl.DataFrame, datasets: list[str], outcomes: dict,
                 ties: dict | None = None) -> list[str]:
    ties = ties or {}
    by = {(r["predictor"], r["dataset"]): r for r in runs.iter_rows(named=True)}
    predictors = sorted({p for p, _ in by} | {p for p, d in outcomes if d in datasets})
    rows = []
    for p in predictors:
        for d in datasets:
            run = by.get((p, d))
            if run is None:
                status = outcomes.get((p, d), "no run")
                rows.append([p, d, status.replace("|", "/")[:140], *["—"] * 10])
            elif not run["valid"]:
                rows.append([p, d, "INVALID: " + "; ".join(run["invalid_reasons"])[:140],
                             *["—"] * 10])
            else:
                n = phase_stat(run, "ttft", "n")
                rows.append([p, d, "VALID", "—" if n is None else f"{n:,}",
                             *(fmt(phase_stat(run, m, s)) for m in ("ttft", "tpot")
                                              for s in ("mape", "median_ape", "p90_ape")),
                             fmt(phase_stat(run, "ttft_steady", "mape")),
                             fmt(phase_stat(run, "service", "mape")), ties.get((p, d), "—")])
    return table(["predictor", "dataset", "status", "n loads", "TTFT MAPE %", "TTFT median %",
                  "TTFT P90 %", "TPOT MAPE %", "TPOT median %", "TPOT P90 %",
                  "steady TTFT MAPE %", "service MAPE %", "TTFT vs best"], rows, "lll" + "r" * 10)


def coverage_and_distance(runs: pl.DataFrame, oracle: pl.DataFrame, predictions: pl.DataFrame
                          ) -> list[str]:
    """Per predictor: the share of the serving targets it scores VALID, and its TTFT and TPOT
    error measured against the oracle's prediction of the same target (its kernel error as
    the replay sees it, the replay's own error taken out)."""
    targets = {r["dataset"]: phase_stat(r, "ttft", "n") or 0 for r in oracle.iter_rows(named=True)}
    for r in runs.filter(pl.col("valid")).iter_rows(named=True):
        targets[r["dataset"]] = max(targets.get(r["dataset"], 0), phase_stat(r, "ttft", "n") or 0)
    total = sum(targets.values())
    reference = predictions.filter(pl.col("run_id").is_in(oracle["run_id"].to_list())).select(
        "dataset", "cell_id", oracle_ms="pred_ms")
    rows = []
    for p in sorted(set(runs["predictor"])):
        mine = runs.filter((pl.col("predictor") == p) & pl.col("valid"))
        scored = sum(phase_stat(r, "ttft", "n") or 0 for r in mine.iter_rows(named=True))
        paired = (predictions.filter(pl.col("run_id").is_in(mine["run_id"].to_list()))
                  .join(reference, on=["dataset", "cell_id"]))
        distance = {m: None for m in ("ttft", "tpot")}
        for m in distance:
            part = paired.filter(pl.col("phase") == m)
            if len(part):
                distance[m] = float(((part["pred_ms"] / part["oracle_ms"] - 1).abs().mean()) * 100)
        rows.append([p, f"{scored:,} of {total:,}", fmt(100 * scored / total if total else None),
                     fmt(distance["ttft"]), fmt(distance["tpot"])])
    return ["### Coverage and distance from the oracle", "",
            "Coverage: the serving targets a predictor scores VALID, of all targets of the serving "
            "sets. Distance: its mean absolute difference from the oracle's prediction of the same "
            "target, in % of the oracle's (targets with an oracle only).", ""] + table(
        ["predictor", "targets scored", "coverage %", "TTFT from oracle %", "TPOT from oracle %"],
        rows)


def disagreement(step_runs: pl.DataFrame, runs: pl.DataFrame) -> list[str]:
    """Per predictor: step-level MAPE on H100 against its serving-level MAPE on H100."""
    step_by = {r["predictor"]: r for r in step_runs.filter(
        (pl.col("dataset") == STEP_PAIR[0]) & pl.col("valid")).iter_rows(named=True)}
    serve_by = {r["predictor"]: r for r in runs.filter(
        (pl.col("dataset") == STEP_PAIR[1]) & pl.col("valid")).iter_rows(named=True)}
    rows = []
    for p in sorted(set(step_by) & set(serve_by)):
        step = phase_stat(step_by[p], "all", "mape")
        decode = phase_stat(step_by[p], "decode", "mape")
        tpot, ttft = (phase_stat(serve_by[p], m, "mape") for m in ("tpot", "ttft"))
        gap = None if None in (decode, tpot) else tpot - decode
        rows.append([p, fmt(step), fmt(decode), fmt(tpot), fmt(ttft), fmt(gap)])
    order = sorted(rows, key=lambda r: float(r[3].replace(",", "")) if r[3] != "—" else np.inf)
    return table(["predictor", f"{STEP_PAIR[0]} step MAPE %", "decode steps MAPE %",
                  f"{STEP_PAIR[1]} TPOT MAPE %", "TTFT MAPE %", "TPOT - decode (points)"], order)


def sku_ranking(predictions: pl.DataFrame) -> list[str]:
    runs = predictions.filter((pl.col("phase") == "tpot") & pl.col("valid")).with_columns(
        workload_id=pl.concat_str([pl.col(c).cast(pl.String).fill_null("-") for c in LOAD_KEY],
                                  separator="|"))
    # A load run more than once on one GPU (repeated runs, another engine version, or one
    # target per request) is one result of that GPU, or it would pair with every other GPU's
    # run once per repeat.
    tpot = runs.group_by("predictor", "workload_id", "sku", "split").agg(
        pl.col("gt_ms").mean(), pl.col("pred_ms").mean(), runs=pl.len())
    repeated = tpot.filter(pl.col("runs") > 1).select("workload_id", "sku").unique().height
    ranks = ranking.ranking_table(ranking.sku_pairs(tpot))
    n_loads = tpot.group_by("workload_id").agg(pl.col("sku").n_unique()).filter(pl.col("sku") > 1)
    lines = [f"Same model, precision, TP, expert placement, backend and load (isl, osl, "
             f"concurrency) on two GPUs: which gives "
             f"the lower TPOT, measured against predicted (ties within {ranking.TOLERANCE:.0%}). "
             f"Loads measured on more than one GPU: {len(n_loads)}. A load with more than one "
             f"target on one GPU (repeated runs, another engine version, or one target per "
             f"request) counts once, at the mean of its targets, measured and predicted: "
             f"{repeated} such.", ""]
    if ranks.is_empty():
        return lines + ["No pair to rank: no load of the usable runs was measured on two GPUs "
                        "(the BF16 runs are H100 at isl 1024/2048/4096 and GB200 at 2000/4000; "
                        "the cross-GPU runs are FP8).", ""]
    return lines + table(["predictor", "loads", "pairs", "correct", "wrong", "ties",
                          "tie-aware acc."], [
        [r["predictor"], str(r["workloads"]), str(r["pairs"]), str(r["correct"]), str(r["wrong"]),
         str(r["ties"]), fmt(r["tie_aware_accuracy"], 3)] for r in ranks.iter_rows(named=True)])


def atlas(predictions: pl.DataFrame, atlas_dir: Path) -> list[str]:
    """Median APE by (isl, concurrency) per metric: all predictors to a parquet, the best TPOT
    predictor and ``ours`` in the report."""
    closed = predictions.filter(pl.col("valid") & pl.col("concurrency").is_not_null())
    if closed.is_empty():
        return []
    cube = (closed.group_by("predictor", "dataset", "phase", "isl", "concurrency")
            .agg(median_ape=pl.col("signed_pct").abs().median(), runs=pl.len())
            .sort("predictor", "dataset", "phase", "isl", "concurrency"))
    atlas_dir.mkdir(parents=True, exist_ok=True)
    cube.write_parquet(atlas_dir / "serving.parquet")
    best = (closed.filter(pl.col("phase") == "tpot").group_by("predictor")
            .agg(pl.col("signed_pct").abs().mean()).sort("signed_pct", "predictor")["predictor"][0])
    lines = [f"Median APE % by prompt length (rows) and concurrency (columns), over the `_silicon` "
             f"runs; every predictor in `{atlas_dir.name}/serving.parquet`.", ""]
    for predictor in dict.fromkeys(["ours", best]):
        for metric in ("tpot", "ttft"):
            mine = cube.filter((pl.col("predictor") == predictor) & (pl.col("phase") == metric))
            if mine.is_empty():
                continue
            wide = (mine.group_by("isl", "concurrency").agg(pl.col("median_ape").median())
                    .pivot("concurrency", index="isl", values="median_ape", sort_columns=True)
                    .sort("isl"))
            concs = [c for c in wide.columns if c != "isl"]
            lines += [f"**{predictor}, {metric.upper()}**", ""]
            lines += table(["isl \\ concurrency", *concs],
                           [[str(r["isl"]), *(fmt(r[c]) for c in concs)]
                            for r in wide.iter_rows(named=True)])
    return lines


def section(runs: pl.DataFrame, step_runs: pl.DataFrame, runs_dir: Path,
            atlas_dir: Path, oracle: pl.DataFrame | None = None) -> list[str]:
    datasets = sorted(set(runs["dataset"]))
    timing = last_rerun(runs_dir) or {"outcomes": []}
    outcomes = {(o["predictor"], o["dataset"]): o["status"] for o in timing["outcomes"]
                if o["dataset"] in datasets or o["dataset"].endswith(("_silicon", "_serving"))}
    datasets = sorted(set(datasets) | {d for _, d in outcomes})
    if not datasets:
        return []
    lines = ["## Serving: TTFT and TPOT against measured deployments", "",
             "Each `_silicon` target is one measured serving run (aiconfigurator's silicon sample, BF16 "
             "dense models, aggregated mode); `rtx4090_serving` holds the requests of one vLLM run with "
             "recorded arrivals. The replay schedules each load with the backend's defaults "
             "(`conf/serving/schedulers.yaml`: a closed loop of 4 waves whose clients start together, an "
             "idle engine running the first request of a burst alone and the rest in the next "
             "step; KV "
             "capacity in GiB by each backend's memory rule (SGLang's `mem_fraction_static` from its "
             "version's default rule, TRT-LLM's fraction of what the weights leave free); vLLM's KV "
             "allocated on demand with recompute preemption, a preempted request resumed from what the "
             "prefix cache kept, from 0.19.0 a waiting request admitted only when its whole sequence "
             "fits, a host time per step from Vidur's measured vLLM CPU overheads, added to the step "
             "before 0.14.0 and overlapped with it from 0.14.0 (async scheduling: the longer of the two), "
             "none for SGLang and TRT-LLM (unmeasured, and hidden by their overlap schedulers), and a "
             "closed-loop run of vLLM 0.14.1 or later, whose launch template passes "
             "the flag, with the token budget aiconfigurator's launcher sets, `concurrency + isl + 1500`; "
             "SGLang's admitted on an estimated output and retracted when a decode step runs out; "
             "TRT-LLM's reserved for prompt and output at admission) and the predictor times every step; "
             "TTFT and TPOT follow. The `_silicon_fp8` sets hold vLLM's FP8 runs. Left-out rows: the "
             "dataset cards.", ""]
    oracle = oracle if oracle is not None else runs.clear()
    predictions = results.load_predictions(pl.concat([runs, oracle], how="diagonal_relaxed"))
    lines += (oracle_section(oracle, predictions) + aiconfigurator_section.section(oracle, predictions)
              + closed_loop_lengths() + engine_choices()
              + light_kernels() + kv_write())
    lines += ["### TTFT and TPOT per predictor", "",
              "Service time (recorded arrivals only): first token minus the first step that "
              "scheduled the request, TTFT without the queue. TTFT vs best: `tie` where a "
              "predictor's TTFT MAPE is within the oracle's TTFT MAPE of the best one on that "
              "dataset (inside the replay's own error), else the points behind the best; where "
              "the oracle's own TTFT error is large every predictor ties, the replay being "
              "unable to rank them on TTFT there.", ""]
    lines += errors_table(runs, datasets, outcomes, ttft_ties(runs, oracle))
    if len(predictions):
        lines += coverage_and_distance(runs, oracle, predictions)
    lines += ["### Step level against serving level (H100)", "",
              "The same predictor's error on H100 steps (`h100_vidur`, kernel sums) and on H100 "
              "serving (`h100_silicon`, end to end). TPOT is made of decode-heavy steps, so the "
              "decode-step MAPE is its nearest step-level counterpart.", ""]
    lines += disagreement(step_runs, runs)
    predictions = predictions.filter(~pl.col("run_id").is_in(oracle["run_id"].to_list())) \
        if len(predictions) else predictions
    if len(predictions):
        lines += ["### Serving-level SKU ranking (TPOT)", ""] + sku_ranking(predictions)
        lines += ["### Serving error atlas", ""] + atlas(predictions, atlas_dir)
    return lines

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
