"""The published runs: the runs behind RESULTS.md, in one file of a few MB that a fresh clone
reads without a rerun (``results/published-runs.tar.gz``, ``report.published``).

A run folder is its ``metrics.json`` and ``predictions.parquet``; 1,400 of them are about
200 MB, most of it every scored row's columns, the same for every predictor on a dataset. The
published file keeps each run's ``metrics.json`` whole, each dataset's scored rows once
(``targets/<dataset>.parquet``: every column but the prediction, its error and the per-op
split), and the predictions of the runs whose rows are read (``PREDICTIONS_READ``) as (run,
row, float32 prediction: a relative 6e-8 of the float64) in one table. ``unpack`` rebuilds
every run folder, its rows joined back and its signed error recomputed; the per-op split of a
step prediction is not kept.

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

from leaderboard.score import metrics as metric_defs
from leaderboard.score import results
from leaderboard_core import paths
from leaderboard_core.contract import BY_OP_PREFIX

DEFAULT = paths.REPO_ROOT / "results" / "published-runs.tar.gz"
PREDICTIONS = "predictions.parquet"
RERUN_MEMBER = "rerun.json"
# Whose rows the report and the site read: the ranked step runs (atlases, rankings, decisions,
# pictures) and serving runs (decisions). Op-level and protocol runs are tabled from their
# metrics alone, so their rows (4.8 of 7.1 million) are not published: their folders unpack
# with an empty predictions.parquet of the right columns.
PREDICTIONS_READ = ("step", "serving")
MAX_MEMBER = 256 << 20
MAX_TOTAL = 2 << 30  # unpacked: every run folder of a full rerun is about 200 MB


def write(runs_dir: Path, out: Path = DEFAULT) -> Path:
    """The current runs of ``runs_dir`` as one published file at ``out`` (written whole, then
    renamed)."""
    runs = results.current(results.load_runs(runs_dir)).pl()
    predictions, targets = [], {}
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(partial, "w:gz", compresslevel=9) as tar:
        for run_id, folder, dataset, level, ranked in runs.select(
                "run_id", "folder", "dataset", "level", "rankable").iter_rows():
            folder = Path(folder)
            _add(tar, f"runs/{run_id}/metrics.json", (folder / "metrics.json").read_bytes())
            rows = pl.read_parquet(folder / "predictions.parquet")
            shared = rows.drop("run_id", "pred_ms", "signed_pct",
                               *(c for c in rows.columns if c.startswith(BY_OP_PREFIX)))
            if ranked and level in PREDICTIONS_READ:
                predictions.append(rows.select("run_id", "cell_id",
                                               pl.col("pred_ms").cast(pl.Float32)))
            else:  # the columns, for the empty predictions its folder unpacks with
                shared = shared.head(0)
            targets[dataset] = pl.concat([targets[dataset], shared], how="diagonal_relaxed") \
                .unique("cell_id", keep="first") if dataset in targets else shared
        for dataset, rows in sorted(targets.items()):
            _add(tar, f"targets/{dataset}.parquet", _parquet(rows.sort("cell_id")))
        _add(tar, PREDICTIONS, _parquet(pl.concat(predictions) if predictions else pl.DataFrame(
            schema={"run_id": pl.String, "cell_id": pl.String, "pred_ms": pl.Float32})))
        timing = Path(runs_dir) / rerun_record()
        if timing.is_file():  # the outcomes (NotSupported answers too) and the rerun's time
            _add(tar, RERUN_MEMBER, timing.read_bytes())
    partial.replace(out)
    return out


def _parquet(frame: pl.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.write_parquet(buffer, compression="zstd", compression_level=19)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def rerun_record() -> str:
    from leaderboard.run.roster import TIMING_FILE  # noqa: PLC0415 - the roster imports the harness

    return TIMING_FILE


def unpack(path: Path, into: Path, skip: set[str] = frozenset()) -> list[Path]:
    """The published runs of ``path`` as run folders under ``into`` (those of ``skip``, run
    ids already at hand, left out), with the rerun's record; members are read as regular files
    only, never extracted by path."""
    files, total = {}, 0
    with tarfile.open(path, "r:gz") as tar:
        for member in tar:
            total += member.size
            if total > MAX_TOTAL:
                raise ValueError(f"{path} unpacks to over {MAX_TOTAL >> 20} MB; not a published "
                                 "runs file")
            if member.isfile() and member.size <= MAX_MEMBER:
                files[member.name] = tar.extractfile(member).read()
    predicted = pl.read_parquet(io.BytesIO(files[PREDICTIONS]))
    by_run = predicted.partition_by("run_id", as_dict=True)
    targets = {name.removeprefix("targets/").removesuffix(".parquet"):
               pl.read_parquet(io.BytesIO(data)) for name, data in files.items()
               if name.startswith("targets/")}
    written = []
    into.mkdir(parents=True, exist_ok=True)
    if RERUN_MEMBER in files:
        (into / rerun_record()).write_bytes(files[RERUN_MEMBER])
    for name in sorted(n for n in files if n.startswith("runs/") and n.endswith("/metrics.json")):
        run_id = name.split("/")[1]
        if name.count("/") != 2 or run_id.startswith(".") or run_id in skip:
            continue
        metrics = json.loads(files[name])
        if not run_id or metrics.get("run_id") != run_id or metrics.get("dataset") not in targets:
            print(f"published: {name} skipped (its run id or its dataset's rows do not match)",
                  file=sys.stderr)
            continue
        folder = into / run_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_bytes(files[name])
        mine = by_run.get((run_id,), pl.DataFrame(schema=predicted.schema))
        rows = mine.join(targets[metrics["dataset"]], on="cell_id", how="left")
        rows.with_columns(pl.col("pred_ms").cast(pl.Float64)).with_columns(
            signed_pct=metric_defs.errors(pl.col("pred_ms"), pl.col("gt_ms"))).write_parquet(
            folder / "predictions.parquet")
        written.append(folder)
    return written


def main(argv: list[str]) -> int:
    from leaderboard.run.config import command_config  # noqa: PLC0415

    cfg = command_config(argv, "python -m leaderboard.published", __doc__, "report", {})
    out = write(paths.from_user(cfg.runs_dir), paths.from_user(cfg.report.published))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from leaderboard.run.inputs import guarded

    sys.exit(guarded(main, "python -m leaderboard.published")(sys.argv[1:]))

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
