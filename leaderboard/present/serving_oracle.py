"""The replay's own error in RESULTS.md: the oracle's TTFT and TPOT error per serving set, by
backend, prompt length and concurrency, the closed-loop bracket (lockstep against steady state),
and what, measured, keeps the oracle from the replay's goal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from leaderboard.cells import families
from leaderboard.present import leaderboard_table
from leaderboard.present.serving_kv_write import KV_WRITE_JSON
from leaderboard.present.serving_light import LIGHT_JSON, light_kernels_measured
from leaderboard.present.serving_unknowns import CHOICES_JSON, TARGETS, WAVES_JSON, unknowns_measured
from leaderboard.run.oracle import ORACLE, ORACLE_POINTS, STEP_FAMILY, oracle_home
from leaderboard.score import metrics, results
from leaderboard_core.report_tables import fmt, phase_stat, table


def _bracket(predictions: pl.DataFrame) -> pl.DataFrame:
    """Per closed-loop target with both bounds: where its measured TTFT lies against the
    bracket (``side``: below, inside or above) and its distance from it (% of the measured
    TTFT, 0 inside)."""
    ends = (predictions.filter(pl.col("phase").is_in(["ttft", "ttft_steady"]))
            .pivot("phase", index=["dataset", "workload_id", "gt_ms"], values="pred_ms")
            .drop_nulls())
    if "ttft_steady" not in ends.columns:
        return pl.DataFrame()
    low = pl.min_horizontal("ttft", "ttft_steady")
    high = pl.max_horizontal("ttft", "ttft_steady")
    gt = pl.col("gt_ms")
    return ends.with_columns(
        side=pl.when(gt < low).then(pl.lit("below")).when(gt > high).then(pl.lit("above"))
        .otherwise(pl.lit("inside")),
        off=pl.max_horizontal(low - gt, gt - high, pl.lit(0.0)) / gt * 100)


def inside_bracket(predictions: pl.DataFrame) -> dict[str, tuple[int, float, float]]:
    """Per dataset: the closed-loop targets with both bounds, the share (%) whose measured
    TTFT lies between the lockstep TTFT and the steady-state one, and the mean distance (% of
    the measured TTFT) from the measured TTFT to the bracket, 0 inside it: the error left if the
    clients' unknown drift were granted."""
    ends = _bracket(predictions)
    return {d: (len(g), 100 * float((g["side"] == "inside").mean()), float(g["off"].mean()))
            for (d,), g in ends.group_by("dataset")} if len(ends) else {}


def bracket_split(predictions: pl.DataFrame) -> list[str]:
    """Markdown: per dataset, the headline TTFT MAPE over its closed loops split by where each
    target's measured TTFT lies against the bracket, in points of that MAPE (their errors
    summed over all the set's closed loops), with their count and mean distance from it."""
    ends = _bracket(predictions)
    if ends.is_empty():
        return []
    ends = ends.join(predictions.filter(phase="ttft").select(
        "dataset", "workload_id", error=pl.col("signed_pct").abs()), on=["dataset", "workload_id"])

    def cell(g: pl.DataFrame, side: str) -> str:
        mine = g.filter(side=side)
        text = f"{len(mine)}: {fmt(float(mine['error'].sum()) / len(g))}"
        off = f" ({fmt(float(mine['off'].mean()))} % off)" if side != "inside" and len(mine) else ""
        return text + off

    body = [[dataset, str(len(g)), fmt(float(g["error"].mean())),
             *(cell(g, side) for side in ("inside", "above", "below"))]
            for (dataset,), g in ends.sort("dataset").group_by("dataset", maintain_order=True)]
    return ["Where the headline's TTFT error lies against the bracket: its MAPE over each set's "
            "closed loops split into the points the targets inside the bracket give (the "
            "clients' drift, which no record states, can account for them), those above it "
            "(measured slower than either end: time outside the replayed steps, or an engine "
            "slower than its kernel tables) and those below it (measured faster than either "
            "end: limits, a KV cache or kernels that make the replay slower than the engine). "
            "A target off the bracket books its whole lockstep error to its side; only its "
            "distance from the bracket lies beyond any drift. Each cell: targets: points of "
            "MAPE, and for those off the bracket their mean distance from it, in % of the "
            "measured TTFT:", "",
            *table(["dataset", "n", "TTFT MAPE %", "inside", "above", "below"], body,
                   "lrrrrr")]


