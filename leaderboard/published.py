"""The published runs: the runs behind RESULTS.md, in one file of a few MB that a fresh clone
reads without a rerun (``results/published-runs.tar.gz``, ``report.published``).

A run folder is its ``metrics.json`` and ``predictions.parquet``; 1,400 of them are about
200 MB, most of it every scored cell's columns repeated from the store. The published file
keeps each run's ``metrics.json`` whole and, for step runs, only each scored cell's id and
prediction (float32, a relative 6e-8 of the float64), in one table; op-level and serving runs
(a few hundred rows each) keep their predictions as they are. ``unpack`` rebuilds every run
folder, a step run's scored rows joined back from the store's cells at the run's dataset
version (the report takes only runs at the store's versions, so a row is the one the run
scored) and its signed error recomputed; the per-op split of a step prediction is not kept.

The file is the repository's own, committed beside RESULTS.md: its runs are the suite's, made
by the commit's code, and the report takes them as current only while that code is today's
(``results.current``), as it takes the runs of ``results/runs``. ``write`` is how it is made:
``python -m leaderboard.published`` after a full rerun.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path

import polars as pl

from leaderboard import metrics as metric_defs
from leaderboard import results, store
from leaderboard_core import paths

DEFAULT = paths.REPO_ROOT / "results" / "published-runs.tar.gz"
STEP_TABLE = "step-predictions.parquet"
RERUN_MEMBER = "rerun.json"
MAX_MEMBER = 256 << 20
# The step runs' prediction columns, as ``evaluate.PREDICTION_COLUMNS`` writes them
STEP_COLUMNS = ("cell_id", "workload_id", "model", "tp", "phase", "num_requests", "num_decode",
                "total_tokens", "decode_ctx_sum", "gt_kind", "gt_ms", "warm_share", "composed",
                "weight")


def write(runs_dir: Path, out: Path = DEFAULT) -> Path:
    """The current runs of ``runs_dir`` as one published file at ``out`` (written whole, then
    renamed)."""
    runs = results.current(results.load_runs(runs_dir)).pl()
    steps, partial = [], out.with_name(f".{out.name}.{os.getpid()}.partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(partial, "w:gz", compresslevel=9) as tar:
        for run_id, folder, level in runs.select("run_id", "folder", "level").iter_rows():
            folder = Path(folder)
            _add(tar, f"runs/{run_id}/metrics.json", (folder / "metrics.json").read_bytes())
            predictions = pl.read_parquet(folder / "predictions.parquet")
            if level == "step":
                steps.append(predictions.select("run_id", "cell_id",
                                                pl.col("pred_ms").cast(pl.Float32)))
            else:
                _add(tar, f"runs/{run_id}/predictions.parquet",
                     (folder / "predictions.parquet").read_bytes())
        buffer = io.BytesIO()
        (pl.concat(steps) if steps else pl.DataFrame(schema={
            "run_id": pl.String, "cell_id": pl.String, "pred_ms": pl.Float32})).write_parquet(
            buffer, compression="zstd", compression_level=19)
        _add(tar, STEP_TABLE, buffer.getvalue())
        timing = Path(runs_dir) / rerun_record()
        if timing.is_file():  # the outcomes (NotSupported answers too) and the rerun's time
            _add(tar, RERUN_MEMBER, timing.read_bytes())
    partial.replace(out)
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def rerun_record() -> str:
    from leaderboard.rerun import TIMING_FILE  # noqa: PLC0415 - the rerun imports the harness

    return TIMING_FILE


def unpack(path: Path, into: Path, skip: set[str] = frozenset()) -> list[Path]:
    """The published runs of ``path`` as run folders under ``into`` (those of ``skip``, run
    ids already at hand, left out), with the rerun's record; members are read as regular files
    only, never extracted by path."""
    files = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.size <= MAX_MEMBER:
                files[member.name] = tar.extractfile(member).read()
    steps = pl.read_parquet(io.BytesIO(files[STEP_TABLE]))
    by_run = dict(iter(steps.partition_by("run_id", as_dict=True).items()))
    with store.connect() as con:
        cells = con.execute(f"SELECT dataset, {', '.join(STEP_COLUMNS)} FROM cells").pl()
    written = []
    into.mkdir(parents=True, exist_ok=True)
    if RERUN_MEMBER in files:
        (into / rerun_record()).write_bytes(files[RERUN_MEMBER])
    for name in sorted(n for n in files if n.startswith("runs/") and n.endswith("/metrics.json")):
        run_id = name.split("/")[1]
        if name.count("/") != 2 or run_id.startswith(".") or run_id in skip:
            continue
        metrics = json.loads(files[name])
        folder = into / run_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_bytes(files[name])
        own = f"runs/{run_id}/predictions.parquet"
        if own in files:
            (folder / "predictions.parquet").write_bytes(files[own])
        else:
            scored = by_run.get((run_id,), pl.DataFrame(schema=steps.schema))
            rows = scored.join(cells.filter(pl.col("dataset") == metrics["dataset"]).drop(
                "dataset"), on="cell_id", how="left")
            rows.select(*STEP_COLUMNS, pred_ms=pl.col("pred_ms").cast(pl.Float64),
                        run_id=pl.col("run_id")).with_columns(
                signed_pct=metric_defs.errors(pl.col("pred_ms"), pl.col("gt_ms"))).write_parquet(
                folder / "predictions.parquet")
        written.append(folder)
    return written


def main(argv: list[str]) -> int:
    from leaderboard.config import command_config  # noqa: PLC0415

    cfg = command_config(argv, "python -m leaderboard.published", __doc__, "report", {})
    out = write(paths.from_user(cfg.runs_dir), paths.from_user(cfg.report.published))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from leaderboard.inputs import guarded

    sys.exit(guarded(main, "python -m leaderboard.published")(sys.argv[1:]))

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
