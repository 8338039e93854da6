"""Write the store's cell and op datasets as a Hugging Face dataset folder (see ``leaderboard.hub``).

The folder is written under a temporary name beside PATH and renamed into place when complete,
so an interrupted export leaves no PATH, and with ``hub.overwrite=true`` the previous export intact.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from pathlib import Path

import duckdb
import polars as pl
import yaml
from rich.console import Console
from rich.progress import Progress

from leaderboard.cells.traces import base_trace
from leaderboard.present import results_table, serving_oracle
from leaderboard.run import homes
from leaderboard.seal import sandbox
from leaderboard.store import database
from leaderboard.store.catalog import StoreCatalog
from leaderboard.store.hub_layout import CATALOG_SCHEMA, collectives_config, lineage_config
from leaderboard_core import paths, yaml_io

stderr = Console(stderr=True)

TITLE = "LLM step-latency ground truth"
TAGS = ["llm", "inference", "latency", "gpu", "benchmark"]


def selected(rows: dict[str, dict], only: list[str] | None) -> list[str]:
    """Every dataset (cells, op points, serving targets), or those named plus each one's home,
    which a run needs to fit on."""
    if not only:
        return sorted(rows)
    names = set()
    for name in only:
        homes.require_dataset(rows, name)
        home = homes.home_of(name, None, rows)
        # the home GPU's op points and all-reduces: its full grid (leaderboard.run.home_grid)
        grid = {f"{rows[home]['sku']}_ops"} & set(rows)
        names |= {name, home, *grid}
    return sorted(names)


def source_rows(con: duckdb.DuckDBPyConnection, name: str, card: str) -> list[tuple]:
    """(rel, repo, commit, license) of the upstream files behind a dataset: those its card lists,
    and the request traces its workloads were replayed from (the cards list measured files only)."""
    traces = sorted({base_trace(t) for (t,) in con.execute(
        "SELECT DISTINCT trace FROM cells WHERE dataset = ? AND trace IS NOT NULL", [name]).fetchall()})
    files = {f for (f,) in con.execute("SELECT DISTINCT file FROM request_traces "
                                       "WHERE list_contains(?, trace)", [traces]).fetchall()}
    if "sharegpt" in traces:  # leaderboard.cells.traces replays LLMServingSim's serving requests
        files |= {f for (f,) in con.execute("SELECT DISTINCT file FROM serving_requests").fetchall()}
    return [r for r in con.execute("SELECT rel, repo, commit, license FROM sources ORDER BY rel")
            .fetchall() if r[0] in files or f"`{r[0]}`" in card]


def _coefficient_sources(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    return con.execute("SELECT rel, repo, commit, license FROM sources WHERE rel IN "
                       "(SELECT DISTINCT file FROM coefficients) ORDER BY rel").fetchall()


def _write_split(root: Path, folder: str, split: str, frame: pl.DataFrame) -> str:
    rel = f"{folder}/{split}.parquet"
    (root / folder).mkdir(parents=True, exist_ok=True)
    frame.write_parquet(root / rel, compression="zstd")
    return rel


def _repos(sources: list[tuple]) -> str:
    return ", ".join(sorted({f"{repo}@{commit[:7]}" if commit else f"{repo} (unpinned)"
                             for _, repo, commit, _ in sources}))


def _licenses(sources: list[tuple]) -> str:
    return ", ".join(sorted({lic for *_, lic in sources if lic}))


def render_readme(configs: list[dict], meta: dict[str, str]) -> str:
    """The card: YAML ``configs:`` for ``load_dataset``, then one table row per config and one
    per source repository with its license."""
    all_sources = {s for c in configs for s in c["sources"]}
    front = {"license": sorted({lic.lower() for *_, lic in all_sources if lic}),
             "pretty_name": TITLE, "tags": TAGS,
             "configs": [{"config_name": c["config"],
                          "data_files": [{"split": c["split"], "path": c["path"]}]}
                         for c in configs],
             "dataset_info": [{"config_name": c["config"], "features": [
                 {"name": name, **hf_type(dtype)} for name, dtype in c["columns"].items()]}
                 for c in configs]}
    config_rows = "\n".join(
        f"| `{c['config']}` | {c['kind']} | {c['sku'] or '-'} | {c['rows']:,} | `{c['version']}` | "
        f"{_repos(c['sources']) or '-'} | {_licenses(c['sources']) or '-'} |" for c in configs)
    by_repo = defaultdict(set)
    for rel, repo, commit, lic in all_sources:
        by_repo[(repo, commit or "unpinned", lic or "unknown")].add(rel)
    repo_rows = "\n".join(f"| [{repo}](https://github.com/{repo}) | `{commit}` | {lic} | "
                          f"{len(rels)} |" for (repo, commit, lic), rels in sorted(by_repo.items()))
    return (paths.DATASETS_DIR / "cards" / "hf_readme.md").read_text().format(
        front_matter=yaml.safe_dump(front, sort_keys=False), config_rows=config_rows,
        columns="\n".join(column_dictionary(configs)), citation=citation(),
        source_rows=repo_rows, store_version=meta["store_version"],
        builder_version=meta["builder_version"], code_version=meta["code_version"])


def _results(runs_dir: Path) -> pl.DataFrame | None:
    """The tidy results table of the current rankable runs in ``runs_dir`` (run x phase x
    statistic, with the dataset version, code hash and predictor kind), or None without runs."""
    runs = results_table.current_runs(runs_dir) if Path(runs_dir).is_dir() else None
    return results_table.tidy(runs) if runs is not None and len(runs) else None


def hf_type(dtype: pl.DataType) -> dict:
    """A column's type as a Hugging Face ``features`` entry (``dtype``, or a ``sequence``)."""
    if isinstance(dtype, pl.List):
        return {"sequence": hf_type(dtype.inner)["dtype"]}
    names = {pl.String: "string", pl.Int64: "int64", pl.Int32: "int32", pl.Float64: "float64",
             pl.Float32: "float32", pl.Boolean: "bool", pl.Categorical: "string"}
    return {"dtype": next((v for k, v in names.items() if dtype == k), str(dtype).lower())}


