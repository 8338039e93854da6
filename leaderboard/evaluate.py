"""One leaderboard run: fit on the home's training rows, predict the target blind, score it.

The run folder is written under a temporary name and renamed when complete, so an interrupted
run leaves nothing the leaderboard would count.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
from omegaconf import OmegaConf

from leaderboard import (
    atlas,
    debris,
    home_grid,
    homes,
    metrics,
    predictor_index,
    readings,
    sandbox,
    seal_walls,
)
from leaderboard import op_level as op_level_api
from leaderboard.catalog import StoreCatalog
from leaderboard.hub import HubCatalog
from leaderboard.serving import scoring as serving_api
from leaderboard.split import default_split, split
from leaderboard_core import paths
from leaderboard_core.contract import BY_OP_PREFIX, GROUND_TRUTH_COLUMNS, Home, NotSupported
from leaderboard_core.specs import GpuSpec, is_moe, load_gpu_specs, load_models, require_gpu, spec_hash
from leaderboard_core.versioning import code_hash, code_version

PREDICTION_COLUMNS = ("cell_id", "workload_id", "model", "tp", "phase", "num_requests",
                      "num_decode", "total_tokens", "decode_ctx_sum", "gt_kind", "gt_ms",
                      "warm_share", "composed", "weight")


@dataclass
class RunSpec:
    predictor: str
    dataset: str
    params: dict
    home: str | list[str] | None = None  # a list: several homes, every one fitted on
    seed: int = field(default_factory=lambda: default_split()["seed"])
    test_fraction: float = field(default_factory=lambda: default_split()["test_fraction"])
    # What op points fit sees: the home GPU's whole measured grid, or those behind its cells.
    home_points: str = field(default_factory=lambda: default_split()["home_points"])
    runs_dir: Path = Path("results/runs")
    output_json: str | None = None
    sources_root: str | None = None
    gpu_specs: str | None = None
    hub_repo: str | None = None  # read cells from a Hugging Face export instead of the store
    hub_revision: str | None = None
    reading_max_points: int = readings.MAX_POINTS
    reading_max_fraction: float = readings.MAX_FRACTION

    def __post_init__(self):
        # relative to the repository root, as report.out is: one folder whatever the working
        # folder, so the report finds every run
        self.runs_dir = paths.REPO_ROOT / self.runs_dir

    @classmethod
    def from_config(cls, cfg) -> RunSpec:
        """The run a composed ``conf/config.yaml`` (with its overrides) describes. Here, not in
        the CLI, because it decides a run's numbers: this module is in the code hash."""
        home = cfg.dataset.home  # one name, or a list of homes: dataset.home=[a100_vidur,...]
        return cls(predictor=cfg.predictor.name, dataset=cfg.dataset.name,
                   params={k: v for k, v in OmegaConf.to_container(cfg.predictor).items()
                           if k != "name"},
                   home=list(home) if OmegaConf.is_list(home) else home,
                   hub_repo=cfg.dataset.get("repo"),  # only dataset=hf has one
                   hub_revision=cfg.dataset.get("revision"), seed=cfg.split.seed,
                   test_fraction=cfg.split.test_fraction, home_points=cfg.split.home_points,
                   runs_dir=cfg.runs_dir, output_json=cfg.output.json,
                   sources_root=cfg.sources.root, gpu_specs=cfg.gpu_specs,
                   reading_max_points=cfg.reading.max_points,
                   reading_max_fraction=cfg.reading.max_fraction)


@dataclass
class RunResult:
    folder: Path
    metrics: dict
    predictions: pl.DataFrame


