"""The job folder's files: what the parent hands a sandboxed child and the child reads back.

Frames go as Arrow IPC, the rest as JSON: the home bundle (``write_home``), a deploy reading
(the same layout), a GPU's datasheet. Both sides of ``leaderboard.seal.sandbox`` use it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import polars as pl

from leaderboard_core.contract import Home, Reading
from leaderboard_core.specs import GpuSpec


def write_frame(frame: pl.DataFrame, path: Path) -> None:
    """``frame`` as Arrow IPC, the same bytes for the same rows: a home bundle's bytes name its
    predictor cache (``sandbox.predictor_cache``), so a fit is reused only if they repeat. The
    values under top-level nulls are whatever memory held, so they are rebuilt (the frames here
    hold no null inside a list); strings go in the oldest Arrow layout, one plain buffer per
    column, with no string-view buffers to lay out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with_clean_nulls(frame).write_ipc(path, compat_level=pl.CompatLevel.oldest())


def with_clean_nulls(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with the same value under every top-level null. Setting the nulls again is not
    enough: polars keeps what lay under them unless they are filled first."""
    def clean(column: pl.Expr) -> pl.Expr:
        filled = column.fill_null(column.drop_nulls().first())
        return pl.when(column.is_null()).then(None).otherwise(filled)

    return frame.with_columns(clean(pl.col(name)).alias(name)
                              for name in frame.columns if frame[name].null_count())


def read_frame(path: Path) -> pl.DataFrame:
    return pl.read_ipc(path)


def gpu_json(gpu: GpuSpec) -> dict:
    return {"sku": gpu.sku, "data": gpu.data, "path": str(gpu.path)}


def gpu_of(data: dict) -> GpuSpec:
    return GpuSpec(data["sku"], data["data"], Path(data["path"]))


def write_home(home: Home, folder: Path) -> None:
    write_frame(home.cells, folder / "cells.arrow")
    write_frame(home.published, folder / "published.arrow")
    for op, frame in home.ops.items():
        write_frame(frame, folder / "ops" / f"{op}.arrow")
    (folder / "home.json").write_text(json.dumps(
        {"sku": home.sku, "dataset": home.dataset, "gpu": gpu_json(home.gpu),
         "gpus": {sku: gpu_json(gpu) for sku, gpu in home.gpus.items()},
         "models": home.models, "ops": list(home.ops), "points": home.points}, default=str))


def read_home(folder: Path) -> Home:
    meta = json.loads((folder / "home.json").read_text())
    return Home(sku=meta["sku"], gpu=gpu_of(meta["gpu"]), dataset=meta["dataset"],
                cells=read_frame(folder / "cells.arrow"),
                ops={op: read_frame(folder / "ops" / f"{op}.arrow") for op in meta["ops"]},
                models=meta["models"], published=read_frame(folder / "published.arrow"),
                gpus={sku: gpu_of(gpu) for sku, gpu in meta["gpus"].items()}, points=meta["points"])


def write_reading(reading: Reading, folder: Path) -> None:
    write_home(Home("", GpuSpec("", {}, Path()), "", reading.cells, reading.ops), folder)


def read_reading(folder: Path) -> Reading:
    home = read_home(folder)
    return Reading(home.cells, home.ops)


def tree_digest(folder: Path, digest=None) -> str:
    """``digest`` (a fresh SHA-256 by default) updated with every entry's relative path, its
    kind and, for a file, its bytes under ``folder``, in path order: folders and names count,
    so rows kept as empty folders or file names change it too."""
    digest = digest or hashlib.sha256()
    for entry in sorted(folder.rglob("*")):
        kind = "link" if entry.is_symlink() else "file" if entry.is_file() else "dir"
        digest.update(f"{kind}:{entry.relative_to(folder).as_posix()}\0".encode())
        if kind == "file":
            digest.update(entry.read_bytes())
        elif kind == "link":
            digest.update(os.readlink(entry).encode())
    return digest.hexdigest()
