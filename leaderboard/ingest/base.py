"""What every upstream adapter shares: reading files safely, provenance, and the build context."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any

import polars as pl

from leaderboard.ingest.quarantine import Quarantine
from leaderboard.ingest.sources import SourceFile
from leaderboard_core.specs import GpuSpec, require_gpu, resolve_model


class BuildError(RuntimeError):
    """The build cannot go on; the message names the file and the problem."""


@dataclass
class IngestContext:
    gpus: dict[str, GpuSpec]
    models: dict[str, dict[str, Any]]
    quarantine: Quarantine = field(default_factory=Quarantine)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why) left unread

    def gpu(self, sku: str, file: SourceFile) -> GpuSpec:
        return require_gpu(self.gpus, sku, file.rel)

    def model(self, spelling: str, file: SourceFile) -> str:
        return resolve_model(self.models, spelling, file.rel)


def read_table(file: SourceFile, required: list[str], **csv_options) -> pl.DataFrame:
    """Read a CSV, parquet or JSON-lines file and check it has the columns the adapter needs."""
    suffix = file.path.suffix
    try:
        if suffix == ".parquet":
            df = pl.read_parquet(file.path)
        elif suffix == ".jsonl":
            df = pl.read_ndjson(file.path, infer_schema_length=None)
        else:
            df = pl.read_csv(file.path, infer_schema_length=None, **csv_options)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a corrupt source file
        raise BuildError(f"{file.path}: cannot read {suffix} file ({type(exc).__name__}: {exc})") from exc
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise BuildError(f"{file.path}: missing column(s) {', '.join(missing)} (source {file.rel})")
    return df


def read_json(file: SourceFile) -> Any:
    try:
        return json.loads(file.path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BuildError(f"{file.path}: cannot read JSON ({exc})") from exc


def provenance(
    df: pl.DataFrame, file: SourceFile, source: str, sku: str | None, backend: str,
    backend_version: str, statistic: str,
) -> pl.DataFrame:
    return df.with_columns(
        source=pl.lit(source), sku=pl.lit(sku, dtype=pl.String), backend=pl.lit(backend),
        backend_version=pl.lit(backend_version), file=pl.lit(file.rel),
        file_sha256=pl.lit(file.sha256), pinned=pl.lit(file.pinned), statistic=pl.lit(statistic),
    )


@dataclass(frozen=True)
class Adapter:
    """One upstream project: the files it reads (globs under the sources root) and its reader."""

    name: str
    patterns: tuple[str, ...]
    ingest: Any  # Callable[[list[SourceFile], IngestContext], list[tuple[str, pl.DataFrame]]]

    def matches(self, rel: str) -> bool:
        return any(fnmatch(rel, p) for p in self.patterns)
