"""``python -m leaderboard.data {build,list} [--json] [key=value ...]``: the store's command line.

``list --json`` prints only the JSON array to stdout; progress and reports go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from leaderboard import store
from leaderboard.config import load_config, unknown_key
from leaderboard.ingest import BuildError
from leaderboard.sources import SourceError
from leaderboard_core.specs import SpecError


def skipped_files(**where) -> list[tuple[str, str]]:
    """Upstream files the last build found but does not read (another framework or format)."""
    with store.connect(**where) as con:
        return con.sql("SELECT rel, reason FROM skipped_files ORDER BY rel").fetchall()


def list_datasets(include_all: bool = False, **where) -> list[dict]:
    with store.connect(**where) as con:
        rows = con.sql("SELECT * EXCLUDE (card) FROM datasets ORDER BY kind, name").pl().to_dicts()
    for row in rows:
        for key in ("tables", "backend_versions", "files", "phases"):
            row[key] = json.loads(row[key]) if row[key] is not None else None
        if row["phases"] is None:
            del row["phases"]
    return [r for r in rows if include_all or r["kind"] in ("ops", "cells")]


def print_table(rows: list[dict]) -> None:
    table = Table(title="leaderboard store")
    for col in ("name", "kind", "sku", "rows", "version", "tables"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for r in rows:
        tables = ", ".join(f"{t} {n:,}" for t, n in r["tables"].items())
        table.add_row(r["name"], r["kind"], r["sku"] or "-", f"{r['rows']:,}", r["version"], tables)
    Console(width=max(Console().width, 160)).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m leaderboard.data", description=__doc__)
    parser.add_argument("command", choices=["build", "list"])
    parser.add_argument("--json", action="store_true", help="print a JSON array to stdout")
    parser.add_argument("--all", action="store_true",
                        help="also list traces and fitted coefficients, not only ops/cells")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. sources.root=/data")
    args = parser.parse_args(argv)
    if message := unknown_key(args.overrides):
        parser.error(message)
    cfg = load_config(args.overrides)
    where = {"sources_root": cfg.sources.root, "gpu_specs": cfg.gpu_specs}
    try:
        if args.command == "build":
            only = list(cfg.sources.only) if cfg.sources.only else None
            store.build(**where, only=only)
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
    sys.exit(main())

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
