"""The kernel-floor benchmark behind ours's missed targets: its measured floors are the store's
points, and the report shows them."""

from __future__ import annotations

import json
import sys

import duckdb
import polars as pl
import pytest

from leaderboard import report_sections
from leaderboard_core import paths

sys.path.insert(0, str(paths.REPO_ROOT / "benchmarks"))
import kernel_floors  # noqa: E402 - a script of benchmarks/, imported as one


def test_the_measured_floors_are_the_stores_points(real_store):
    with duckdb.connect(str(real_store.path), read_only=True) as con:
        rows = kernel_floors.measure(con)
        attention = con.sql("SELECT * FROM attention WHERE sku = 'h100_sxm'").pl()
        vidur_version = con.execute(
            "SELECT key FROM cell_lineage WHERE dataset = 'h100_vidur' AND op = 'attn_decode' "
            "LIMIT 1").fetchone()[0]
    shape = kernel_floors.ATTENTION
    raw = attention.filter(
        (pl.col("phase") == "decode") & (pl.col("backend") == "vllm")
        & (pl.col("dtype") == "bfloat16") & (pl.col("kv_dtype") == "bfloat16")
        & (pl.col("window_size") == 0) & (pl.col("source") == "aiconfigurator")
        & pl.all_horizontal(pl.col(k) == v for k, v in shape.items()))
    h100 = [r for r in rows if r["gpu"] == "h100_sxm"]
    assert {r["vllm"] for r in h100} >= set(raw["backend_version"]) and len(h100) >= 2
    for r in h100:
        points = raw.filter(pl.col("backend_version") == r["vllm"])["latency_ms"]
        if len(points):
            assert r["attention_us"] == pytest.approx(points.median() * 1e3)
    # exactly the version the h100_vidur cells were built from is marked
    assert [r["vllm"] for r in h100 if r["in_vidur"]] == [json.loads(vidur_version)[
        "backend_version"]]
    assert len({r["ours_attention_us"] for r in h100}) == 1  # ours sees no version


def test_the_report_shows_the_floors_or_says_they_are_missing(tmp_path):
    path = tmp_path / "floors.json"
    assert "No benchmark result" in "\n".join(report_sections.kernel_floors(path))
    row = {"gpu": "b200_sxm", "vllm": "0.19.0", "in_vidur": True, "attention_us": 6.94,
           "ours_attention_us": 9.93, "allreduce_us": None, "ours_allreduce_us": 5.5}
    path.write_text(json.dumps({"attention": kernel_floors.ATTENTION,
                                "allreduce": kernel_floors.ALLREDUCE, "code_version": "abc",
                                "date": "today", "rows": [row]}))
    text = "\n".join(report_sections.kernel_floors(path))
    assert "| b200_sxm | 0.19.0 | yes | 6.9 | 9.9 | — | 5.5 |" in text
    assert "1 request over 63 cached tokens" in text and "TP2 all-reduce of 4 KiB" in text