def oracle_section(oracle: pl.DataFrame, predictions: pl.DataFrame) -> list[str]:
    """The oracle's error per dataset, then per backend, prompt length and concurrency."""
    lines = ["### The replay's own error: the oracle", "",
             f"The oracle times every replayed step from the target GPU's own measured kernels "
             f"(`{ORACLE}` fitted on the target's `_vidur` set: its GEMM, attention and "
             "all-reduce tables, and the LM head; `leaderboard/run/oracle.py`). A perfect "
             "kernel predictor would score about this; what it misses is the replay's and the "
             "tables' (light kernels, host and frontend time, another backend's kernels). It is "
             "never ranked. A `_silicon_fp8` set's oracle is fitted on the GPU's `_vidur_fp8` "
             "set (FP8 GEMM tables of vLLM 0.19.0). `rtx4090_serving`'s is fitted on "
             "LLMServingSim's vLLM profile of the RTX4090 (`rtx4090_llmservingsim`: its "
             "projections and LM head as GEMMs, its prefill and decode attention; no "
             "aiconfigurator table holds the GPU). `b200_silicon_fp8` has no oracle (no FP8 "
             "step set of the B200: its per-tensor FP8 GEMM tables fail the build's FP8 check, "
             "as the `_vidur_fp8` card measures). A `_silicon_moe` set's oracle reads the GPU's "
             "block-scaled FP8 GEMM and fused-MoE tables of vLLM 0.19.0 (the published "
             "checkpoints scale per 128 x 128 block; balanced routing, the run's expert "
             "placement where the tables time it, else the nearest placement of the same dtype "
             "rescaled by the roofline), through the `_vidur_fp8` set on the H100 and H200 and "
             "the `_vidur_moe` set on the B200; the router and routing imbalance stay outside "
             "it.",
             ""]
    if oracle.is_empty():
        return lines + ["No oracle run is current (`python -m leaderboard.rerun` runs it).", ""]
    mine = predictions.filter(pl.col("run_id").is_in(oracle["run_id"].to_list()))
    bracket = inside_bracket(mine)
    lines += table(["dataset", "n targets", "TTFT MAPE %", "TTFT median %", "TTFT bias %",
                    "TPOT MAPE %", "TPOT median %", "TPOT bias %", "steady TTFT MAPE %",
                    "steady TTFT bias %", "measured TTFT inside the bracket",
                    "TTFT off the bracket %"], [
        [r["dataset"], f"{phase_stat(r, 'ttft', 'n'):,}",
         *(fmt(phase_stat(r, m, s)) for m in ("ttft", "tpot") for s in ("mape", "median_ape", "bias")),
         fmt(phase_stat(r, "ttft_steady", "mape")), fmt(phase_stat(r, "ttft_steady", "bias")),
         f"{bracket[r['dataset']][1]:.0f} % of {bracket[r['dataset']][0]}"
         if r["dataset"] in bracket else "—",
         fmt(bracket[r["dataset"]][2]) if r["dataset"] in bracket else "—"]
        for r in oracle.sort("dataset").iter_rows(named=True)])
    lines += ["The TTFT columns replay a closed loop whose clients start together (`lockstep`, "
              "the headline), parted only where an idle engine runs the first request of a "
              "burst alone; the steady TTFT columns its steady state (clients "
              "staggered over one request's decode, the first wave dropped). A benchmark's "
              "clients drift apart, so a measured TTFT should lie between the two: the last "
              "column but one counts how often it does. Above the bracket lies time outside "
              "the steps (the frontend's queueing, tokenization, HTTP) or an engine slower than "
              "its kernel tables; below it, a replay slower than the engine (its limits or its "
              "kernels). TTFT off the bracket: the mean distance from the measured TTFT to the "
              "nearer end of the bracket, in % of the measured, 0 inside it: the oracle's TTFT "
              "error left if how far the clients drifted apart, which no record states, were "
              "granted.", ""]
    if mine.is_empty():
        return lines
    # a run of recorded arrivals (no concurrency) is one row: its prompts are each of its own length
    cube = (mine.with_columns(isl=pl.when(pl.col("concurrency").is_not_null()).then("isl"))
            .group_by("dataset", "backend", "isl", "concurrency", "phase")
            .agg(mape=pl.col("signed_pct").abs().mean(), n=pl.len())
            .pivot("phase", index=["dataset", "backend", "isl", "concurrency"],
                   values=["mape", "n"])
            .sort("dataset", "backend", "isl", "concurrency"))
    lines += ["By backend, prompt length and concurrency (MAPE %):", ""]
    lines += table(["dataset", "backend", "isl", "concurrency", "n", "TTFT MAPE %", "TPOT MAPE %"], [
        [r["dataset"], r["backend"], "—" if r["isl"] is None else str(r["isl"]),
         "recorded arrivals" if r["concurrency"] is None else str(r["concurrency"]), str(r["n_ttft"]),
         fmt(r["mape_ttft"]), fmt(r.get("mape_tpot"))] for r in cube.iter_rows(named=True)],
        "llrrrrr")
    valid = predictions.filter(pl.col("run_id").is_in(oracle.filter(pl.col("valid"))["run_id"]
                                                      .to_list()))
    return lines + what_stops_the_oracle(valid)


