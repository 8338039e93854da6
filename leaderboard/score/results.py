"""The results store: the folder of run outputs, queried read-only through an in-memory DuckDB.

Each run is a folder ``<runs_dir>/<run_id>/`` holding ``metrics.json`` and
``predictions.parquet`` (``leaderboard.run.evaluate`` writes it under a hidden ``.<run_id>.partial``
name and renames it when complete). There is no results database file: concurrent runs only
ever create folders, so no two processes ever open one DuckDB file for writing.

As in asv, a result is keyed by what produced it. ``current`` keeps the runs whose code hash is
today's and whose target and home dataset versions are the store's, and of those the latest per
(predictor, dataset, params, split, homes, home points); everything else is stale and drops out
of the leaderboard.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

import duckdb
import polars as pl

from leaderboard.store import database
from leaderboard_core.specs import load_gpu_specs, load_models, spec_hash

# The metrics.json fields the store exposes, with their DuckDB types. Nested fields stay JSON so
# predictors with different parameters share one schema.
RUN_COLUMNS = {
    "run_id": "VARCHAR", "predictor": "VARCHAR", "params": "JSON", "card": "JSON",
    "dataset": "VARCHAR", "sku": "VARCHAR", "home_dataset": "VARCHAR", "home_sku": "VARCHAR",
    "split": "VARCHAR", "split_seed": "BIGINT", "test_fraction": "DOUBLE",
    "dataset_version": "VARCHAR", "home_dataset_version": "VARCHAR", "code_version": "VARCHAR",
    "code_hash": "VARCHAR", "valid": "BOOLEAN", "invalid_reasons": "VARCHAR[]",
    "fit_seconds": "DOUBLE", "profiled_rows": "BIGINT", "deploy_rows": "BIGINT",
    "predict_cells_per_s": "DOUBLE", "phases": "JSON", "created_at": "VARCHAR",
    "home_datasets": "VARCHAR[]", "home_points": "VARCHAR", "home_points_used": "VARCHAR",
    "sandbox": "VARCHAR", "sealed": "BOOLEAN", "spec_hash": "VARCHAR", "home_profiled_rows": "BIGINT",
    "rankable": "BOOLEAN", "unrankable_because": "VARCHAR[]", "harness_hash": "VARCHAR",
    "predictor_folder": "VARCHAR", "decisions": "JSON", "level": "VARCHAR",
}
RUN_FILES = ("metrics.json", "predictions.parquet")


# What each DuckDB type of RUN_COLUMNS takes in metrics.json (null is always allowed).
JSON_TYPES = {"VARCHAR": (str,), "BIGINT": (int,), "DOUBLE": (int, float), "BOOLEAN": (bool,),
              "VARCHAR[]": (list,), "JSON": (dict, list, str, int, float, bool)}


def complete_run_folders(runs_dir: str | Path) -> list[Path]:
    """Run folders holding both outputs whose ``metrics.json`` reads as a run; hidden
    ``.partial`` folders of interrupted or running runs are passed over. A folder whose
    metrics do not read (a hand edit, an older layout, a value of the wrong type) is skipped
    with one line naming it, so one bad folder never stops the report."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    found = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                   and all((p / name).is_file() for name in RUN_FILES))
    good = []
    for folder in found:
        if problem := metrics_problem(folder / "metrics.json"):
            print(f"skipped run folder {folder}: {problem}", file=sys.stderr)
        else:
            good.append(folder)
    return good


def metrics_problem(path: Path) -> str | None:
    """Why ``path`` does not read as a run's metrics, or None."""
    try:
        metrics = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"metrics.json does not parse ({exc})"
    if not isinstance(metrics, dict):
        return "metrics.json is not an object"
    for column, kind in RUN_COLUMNS.items():
        value = metrics.get(column)
        types = JSON_TYPES[kind]
        if value is not None and (not isinstance(value, types)
                                  or (isinstance(value, bool) and bool not in types)):
            return f"{column}={value!r} is not {kind.lower()}"
    return None


def load_runs(runs_dir: str | Path | list, con: duckdb.DuckDBPyConnection | None = None
              ) -> duckdb.DuckDBPyRelation:
    """Every complete run (of one runs folder, or of a list of them) as one row
    (``RUN_COLUMNS`` plus ``folder``); ``params`` is minified JSON, so equal parameters compare
    equal as text."""
    con = con or duckdb.connect()
    folders = runs_dir if isinstance(runs_dir, list) else [runs_dir]
    files = [str(p / "metrics.json") for f in folders for p in complete_run_folders(f)]
    if not files:
        typed = ", ".join(f'NULL::{t} AS "{c}"' for c, t in RUN_COLUMNS.items())
        return con.sql(f"SELECT {typed}, NULL::VARCHAR AS folder WHERE false")
    columns = "{" + ", ".join(f"'{c}': '{t}'" for c, t in RUN_COLUMNS.items()) + "}"
    return con.sql(
        f"SELECT * REPLACE (json(params::VARCHAR) AS params), "
        f"parse_dirpath(filename) AS folder "
        f"FROM read_json($files, columns={columns}, filename=true, format='auto')",
        params={"files": files}).project(", ".join([*(f'"{c}"' for c in RUN_COLUMNS), "folder"]))


