"""One leaderboard run: fit on the home's training rows, predict the target blind, score it.

The run folder is written under a temporary name and renamed when complete, so an interrupted
run leaves nothing the leaderboard would count.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard.cells import families
from leaderboard.run import op_level as op_level_api
from leaderboard.run import rankable, readings
from leaderboard.run.run_inputs import RunInputs, RunSpec, load_inputs, require_card_scope
from leaderboard.score import atlas, decisions, metrics
from leaderboard.seal import predictor_index, sandbox, walls
from leaderboard.seal.predictor_index import PredictorCode
from leaderboard.serving import scoring as serving_api
from leaderboard.store import debris
from leaderboard_core.contract import BY_OP_PREFIX, GROUND_TRUTH_COLUMNS, NotSupported
from leaderboard_core.specs import spec_hash
from leaderboard_core.versioning import code_version, harness_hash

PREDICTION_COLUMNS = ("cell_id", "workload_id", "model", "tp", "phase", "num_requests",
                      "num_decode", "total_tokens", "decode_ctx_sum", "gt_kind", "gt_ms",
                      "warm_share", "composed", "weight")


@dataclass
class RunResult:
    folder: Path
    metrics: dict
    predictions: pl.DataFrame


def _priced(described: dict, code: PredictorCode, params: dict, inputs: RunInputs,
            budget: int, spec: RunSpec) -> tuple[pl.DataFrame, np.ndarray | None, dict]:
    """The scored rows, their predictions (or None) and the timing/validity facts.

    Construct, fit, reading and predict run in a child process that gets the home bundle and
    the blind target only (``leaderboard.seal.sandbox``); this process keeps the ground truth. A
    predictor's exception is an INVALID reason, not a crash of the harness. Cells a deploy
    reading touched are removed from the scored target. On serving targets the child prices the
    steps this process's replay schedules (no deploy reading), and the rows are one per target
    and metric, scored against the measured TTFT/TPOT this process keeps.
    """
    serving = inputs.serving
    hidden = (serving_api.GROUND_TRUTH if serving else
              op_level_api.MEASURED if inputs.op_level else GROUND_TRUTH_COLUMNS)
    supplier = readings.Supplier(inputs.target, pl.DataFrame() if serving else
                                 inputs.target_lineage, budget)
    pred, unscored, facts = sandbox.fit_and_predict(
        described, params, inputs.home, inputs.target.drop(hidden), inputs.gpu, inputs.level,
        budget, supplier, inputs.data_roots, code.readable, code.registered, spec.stage_seconds,
        code_hash=code.code_hash)
    if serving:
        if facts.get("not_supported"):
            raise NotSupported(facts["not_supported"])
        facts["deploy_row_ids"], facts["target_rows"] = [], 0
        nan = np.full(len(inputs.target), np.nan)
        scored = serving_api.phases_of(inputs.target_row["name"])
        rows = serving_api.prediction_rows(inputs.target, {
            m: pred[i] if pred is not None else nan
            for i, m in enumerate(serving_api.METRICS) if m in scored})
        return rows, None if facts["invalid_reasons"] else rows["pred_ms"], facts
    facts["deploy_row_ids"], facts["target_rows"] = unscored, supplier.rows_used
    target = supplier.scored()
    if pred is not None and pred.shape != (len(target),):
        facts["invalid_reasons"].append(f"predict returned shape {pred.shape}, expected "
                                        f"({len(target)},)")
        facts.pop("by_op", None)
        pred = None
    elif pred is not None and (bad := ~(np.isfinite(pred) & (pred > 0))).any():
        facts["invalid_reasons"].append(f"{int(bad.sum())} of {len(pred)} predictions are not "
                                        "finite and positive")
    columns = op_level_api.PREDICTION_COLUMNS if inputs.op_level else PREDICTION_COLUMNS
    rows = target.select(columns).with_columns(
        pred_ms=pl.Series(pred if pred is not None else np.full(len(target), np.nan)),
        **{f"{BY_OP_PREFIX}{op}": pl.Series(ms) for op, ms in facts.pop("by_op", {}).items()})
    return rows, pred, facts


def split_of(dataset: str, sku: str, home_rows: list[dict]) -> str:
    """``home_heldout`` for a home dataset (scored on its held-out cells); ``home_gpu`` for
    another dataset of a home GPU, which is not a GPU the predictor never saw; else ``unseen``."""
    if dataset in {r["name"] for r in home_rows}:
        return "home_heldout"
    return "home_gpu" if sku in {r["sku"] for r in home_rows} else "unseen"


def run(spec: RunSpec) -> RunResult:
    # The predictor's module is never imported here, where the ground truth is: its description
    # comes from a sealed child, and its code runs only in each run's sealed child.
    described = predictor_index.get(spec.predictor)
    predictor_index.check_params(spec.predictor, spec.params)
    params = {**described["defaults"], **spec.params}
    code = predictor_index.code_of(described)
    inputs = load_inputs(spec)
    if inputs.op_level:
        op_level_api.require_op_predictor(described)
    card = described["card"]
    require_card_scope(spec.predictor, card, inputs)
    # what the run read, as it read it: the GPU and model specs and the rows
    read = {"spec_hash": spec_hash(inputs.gpu, inputs.home.models),
            "inputs_digest": inputs.digest()}
    target_row, home_row, home_name = inputs.target_row, inputs.home_row, inputs.home_row["name"]
    home_names = [r["name"] for r in inputs.home_rows]
    op_level = inputs.op_level
    # Deploy readings are for step targets only (docs/design.md): an op-level or serving
    # child that asks anyway is refused, and its run INVALID
    budget = (readings.cap(len(inputs.target), spec.reading_max_points, spec.reading_max_fraction)
              if inputs.level == "step" else 0)
    predictions, pred, facts = _priced(described, code, params, inputs, budget, spec)
    predictions = predictions.with_columns(
        signed_pct=metrics.errors(pl.col("pred_ms"), pl.col("gt_ms")))
    phases = (serving_api.phases_of(spec.dataset) if inputs.serving else
              op_level_api.OP_PHASES if op_level else families.PHASES)
    result = {
        "predictor": spec.predictor, "params": params,
        "card": {"kind": card["kind"], "reference": card["reference"],
                 "trained_on": home_row["sku"], "needs_profiled_rows": card["needs_profiled_rows"],
                 "precisions": card["precisions"], "layers": card["layers"]},
        "dataset": spec.dataset, "dataset_repo": spec.hub_repo,
        "dataset_revision": spec.hub_revision, "sku": target_row["sku"], "home_dataset": home_name,
        "home_sku": home_row["sku"],
        "split": split_of(spec.dataset, target_row["sku"], inputs.home_rows),
        "home_datasets": home_names, "home_points": spec.home_points,
        "home_points_used": inputs.home_points,
        "split_seed": spec.seed, "test_fraction": spec.test_fraction,
        "dataset_version": target_row["version"], "home_dataset_version": home_row["version"],
        "code_version": code_version(), "code_hash": code.code_hash,
        "harness_hash": harness_hash(), "predictor_folder": code.folder_name,
        "valid": not facts["invalid_reasons"],
        "invalid_reasons": facts["invalid_reasons"], "fit_seconds": facts.get("fit_seconds"),
        "fit_reused": facts.get("fit_reused", False),
        "by_op_error": facts.get("by_op_error"),
        "sandbox": facts.get("sandbox", "process"),
        # ranked only when sealed: without namespaces and Landlock nothing but the predictor's
        # discipline keeps it from the store
        "sealed": facts.get("sandbox") == walls.SEALED,
        "spec_hash": read["spec_hash"],
        # target rows read (deploy reading), against the cap; home rows fit read are apart
        "profiled_rows": facts["target_rows"], "reading_cap": budget,
        "home_profiled_rows": facts.get("home_profiled_rows", 0),
        "deploy_rows": len(facts["deploy_row_ids"]), "deploy_row_ids": facts["deploy_row_ids"],
        "predict_cells_per_s": (facts.get("steps", len(predictions)) / facts["predict_seconds"]
                                if facts.get("predict_seconds") else None),
        "level": inputs.level,
        "phases": metrics.by_phase(predictions, phases, inputs.level) if pred is not None else {},
        # what its predictions decide, scored by what was measured (leaderboard.score.decisions)
        "decisions": ({"capacity": decisions.run_capacity(predictions)}
                      if inputs.level == "step" and pred is not None else {}),
        "reading_max_points": spec.reading_max_points,
        "reading_max_fraction": spec.reading_max_fraction,
        "inputs_digest": read["inputs_digest"],
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    result["unrankable_because"] = [
        *rankable.reasons(spec, inputs, params, described["defaults"], result["sealed"],
                          result["sandbox"]),
        *rankable.implausible(result["split"], result["phases"])]
    result["rankable"] = not result["unrankable_because"]
    folder = _write(spec, result, predictions, inputs.target_lineage)
    return RunResult(folder, result, predictions)


def _write(spec: RunSpec, result: dict, predictions: pl.DataFrame, lineage: pl.DataFrame) -> Path:
    run_id = (f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{spec.predictor}-{spec.dataset}-"
              f"{uuid.uuid4().hex[:6]}")
    result["run_id"] = run_id
    final = Path(spec.runs_dir) / run_id
    partial = final.with_name(f".{run_id}.{os.getpid()}.partial")
    partial.mkdir(parents=True)
    try:
        (partial / "metrics.json").write_text(json.dumps(result, indent=1) + "\n")
        predictions.with_columns(run_id=pl.lit(run_id)).write_parquet(partial / "predictions.parquet")
        if spec.atlas and len(lineage) and result["phases"]:  # step runs with predictions
            atlas.write_run(predictions, atlas.dominant_of(lineage), spec.dataset,
                            partial / "atlas.png")
        os.replace(partial, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    debris.sweep(spec.runs_dir)  # the partial folders of writers that died
    if spec.output_json:
        out = Path(spec.output_json)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(final / "metrics.json", out)
    return final
