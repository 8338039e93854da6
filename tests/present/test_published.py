"""The published runs: one small file that a fresh clone's report reads as run folders, each
rebuilt to what the run wrote (its metrics whole; a step run's scored rows from the store)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from leaderboard import published
from leaderboard.run.evaluate import RunSpec, run


@pytest.mark.slow
def test_published_runs_unpack_to_the_runs_that_were_made(store_home, tmp_path):
    runs = tmp_path / "runs"
    made = [run(RunSpec(p, d, {}, runs_dir=runs)) for p, d in
            (("ours", "h200_vidur"), ("genz", "h200_vidur"), ("llm_viewer", "h200_vidur"),
             ("llm_viewer", "h200_sxm_ops"), ("table_scaled", "h200_sxm_ops"))]
    out = published.write(runs, tmp_path / "published.tar.gz")
    size = sum(p.stat().st_size for p in runs.rglob("*.parquet"))
    assert out.stat().st_size < size / 2  # the point of the file: a fraction of the folders
    rebuilt = {p.name: p for p in published.unpack(out, tmp_path / "again")}
    assert sorted(rebuilt) == sorted(r.folder.name for r in made)
    for result in made:
        folder = rebuilt[result.folder.name]
        assert json.loads((folder / "metrics.json").read_text()) == result.metrics
        original = pl.read_parquet(result.folder / "predictions.parquet")
        again = pl.read_parquet(folder / "predictions.parquet")
        kept = [c for c in original.columns if not c.startswith("op_ms_")]
        assert set(kept) <= set(again.columns)
        if result.metrics["level"] not in published.PREDICTIONS_READ:
            assert again.is_empty()  # tabled from its metrics alone: its rows are not published
            continue
        joined = original.join(again, on="cell_id", suffix="_again")
        assert len(joined) == len(original) == len(again)
        for column in (c for c in kept if c not in ("cell_id", "pred_ms", "signed_pct")):
            assert joined[column].equals(joined[f"{column}_again"], null_equal=True), column
        assert ((joined["pred_ms_again"] / joined["pred_ms"] - 1).abs().max()) < 1e-6
    skipped = published.unpack(out, tmp_path / "third", {made[0].folder.name})
    assert sorted(p.name for p in skipped) == sorted(r.folder.name for r in made[1:])