def column_dictionary(configs: list[dict]) -> list[str]:
    """One table per kind of config: every column with its type, unit and meaning
    (``datasets/cards/columns.yaml``)."""
    meanings = yaml_io.safe_load((paths.DATASETS_DIR / "cards" / "columns.yaml").read_text())
    lines, seen = [], set()
    for c in configs:
        kind = (c["kind"], c["split"])
        if kind in seen:
            continue
        seen.add(kind)
        lines += [f"**{c['split']}** ({c['kind']} configs, e.g. `{c['config']}`)", "",
                  "| column | type | unit | meaning |", "|---|---|---|---|"]
        for name, dtype in c["columns"].items():
            entry = meanings.get(name, {"unit": "?", "meaning": "?"})
            typed = hf_type(dtype)
            shown = typed.get("dtype") or f"list of {typed['sequence']}"
            lines.append(f"| `{name}` | {shown} | {entry['unit']} | {entry['meaning']} |")
        lines.append("")
    return lines


def citation() -> str:
    """The suite's citation (CITATION.cff) as BibTeX."""
    cff = yaml_io.safe_load((paths.REPO_ROOT / "CITATION.cff").read_text())
    authors = " and ".join(a.get("name") or f"{a.get('family-names')}, {a.get('given-names')}"
                           for a in cff["authors"])
    return (f"@software{{llm_step_leaderboard,\n  title = {{{cff['title']}}},\n"
            f"  author = {{{authors}}},\n  version = {{{cff['version']}}},\n"
            f"  year = {{{str(cff['date-released'])[:4]}}},\n  license = {{{cff['license']}}}\n}}")


