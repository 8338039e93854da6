"""Serving-level datasets (kind ``serving``): measured TTFT and TPOT, built at store build time.

- ``<sku>_silicon``: one target per aiconfigurator silicon run the suite can express (see
  ``exclusion``) with BF16 weights; ground truth is the run's mean TTFT and TPOT under its
  closed-loop load. ``<sku>_silicon_fp8``: the same for vLLM's FP8 runs (FP8 GEMMs, BF16
  attention and KV cache, as vLLM's ``quantization=fp8`` runs them). ``<sku>_silicon_moe``:
  vLLM's runs of the mixture-of-experts models the suite composes (GQA attention, no shared
  expert; experts split over the TP group or spread whole over it), at BF16 or FP8.
- ``rtx4090_serving``: one target per request of LLMServingSim's RTX4090 vLLM run, its TTFT and
  TPOT from the recorded timestamps.
- ``<short>_e2e``: one target per LLM-Inference-Bench vLLM run, a static batch timed end to end
  (``leaderboard.cells.static_batches``).

Every silicon row is accounted for in the card's coverage table: usable, or the reason it is not.
"""

from __future__ import annotations

import json

import duckdb
import polars as pl

from leaderboard.cells import memory, serving_artefacts, static_batches
from leaderboard.cells.common import coverage_table, render_card, source_lines
from leaderboard.cells.fp8_check import block_ratios
from leaderboard_core.specs import GpuSpec, is_moe, load_models, uncomposable_reason
from leaderboard_core.versioning import content_hash, release

SUPPORTED_PRECISIONS = ("bf16", "fp8")
FP8_BACKENDS = ("vllm",)  # FP8 rows replayed so far; another backend's FP8 kernels are unchecked
FAMILY_OF_PRECISION = {"bf16": "silicon", "fp8": "silicon_fp8"}
MOE_FAMILY = "silicon_moe"  # an MoE model's runs, whatever their precision
MOE_BACKENDS = ("vllm",)  # the MoE tables are vLLM's fused-MoE kernels
SERVING_RUN = "RTX4090/Llama-3.1-8B"  # the LLMServingSim run with recorded arrivals
TARGET_SCHEMA = {
    "dataset": pl.String, "target_id": pl.String, "sku": pl.String, "model": pl.String,
    "tp": pl.Int64, "moe_ep": pl.Int64, "backend": pl.String, "backend_version": pl.String,
    "precision": pl.String,
    "gemm_dtype": pl.String, "load": pl.String, "run": pl.String, "isl": pl.Int64, "osl": pl.Int64,
    "concurrency": pl.Int64, "arrival_ms": pl.Float64, "gt_ttft_ms": pl.Float64,
    "gt_tpot_ms": pl.Float64, "gt_service_ms": pl.Float64, "gt_e2e_ms": pl.Float64,
    "gt_kind": pl.String,
    "source": pl.String, "file": pl.String,
    "file_sha256": pl.String,
}


def exclusion(row: dict, gpus: dict[str, GpuSpec], models: dict[str, dict]) -> str | None:
    """Why a silicon row cannot be a serving target here, or None when it can."""
    if row["mode"] != "agg":
        return "disaggregated (separate prefill and decode workers)"
    if row["model"] is None:
        return "no shape in conf/model (a model or pre-quantized checkpoint not described there)"
    model = models[row["model"]]
    if is_moe(model) and (why := _moe_exclusion(row, model)):
        return why
    if row["precision"] not in SUPPORTED_PRECISIONS:
        return (f"{row['precision'].upper() or 'unstated'} precision: the step predictors score "
                "BF16 and FP8 only")
    if row["precision"] == "fp8" and row["backend"] not in FP8_BACKENDS:
        return (f"FP8 on {row['backend']}: only vLLM's FP8 runs are replayed (the other "
                "backends' FP8 kernels are not checked against a measured table yet)")
    if row["sku"] not in gpus:
        return "no conf/gpu spec for the GPU"
    if why := memory.weight_misfit(model, row["tp"], row["precision"],
                                   gpus[row["sku"]]["mem_gb"]):
        return why
    if (row["pp"] or 1) > 1 or (row["attention_dp"] or 1) > 1:
        return "pipeline or attention-data parallel"
    if row["concurrency"] is not None and row["concurrency"] != row["batch_size"]:
        return "load ambiguous: batch_size differs from the stated concurrency (replicas unstated)"
    return None


