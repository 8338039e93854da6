"""``python -m leaderboard predictor=NAME dataset=NAME [key=value ...]``: one leaderboard run.

The Hydra task lives in this importable module, not in ``__main__``, so multirun launchers
(joblib's loky workers, submitit) pickle it by reference.

Fits the predictor on the home dataset's training rows, predicts the target blind, prints the
per-phase errors and writes ``<runs_dir>/<run_id>/{metrics.json, predictions.parquet}``.
"""

from __future__ import annotations

import json
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from leaderboard.ingest import BuildError
from leaderboard.ingest.sources import SourceError
from leaderboard.run import config, inputs
from leaderboard.run.config import check_names, load_config, unknown_key
from leaderboard.run.evaluate import RunSpec, run
from leaderboard.run.inputs import InputError
from leaderboard.score.metrics import registered as registered_metrics
from leaderboard.seal import predictor_index
from leaderboard.store import database
from leaderboard_core import paths
from leaderboard_core.contract import NotSupported
from leaderboard_core.specs import SpecError

stderr = Console(stderr=True)


def check_choices(argv: list[str]) -> None:
    """Answer a typo in ``predictor=``, ``dataset=``, a predictor field or any key with the
    valid names and the closest one (``config.check_names``, ``config.unknown_key``)."""
    try:
        config.refuse_config_doors(argv)
        check_names(argv)
        given = [folder for a in argv if a.startswith("runs_dir=")
                 for folder in a.partition("=")[2].split(",")]  # a sweep's, each
        for folder in given or [load_config().runs_dir]:  # before Hydra logs there
            inputs.check_writable_folder(paths.from_user(folder), "runs_dir")
    except InputError as exc:
        _fail(str(exc))
    check_parameters(argv)
    if message := unknown_key([a for a in argv if "=" in a]):
        _fail(message)


def check_parameters(argv: list[str]) -> None:
    """Answer a misspelt ``predictor.<field>=`` with the predictor's fields and the closest."""
    fields = [a.partition("=")[0].removeprefix("predictor.") for a in argv
              if a.startswith("predictor.")]
    if not fields:
        return
    chosen = next((a.partition("=")[2] for a in argv if a.startswith("predictor=")), None)
    for name in (chosen or load_config().predictor.name).split(","):
        try:
            predictor_index.check_params(name, fields)
        except ValueError as exc:
            _fail(str(exc))


def _fail(message: str) -> None:
    stderr.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    sys.exit(2)


NOT_SUPPORTED = "NOT SUPPORTED"


def verdict(metrics: dict) -> str:
    """NOT SUPPORTED (the predictor stated a limit, every reason its ``NotSupported``), INVALID,
    UNSEALED (every cell predicted, but not behind namespaces and Landlock, so never ranked) or
    VALID."""
    reasons = metrics["invalid_reasons"]
    if reasons and all(r.startswith("NotSupported:") for r in reasons):
        return NOT_SUPPORTED
    if not metrics["valid"]:
        return "INVALID"
    return "VALID" if metrics.get("sealed") else "UNSEALED"


def print_metrics(metrics: dict, folder) -> None:
    status = verdict(metrics)
    homes = "+".join(metrics["home_datasets"])
    table = Table(title=f"{metrics['predictor']} on {metrics['dataset']} ({metrics['split']}, "
                        f"home {homes}, {metrics['home_points_used']}): {status}")
    columns = registered_metrics(metrics.get("level", "step"))
    for col in ("phase", "n", *(m.label for m in columns)):
        table.add_column(col, justify="left" if col == "phase" else "right")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    # an INVALID run's errors are no score: its table says so rather than show them
    for phase, m in metrics["phases"].items() if metrics["valid"] else ():
        table.add_row(phase, str(m["n"]), *(fmt(m.get(c.name)) for c in columns))
    Console().print(table)
    for reason in metrics["invalid_reasons"]:
        stderr.print(f"[red]invalid:[/] {reason}", highlight=False)
    if status == "UNSEALED":
        stderr.print(f"[yellow]unsealed:[/] sandbox {metrics['sandbox']}, not namespaces and "
                     "Landlock: the report lists this run apart and never ranks it",
                     highlight=False)
    if metrics["valid"] and not metrics.get("rankable"):
        stderr.print(f"[yellow]not rankable:[/] {'; '.join(metrics.get('unrankable_because', []))}",
                     highlight=False)
    Console().print(f"fit {metrics['fit_seconds'] or 0:.2f} s, predict "
                    f"{metrics['predict_cells_per_s'] or 0:,.0f} cells/s; sandbox "
                    f"{metrics['sandbox']}, target rows read {metrics['profiled_rows']} of "
                    f"{metrics['reading_cap']}; wrote {folder}")


