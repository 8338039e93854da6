"""The leaderboard's runs: which (predictor, dataset, homes, home points) runs make it, which of
them have no current run in a runs folder, and the record a rerun leaves beside the runs.
``python -m leaderboard.rerun`` runs what is pending; the report and ``submit`` read the same list.
"""

from __future__ import annotations

import json
from pathlib import Path

from leaderboard.cells import families
from leaderboard.run.home_grid import HELD_OUT_SHAPES
from leaderboard.run.homes import home_of, leave_one_gpu_out
from leaderboard.run.oracle import ORACLE, ORACLE_POINTS, oracle_home
from leaderboard.run.run_inputs import RunSpec
from leaderboard.seal import predictor_index
from leaderboard.store.catalog import StoreCatalog

# Written beside the runs (hidden, so the results loader never takes it for a run).
TIMING_FILE = ".rerun.json"


def leaderboard_datasets() -> list[str]:
    """The store's datasets of the leaderboard families, including any GPU added through a
    sources directory (which has no ``conf/dataset`` file)."""
    with StoreCatalog() as catalog:
        return sorted(n for n in catalog.datasets() if families.on_leaderboard(n))


def run_specs(runs_dir: Path) -> list[RunSpec]:
    """Every leaderboard run, and the serving oracle on each serving set whose GPU has kernel
    tables (``leaderboard.run.oracle``: a self-check of the replay, never ranked)."""
    specs = []
    with StoreCatalog() as catalog:
        rows = catalog.datasets()
    for dataset in leaderboard_datasets():
        fam = families.of(dataset)
        # Op-level datasets are scored by the predictors that predict single kernels.
        names = [name for name, described in predictor_index.index().items()
                 if fam.level != "op" or described["predicts_ops"]]
        # A run atlas is drawn only where the site shows it (a second or two of matplotlib
        # each, a fifth of a rerun when every step run drew one).
        specs += [RunSpec(predictor=name, dataset=dataset, params={}, runs_dir=runs_dir,
                          atlas=fam.suffix == families.MAIN) for name in names]
        if fam.two_homes:  # the two-home protocol, beside the one-home one
            specs += [RunSpec(predictor=name, dataset=dataset, params={}, runs_dir=runs_dir,
                              home=list(fam.two_homes), atlas=False) for name in names]
        if fam.leave_one_out:  # each GPU scored with every other GPU of the family as homes
            others = leave_one_gpu_out(dataset, rows)
            specs += [RunSpec(predictor=name, dataset=dataset, params={}, runs_dir=runs_dir,
                              home=others, atlas=False) for name in names]
        if fam.leave_one_out and dataset == home_of(dataset, None, rows):  # out of sample
            specs += [RunSpec(predictor=name, dataset=dataset, params={}, runs_dir=runs_dir,
                              home_points=HELD_OUT_SHAPES, atlas=False) for name in names]
        if fam.level == "serving" and (home := oracle_home(dataset, rows)):
            specs.append(RunSpec(predictor=ORACLE, dataset=dataset, params={}, runs_dir=runs_dir,
                                 home=home, home_points=ORACLE_POINTS, atlas=False))
    return specs


def spec_key(predictor: str, dataset: str, homes, home_points: str) -> tuple:
    return predictor, dataset, tuple(sorted(homes)) if homes else "default", home_points


def pending(specs: list[RunSpec], runs_dir: Path | list[Path],
            versions: dict[str, str] | None = None) -> list[RunSpec]:
    """The specs with no current run in ``runs_dir`` (one folder, or several): none made by
    today's code for their predictor (``results.current``) at the spec's homes and home points,
    default parameters,
    split and caps. A run that differs from the default only by its homes, home points or its
    sandbox (unsealed where the machine cannot seal) stands for its spec. ``versions``: the
    dataset versions runs are current at (the store's, unless given)."""
    from leaderboard.score import results  # presentation-side reads, only when a rerun starts

    runs = results.current(results.load_runs(runs_dir), versions).pl()
    done = set()
    for name, dataset, homes, points, because in runs.select(
            "predictor", "dataset", "home_datasets", "home_points",
            "unrankable_because").iter_rows():
        parts = {r.partition(":")[0] for r in because or []}
        if because is not None and parts <= {"home", "home_points", "unsealed"}:
            # a spec that names its homes matches them; one that names none, the default
            done.add(spec_key(name, dataset, homes, points))
            if "home" not in parts:
                done.add(spec_key(name, dataset, None, points))
    return [s for s in specs if spec_key(s.predictor, s.dataset, [s.home] if isinstance(
        s.home, str) else s.home, s.home_points) not in done]


def last_rerun(runs_dir: Path) -> dict | None:
    """The record of the last rerun into ``runs_dir`` (``TIMING_FILE``), if there is one."""
    path = Path(runs_dir) / TIMING_FILE
    return json.loads(path.read_text()) if path.is_file() else None


PRESENTATION = True