def measured_gap(rows: pl.DataFrame) -> tuple[str, list[float]]:
    """Measured minus predicted (ms): its median at the lowest and highest concurrency, and the
    slopes of lines over concurrency per (model, TP, isl), so that which models ran at which
    loads does not enter."""
    gap = rows.with_columns(gap=pl.col("gt_ms") - pl.col("pred_ms"))
    slopes = [np.polyfit(g["concurrency"].to_numpy().astype(np.float64), g["gap"].to_numpy(), 1)[0]
              for _, g in gap.group_by("model", "tp", "isl") if g["concurrency"].n_unique() > 1]
    c = gap["concurrency"]
    ends = (f"{gap.filter(pl.col('concurrency') == c.min())['gap'].median():.2f} / "
            f"{gap.filter(pl.col('concurrency') == c.max())['gap'].median():.2f}"
            if c.drop_nulls().len() else "—")
    return ends, slopes


# Time a vLLM request spends outside the engine, one source's measurement: the client's TTFT
# minus vLLM's own (its vllm:time_to_first_token_seconds metric, timed inside the server), the
# lowest and highest of five rounds of 32 requests (512-token prompts, 8 clients, vLLM
# 0.28.1rc1 behind its own API server, an RTX 4070 laptop GPU under WSL2). It holds what the
# server's clock misses: HTTP both ways, the client, and whatever of the request's processing
# comes before that clock starts. Not the runs' path: aiconfigurator's launch scripts serve
# through Dynamo's frontend, and the runs' prompts reach 8k tokens.
FRONTEND_MS = (8.4, 12.2)
FRONTEND_SOURCE = "https://github.com/vllm-project/vllm/pull/54628"


def frontend_reading(mine: pl.DataFrame) -> list[str]:
    """Per dataset, the oracle's TTFT MAPE over its vLLM closed-loop targets as replayed and
    with each end of ``FRONTEND_MS`` added to every first token, for the lockstep and the
    steady-state ends of the bracket."""
    vllm = mine.filter((pl.col("backend") == "vllm") & pl.col("concurrency").is_not_null()
                       & pl.col("phase").is_in(["ttft", "ttft_steady"]))
    if vllm.is_empty():
        return []

    def mape(rows: pl.DataFrame, added: float) -> str:
        signed = metrics.errors(rows["pred_ms"] + added, rows["gt_ms"])
        return fmt(float(signed.abs().mean())) if len(rows) else "—"

    body = []
    for (dataset,), group in vllm.group_by("dataset", maintain_order=True):
        lock, steady = group.filter(phase="ttft"), group.filter(phase="ttft_steady")
        body.append([dataset, str(len(lock)),
                     " / ".join(mape(lock, f) for f in (0.0, *FRONTEND_MS)),
                     " / ".join(mape(steady, f) for f in (0.0, *FRONTEND_MS))])
    low_ms, high_ms = FRONTEND_MS
    return [f"A per-request time outside the steps: one source measured vLLM's at {low_ms} "
            f"to {high_ms} ms a request over five rounds, a client's TTFT minus vLLM's own TTFT "
            f"metric ({FRONTEND_SOURCE}). It is a sensitivity, not a bound: one laptop GPU, "
            "vLLM's own API server and 512-token prompts, where aiconfigurator's launch scripts "
            "serve through Dynamo's frontend (generator/config/backend_templates/vllm/run.sh.j2) "
            "and the runs' prompts reach 8k tokens. The replay adds none. The oracle's "
            "TTFT MAPE % over each set's vLLM closed loops as replayed, then with the lowest and "
            "highest round's time added to every first token, at both ends of the bracket (the "
            "table above gives the steady-state gaps such a time would fill):", "",
            *table(["dataset", "n", f"lockstep TTFT MAPE %: +0 / +{low_ms} / +{high_ms} ms",
                    f"steady TTFT MAPE %: +0 / +{low_ms} / +{high_ms} ms"], sorted(body),
                   "lrrr")]