def _fit_and_predict(described: dict, params: dict, inputs: RunInputs, budget: int
                     ) -> tuple[np.ndarray | None, pl.DataFrame, dict]:
    """Predictions (or None), the target rows they score, and the timing/validity facts.

    Construct, fit, reading and predict run in a child process that gets the home bundle and
    the blind target only (``leaderboard.sandbox``); this process keeps the ground truth. A
    predictor's exception is an INVALID reason, not a crash of the harness. Cells a deploy
    reading touched are removed from the scored target.
    """
    hidden = op_level_api.MEASURED if inputs.op_level else GROUND_TRUTH_COLUMNS
    supplier = readings.Supplier(inputs.target, inputs.target_lineage, budget)
    pred, unscored, facts = sandbox.fit_and_predict(
        described, params, inputs.home, inputs.target.drop(hidden), inputs.gpu, inputs.level, budget,
        supplier, inputs.data_roots, predictor_index.folders())
    facts["deploy_row_ids"], facts["target_rows"] = unscored, supplier.rows_used
    target = supplier.scored()
    if pred is None:
        return None, target, facts
    if pred.shape != (len(target),):
        facts["invalid_reasons"].append(f"predict returned shape {pred.shape}, expected "
                                        f"({len(target)},)")
        facts.pop("by_op", None)
        return None, target, facts
    bad = ~(np.isfinite(pred) & (pred > 0))
    if bad.any():
        facts["invalid_reasons"].append(f"{int(bad.sum())} of {len(pred)} predictions are not "
                                        "finite and positive")
    return pred, target, facts


def _simulate(described: dict, params: dict, inputs: RunInputs) -> tuple[pl.DataFrame, dict]:
    """Serving targets: the sandboxed child fits the predictor and prices the steps this
    process's replay schedules (no deploy reading); this process keeps the measured TTFT/TPOT
    and builds the scored rows."""
    refuse_all = readings.Supplier(inputs.target, pl.DataFrame(), 0)
    pred, _, facts = sandbox.fit_and_predict(
        described, params, inputs.home, inputs.target.drop(serving_api.GROUND_TRUTH), inputs.gpu,
        "serving", 0, refuse_all, inputs.data_roots, predictor_index.folders())
    if facts.get("not_supported"):
        raise NotSupported(facts["not_supported"])
    facts["deploy_row_ids"], facts["target_rows"] = [], 0
    nan = np.full(len(inputs.target), np.nan)
    predicted = {m: pred[i] if pred is not None else nan for i, m in enumerate(serving_api.METRICS)}
    return serving_api.prediction_rows(inputs.target, predicted), facts


@dataclass
class RunInputs:
    """What a run reads before any predictor code runs."""

    home: Home
    target: pl.DataFrame  # ground truth included; the harness hides it from predict
    gpu: GpuSpec
    target_row: dict
    home_row: dict  # the first home
    op_level: bool
    target_lineage: pl.DataFrame  # the measured points behind each target cell (empty for ops)
    home_rows: list[dict] = field(default_factory=list)  # every home, the first one included
    home_points: str = "behind_cells"  # what the home's op points are (``homes.points_of``)
    serving: bool = False  # a serving dataset: targets are TTFT/TPOT of replayed loads
    data_roots: tuple[str, ...] = ()  # where this run's measurements come from or go

    @property
    def level(self) -> str:
        return "serving" if self.serving else "op" if self.op_level else "step"


