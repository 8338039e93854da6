"""The e2e family in RESULTS.md: end-to-end latency across vendors, and its headline row.

A predictor's GPU-mean, and the headline, are over the sets whose chip no predictor was fitted
on: the home is the A100 80GB step set, so these rows' A100 40GB (the same chip) is shown but
not averaged. The oracle's row is the replay's own error where a GPU has kernel tables (the
H100).
"""

from __future__ import annotations

import polars as pl

from leaderboard.cells import families
from leaderboard.present.headline import family_rows
from leaderboard.score import ranking, results
from leaderboard_core.report_tables import fmt, phase_stat, table
from leaderboard_core.specs import load_gpu_specs

FAMILY = "e2e"
TITLE = "e2e (across vendors)"


def _chip(spec) -> tuple:
    return spec["vendor"], spec["arch"], spec["sm_count"], spec["bf16_dense_tflops"]


def _unseen(runs: pl.DataFrame) -> list[str]:
    """The sets whose chip no predictor was fitted on: unseen, and not another board of a home
    GPU's chip (these rows' A100 40GB against the A100 80GB home)."""
    gpus = load_gpu_specs()
    home_chips = {_chip(gpus[s]) for s in set(runs["home_sku"].drop_nulls()) if s in gpus}
    unseen = runs.filter(pl.col("split") == "unseen")
    return sorted({d for d, sku in unseen.select("dataset", "sku").iter_rows()
                   if sku in gpus and _chip(gpus[sku]) not in home_chips})


def headline_rows(runs: pl.DataFrame) -> list[list[str]]:
    """The family's rows of the headline table, one per kind, ranked by end-to-end MAPE."""
    if runs.is_empty():
        return []
    unseen = _unseen(runs)
    predictions = results.load_predictions(runs.filter(pl.col("dataset").is_in(unseen)))
    scored = predictions.filter(pl.col("phase") == "e2e") if len(predictions) else predictions
    return family_rows(TITLE, runs, unseen, scored, families.get(FAMILY).home)


def section(runs: pl.DataFrame, oracle: pl.DataFrame, outcomes: dict) -> list[str]:
    """Per predictor and GPU: the end-to-end MAPE and bias, and the oracle's."""
    datasets = sorted(set(runs["dataset"]) | set(oracle["dataset"])
                      | {d for _, d in outcomes if d.endswith(f"_{FAMILY}")})
    if not datasets:
        return []
    by = {(r["predictor"], r["dataset"]): r for r in runs.iter_rows(named=True)}
    unseen = _unseen(runs) if len(runs) else []
    rows, reasons = [], {}  # reasons: (predictor, why) -> the sets it holds for
    for p in sorted({p for p, _ in by} | {p for p, d in outcomes if d in datasets}):
        cells, means, scored = [], [], []
        for d in datasets:
            run = by.get((p, d))
            if run is None:
                status = outcomes.get((p, d), "no run")
                cells.append("n/s" if status.lower().startswith("not supported") else status[:12])
                reasons.setdefault((p, status), []).append(d)
            elif not run["valid"]:
                cells.append("INVALID")
                reasons.setdefault((p, "INVALID: " + "; ".join(run["invalid_reasons"])),
                                   []).append(d)
            else:
                mape = phase_stat(run, "e2e", "mape")
                means.append(mape)
                scored.append(d)
                cells.append(f"{fmt(mape)} ({fmt(phase_stat(run, 'e2e', 'bias'))})")
        mine = [m for d, m in zip(scored, means, strict=True) if d in unseen]
        mean = sum(mine) / len(mine) if len(mine) == len(unseen) and mine else None
        rows.append([p, *cells, fmt(mean)])
    for r in oracle.iter_rows(named=True):
        rows.append([f"oracle ({r['dataset']})", *[
            f"{fmt(phase_stat(r, 'e2e', 'mape'))} ({fmt(phase_stat(r, 'e2e', 'bias'))})"
            if d == r["dataset"] else "—" for d in datasets], "—"])
    oracle_line = [
        f"The oracle prices every step of {r['dataset']} from that GPU's own kernel tables "
        f"(aiconfigurator's vLLM, against these rows' unpinned 2024 vLLM): end-to-end MAPE "
        f"{fmt(phase_stat(r, 'e2e', 'mape'))} % (bias {fmt(phase_stat(r, 'e2e', 'bias'))} %), "
        f"TTFT MAPE {fmt(phase_stat(r, 'ttft', 'mape'))} % over {phase_stat(r, 'ttft', 'n')} "
        "rows: the replay's own error there (host time, sampling, the scheduler's defaults and "
        "the version gap), which no predictor can remove." for r in oracle.iter_rows(named=True)]
    return ["## Across vendors: end-to-end latency (LLM-Inference-Bench)", "",
            "One static batch per row, run offline by vLLM on NVIDIA, AMD and Intel GPUs and "
            "timed end to end; the replay prefills the batch and decodes it step by step "
            "(`leaderboard/serving/static_batch.py`, the scheduler's defaults in "
            "`conf/serving/schedulers.yaml`), and each predictor times every step. Cell: "
            "end-to-end MAPE % (bias %); `GPU-mean`: the mean over the GPUs whose chip no "
            f"predictor was fitted on ({', '.join(unseen) or 'none yet'}; the home is "
            "`a100_vidur`, the A100 80GB, so these rows' A100 40GB is shown but not averaged). "
            "What a device is on each GPU, and what the family cannot "
            "test: the cards (`python -m leaderboard.data card mi250_e2e`).", "",
            *oracle_line, "",
            *table(["predictor", *datasets, "GPU-mean"], rows, "l" + "r" * (len(datasets) + 1)),
            *(["Why a predictor has no number on a set (`n/s`: it answered NotSupported):", "",
               *(f"- {p} on {', '.join(f'`{d}`' for d in sets)}: {why.replace('|', '/')[:300]}"
                 for (p, why), sets in sorted(reasons.items())), ""] if reasons else []),
            f"Headline kind and bootstrap CI ({ranking.CONFIDENCE:.0%}) over workloads: the "
            "headline table.", ""]

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
