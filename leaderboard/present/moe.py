"""RESULTS.md's mixture-of-experts section: the MoE step families (balanced and power-law routing)
and the MoE serving sets side by side, with the predictors that decline MoE layers and why.

The full per-phase tables of the step families are in the main leaderboard; this section puts
the MoE answers in one place, as a reader sizing an MoE deployment would look for them.
"""

from __future__ import annotations

import polars as pl

from leaderboard_core.report_tables import GPU_MEAN, PhaseMapes, datasets_of, fmt, table

STEP_FAMILIES = {"vidur_moe": "balanced routing (the headline)",
                 "vidur_moe_ep": "balanced routing, experts spread whole over the GPUs (expert "
                                 "parallelism, vLLM 0.19.0)",
                 "vidur_moe_powerlaw": "power-law routing (`power_law_1.01`, the variant)"}
SERVING_FAMILY = "silicon_moe"


def _declined(runs: pl.DataFrame, outcomes: dict[tuple[str, str], str], datasets: set[str]
              ) -> dict[tuple[str, str], list[str]]:
    """(predictor, NotSupported reason) -> the MoE ``datasets`` it declined with that reason (a
    dense-only card, or a precision it does not price: the MoE serving sets are FP8), from the
    last rerun's outcomes (a run declined before it starts writes no run) and the runs."""
    found = {(p, d): why.removeprefix("not supported: ") for (p, d), why in outcomes.items()
             if d in datasets and why.startswith("not supported")}
    for p, d, reasons in runs.filter(~pl.col("valid")).select(
            "predictor", "dataset", "invalid_reasons").iter_rows():
        if reasons and all(r.startswith("NotSupported") for r in reasons):
            found.setdefault((p, d), reasons[0].removeprefix("NotSupported: "))
    out: dict[tuple[str, str], list[str]] = {}
    for (p, d), why in sorted(found.items()):
        out.setdefault((p, why.split("; dataset ")[0]), []).append(d)
    return out


def _step_table(runs: pl.DataFrame, fam: str) -> list[str]:
    homes, unseen = datasets_of(runs, fam)
    mine = runs.filter(pl.col("dataset").is_in(homes + unseen))
    if mine.is_empty():
        return []
    mapes = PhaseMapes(mine, unseen)
    valid = sorted(set(mine.filter("valid")["predictor"]),
                   key=lambda p: (mapes.unseen_mean(p, "all") is None,
                                  round(mapes.unseen_mean(p, "all") or 0.0, 1), p))
    rows = [[p, *(fmt(mapes.mape(p, d, "all")) for d in homes + unseen),
             *(fmt(mapes.unseen_mean(p, phase)) for phase in ("all", "prefill", "decode"))]
            for p in valid]
    header = ["predictor", *(f"{d} (home)" for d in homes), *unseen,
              f"{GPU_MEAN} all %", "prefill %", "decode %"]
    return [f"**`_{fam}`**, {STEP_FAMILIES[fam]}: `all` MAPE % per GPU, and the {GPU_MEAN} over "
            "the unseen GPUs per phase.", "", *table(header, rows)]


def _serving_table(serving_runs: pl.DataFrame) -> list[str]:
    mine = serving_runs.filter(pl.col("family") == SERVING_FAMILY)
    if mine.is_empty():
        return ["No MoE serving run is on record.", ""]
    datasets = sorted(set(mine["dataset"]))
    mapes = PhaseMapes(mine, datasets)
    valid = sorted(set(mine.filter("valid")["predictor"]))
    rows = [[p, *(f"{fmt(mapes.mape(p, d, 'ttft'))} / {fmt(mapes.mape(p, d, 'tpot'))}"
                  for d in datasets)] for p in valid]
    return ["**`_silicon_moe`**, measured vLLM serving of MoE models (MiniMax-M2.5 and "
            "Qwen3-235B-A22B, FP8, experts split over the TP group or spread whole over it): "
            "TTFT / TPOT MAPE %, replayed as the "
            "dense sets are (the dataset cards list every MoE row left out, with its reason).", "",
            *table(["predictor", *(mapes.header(d, "tpot") for d in datasets)], rows)]


def section(runs: pl.DataFrame, serving_runs: pl.DataFrame,
            outcomes: dict[tuple[str, str], str] | None = None) -> list[str]:
    """The MoE section, from the leaderboard runs (step and serving, each with ``family``) and
    the last rerun's status per (predictor, dataset)."""
    moe = runs.filter(pl.col("family").is_in(list(STEP_FAMILIES)))
    serving = serving_runs.filter(pl.col("family") == SERVING_FAMILY)
    if moe.is_empty() and serving.is_empty():
        return []
    lines = ["## Mixture-of-experts models", "",
             "Step cells of Mixtral-8x7B (TP2, 4, 8) and Qwen3-30B-A3B (TP1, 2), one measured "
             "fused-MoE kernel per layer (`<sku>_vidur_moe`, home H100; the power-law variant's "
             "home is the A100, the only GPU whose vLLM 0.14.0 tables timed that routing and not "
             "the balanced one), the same workload sampling under expert parallelism "
             "(`_vidur_moe_ep`: Mixtral TP2, 4 and 8, Qwen3-30B-A3B TP2, each GPU holding "
             "experts / TP whole experts, vLLM 0.19.0; home H100), and the measured MoE "
             "serving runs the replay can express. A predictor whose card does not list `moe` "
             "(or `moe_ep`) layers answers NotSupported before it runs (docs/baselines.md says "
             "why each does or does not). Only `ours` reads the routing a cell states: on the "
             "power-law cells it spreads the rows as the collector's draw does (few tokens touch "
             "few experts; rung `ours_r8_routing`, docs/ours.md), so `ours_r7_collectives` is "
             "`ours` priced as if balanced. Every other predictor prices all routing as balanced.",
             ""]
    for fam in STEP_FAMILIES:
        lines += _step_table(moe, fam)
    lines += _serving_table(serving)
    both = pl.concat([moe, serving], how="diagonal_relaxed")
    declined = _declined(both, outcomes or {}, set(both["dataset"]))
    if declined:
        lines += ["NotSupported on the MoE sets, with the reason each predictor gave (a card "
                  "without `moe` layers, or a precision it does not price):", ""]
        lines += [f"- {p}: {why} ({len(sets)} sets)" for (p, why), sets in sorted(declined.items())]
        lines.append("")
    return lines


# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