def _moe_exclusion(row: dict, model: dict) -> str | None:
    """Why an MoE run cannot be replayed, or None: the replay prices what the MoE step cells
    compose (``leaderboard.cells.vidur_method``), one vLLM fused-MoE kernel per layer."""
    if row["backend"] not in MOE_BACKENDS:
        return f"MoE on {row['backend']}: the MoE kernel tables are vLLM's"
    if why := uncomposable_reason(model):
        return why
    ep, moe_tp = row["moe_ep"] or 1, row.get("moe_tp") or row["tp"]
    if ep > 1 and (ep, moe_tp) != (row["tp"], 1):
        return (f"experts over TP{moe_tp} x EP{ep} beside attention over TP{row['tp']}: the "
                "replay spreads the experts over the attention's TP group, whole or split")
    if ep > 1 and row["attention_dp"] is None:
        return ("expert parallelism with attention data parallelism unstated (with it, an "
                "all-to-all no table times)")
    if ep == 1 and moe_tp != row["tp"]:
        return (f"experts over TP{row['moe_tp']} beside attention over TP{row['tp']} (attention "
                "data parallelism left unstated): the replay splits both over one TP group")
    return None


def _versions(versions: pl.Series) -> str:
    """Each backend version of ``versions`` with its count of runs, oldest first."""
    counts = versions.value_counts()
    return ", ".join(f"{v} ({n})" for v, n in sorted(
        counts.iter_rows(), key=lambda row: (release(row[0]) is None, release(row[0]) or (),
                                             str(row[0]))))


def _silicon(con, gpus) -> list[tuple[str, str, pl.DataFrame, str]]:
    runs = con.sql("SELECT * FROM serving_runs ORDER BY row").pl()
    if not len(runs):
        return []
    models = load_models()
    runs = runs.with_columns(why=pl.Series([exclusion(r, gpus, models)
                                            for r in runs.iter_rows(named=True)], dtype=pl.String))
    slope = serving_artefacts.slope_artefacts(runs)
    runs = runs.with_columns(why=pl.when(pl.col("row").is_in(list(slope)))
                             .then(pl.lit(serving_artefacts.REASON)).otherwise("why"))
    floors = serving_artefacts.below_decode_floor(runs, gpus, models)
    floored = serving_artefacts.campaign_rows(runs, list(floors))
    runs = runs.with_columns(why=pl.when(pl.col("row").is_in(floored))
                             .then(pl.lit(serving_artefacts.FLOOR_REASON)).otherwise("why"))
    coverage = coverage_table(runs, {"GPU": "sku", "model": "model_path", "backend": "backend",
                                     "precision": "precision"}, "usable")
    sources = source_lines(con, runs.select("file", "file_sha256").unique().iter_rows())
    out = []
    usable = runs.filter(pl.col("why").is_null())
    usable = usable.with_columns(family=pl.Series(
        [MOE_FAMILY if is_moe(models[m]) else FAMILY_OF_PRECISION[p]
         for m, p in usable.select("model", "precision").iter_rows()], dtype=pl.String))
    for (sku, fam), group in usable.group_by("sku", "family", maintain_order=True):
        name = f"{gpus[sku]['short_name']}_{fam}"
        precision = "/".join(sorted(set(group["precision"])))
        targets = group.select(
            target_id="run_id", sku="sku", model="model", tp="tp",
            moe_ep=pl.when(pl.col("moe_ep") > 1).then("moe_ep"), backend="backend",
            backend_version="backend_version", precision="precision",
            gemm_dtype="precision", load=pl.lit("closed"),
            run="run_id", isl="isl", osl="osl", concurrency="batch_size",
            gt_ttft_ms="ttft_ms", gt_tpot_ms="tpot_ms", source="source", file="file",
            file_sha256="file_sha256")
        experts = ({"block_ratios": block_ratios(con, sku),
                    "run_versions": _versions(group["backend_version"])}
                   if fam == MOE_FAMILY else {})
        card = render_card("silicon_moe" if fam == MOE_FAMILY else "silicon", name=name, sku=sku,
                           precision=precision.upper(), **experts,
                           rows=len(group),
                           runs_total=len(runs), usable_total=int(runs["why"].is_null().sum()),
                           coverage=coverage, sources=sources,
                           slope_rows=len(slope), slope_fits=serving_artefacts.fit_table(runs, slope),
                           floor_rows=len(floored),
                           floors=serving_artefacts.floor_table(runs, floors, gpus, models))
        out.append((name, sku, targets, card))
    return out