def _write_all(root: Path, catalog: StoreCatalog, con: duckdb.DuckDBPyConnection,
               only: list[str] | None, quiet: bool, runs_dir: Path | None) -> list[dict]:
    rows = catalog.datasets()
    names = selected(rows, only)
    cards = dict(con.execute("SELECT name, card FROM datasets WHERE list_contains(?, name)",
                             [names]).fetchall())
    configs = []
    with Progress(console=stderr, transient=True, disable=quiet) as progress:
        task = progress.add_task("exporting", total=len(names) + 1)
        for name in names:
            row = rows[name]
            progress.update(task, description=f"exporting {name}")
            sources = source_rows(con, name, cards[name])
            if row["kind"] == "cells":
                parts = [(name, "cells", catalog.cells(name)),
                         (lineage_config(name), "lineage", catalog.lineage(name))]
            elif row["kind"] == "serving":
                parts = [(name, "targets", catalog.serving_targets(name))]
                if runs_dir is not None:  # the replay's own error, as `data card` ends with it
                    cards[name] = cards[name].rstrip() + "\n\n" + "\n".join(
                        serving_oracle.for_card(name, runs_dir, rows))
            else:
                parts = [(name, "points", catalog.op_points(name)),
                         (collectives_config(row["sku"]), "collectives",
                          catalog.collective_points(row["sku"], row["backend_versions"][0]))]
            for config, split, frame in parts:
                configs.append({"config": config, "split": split, "rows": len(frame),
                                "columns": dict(frame.schema),
                                "path": _write_split(root, name, split, frame),
                                "kind": "lineage" if split == "lineage" else row["kind"],
                                "sku": row["sku"], "version": row["version"], "sources": sources})
            (root / name / "card.md").write_text(cards[name])
            progress.advance(task)
        coefficients = catalog.coefficients()
        version = con.execute("SELECT version FROM table_versions "
                              "WHERE table_name = 'coefficients'").fetchall()[0][0]
        configs.append({"config": "coefficients", "split": "coefficients", "kind": "coefficients",
                        "rows": len(coefficients), "columns": dict(coefficients.schema),
                        "sku": None, "version": version,
                        "sources": _coefficient_sources(con),
                        "path": _write_split(root, "coefficients", "coefficients", coefficients)})
        listed = pl.DataFrame([{**{k: rows[n][k] for k in CATALOG_SCHEMA if k != "rows"},
                                "rows": next(c["rows"] for c in configs if c["config"] == n)}
                               for n in names], schema=CATALOG_SCHEMA)
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        if runs_dir is not None and (table := _results(runs_dir)) is not None:
            configs.append({"config": "results", "split": "results", "kind": "results",
                            "rows": len(table), "columns": dict(table.schema), "sku": None,
                            "version": meta["store_version"], "sources": [],
                            "path": _write_split(root, "results", "results", table)})
        configs.append({"config": "catalog", "split": "catalog", "kind": "catalog",
                        "rows": len(listed), "columns": dict(listed.schema),
                        "sku": None, "version": meta["store_version"],
                        "sources": [], "path": _write_split(root, "catalog", "catalog", listed)})
        (root / "README.md").write_text(render_readme(configs, meta))
        (root / EXPORT_MARKER).write_text("written by python -m leaderboard.hub\n")
        progress.advance(task)
    return configs


# The file every export holds: hub.overwrite=true replaces only a folder that has it (or an
# empty one), so a mistyped path never removes a folder of other files.
EXPORT_MARKER = ".leaderboard-export"


def replaceable(folder: Path) -> bool:
    return folder.is_dir() and ((folder / EXPORT_MARKER).is_file() or not any(folder.iterdir()))


def export(path: str | Path, only: list[str] | None = None, overwrite: bool = False,
           quiet: bool = False, sources_root: str | None = None,
           gpu_specs: str | None = None, runs_dir: str | Path | None = None) -> dict[str, int]:
    """Write the folder; returns the rows of each config written. A serving set's card ends with
    its oracle's error from the runs in ``runs_dir`` (or says there is no oracle run there)."""
    target = Path(path).expanduser().absolute()
    sandbox.refuse_inside_read_roots(target, "hub.export")
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass hub.overwrite=true to replace it")
    if target.exists() and not replaceable(target):
        # overwrite replaces the whole folder: never one this command did not write
        raise FileExistsError(f"{target} is not an earlier export (it has no {EXPORT_MARKER}), "
                              "so hub.overwrite=true will not replace it; name a new folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with StoreCatalog(sources_root, gpu_specs) as catalog, \
                database.connect(sources_root, gpu_specs) as con:
            configs = _write_all(tmp, catalog, con, only, quiet,
                                 Path(runs_dir) if runs_dir is not None else None)
        if target.exists():
            old = target.with_name(f".{target.name}.{os.getpid()}.old")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {c["config"]: c["rows"] for c in configs}

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
