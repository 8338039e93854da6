"""``python -m leaderboard.submit predictor=NAME [predictors_path=DIR]``: score one predictor on
the whole leaderboard and write the results bundle to send in.

Runs the predictor (and every name registered by its module: its variants) on every leaderboard
dataset, skipping runs already current (``leaderboard.rerun``), with progress; prints its place
per family against the current runs of the others (the runs folder and the published runs);
writes ``submit.out`` (default ``<runs_dir>/<NAME>-<code hash>.tar.gz``), a results bundle of
its current rankable runs, its card, code hash and folder name (``leaderboard.present.bundles``), which
``python -m leaderboard.report report.bundles=[FILE]`` merges. Exit 0 when every run is VALID or
NOT SUPPORTED with its reason, 1 otherwise.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.table import Table

from leaderboard import rerun
from leaderboard.present import bundles
from leaderboard.run.config import command_config
from leaderboard.run.homes import with_family
from leaderboard.run.inputs import guarded
from leaderboard.score import results
from leaderboard.seal import predictor_index
from leaderboard_core import paths
from leaderboard_core.report_tables import phase_stat
from leaderboard_core.versioning import module_files

console = Console(stderr=True)


def variants(name: str) -> list[str]:
    """``name`` and every other name its module registers (its variants), in order."""
    index = predictor_index.index()
    module = index[name]["module"]
    return [name, *sorted(n for n, d in index.items() if d["module"] == module and n != name)]


def places(runs: pl.DataFrame, names: list[str]) -> list[list[str]]:
    """Per family and submitted name: its GPU-mean MAPE over the family's unseen GPUs (all
    phase, rankable runs), and its place among every predictor with a number on each of them."""
    unseen = with_family(runs.filter(pl.col("rankable") & pl.col("valid")
                                     & (pl.col("split") == "unseen")))
    rows = []
    for fam in sorted(set(unseen["family"])):
        mine = unseen.filter(pl.col("family") == fam)
        gpus = sorted(set(mine["dataset"]))
        means = {}
        for predictor in set(mine["predictor"]):
            found = {r["dataset"]: phase_stat(r, "all")
                     for r in mine.filter(pl.col("predictor") == predictor).iter_rows(named=True)}
            if all(found.get(d) is not None for d in gpus):
                means[predictor] = statistics.fmean(found[d] for d in gpus)
        for name in names:
            if name in means:
                place = 1 + sum(v < means[name] for v in means.values())
                rows.append([fam, name, f"{means[name]:.1f}", f"{place} of {len(means)}",
                             str(len(gpus))])
    return rows


def main(argv: list[str]) -> int:
    chosen = [a.partition("=")[2] for a in argv if a.startswith("predictor=")]
    if not chosen:
        console.print("python -m leaderboard.submit needs predictor=NAME (and predictors_path=DIR "
                      "for a predictor of your own)", highlight=False)
        return 2
    cfg = command_config(argv, "python -m leaderboard.submit", __doc__, "submit", {})
    name, runs_dir = cfg.predictor.name, paths.from_user(cfg.runs_dir)
    names = variants(name)
    started = time.perf_counter()
    outcomes = rerun.rerun_all(runs_dir, cfg.report.jobs, predictors=names)
    current = results.current(results.load_runs(runs_dir)).pl()
    mine = current.filter(pl.col("predictor").is_in(names) & pl.col("rankable"))
    index = predictor_index.index()
    folder = predictor_index.folder_of(index[name]["module"])
    claimed = {n: {"card": index[n]["card"], "code_hash": predictor_index.code_hash_of(n),
                   "folder": Path(folder).name if folder else None} for n in names}
    out = Path(cfg.submit.out).expanduser().resolve() if cfg.submit.out else runs_dir / (
        f"{name}-{claimed[name]['code_hash']}.tar.gz")
    code = [f for f in module_files(index[name]["module"], [Path(folder)])] if folder else []
    bundle = bundles.write([Path(f) for f in mine["folder"]], out, claimed, code,
                           Path(folder) if folder else None)
    table = Table(title=f"{name}: GPU-mean MAPE % on the unseen GPUs, and its place")
    for column in ("family", "predictor", "GPU-mean MAPE %", "place", "unseen GPUs"):
        table.add_column(column)
    for row in places(current, names):
        table.add_row(*row)
    Console().print(table)
    bad = [o for o in outcomes if o.status != "valid" and not o.status.startswith("not supported")]
    unsupported = [o for o in outcomes if o.status.startswith("not supported")]
    for o in bad:
        console.print(f"[red]{o.predictor} on {o.dataset}:[/] {o.status}", highlight=False)
    console.print(f"{len(outcomes)} runs made ({len(unsupported)} not supported, {len(bad)} "
                  f"INVALID or failed) in {time.perf_counter() - started:.0f} s; bundle of "
                  f"{len(mine)} rankable runs: {bundle}", highlight=False)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(guarded(main, "python -m leaderboard.submit")(sys.argv[1:]))

# Moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