def _recorded(con) -> list[tuple[str, str, pl.DataFrame, str]]:
    reqs = con.sql("SELECT * FROM serving_requests WHERE run = ? ORDER BY queued_ts, request_id",
                   params=[SERVING_RUN]).pl()
    if not len(reqs):
        return []
    # arrival_time is the client's wall clock; the engine's timestamps share another clock, so
    # the engine's queueing time is the arrival both for the ground truth and the replay.
    first = reqs["queued_ts"].min()
    targets = reqs.select(
        target_id="request_id", sku="sku", model="model", tp=pl.lit(1, pl.Int64),
        backend="backend", backend_version="backend_version", precision=pl.lit("bf16"),
        gemm_dtype=pl.lit("bf16"),
        load=pl.lit("recorded"), run="run", isl="input_toks", osl="output_toks",
        concurrency=pl.lit(None, pl.Int64), arrival_ms=(pl.col("queued_ts") - first) * 1e3,
        gt_ttft_ms=(pl.col("first_token_ts") - pl.col("queued_ts")) * 1e3,
        # A one-token output has no TPOT: its target scores TTFT only (it still loads the replay).
        gt_tpot_ms=pl.when(pl.col("output_toks") > 1).then(
            (pl.col("last_token_ts") - pl.col("first_token_ts")) * 1e3 / (pl.col("output_toks") - 1)),
        # The engine's own view: first token minus the first step that scheduled the request.
        gt_service_ms=(pl.col("first_token_ts") - pl.col("scheduled_ts")) * 1e3,
        source="source", file="file", file_sha256="file_sha256")
    sku = reqs["sku"][0]
    card = render_card("serving", name=f"{sku}_serving", sku=sku, requests=len(reqs),
                       one_token=int((reqs["output_toks"] <= 1).sum()),
                       sources=source_lines(con, reqs.select("file", "file_sha256").unique().iter_rows()))
    return [(f"{sku}_serving", sku, targets, card)]


def build_all(con: duckdb.DuckDBPyConnection, gpus: dict[str, GpuSpec], builder_version: str
              ) -> tuple[pl.DataFrame, list[dict]]:
    """All serving targets (one frame) and their ``datasets``-table entries."""
    frames, entries = [pl.DataFrame(schema=TARGET_SCHEMA)], []
    for name, sku, targets, card in [*_silicon(con, gpus), *_recorded(con),
                                     *static_batches.build(con, gpus)]:
        targets = targets.with_columns(dataset=pl.lit(name), gt_kind=pl.lit("serving"))
        targets = targets.select([(pl.col(c) if c in targets.columns else pl.lit(None)).cast(t)
                                  .alias(c) for c, t in TARGET_SCHEMA.items()])
        frames.append(targets)
        digest = targets.select("target_id", "gt_ttft_ms", "gt_tpot_ms", "gt_service_ms",
                                "gt_e2e_ms").sort(
            "target_id").write_csv()
        entries.append({
            "name": name, "kind": "serving", "source": targets["source"][0], "sku": sku,
            "rows": len(targets), "version": content_hash(builder_version, digest, card),
            "tables": json.dumps({"serving_targets": len(targets)}),
            "backend_versions": json.dumps(sorted(set(targets["backend_version"].drop_nulls()))),
            "files": json.dumps(sorted(set(targets["file"]))), "pinned": True,
            "phases": json.dumps({m: int(targets[f"gt_{m}_ms"].is_not_null().sum())
                                  for m in ("ttft", "tpot", "service", "e2e")
                                  if targets[f"gt_{m}_ms"].is_not_null().any()}),
            "card": card,
        })
    return pl.concat(frames), entries