def what_stops_the_oracle(mine: pl.DataFrame, waves: Path = WAVES_JSON,
                          choices: Path = CHOICES_JSON, light: Path = LIGHT_JSON,
                          kv_write: Path = KV_WRITE_JSON) -> list[str]:
    """Measured, per dataset and backend: which way the oracle misses, how its TPOT gap
    (measured minus oracle) grows with the clients, and how far the measured TTFT lies above
    the steady state's (the time a first token spends outside the replayed steps); per dataset
    that misses the goal, what the replay's unknowns were measured to give."""
    lines = ["What keeps the oracle from the replay's goal (TTFT MAPE <= 12 %, TPOT <= 7 % on every "
             "`_silicon` set; docs/design.md), measured from its predictions: the signed median error "
             "(negative: the replay is faster than the engine), and its TPOT gap, measured minus oracle, "
             "at the lowest and highest concurrency and per added client (the median over (model, TP, "
             "isl) of a line fitted over their loads). The gap holds what the kernel tables and the vLLM "
             "host time leave out of a step (light kernels and sampling, whose share "
             "`benchmarks/light_kernels.py` measures below, host work an overlap scheduler does "
             "not hide, detokenisation), and also the tables' interpolation and the replay's own error; a "
             "gap that grows with the clients points to per-request work. The steady-state TTFT gap is "
             "the same reading of the measured TTFT against the steady state's: what a first token waits "
             "outside the replayed steps, if the clients had drifted fully apart. The engine limits each "
             "backend is replayed with, and their sources, are in `conf/serving/schedulers.yaml`.", ""]
    rows = []
    for (dataset, backend), group in mine.group_by("dataset", "backend", maintain_order=True):
        ttft, tpot = group.filter(phase="ttft"), group.filter(phase="tpot")
        tpot_ends, tpot_slopes = measured_gap(tpot)
        steady_ends, steady_slopes = measured_gap(group.filter(phase="ttft_steady"))
        rows.append([dataset, backend, str(len(ttft)), fmt(ttft["signed_pct"].abs().mean()),
                     fmt(ttft["signed_pct"].median()), fmt(tpot["signed_pct"].abs().mean()),
                     fmt(tpot["signed_pct"].median()), tpot_ends,
                     fmt(1e3 * float(np.median(tpot_slopes))) if tpot_slopes else "—",
                     steady_ends, fmt(float(np.median(steady_slopes))) if steady_slopes else "—"])
    lines += table(["dataset", "backend", "n", "TTFT MAPE %", "TTFT signed median %",
                    "TPOT MAPE %", "TPOT signed median %", "TPOT gap ms, lowest / highest c",
                    "TPOT gap per client µs", "steady TTFT gap ms, lowest / highest c",
                    "steady TTFT gap per client ms"], sorted(rows), "llrrrrrrrrr")
    lines += bracket_split(mine)
    lines += frontend_reading(mine)
    bracket = inside_bracket(mine)
    for (dataset,), group in mine.group_by("dataset", maintain_order=True):
        missed = [f"{m.upper()} {mape:.1f} % against {goal:.0f} %" for m, goal in TARGETS.items()
                  if not (mape := group.filter(phase=m)["signed_pct"].abs().mean()) <= goal]
        service = group.filter(phase="service")["signed_pct"]
        if len(service):  # recorded arrivals: not a `_silicon` set, and its TTFT is queueing
            lines += ["", f"`{dataset}` (recorded arrivals, not held to the `_silicon` goal): "
                      + ("; ".join(missed) + " would miss it" if missed else
                         "TTFT and TPOT within its thresholds")
                      + ", but its TTFT is mostly queueing; the service time (first token minus "
                      f"first scheduled, TTFT without the queue) is {service.abs().mean():.1f} % "
                      f"MAPE, signed median {service.median():.1f} %."
                      + (f" Measured: {clause}." if (clause := light_kernels_measured(
                          dataset, light)) is not None else "")]
            continue
        lines += ["", f"`{dataset}`: " + ("; ".join(missed) + ": missed." if missed else "met.")
                  + (unknowns_measured(dataset, bracket.get(dataset), waves, choices, light,
                                       kv_write)
                     if missed else "")]
    return lines + [""]


def for_card(name: str, runs_dir: Path, rows: dict[str, dict]) -> list[str]:
    """The oracle's measured error on serving set ``name``, for its card: the tables of the
    report from its current oracle run in ``runs_dir``, or why there is none."""
    heading = ["## The replay's own error, measured", ""]
    home = oracle_home(name, rows)
    if home is None:
        steps = STEP_FAMILY.get(families.suffix_of(name), ())
        why = ("no step family of its runs' kind holds the GPU's own kernel tables (see \"No "
               "oracle here\" above)" if not steps else
               f"no {' or '.join(f'`_{s}`' for s in steps)} set of its GPU holds the GPU's own "
               "kernel tables at the runs' precision (the B200's per-tensor FP8 GEMM tables "
               "fail the FP8 check of the `_vidur_fp8` card)")
        return heading + [f"{name} has no oracle: {why}.", ""]
    current = results.current(results.load_runs(runs_dir)).pl() if Path(runs_dir).is_dir() \
        else pl.DataFrame()
    oracle = leaderboard_table.oracle_runs(current, [name]) if len(current) else current
    if oracle.is_empty():
        return heading + [f"No current oracle run of {name} in {runs_dir}; make one with "
                          f"`python -m leaderboard predictor={ORACLE} dataset={name} "
                          f"dataset.home={home} split.home_points={ORACLE_POINTS}`.", ""]
    return heading + oracle_section(oracle, results.load_predictions(oracle))[2:]


# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
