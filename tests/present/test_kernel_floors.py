"""The kernel-floor benchmark behind ours's missed targets: its measured floors are the store's
points, and the report shows them."""

from __future__ import annotations

import json
from collections import Counter

import duckdb
import polars as pl
import pytest
from conftest import load_benchmark

from leaderboard.present import sections

kernel_floors = load_benchmark("kernel_floors")


def test_the_measured_floors_are_the_stores_points(real_store):
    with duckdb.connect(str(real_store.path), read_only=True) as con:
        shape, rows = kernel_floors.measure(con)
        attention = con.sql("SELECT * FROM attention WHERE sku = 'h100_sxm'").pl()
        collective = con.sql("SELECT * FROM collective WHERE sku = 'h100_sxm'").pl()
        lineage = con.sql("SELECT dataset, key FROM cell_lineage WHERE op = 'attn_decode' "
                          "AND dataset LIKE '%vidur'").pl()
    keys = [json.loads(k) for d, k in lineage.iter_rows() if d.endswith("_vidur")]
    shapes = Counter((k["num_heads"], k["num_kv_heads"], k["head_dim"]) for k in keys)
    assert (shape["num_heads"], shape["num_kv_heads"], shape["head_dim"]) == \
        shapes.most_common(1)[0][0]
    # the kernel: bf16 data and cache, no sliding window, as the _vidur cells take it
    raw = attention.filter(
        (pl.col("phase") == "decode") & (pl.col("backend") == "vllm")
        & (pl.col("source") == "aiconfigurator") & (pl.col("dtype") == "bfloat16")
        & (pl.col("kv_dtype") == "bfloat16") & (pl.col("window_size").fill_null(0) == 0)
        & pl.all_horizontal(pl.col(k) == v for k, v in shape.items()))
    reduce = collective.filter((pl.col("backend") == "vllm_graph") & (pl.col("num_gpus") == 2)
                               & (pl.col("message_bytes") == 4096)
                               & (pl.col("dtype") == "bfloat16"))
    h100 = [r for r in rows if r["gpu"] == "h100_sxm"]
    assert len(h100) >= 2
    for r in h100:
        for column, points in (("attention_us", raw), ("allreduce_us", reduce)):
            times = points.filter(pl.col("backend_version") == r["vllm"])["latency_ms"]
            assert r[column] == (pytest.approx(times.median() * 1e3) if len(times) else None)
    # exactly the version the h100_vidur cells were built from is marked
    h100_versions = {k["backend_version"] for d, k in zip(lineage["dataset"], keys, strict=False)
                     if d == "h100_vidur"}
    assert {r["vllm"] for r in h100 if r["in_vidur"]} == h100_versions and len(h100_versions) == 1


def test_the_report_shows_the_floors_and_the_widest_spread(tmp_path):
    path = tmp_path / "floors.json"
    assert "No benchmark result" in "\n".join(sections.kernel_floors(path))
    rows = [{"gpu": "b200_sxm", "vllm": v, "in_vidur": v == "0.19.0", "attention_us": a,
             "ours_attention_us": 9.93, "allreduce_us": None, "ours_allreduce_us": 5.5}
            for v, a in (("0.19.0", 6.0), ("0.24.0", 9.0))]
    path.write_text(json.dumps({
        "attention": {"batch": 1, "kv_len": 63, "num_heads": 8, "num_kv_heads": 2,
                      "head_dim": 128}, "allreduce": kernel_floors.ALLREDUCE,
        "code_version": "abc", "date": "today", "rows": rows}))
    text = "\n".join(sections.kernel_floors(path))
    assert "| b200_sxm | 0.19.0 | yes | 6.0 | 9.9 | — | 5.5 |" in text
    assert "the decode-attention floor moves by up to 50 % (b200_sxm)" in text
    assert "all-reduce floor moves" not in text  # measured at one version at most