def load_inputs(spec: RunSpec) -> RunInputs:
    """The home (training rows only) and the target of a run, from the store or a hub export."""
    catalog = (HubCatalog(spec.hub_repo, spec.hub_revision) if spec.hub_repo
               else StoreCatalog(spec.sources_root, spec.gpu_specs))
    with catalog:
        rows = catalog.datasets()
        target_row = homes.require_dataset(rows, spec.dataset)
        op_level = target_row["kind"] == "ops"
        serving = target_row["kind"] == "serving"
        home_rows = [rows[n] for n in homes.homes_of(spec.dataset, spec.home, rows)]
        for home_row in home_rows:
            if (home_row["kind"] == "ops") != op_level:
                raise ValueError(f"home '{home_row['name']}' is a {home_row['kind']} dataset but "
                                 f"'{spec.dataset}' is a {target_row['kind']} dataset")
        gpus = load_gpu_specs(spec.gpu_specs)
        gpu = require_gpu(gpus, target_row["sku"], f"dataset {spec.dataset}")
        home_gpus = [require_gpu(gpus, r["sku"], f"home dataset {r['name']}") for r in home_rows]
        if op_level:
            if len(home_rows) > 1:
                raise ValueError(f"op-level dataset '{spec.dataset}' takes one home; got "
                                 f"{[r['name'] for r in home_rows]}")
            home, target = op_level_api.home_and_target(
                catalog, home_rows[0], spec.dataset, home_gpus[0], load_models(), spec.seed,
                spec.test_fraction)
        else:
            home, target = _step_home_and_target(catalog, spec, home_rows, home_gpus, rows)
            if serving:
                target = catalog.serving_targets(spec.dataset)
        lineage = pl.DataFrame() if op_level or serving else catalog.lineage(spec.dataset)
    return RunInputs(home, target, gpu, target_row, home_rows[0], op_level, lineage, home_rows,
                     "split_by_point" if op_level else homes.points_of(spec.home_points, home_rows,
                                                                        rows), serving,
                     _data_roots(spec))


def _data_roots(spec: RunSpec) -> tuple[str, ...]:
    """The run's own places of measurements, where the sandbox records a predictor's opens:
    its sources root, its runs folder (made later by the first run that finishes) and a hub
    export that is a local folder (else ``hub_repo`` is a repository id)."""
    local_hub = spec.hub_repo if spec.hub_repo and Path(spec.hub_repo).expanduser().is_dir() else None
    return tuple(str(r) for r in (spec.sources_root, spec.runs_dir, local_hub) if r)


def _step_home_and_target(catalog, spec: RunSpec, home_rows: list[dict], home_gpus: list,
                          rows: dict[str, dict]) -> tuple[Home, pl.DataFrame]:
    """Each home's training split (and op points), merged; the target is a home's held-out
    cells when it is one of the homes (a home is never scored as unseen), else all its cells.
    Under ``held_out_shapes`` the one home is the target, split by (model, TP) configuration."""
    parts, target = [], None
    by_config = spec.home_points == home_grid.HELD_OUT_SHAPES
    for row, home_gpu in zip(home_rows, home_gpus, strict=True):
        points = homes.points_of(spec.home_points, [row], rows)
        if by_config:
            _require_one_home_with_a_grid(spec, home_rows, points)
        cells = catalog.cells(row["name"])
        if by_config:  # whole configurations held out
            cells = cells.with_columns(config=pl.col("model") + " TP" + pl.col("tp").cast(pl.Utf8))
        train, heldout = split(cells, "config" if by_config else "workload_id", spec.seed,
                               spec.test_fraction)
        train, heldout = train.drop("config", strict=False), heldout.drop("config", strict=False)
        parts.append(homes.build_home(catalog, row, train, home_gpu, load_models(), points,
                                      heldout))
        if row["name"] == spec.dataset:
            target = heldout
    return homes.merge(parts), target if target is not None else catalog.cells(spec.dataset)


def _require_one_home_with_a_grid(spec: RunSpec, home_rows: list[dict], points: str) -> None:
    names = [r["name"] for r in home_rows]
    if names != [spec.dataset]:
        raise ValueError(f"split.home_points={home_grid.HELD_OUT_SHAPES} scores one home on its "
                         f"own held-out configurations; dataset {spec.dataset} with homes {names} "
                         f"is not that (pass dataset={names[0]} and no dataset.home)")
    if points != home_grid.HELD_OUT_SHAPES:
        raise ValueError(f"split.home_points={home_grid.HELD_OUT_SHAPES} needs the measured op "
                         f"grid of home {names[0]} ({home_rows[0]['sku']}"
                         f"{home_grid.OPS_SUFFIX} at its backend version), which its family "
                         "lacks; it fits on the points behind its cells (pass "
                         "split.home_points=behind_cells)")


