"""One leaderboard run: fit on the home's training rows, predict the target blind, score it.

The run folder is written under a temporary name and renamed when complete, so an interrupted
run leaves nothing the leaderboard would count.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard import atlas, guard, homes, metrics
from leaderboard import op_level as op_level_api
from leaderboard.catalog import StoreCatalog
from leaderboard.hub import HubCatalog
from leaderboard.serving import scoring as serving_api
from leaderboard.specs import GpuSpec, load_gpu_specs, load_models, require_gpu
from leaderboard.split import default_split, split
from leaderboard.versioning import code_hash, code_version
from predictors import registry
from predictors.base import GROUND_TRUTH_COLUMNS, Home

PREDICTION_COLUMNS = ("cell_id", "workload_id", "model", "tp", "phase", "num_requests",
                      "num_decode", "total_tokens", "decode_ctx_sum", "gt_kind", "gt_ms")


@dataclass
class RunSpec:
    predictor: str
    dataset: str
    params: dict
    home: str | None = None
    seed: int = field(default_factory=lambda: default_split()["seed"])
    test_fraction: float = field(default_factory=lambda: default_split()["test_fraction"])
    runs_dir: Path = Path("results/runs")
    output_json: str | None = None
    sources_root: str | None = None
    gpu_specs: str | None = None
    hub_repo: str | None = None  # read cells from a Hugging Face export instead of the store
    hub_revision: str | None = None


@dataclass
class RunResult:
    folder: Path
    metrics: dict
    predictions: pl.DataFrame


def take_deploy_reading(estimator, target: pl.DataFrame, gpu) -> tuple[pl.DataFrame, list[str]]:
    """Hand the predictor the target rows it asks for as its one deploy reading (ground truth
    included) and return the rest, the rows to score, with the ids of those taken."""
    with guard.sealed("deploy reading"):
        mask = estimator.deploy_rows(target.drop(GROUND_TRUTH_COLUMNS))
        if mask is None or not np.asarray(mask).any():
            return target, []
        mask = pl.Series(np.asarray(mask, dtype=bool))
        estimator.calibrate(target.filter(mask), gpu)
    return target.filter(~mask), target.filter(mask)["cell_id"].to_list()


def _fit_and_predict(estimator, home, target: pl.DataFrame, gpu, op_level: bool = False
                     ) -> tuple[np.ndarray | None, pl.DataFrame, dict]:
    """Predictions (or None), the target rows they score, and the timing/validity facts.

    A predictor's exception is an INVALID reason, not a crash of the harness. Rows taken as the
    predictor's deploy reading are removed from the scored target.
    """
    facts = {"fit_seconds": None, "predict_seconds": None, "invalid_reasons": [],
             "deploy_row_ids": []}
    try:
        started = time.perf_counter()
        with guard.sealed("fit"):
            fitted = estimator.fit(home)
        facts["fit_seconds"] = time.perf_counter() - started
        if fitted is not estimator:
            facts["invalid_reasons"].append("fit did not return self")
        hidden = op_level_api.MEASURED if op_level else GROUND_TRUTH_COLUMNS
        if not op_level:
            target, facts["deploy_row_ids"] = take_deploy_reading(estimator, target, gpu)
        blind = target.drop(hidden)
        predict = estimator.predict_ops if op_level else estimator.predict
        with guard.sealed("predict"):
            predict(blind.head(8), gpu)  # warm caches, so the timing below is throughput
        started = time.perf_counter()
        with guard.sealed("predict"):
            pred = np.asarray(predict(blind, gpu), dtype=np.float64)
        facts["predict_seconds"] = time.perf_counter() - started
    except Exception as exc:  # noqa: BLE001 - any failure of a predictor makes the run INVALID
        last = traceback.extract_tb(exc.__traceback__)[-1]
        facts["invalid_reasons"].append(
            f"{type(exc).__name__}: {exc} (at {Path(last.filename).name}:{last.lineno})")
        return None, target, facts
    if pred.shape != (len(target),):
        facts["invalid_reasons"].append(f"predict returned shape {pred.shape}, expected "
                                        f"({len(target)},)")
        return None, target, facts
    bad = ~(np.isfinite(pred) & (pred > 0))
    if bad.any():
        facts["invalid_reasons"].append(f"{int(bad.sum())} of {len(pred)} predictions are not "
                                        "finite and positive")
    return pred, target, facts


@dataclass
class RunInputs:
    """What a run reads before any predictor code runs."""

    home: Home
    target: pl.DataFrame  # ground truth included; the harness hides it from predict
    gpu: GpuSpec
    target_row: dict
    home_row: dict
    op_level: bool
    target_lineage: pl.DataFrame  # the measured points behind each target cell (empty for ops)
    serving: bool = False  # a serving dataset: targets are TTFT/TPOT of replayed loads


def load_inputs(spec: RunSpec) -> RunInputs:
    """The home (training rows only) and the target of a run, from the store or a hub export."""
    catalog = (HubCatalog(spec.hub_repo, spec.hub_revision) if spec.hub_repo
               else StoreCatalog(spec.sources_root, spec.gpu_specs))
    with catalog:
        rows = catalog.datasets()
        target_row = homes.require_dataset(rows, spec.dataset)
        op_level = target_row["kind"] == "ops"
        serving = target_row["kind"] == "serving"
        home_name = homes.home_of(spec.dataset, spec.home, rows)
        home_row = rows[home_name]
        if (home_row["kind"] == "ops") != op_level:
            raise ValueError(f"home '{home_name}' is a {home_row['kind']} dataset but "
                             f"'{spec.dataset}' is a {target_row['kind']} dataset")
        gpus = load_gpu_specs(spec.gpu_specs)
        gpu = require_gpu(gpus, target_row["sku"], f"dataset {spec.dataset}")
        home_gpu = require_gpu(gpus, home_row["sku"], f"home dataset {home_name}")
        if op_level:
            home, target = op_level_api.home_and_target(
                catalog, home_row, spec.dataset, home_gpu, load_models(), spec.seed,
                spec.test_fraction)
        else:
            train, heldout = split(catalog.cells(home_name), "workload_id", spec.seed,
                                   spec.test_fraction)
            home = homes.build_home(catalog, home_row, train, home_gpu, load_models())
            target = (catalog.serving_targets(spec.dataset) if serving else
                      heldout if spec.dataset == home_name else catalog.cells(spec.dataset))
        lineage = pl.DataFrame() if op_level or serving else catalog.lineage(spec.dataset)
    return RunInputs(home, target, gpu, target_row, home_row, op_level, lineage, serving)


def run(spec: RunSpec) -> RunResult:
    estimator = registry.build(spec.predictor, spec.params)
    inputs = load_inputs(spec)
    if inputs.op_level:
        op_level_api.require_op_predictor(estimator)
    target_row, home_row, home_name = inputs.target_row, inputs.home_row, inputs.home_row["name"]
    op_level = inputs.op_level
    if inputs.serving:  # one row per target and metric; the steps timed are the replay's
        predictions, facts = serving_api.fit_and_simulate(estimator, inputs.home, inputs.target,
                                                          inputs.gpu, load_models())
        pred = None if facts["invalid_reasons"] else predictions["pred_ms"]
        target, facts["deploy_row_ids"] = predictions, []
    else:
        pred, target, facts = _fit_and_predict(estimator, inputs.home, inputs.target, inputs.gpu,
                                               op_level)
        columns = op_level_api.PREDICTION_COLUMNS if op_level else PREDICTION_COLUMNS
        predictions = target.select(columns).with_columns(
            pred_ms=pl.Series(pred if pred is not None else np.full(len(target), np.nan)))
    predictions = predictions.with_columns(
        signed_pct=metrics.errors(pl.col("pred_ms"), pl.col("gt_ms")))
    phases = (serving_api.SERVING_PHASES if inputs.serving else
              op_level_api.OP_PHASES if op_level else metrics.PHASES)
    result = {
        "predictor": spec.predictor, "params": estimator.get_params(),
        "card": {"kind": estimator.card.kind, "reference": estimator.card.reference,
                 "trained_on": home_row["sku"], "needs_profiled_rows": estimator.card.needs_profiled_rows},
        "dataset": spec.dataset, "dataset_repo": spec.hub_repo,
        "dataset_revision": spec.hub_revision, "sku": target_row["sku"], "home_dataset": home_name,
        "home_sku": home_row["sku"], "split": "home_heldout" if spec.dataset == home_name else "unseen",
        "split_seed": spec.seed, "test_fraction": spec.test_fraction,
        "dataset_version": target_row["version"], "home_dataset_version": home_row["version"],
        "code_version": code_version(), "code_hash": code_hash(), "valid": not facts["invalid_reasons"],
        "invalid_reasons": facts["invalid_reasons"], "fit_seconds": facts["fit_seconds"],
        "profiled_rows": int(getattr(estimator, "profiled_rows_", 0)),
        "deploy_rows": len(facts["deploy_row_ids"]), "deploy_row_ids": facts["deploy_row_ids"],
        "predict_cells_per_s": (facts.get("steps", len(target)) / facts["predict_seconds"]
                                if facts["predict_seconds"] else None),
        "level": "serving" if inputs.serving else "op" if op_level else "step",
        "phases": metrics.by_phase(predictions, phases) if pred is not None else {},
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    folder = _write(spec, result, predictions, inputs.target_lineage)
    return RunResult(folder, result, predictions)


def _write(spec: RunSpec, result: dict, predictions: pl.DataFrame, lineage: pl.DataFrame) -> Path:
    run_id = (f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{spec.predictor}-{spec.dataset}-"
              f"{uuid.uuid4().hex[:6]}")
    result["run_id"] = run_id
    final = Path(spec.runs_dir) / run_id
    partial = final.with_name(f".{run_id}.partial")
    partial.mkdir(parents=True)
    try:
        (partial / "metrics.json").write_text(json.dumps(result, indent=1) + "\n")
        predictions.with_columns(run_id=pl.lit(run_id)).write_parquet(partial / "predictions.parquet")
        if len(lineage) and result["phases"]:  # step-level runs with predictions get their atlas
            atlas.write_run(predictions, atlas.dominant_of(lineage), spec.dataset,
                            partial / "atlas.png")
        os.replace(partial, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    if spec.output_json:
        out = Path(spec.output_json)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(final / "metrics.json", out)
    return final