def store_versions() -> dict[str, str]:
    """The store's current version of every dataset, from its ``datasets`` table."""
    with database.connect() as con:
        return dict(con.execute("SELECT name, version FROM datasets").fetchall())


def spec_hashes() -> dict[str, str]:
    """Today's ``spec_hash`` of every GPU spec (with today's model shapes)."""
    models = load_models()
    return {sku: spec_hash(gpu, models) for sku, gpu in load_gpu_specs().items()}


def code_hashes(predictors) -> dict[str, str]:
    """Today's code hash of each predictor's runs (``predictor_index.code_hash_of``): the
    harness and the predictor's own files, so editing one predictor stales only its runs."""
    from leaderboard.seal import predictor_index  # the describing child: only when a report asks

    return {name: predictor_index.code_hash_of(name) for name in predictors}


def up_to_date(runs: duckdb.DuckDBPyRelation, versions: Mapping[str, str] | None = None,
               code: Mapping[str, str] | None = None, specs: Mapping[str, str] | None = None,
               bundled: Mapping[str, str] | None = None) -> duckdb.DuckDBPyRelation:
    """The runs made by today's code (their predictor's code hash: ``code`` maps predictor names
    to hashes, else ``code_hashes``) with today's GPU spec and model shapes (``spec_hash``,
    unless ``specs`` maps skus to hashes) on today's target and home dataset versions (the
    store's, unless ``versions`` maps dataset names to versions). ``bundled``: the code hash of
    each predictor that reached the report in a results bundle (``leaderboard.present.bundles``)."""
    versions = store_versions() if versions is None else versions
    specs = spec_hashes() if specs is None else specs
    names = [r[0] for r in runs.query("runs", "SELECT DISTINCT predictor FROM runs").fetchall()]
    code = {**(code_hashes(names) if code is None else code), **(bundled or {})}
    if not versions or not specs or not code:
        return runs.filter("false")
    table = ", ".join(f"({_quote(name)}, {_quote(version)})" for name, version in versions.items())
    hashes = ", ".join(f"({_quote(sku)}, {_quote(h)})" for sku, h in specs.items())
    codes = ", ".join(f"({_quote(name)}, {_quote(h)})" for name, h in code.items())
    return runs.query("runs", f"""
        WITH versions(name, version) AS (VALUES {table}), specs(sku, hash) AS (VALUES {hashes}),
             codes(predictor, hash) AS (VALUES {codes})
        SELECT runs.* FROM runs
        JOIN specs ON specs.sku = runs.sku AND specs.hash = runs.spec_hash
        JOIN codes ON codes.predictor = runs.predictor AND codes.hash = runs.code_hash
        JOIN versions target ON target.name = runs.dataset AND target.version = runs.dataset_version
        JOIN versions home ON home.name = runs.home_dataset
                           AND home.version = runs.home_dataset_version""")


def current(runs: duckdb.DuckDBPyRelation, versions: Mapping[str, str] | None = None,
            code: Mapping[str, str] | None = None, specs: Mapping[str, str] | None = None,
            bundled: Mapping[str, str] | None = None) -> duckdb.DuckDBPyRelation:
    """The runs that still count: up to date, and of those the latest per (predictor, dataset,
    params, split, homes, home points, and why it is not rankable): a later run that changed
    the rules never hides the default one."""
    return up_to_date(runs, versions, code, specs, bundled).query("fresh", """
        SELECT * FROM fresh
        QUALIFY row_number() OVER (PARTITION BY predictor, dataset, params, split_seed, test_fraction,
                                                home_datasets, home_points, rankable,
                                                unrankable_because
                                   ORDER BY created_at DESC, run_id DESC) = 1
        ORDER BY predictor, dataset""")


def load_predictions(runs: pl.DataFrame) -> pl.DataFrame:
    """The per-cell predictions of the given runs, with each run's predictor, dataset, sku, split
    and validity attached."""
    if runs.is_empty():
        return pl.DataFrame()
    # diagonal: runs of predictors that split their prediction by op carry more columns
    cells = pl.concat([pl.read_parquet(Path(folder) / "predictions.parquet")
                       for folder in runs["folder"]], how="diagonal_relaxed")
    return cells.join(runs.select("run_id", "predictor", "dataset", "sku", "split", "valid"),
                      on="run_id", how="left")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
