"""What a run reads before any predictor code runs: the spec of a run, and its home and target
from the store or a hub export, with the checks that refuse a run before a predictor sees it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
from omegaconf import OmegaConf

from leaderboard.run import home_grid, homes, readings
from leaderboard.run import op_level as op_level_api
from leaderboard.run.oracle import ORACLE, ORACLE_POINTS
from leaderboard.run.split import default_split, split
from leaderboard.store.catalog import StoreCatalog
from leaderboard.store.hub_catalog import HubCatalog
from leaderboard_core import paths
from leaderboard_core.contract import Home, NotSupported, expert_parallel
from leaderboard_core.specs import GpuSpec, is_moe, load_gpu_specs, load_models, require_gpu


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
    runs_dir: Path = paths.REPO_ROOT / "results" / "runs"
    output_json: str | None = None
    sources_root: str | None = None
    gpu_specs: str | None = None
    hub_repo: str | None = None  # read cells from a Hugging Face export instead of the store
    hub_revision: str | None = None
    reading_max_points: int = readings.MAX_POINTS
    reading_max_fraction: float = readings.MAX_FRACTION
    stage_seconds: float = 7200.0  # conf/config.yaml's seal.stage_seconds
    # The run folder's atlas.png (a picture, never a number): the rerun draws it for the runs
    # the leaderboard shows and skips it for the protocol runs (other homes or home points).
    atlas: bool = True

    def __post_init__(self):
        # a relative folder is taken from the working folder, as a command line takes it
        self.runs_dir = paths.from_user(self.runs_dir)

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
                   reading_max_fraction=cfg.reading.max_fraction,
                   stage_seconds=cfg.seal.stage_seconds)


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
    serving: bool = False  # a serving dataset: targets are TTFT/TPOT of replayed loads
    data_roots: tuple[str, ...] = ()  # where this run's measurements come from or go
    default_homes: list[str] = field(default_factory=list)  # the homes of the default run

    @property
    def level(self) -> str:
        return "serving" if self.serving else "op" if self.op_level else "step"

    def digest(self) -> str:
        """The digest of everything the run read: its target (ground truth included), the
        home's training cells and op points."""
        parts = [rows_digest(self.target), rows_digest(self.home.cells),
                 *(f"{op}={rows_digest(frame)}" for op, frame in sorted(self.home.ops.items()))]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    @property
    def home_points(self) -> str:
        """What the home's op points are (``Home.points``); an op-level home is split by point."""
        return "split_by_point" if self.op_level else self.home.points


def rows_digest(frame: pl.DataFrame) -> str:
    """A digest of a frame's rows whatever their order and the order of its columns: what a
    run scored, recorded so that two runs (or a run and the store) can be told apart."""
    if frame.is_empty():
        return hashlib.sha256(",".join(sorted(frame.columns)).encode()).hexdigest()[:16]
    canonical = frame.select(sorted(frame.columns))
    hashed = np.sort(canonical.hash_rows(seed=0).to_numpy())
    header = ",".join(f"{c}:{t}" for c, t in canonical.schema.items()).encode()
    return hashlib.sha256(header + hashed.tobytes()).hexdigest()[:16]


def load_inputs(spec: RunSpec) -> RunInputs:
    """The home (training rows only) and the target of a run, from the store or a hub export.
    A missing or stale store is refused, never built here: the command that asks builds it
    first (``database.ensure``)."""
    if spec.home_points == ORACLE_POINTS and spec.predictor != ORACLE:
        raise ValueError(f"split.home_points={ORACLE_POINTS} is the serving oracle's (predictor="
                         f"{ORACLE}): it gives every precision of the GPU's tables at once, "
                         f"which only {ORACLE} keys by dtype; run predictor={spec.predictor} "
                         "with split.home_points=full_grid or behind_cells")
    # the store file as it was before it is opened: a store replaced later is another key
    store = None if spec.hub_repo else paths.store_path().stat()
    catalog = (HubCatalog(spec.hub_repo, spec.hub_revision) if spec.hub_repo
               else StoreCatalog.current(spec.sources_root, spec.gpu_specs))
    with catalog:
        rows = catalog.datasets()
        target_row = homes.require_dataset(rows, spec.dataset)
        op_level = target_row["kind"] == "ops"
        serving = target_row["kind"] == "serving"
        home_rows = [rows[n] for n in homes.homes_of(spec.dataset, spec.home, rows)]
        home_points = None if op_level else homes.points_of(spec.home_points, home_rows, rows)
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
        elif spec.hub_repo:
            home, target = _step_home_and_target(catalog, spec, home_rows, home_gpus, home_points)
        else:
            home, target = _kept_home(catalog, spec, home_rows, home_gpus, home_points, store)
        if serving:
            target = catalog.serving_targets(spec.dataset)
        lineage = pl.DataFrame() if op_level or serving else catalog.lineage(spec.dataset)
    return RunInputs(home, target, gpu, target_row, home_rows[0], op_level, lineage, home_rows,
                     serving, _data_roots(spec), _default_homes(spec.dataset, rows))