def run_task(cfg: DictConfig) -> None:
    missing = [f"dataset.{k}" for k in ("name", "repo") if OmegaConf.is_missing(cfg.dataset, k)]
    if missing:
        _fail(f"dataset=hf needs {' and '.join(missing)}: "
              "dataset.repo=<hub id or local export folder> dataset.name=<config, e.g. h200_vidur>")
    if cfg.predictors_path:  # a multirun worker is a fresh process: register them there too
        predictor_index.include(cfg.predictors_path)
    try:  # every value checked before the store is opened or a fit starts
        inputs.check_run_inputs(cfg)
    except InputError as exc:
        _fail(str(exc))
    spec = RunSpec.from_config(cfg)
    try:
        if not spec.hub_repo:  # built here, at first need: a run itself never builds it
            database.ensure(spec.sources_root, spec.gpu_specs)
        result = run(spec)
    except (SourceError, SpecError, BuildError, NotSupported, ValueError) as exc:
        if _in_multirun():  # the sweep goes on; its closing table names the reason
            log_sweep_run(cfg, NOT_SUPPORTED if isinstance(exc, NotSupported) else "ERROR",
                          None, str(exc))
            return
        _fail(str(exc))
    print_metrics(result.metrics, result.folder)
    if _in_multirun():
        first = next(iter(result.metrics["phases"].items()), (None, {}))
        why = "; ".join(result.metrics["invalid_reasons"])
        log_sweep_run(cfg, verdict(result.metrics),
                      first[1].get("mape") if result.metrics["valid"] else None,
                      f"{result.folder}: {why}" if why else f"{result.folder} (MAPE of {first[0]})")
    elif not result.metrics["valid"]:
        sys.exit(1)  # the run folder is written; scripts can still tell an INVALID run


# The file a sweep's runs append their outcome to (one JSON line each), set by ``__main__``
# before Hydra starts the launcher, so that joblib's worker processes inherit it.
SWEEP_LOG_ENV = "LEADERBOARD_SWEEP_LOG"


def log_sweep_run(cfg: DictConfig, status: str, mape: float | None, where: str) -> None:
    path = os.environ.get(SWEEP_LOG_ENV)
    if not path:
        return
    line = json.dumps({"predictor": cfg.predictor.name, "dataset": cfg.dataset.name,
                       "status": status, "mape": mape, "where": where.splitlines()[0][:200]})
    with open(path, "a") as log:  # one short write per run: appends from processes interleave whole
        log.write(line + "\n")


def print_sweep(path: str) -> int:
    """The closing table of a sweep; 1 when a run is neither VALID nor NOT SUPPORTED (a limit
    the predictor states, with its reason), or none ran; else 0."""
    runs = [json.loads(line) for line in open(path) if line.strip()]
    table = Table(title=f"sweep: {len(runs)} runs")
    for col in ("predictor", "dataset", "verdict", "MAPE %", "folder or reason"):
        table.add_column(col, justify="right" if "MAPE" in col else "left")
    for r in sorted(runs, key=lambda r: (r["predictor"], r["dataset"])):
        table.add_row(r["predictor"], r["dataset"], r["status"],
                      "-" if r["mape"] is None else f"{r['mape']:.2f}", r["where"])
    Console(width=max(Console().width, 200)).print(table)
    bad = [r for r in runs if r["status"] not in ("VALID", NOT_SUPPORTED)]
    unsupported = sum(r["status"] == NOT_SUPPORTED for r in runs)
    stderr.print(f"{len(runs) - len(bad) - unsupported} VALID, {unsupported} not supported, "
                 f"{len(bad)} INVALID or failed", highlight=False)
    return 1 if bad or not runs else 0


def _in_multirun() -> bool:
    """A sweep goes on past an INVALID run; its runs are compared in the report."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


# Undecorated ``run_task`` stays importable by name, so launchers pickle it by reference.
main = hydra.main(config_path=str(paths.CONF_DIR), config_name="config", version_base="1.3")(run_task)

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