def require_card_scope(name: str, card: dict, inputs: RunInputs) -> None:
    """NotSupported, before any predictor code runs, when the target's or a home's cells hold a
    GEMM precision or a layer kind (an MoE model) the predictor's card does not list."""
    frames = {inputs.target_row["name"]: inputs.target,
              "+".join(r["name"] for r in inputs.home_rows): inputs.home.cells}
    precisions, layers = card["precisions"], card["layers"]
    for dataset, cells in frames.items():
        found = set(cells["gemm_dtype"].drop_nulls()) if "gemm_dtype" in cells.columns else set()
        if found - set(precisions):
            raise NotSupported(f"predictor '{name}' prices {'/'.join(precisions)} GEMMs only; "
                               f"dataset {dataset} holds {'/'.join(sorted(found))} GEMM steps")
        models = set(cells["model"].drop_nulls()) if "model" in cells.columns else set()
        routed = sorted(m for m in models if is_moe(inputs.home.models.get(m, {})))
        if routed and "moe" not in layers:
            raise NotSupported(f"predictor '{name}' prices {'/'.join(layers)} layers only; "
                               f"dataset {dataset} holds mixture-of-experts models "
                               f"({', '.join(routed)}): its card does not list 'moe'")


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
    debris.sweep(spec.runs_dir)
    inputs = load_inputs(spec)
    if inputs.op_level:
        op_level_api.require_op_predictor(described)
    card = described["card"]
    require_card_scope(spec.predictor, card, inputs)
    target_row, home_row, home_name = inputs.target_row, inputs.home_row, inputs.home_row["name"]
    home_names = [r["name"] for r in inputs.home_rows]
    op_level = inputs.op_level
    budget = readings.cap(len(inputs.target), spec.reading_max_points, spec.reading_max_fraction)
    if inputs.serving:  # two rows per target (TTFT, TPOT); the steps timed are the replay's
        predictions, facts = _simulate(described, params, inputs)
        target, pred = predictions, None if facts["invalid_reasons"] else predictions["pred_ms"]
    else:
        pred, target, facts = _fit_and_predict(described, params, inputs, budget)
        columns = op_level_api.PREDICTION_COLUMNS if op_level else PREDICTION_COLUMNS
        predictions = target.select(columns).with_columns(
            pred_ms=pl.Series(pred if pred is not None else np.full(len(target), np.nan)),
            **{f"{BY_OP_PREFIX}{op}": pl.Series(ms)
               for op, ms in facts.pop("by_op", {}).items()})
    predictions = predictions.with_columns(
        signed_pct=metrics.errors(pl.col("pred_ms"), pl.col("gt_ms")))
    phases = (serving_api.phases_of(spec.dataset) if inputs.serving else
              op_level_api.OP_PHASES if op_level else metrics.PHASES)
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
        "code_version": code_version(), "code_hash": code_hash(), "valid": not facts["invalid_reasons"],
        "invalid_reasons": facts["invalid_reasons"], "fit_seconds": facts.get("fit_seconds"),
        "by_op_error": facts.get("by_op_error"),
        "sandbox": facts.get("sandbox", "process"),
        # ranked only when sealed: without namespaces and Landlock nothing but the predictor's
        # discipline keeps it from the store
        "sealed": facts.get("sandbox") == seal_walls.SEALED,
        "spec_hash": spec_hash(inputs.gpu, inputs.home.models),
        # target rows read (deploy reading), against the cap; home rows fit read are apart
        "profiled_rows": facts["target_rows"], "reading_cap": budget,
        "home_profiled_rows": facts.get("home_profiled_rows", 0),
        "deploy_rows": len(facts["deploy_row_ids"]), "deploy_row_ids": facts["deploy_row_ids"],
        "predict_cells_per_s": (facts.get("steps", len(target)) / facts["predict_seconds"]
                                if facts.get("predict_seconds") else None),
        "level": inputs.level,
        "phases": metrics.by_phase(predictions, phases, inputs.level) if pred is not None else {},
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
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
