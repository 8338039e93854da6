"""The DuckDB store: built atomically from every upstream source, versioned, listed.

A build writes a temporary file beside the store, validates it, then renames it over the old
one, so a failed build leaves the previous store intact. One build runs at a time (a file lock);
readers open the store read-only.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import polars as pl
from rich.console import Console

from leaderboard import cells
from leaderboard.cells import families, fp8_check
from leaderboard.cells import serving_targets as serving_datasets
from leaderboard.ingest import ADAPTERS, BuildError, IngestContext, sources
from leaderboard.ingest.quarantine import validate
from leaderboard.ingest.tables import TABLES, conform
from leaderboard.store import debris
from leaderboard_core import guard, paths, progress
from leaderboard_core.specs import load_gpu_specs, load_models
from leaderboard_core.versioning import code_version, content_hash

# Bump when ingestion changes what lands in the store: every version below changes with it.
BUILDER_VERSION = "7"

stderr = Console(stderr=True)


@dataclass
class BuildReport:
    path: Path
    seconds: float
    rows: dict[str, int]
    quarantined: dict[tuple[str, str, str], int]  # (kind, reason, source) -> rows
    merged_duplicates: dict[tuple[str, str, str], int] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why) not read


@contextmanager
def _build_lock():
    paths.store_path().parent.mkdir(parents=True, exist_ok=True)
    with open(paths.store_path().parent / ".build.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with progress.track(f"waiting for another process to finish building the store in "
                                f"{paths.store_path().parent}"):
                fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _selected(only: list[str] | None):
    if not only:
        return list(ADAPTERS.values())
    unknown = sorted(set(only) - set(ADAPTERS))
    if unknown:
        raise BuildError(f"unknown source(s) {unknown}; valid: {sorted(ADAPTERS)}")
    return [ADAPTERS[name] for name in only]


# The hub export's card template and column dictionary: they shape no cell.
EXPORT_ONLY = ("hf_readme.md", "columns.yaml")


def inputs_fingerprint(sources_root=None, gpu_specs=None, only=None) -> str:
    """What a store was built from, short of hashing the upstream files themselves."""
    root = sources.explicit_root(sources_root)
    spec_texts = {s.sku: s.path.read_text() for s in load_gpu_specs(gpu_specs).values()}
    cell_inputs = [p.read_text() for p in sorted([*(paths.CONF_DIR / "cells").glob("*.yaml"),
                                                  *(paths.DATASETS_DIR / "cards").glob("*.md"),
                                                  *(paths.DATASETS_DIR / "cards").glob("*.yaml")])
                   if p.name not in EXPORT_ONLY]
    return content_hash(BUILDER_VERSION, sources.PINS_FILE.read_text(), spec_texts, load_models(),
                        cell_inputs, str(root), sorted(only or ADAPTERS))


def build(sources_root: str | None = None, gpu_specs: str | None = None,
          only: list[str] | None = None, quiet: bool = False) -> BuildReport:
    started = time.perf_counter()
    adapters = _selected(only)
    with _build_lock():
        debris.sweep()
        pins = [p for p in sources.load_pins() if any(a.matches(p.rel) for a in adapters)]
        files = sources.resolve(pins, sources_root)
        files += sources.discover_unpinned([pat for a in adapters for pat in a.patterns],
                                           {p.rel for p in pins}, sources_root)
        ctx = IngestContext(load_gpu_specs(gpu_specs), load_models())
        chunks: dict[str, list[pl.DataFrame]] = {name: [] for name in TABLES}
        with progress.track("store build: ingesting upstream files", len(files),
                            enabled=not quiet) as bar:
            for adapter in adapters:
                mine = [f for f in files if adapter.matches(f.rel)]
                bar.note(adapter.name)
                for table, df in adapter.ingest(mine, ctx):
                    chunks[table].append(conform(df, table))
                bar.advance(len(mine))
        fingerprint = inputs_fingerprint(sources_root, gpu_specs, only)
        steps = len(chunks) + len(families.builders()) + 2
        with progress.track("store build: tables and cells", steps, enabled=not quiet) as bar:
            report = _write(chunks, ctx, files, fingerprint, started, bar)
    if not quiet:
        print_report(report)
    return report


def _summary(name: str, df: pl.DataFrame) -> pl.DataFrame:
    return df.group_by("source", "sku").agg(
        table=pl.lit(name), rows=pl.len(), files=pl.col("file").unique().sort(),
        versions=pl.col("backend_version").unique().sort(), pinned=pl.col("pinned").all())


def _datasets(summaries: list[pl.DataFrame], ctx: IngestContext, files) -> pl.DataFrame:
    """One entry per (source, sku): the op-level view ``list`` prints."""
    sha_of = {f.rel: f.sha256 for f in files}
    entries = []
    for (source, sku), group in pl.concat(summaries).group_by("source", "sku", maintain_order=True):
        kinds = {TABLES[t].kind for t in group["table"]}
        kind = "ops" if "ops" in kinds else kinds.pop()
        file_list = sorted({f for fs in group["files"] for f in fs})
        spec_text = ctx.gpus[sku].path.read_text() if sku in ctx.gpus else ""
        entries.append({
            "name": f"{source}.{sku}" if sku else source, "kind": kind, "source": source,
            "sku": sku, "rows": int(group["rows"].sum()),
            "version": content_hash(BUILDER_VERSION, [sha_of[f] for f in file_list], spec_text),
            "tables": json.dumps(dict(zip(group["table"], group["rows"].cast(int), strict=True))),
            "backend_versions": json.dumps(sorted({v for vs in group["versions"] for v in vs})),
            "files": json.dumps(file_list), "pinned": bool(group["pinned"].all()),
        })
    return pl.DataFrame(entries).sort("kind", "source", "sku")


def _store_table(con, name: str, frame: pl.DataFrame) -> None:
    con.register("frame", frame.to_arrow())
    con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM frame').fetchall()
    con.unregister("frame")
    written = con.execute(f'SELECT count(*) FROM "{name}"').fetchall()[0][0]
    if written != len(frame):
        raise BuildError(f"store table {name}: wrote {written} rows, expected {len(frame)}")


def _write(chunks, ctx: IngestContext, files, fingerprint: str, started,
           bar: progress.Tracker) -> BuildReport:
    """Validate and write one table at a time into a temp file, then rename it into place."""
    target = paths.store_path()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    rows, summaries, table_versions = {}, [], []
    fp8_checks = fp8_check.table_checks(pl.DataFrame(schema=TABLES["gemm"].schema), ctx.gpus)
    con = duckdb.connect(str(tmp), config={"memory_limit": "512MB", "threads": 2})
    try:
        for name in list(chunks):
            bar.note(f"checking and writing {name}")
            frames = chunks.pop(name)
            df = pl.concat(frames) if frames else pl.DataFrame(schema=TABLES[name].schema)
            del frames
            df = validate(df, name, ctx.quarantine)
            if name == "gemm":  # FP8 tables that do not time FP8 never reach a dataset
                df, fp8_checks = fp8_check.quarantine_failing(df, ctx.gpus, ctx.quarantine)
            _store_table(con, name, df)
            rows[name] = len(df)
            if len(df):
                summaries.append(_summary(name, df))
            table_versions.append({"table_name": name, "rows": len(df), "version": content_hash(
                BUILDER_VERSION, sorted(df["file_sha256"].unique().to_list()))})
            del df
            bar.advance()
        quarantine = ctx.quarantine.table()
        _store_table(con, "quarantine", quarantine)
        _store_table(con, fp8_check.TABLE, fp8_checks)
        _store_table(con, "skipped_files", pl.DataFrame(
            ctx.skipped, schema={"rel": pl.String, "reason": pl.String}, orient="row"))
        _store_table(con, "sources", pl.DataFrame([
            {"rel": f.rel, "repo": f.repo, "commit": f.commit, "sha256": f.sha256,
             "bytes": f.path.stat().st_size, "license": f.license, "pinned": f.pinned,
             "read_from": str(f.path.parent)} for f in files]))
        # Cells are composed from the op tables just written, inside the same temporary store.
        cell_sets, cell_entries = cells.build_all(con, ctx.gpus, BUILDER_VERSION, bar)
        bar.note("writing cells")
        cell_frame, lineage_frame = cells.frames(cell_sets)
        _store_table(con, "cells", cell_frame)
        _store_table(con, "cell_lineage", lineage_frame)
        rows["cells"], rows["cell_lineage"] = len(cell_frame), len(lineage_frame)
        bar.advance()
        bar.note("serving targets")
        serving_frame, serving_entries = serving_datasets.build_all(con, ctx.gpus, BUILDER_VERSION)
        _store_table(con, "serving_targets", serving_frame)
        rows["serving_targets"] = len(serving_frame)
        bar.advance()
        cell_entries = [*cell_entries, *serving_entries]
        datasets = pl.concat([_datasets(summaries, ctx, files).with_columns(
            phases=pl.lit(None, pl.String), card=pl.lit(None, pl.String)),
            *([pl.DataFrame(cell_entries)] if cell_entries else [])], how="vertical_relaxed")
        meta = {"builder_version": BUILDER_VERSION, "built_at": datetime.now(UTC).isoformat(),
                "code_version": code_version(), "inputs_fingerprint": fingerprint,
                "store_version": content_hash(BUILDER_VERSION, datasets["version"].to_list())}
        _store_table(con, "datasets", datasets)
        _store_table(con, "table_versions", pl.DataFrame(table_versions))
        _store_table(con, "meta", pl.DataFrame({"key": list(meta), "value": list(meta.values())}))
        con.close()
        os.replace(tmp, target)
    finally:
        # Closed on failure too: DuckDB keeps an open database per path in this process, and a
        # retried build would otherwise write into the failed one's half-built tables.
        con.close()
        tmp.unlink(missing_ok=True)
    quarantined = Counter()
    for kind, reason, source, n in quarantine.group_by("kind", "reason", "source").len().iter_rows():
        quarantined[(kind, reason, source)] += n
    return BuildReport(target, time.perf_counter() - started, rows, dict(quarantined),
                       dict(ctx.quarantine.merged_duplicates), sorted(ctx.skipped))


def print_report(report: BuildReport) -> None:
    total = sum(report.rows.values())
    stderr.print(f"[bold]store built[/] {report.path} in {report.seconds:.1f} s: {total:,} rows "
                 + ", ".join(f"{t} {n:,}" for t, n in report.rows.items() if n))
    for (kind, reason, source), n in sorted(report.quarantined.items()):
        stderr.print(f"  quarantined {n:,} {source} rows: {kind}/{reason}")
    for rel, why in report.skipped:
        stderr.print(f"  skipped {rel}: {why}")
    merged = sum(report.merged_duplicates.values())
    if merged:
        stderr.print(f"  merged {merged:,} duplicate copies that agreed (median kept)")


def read_meta(path: Path) -> dict[str, str]:
    with duckdb.connect(str(path), read_only=True) as con:
        return dict(con.execute("SELECT key, value FROM meta").fetchall())


def is_fresh(sources_root=None, gpu_specs=None) -> bool:
    path = paths.store_path()
    if not path.exists():
        return False
    try:
        meta = read_meta(path)
    except duckdb.Error:
        return False
    return meta.get("inputs_fingerprint") == inputs_fingerprint(sources_root, gpu_specs)


# Set to "refuse" where a build must not start (the rerun's worker processes, a read-only
# deployment): a stale store then raises ``StaleStore`` naming the command to run instead.
STALE_ENV = "LEADERBOARD_STALE_STORE"
BUILD_COMMAND = "python -m leaderboard.data build"


class StaleStore(BuildError):
    """The store is missing or stale and building it here was refused."""


def _state() -> str:
    return "stale (its inputs changed)" if paths.store_path().exists() else "missing"


def require_fresh(sources_root: str | None = None, gpu_specs: str | None = None,
                  why: str = "reading a run's inputs never builds it") -> Path:
    """The store's path, where it is built and fresh; ``StaleStore`` naming the command that
    builds it otherwise. Where building is refused (``LEADERBOARD_STALE_STORE=refuse``: the
    rerun's workers, whose parent ensured the store before starting them) a store found fresh is
    taken as fresh for the rest of the process: its fingerprint hashes every input (0.2 s a
    run)."""
    key = (str(paths.store_path()), sources_root, gpu_specs)
    if not (os.environ.get(STALE_ENV) == "refuse" and key in _FOUND_FRESH):
        if not is_fresh(sources_root, gpu_specs):
            raise StaleStore(f"the store {paths.store_path()} is {_state()} and {why}; run "
                             f"`{BUILD_COMMAND}` first")
        _FOUND_FRESH.add(key)
    return paths.store_path()


def ensure(sources_root: str | None = None, gpu_specs: str | None = None) -> Path:
    """The store's path. A missing or stale store is never rebuilt silently: it is announced on
    stderr and built with its progress bar, or, with ``LEADERBOARD_STALE_STORE=refuse``,
    refused with the command that builds it (``require_fresh``). The commands ensure the store
    before they read a run's inputs."""
    if os.environ.get(STALE_ENV) == "refuse":
        return require_fresh(sources_root, gpu_specs, f"{STALE_ENV}=refuse forbids building it here")
    if not is_fresh(sources_root, gpu_specs):
        with _build_lock():  # another process may be building it right now: wait, then look again
            fresh = is_fresh(sources_root, gpu_specs)
        if not fresh:
            stderr.print(f"[bold]the store {paths.store_path()} is {_state()}:[/] building it now "
                         f"(`{BUILD_COMMAND}` does this ahead of a run)", highlight=False)
            build(sources_root, gpu_specs)
    _FOUND_FRESH.add((str(paths.store_path()), sources_root, gpu_specs))
    return paths.store_path()


_FOUND_FRESH: set[tuple] = set()


def connect(sources_root: str | None = None, gpu_specs: str | None = None):
    """The store, read-only, built first where missing or stale."""
    guard.check("open the store")
    return _open_read_only(ensure(sources_root, gpu_specs))


def connect_current(sources_root: str | None = None, gpu_specs: str | None = None):
    """The store, read-only, as it stands: ``StaleStore`` where it is missing or stale."""
    guard.check("open the store")
    return _open_read_only(require_fresh(sources_root, gpu_specs))


def _open_read_only(path: Path):
    return duckdb.connect(str(path), read_only=True)
