"""aiconfigurator's own estimate of the serving sets, an in-sample reference beside the oracle.

NVIDIA's aiconfigurator (``aiconfigurator`` on PyPI) prices a serving configuration from its own
measured kernel tables of the very GPU it is asked about: on a ``_silicon`` set it reads the
target's own measurements (at its own database version, not the run's), so it is in-sample by
construction, like the replay's oracle. It runs outside the seal, in an environment of its own
(``python -m leaderboard.reference``), and is never ranked. ``requests`` says what it is asked
for each closed-loop target; ``section`` sets its error beside the oracle's.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from leaderboard_core import paths
from leaderboard_core.report_tables import fmt, phase_stat, table
from leaderboard_core.specs import fp8_scaling, is_moe

VERSION = "0.12.0"  # the pinned release: its tables and its estimate
REFERENCE_FILE = paths.REPO_ROOT / "results" / "aiconfigurator-reference.json"
# The GPUs aiconfigurator 0.12.0 ships tables for, by the suite's sku names.
SYSTEMS = ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "gb200", "l40s")
METRICS = ("ttft", "tpot")


def quant_modes(gemm_dtype: str, model: dict) -> tuple[str, str | None]:
    """aiconfigurator's GEMM and MoE quantization for a target: BF16, or FP8 per tensor, or FP8
    with a scale per 128 x 128 block where the checkpoint has them (``fp8_scaling: block``)."""
    if gemm_dtype != "fp8":
        gemm = "bfloat16"
    else:
        gemm = "fp8_block" if fp8_scaling(model) == "block" else "fp8"
    return gemm, gemm if is_moe(model) else None


def requests(targets: pl.DataFrame, models: dict[str, dict]) -> list[dict]:
    """One request per closed-loop target whose GPU aiconfigurator has tables for: the model's
    names, the system, backend, isl, osl, concurrency as its batch, TP and the experts'
    placement (``moe_ep`` = TP: whole experts spread over the group)."""
    out = []
    for t in targets.filter((pl.col("load") == "closed") & pl.col("sku").is_in(SYSTEMS)
                            ).iter_rows(named=True):
        model = models[t["model"]]
        gemm, moe = quant_modes(t["gemm_dtype"], model)
        spread = is_moe(model) and (t.get("moe_ep") or 1) > 1
        out.append({"target_id": t["target_id"], "dataset": t["dataset"],
                    "model_aliases": [model["hf_id"], *model.get("aliases", [])],
                    "system": t["sku"], "backend": t["backend"], "isl": t["isl"],
                    "osl": t["osl"], "concurrency": t["concurrency"], "tp": t["tp"],
                    "moe_tp": (1 if spread else t["tp"]) if moe else None,
                    "moe_ep": (t["tp"] if spread else 1) if moe else None,
                    "gemm_quant": gemm, "moe_quant": moe})
    return out


def errors(estimates: list[dict], measured: pl.DataFrame) -> pl.DataFrame:
    """Per dataset and metric: targets asked, answered, and the absolute and signed percentage
    error of the answers against ``measured`` (dataset, cell_id ``<target>:<metric>``, gt_ms)."""
    rows = [{"dataset": e["dataset"], "cell_id": f"{e['target_id']}:{m}", "est_ms": e.get(f"{m}_ms")}
            for e in estimates for m in METRICS]
    asked = pl.DataFrame(rows, schema={"dataset": pl.String, "cell_id": pl.String,
                                       "est_ms": pl.Float64})
    joined = asked.join(measured.select("dataset", "cell_id", "gt_ms").unique(["dataset", "cell_id"]),
                        on=["dataset", "cell_id"], how="inner")
    signed = (pl.col("est_ms") / pl.col("gt_ms") - 1) * 100
    return (joined.with_columns(metric=pl.col("cell_id").str.split(":").list.last(), signed=signed)
            .group_by("dataset", "metric").agg(
                asked=pl.len(), answered=pl.col("est_ms").is_not_null().sum(),
                mape=pl.col("signed").abs().mean(), median_signed=pl.col("signed").median())
            .sort("dataset", "metric"))


def load(path: Path = REFERENCE_FILE) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def section(oracle: pl.DataFrame, predictions: pl.DataFrame, path: Path = REFERENCE_FILE
            ) -> list[str]:
    """The reference's table, beside the oracle's TTFT and TPOT MAPE on the same sets; nothing
    where no reference file was made."""
    reference = load(path)
    if reference is None or not len(predictions):
        return []
    found = errors(reference["estimates"], predictions)
    if found.is_empty():
        return []
    oracle_by = {r["dataset"]: r for r in oracle.iter_rows(named=True)}
    versions = ", ".join(f"{b} {v}" for b, v in sorted(reference["database_versions"].items()))
    rows = []
    for dataset in sorted(set(found["dataset"])):
        part = {r["metric"]: r for r in found.filter(pl.col("dataset") == dataset).iter_rows(
            named=True)}
        ttft, tpot = part.get("ttft", {}), part.get("tpot", {})
        mine = oracle_by.get(dataset)
        rows.append([dataset, f"{ttft.get('answered', 0)} of {ttft.get('asked', 0)}",
                     fmt(ttft.get("mape")), fmt(ttft.get("median_signed")), fmt(tpot.get("mape")),
                     fmt(tpot.get("median_signed")),
                     fmt(phase_stat(mine, "ttft", "mape")) if mine else "-",
                     fmt(phase_stat(mine, "tpot", "mape")) if mine else "-"])
    return ["### aiconfigurator's own estimate (in-sample reference, never ranked)", "",
            f"aiconfigurator {reference['aiconfigurator']} (`cli_estimate`, aggregated mode, the "
            f"closed loop's concurrency as its batch; its database: {versions}, whatever version "
            "the run measured) prices each closed-loop target from its own measured tables of "
            "the same GPU: in-sample by construction, like the oracle, so it is shown beside "
            "the oracle and never ranked. It runs outside the seal, in a virtualenv of its own "
            "(`python -m leaderboard.reference`). A target it cannot price is counted as asked, "
            f"not answered. Made {reference['made']} at `{reference['code_version'][:12]}`.", ""
            ] + table(["set", "TTFT answered", "TTFT MAPE %", "TTFT median signed %",
                       "TPOT MAPE %", "TPOT median signed %", "oracle TTFT MAPE %",
                       "oracle TPOT MAPE %"], rows) + [""]


# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