def _default_homes(name: str, rows: dict[str, dict]) -> list[str]:
    """The homes a run on ``name`` has when none is named; none where its family has no
    default (every home is then named, and no run on it is the default one)."""
    try:
        return homes.homes_of(name, None, rows)
    except ValueError:
        return []


def _data_roots(spec: RunSpec) -> tuple[str, ...]:
    """The run's own places of measurements, where the sandbox records a predictor's opens:
    its sources root, its runs folder (made later by the first run that finishes) and a hub
    export that is a local folder (else ``hub_repo`` is a repository id)."""
    local_hub = spec.hub_repo if spec.hub_repo and Path(spec.hub_repo).expanduser().is_dir() else None
    return tuple(str(r) for r in (spec.sources_root, spec.runs_dir, local_hub) if r)


# The homes this process built last, by what decides them: a rerun worker takes the runs of one
# home in a row (every predictor on a dataset), and building a home from the store is about a
# third of a run's own work. A home is a frozen value, the same however often it is built.
_HOMES: dict[tuple, tuple[Home, dict[str, pl.DataFrame]]] = {}
KEPT_HOMES = 4


def _kept_home(catalog, spec: RunSpec, home_rows: list[dict], home_gpus: list, points: str,
               store: os.stat_result) -> tuple[Home, pl.DataFrame]:
    """``_step_home_and_target`` from the store, its home kept for the next run of the same
    homes, home points, split, home GPUs, model shapes and store file (``store``: its stat
    before it was opened; rebuilt, another key)."""
    if spec.home_points == home_grid.HELD_OUT_SHAPES:  # a check of the target, never kept
        _require_one_home_with_a_grid(spec, home_rows, points)
    key = (tuple((r["name"], r["version"]) for r in home_rows), points, spec.home_points,
           spec.seed, spec.test_fraction, spec.sources_root, spec.gpu_specs,
           str(paths.store_path()), store.st_mtime_ns, store.st_size, store.st_ino,
           repr(home_gpus), repr(load_models()))
    if key not in _HOMES:
        heldout: dict[str, pl.DataFrame] = {}
        home, _ = _step_home_and_target(catalog, spec, home_rows, home_gpus, points, heldout)
        while len(_HOMES) >= KEPT_HOMES:
            _HOMES.pop(next(iter(_HOMES)))
        _HOMES[key] = home, heldout
    home, heldout = _HOMES[key]
    target = heldout.get(spec.dataset)
    return home, target if target is not None else catalog.cells(spec.dataset)


def _step_home_and_target(catalog, spec: RunSpec, home_rows: list[dict], home_gpus: list,
                          points: str, heldout_of: dict | None = None
                          ) -> tuple[Home, pl.DataFrame]:
    """Each home's training split (and its op points: ``points``, what every home gives),
    merged; the target is a home's held-out cells when it is one of the homes (a home is never
    scored as unseen), else all its cells. Under ``held_out_shapes`` the one home is the target,
    split by (model, TP) configuration. ``heldout_of`` gains each home's held-out cells."""
    parts, target = [], None
    by_config = spec.home_points == home_grid.HELD_OUT_SHAPES
    for row, home_gpu in zip(home_rows, home_gpus, strict=True):
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
        if heldout_of is not None:
            heldout_of[row["name"]] = heldout
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
        if (expert_parallel(cells) > 1).any() and "moe_ep" not in layers:
            raise NotSupported(f"predictor '{name}' prices {'/'.join(layers)} layers only; "
                               f"dataset {dataset} holds expert-parallel MoE steps (experts "
                               "spread whole over the GPUs, moe_ep > 1): its card does not list "
                               "'moe_ep'")
    if card.get("needs_profiled_rows"):
        _require_one_placement(name, inputs)


def _require_one_placement(name: str, inputs: RunInputs) -> None:
    """NotSupported for a predictor that learns from the home's rows when the target places a
    configuration's experts where its home never does (split over the TP group on one, spread
    whole over it on the other): what it learned would be priced as the other placement. A
    serving set may hold both placements of one configuration, each run its own."""
    frames = (inputs.home.cells, inputs.target)
    if not all({"model", "tp"} <= set(f.columns) for f in frames):
        return  # op-level rows: no model configuration
    home, target = (f.select("model", "tp", ep=pl.Series(expert_parallel(f))).unique()
                    for f in frames)
    unlearned = target.join(home, on=["model", "tp"], how="semi").join(
        home, on=["model", "tp", "ep"], how="anti").sort("model", "tp", "ep")
    if unlearned.height:
        model, tp, ep = unlearned.row(0)
        learned = sorted(home.filter(model=model, tp=tp)["ep"])
        placed = {e: "split over the TP group" if e == 1 else f"spread whole over {e} GPUs"
                  for e in (*learned, ep)}
        raise NotSupported(
            f"predictor '{name}' learns from its home's rows, and home "
            f"{'+'.join(r['name'] for r in inputs.home_rows)} has {model} TP{tp}'s experts "
            f"{' or '.join(placed[e] for e in learned)} where dataset "
            f"{inputs.target_row['name']} has them {placed[ep]} (moe_ep); fit it on a home of "
            "the target's placement (the _vidur_moe_ep family for expert parallelism)")
