"""``python -m leaderboard.data {build,list,card} [--json] [--all] [NAME] [key=value ...]``: the store's
command line.

``list`` shows exactly the names ``dataset=`` accepts (cells, op-level and serving sets), each
with its kind, GPU and architecture, default home, row count and phases; ``--all`` adds what the
store holds besides (the source op tables, traces, fitted coefficients). ``card NAME`` prints a
dataset's card. ``list --json`` prints only the JSON array to stdout; progress and reports go to
stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from leaderboard.cells import families
from leaderboard.ingest import BuildError
from leaderboard.ingest.sources import SourceError
from leaderboard.present import serving_oracle
from leaderboard.run import homes
from leaderboard.run.config import load_config, unknown_key
from leaderboard.run.inputs import InputError, check_config, guarded
from leaderboard.store import database
from leaderboard.store.catalog import StoreCatalog
from leaderboard_core import paths
from leaderboard_core.naming import suggestion
from leaderboard_core.specs import SpecError, load_gpu_specs

# The kinds ``dataset=`` takes; an ``ops`` row is a dataset only as ``<sku>_ops`` (the others are
# the source tables those are drawn from).
RUNNABLE_KINDS = ("cells", "ops", "serving")


def runnable(row: dict) -> bool:
    return (row["kind"] in RUNNABLE_KINDS and families.of(row["name"]) is not None
            and (row["kind"] != "ops" or row["name"].endswith("_ops")))


def skipped_files(**where) -> list[tuple[str, str]]:
    """Upstream files the last build found but does not read (another framework or format)."""
    with database.connect(**where) as con:
        return con.sql("SELECT rel, reason FROM skipped_files ORDER BY rel").fetchall()


def list_datasets(include_all: bool = False, **where) -> list[dict]:
    """The store's datasets ``dataset=`` accepts (with ``include_all``, every one it holds),
    each with its default ``home`` and its GPU's ``arch``."""
    with database.connect(**where) as con:
        rows = con.sql("SELECT * EXCLUDE (card) FROM datasets ORDER BY kind, name").pl().to_dicts()
    for row in rows:
        for key in ("tables", "backend_versions", "files", "phases"):
            row[key] = json.loads(row[key]) if row[key] is not None else None
        if row["phases"] is None:
            del row["phases"]
    gpus = load_gpu_specs(where.get("gpu_specs"))
    named = {r["name"]: r for r in rows if runnable(r)}
    for row in rows:
        row["arch"] = gpus[row["sku"]]["arch"] if row["sku"] in gpus else None
        row["leaderboard"] = row["name"] in named and families.on_leaderboard(row["name"])
        if row["name"] in named:
            try:
                row["home"] = homes.home_of(row["name"], None, named)
            except ValueError:
                row["home"] = None  # no default: dataset.home=... must name one
    return [r for r in rows if include_all or r["name"] in named]


def card(name: str, runs_dir: str | None = None, **where) -> str:
    """The dataset's card; a serving set's ends with the replay's own error as its current
    oracle run in ``runs_dir`` measured it (the card itself is built with the store, before
    any run)."""
    with StoreCatalog(where["sources_root"], where["gpu_specs"]) as catalog:
        found, rows = catalog.cards(), catalog.datasets()
    if name not in found:
        raise InputError(f"no dataset '{name}' in the store; {suggestion(name, sorted(found))}")
    text = found[name] or f"{name} has no card"
    fam = families.of(name)
    if runs_dir is None or fam is None or fam.level != "serving":
        return text
    return text.rstrip() + "\n\n" + "\n".join(serving_oracle.for_card(name, Path(runs_dir), rows))


def print_table(rows: list[dict]) -> None:
    ranked = sum(bool(r.get("leaderboard")) for r in rows)
    table = Table(title=f"leaderboard store: {len(rows)} datasets, {ranked} on the leaderboard "
                        "(marked *: what rerun, submit and the report score)")
    for col in ("name", "kind", "GPU", "arch", "home", "rows", "phases", "version"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for r in rows:
        phases = ", ".join(f"{k} {v:,}" for k, v in (r.get("phases") or {}).items())
        table.add_row(f"{r['name']}{' *' if r.get('leaderboard') else ''}", r["kind"],
                      r["sku"] or "-", r.get("arch") or "-",
                      r.get("home") or "-", f"{r['rows']:,}", phases or "-", r["version"])
    Console(width=max(Console().width, 160)).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m leaderboard.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build", "list", "card"])
    parser.add_argument("--json", action="store_true", help="print a JSON array to stdout")
    parser.add_argument("--all", action="store_true",
                        help="also list the source op tables, traces and fitted coefficients")
    parser.add_argument("args", nargs="*", help="card: the dataset name; then config overrides, "
                                                "e.g. sources.root=/data")
    args = parser.parse_args(argv)
    name = args.args[0] if args.command == "card" and args.args and "=" not in args.args[0] else None
    overrides = [a for a in args.args if a != name]
    if args.command == "card" and name is None:
        parser.error("card takes a dataset name: python -m leaderboard.data card h200_vidur")
    if message := unknown_key(overrides):
        parser.error(message)
    cfg = load_config(overrides)
    check_config(cfg)
    where = {"sources_root": cfg.sources.root, "gpu_specs": cfg.gpu_specs}
    try:
        if args.command == "build":
            only = list(cfg.sources.only) if cfg.sources.only else None
            database.build(**where, only=only)
            return 0
        if args.command == "card":
            print(card(name, paths.from_user(cfg.runs_dir), **where))
            return 0
        rows = list_datasets(args.all, **where)
        skipped = skipped_files(**where)
    except (SourceError, SpecError, BuildError) as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    for rel, why in skipped:  # stderr: --json keeps stdout a bare array
        Console(stderr=True).print(f"skipped {rel}: {why}", highlight=False, soft_wrap=True)
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main, "python -m leaderboard.data")())

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
