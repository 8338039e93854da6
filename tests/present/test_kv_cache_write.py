"""The KV-cache-write benchmark differences two vLLM versions' decode attention per bytes a call
writes, adds the write per layer at the nearest measured bytes, replays only the sets whose
oracle reads the later tables, and the report shows its tables and each set's clause."""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import SHARED, load_benchmark

from leaderboard.ingest.aiconfigurator import ROOT as AIC_ROOT
from leaderboard.present.serving_kv_write import kv_write, kv_write_measured
from leaderboard.present.serving_unknowns import unknowns_measured
from leaderboard_core.specs import load_models


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("kv_cache_write")


def test_each_layer_writes_its_new_tokens_at_the_nearest_measured_bytes(bench):
    """Llama-3.1-70B (80 layers, 8 KV heads of 128): at TP 2 a GPU holds 4 heads, so a token
    writes 4 x 128 x 2 x 2 = 2,048 bytes; at TP 8 one head, 512 bytes. Measured: 1 µs at 1 KiB,
    3 µs at 4 KiB, 10 µs at 16 KiB. Two tokens at TP 2 write 4 KiB (3 µs a layer); 100 tokens
    write 200 KiB, past the largest, which they read; two tokens at TP 8 write 1 KiB."""
    difference = pl.DataFrame({"written_bytes": [1024, 4096, 16384],
                               "median_us": [1.0, 3.0, 10.0]})
    write = bench.CacheWrite(difference, load_models())
    cells = pl.DataFrame({"model": ["llama-3.1-70b"] * 3, "tp": [2, 2, 8],
                          "total_tokens": [2, 100, 2]})
    assert write.step_ms(cells) == pytest.approx([80 * 3.0 / 1e3, 80 * 10.0 / 1e3,
                                                  80 * 1.0 / 1e3])


def test_only_sets_read_at_a_later_aiconfigurator_version_with_a_difference_are_replayed(bench):
    later = {"source": "aiconfigurator", "sku": "h100_sxm", "version": bench.AFTER}
    assert bench.not_replayed(later, {"h100_sxm"}) is None
    assert bench.not_replayed({**later, "version": "0.24.0"}, {"h100_sxm"}) is None
    assert "0.14.0's tables, at or before 0.14.0: where the difference is the write, they hold" \
        in bench.not_replayed({**later, "version": bench.BEFORE}, {"h100_sxm"})
    assert "at or before" in bench.not_replayed({**later, "version": "0.12.0"}, {"h100_sxm"})
    for between in ("0.16.0", "unknown"):
        assert "before 0.19.0: whether they hold the write is unknown" in bench.not_replayed(
            {**later, "version": between}, {"h100_sxm"})
    assert bench.not_replayed({**later, "sku": "b200_sxm"}, {"h100_sxm"}) == \
        f"no vLLM {bench.BEFORE} table of b200_sxm to difference"
    assert "whole attention layer" in bench.not_replayed(
        {**later, "source": "llmservingsim"}, {"h100_sxm"})


def test_each_group_is_read_against_one_launch_plus_the_write_at_datasheet_bandwidth(bench):
    """Two GPUs, each against its own launch and bandwidth. A (2,000 GB/s, 2e6 bytes a µs,
    listed last): one shape writing 512 bytes, 2 µs slower at the earlier version, and three
    writing 8 MiB, 10, 20 and 30 µs slower (median 20); its launch is 2 µs and 8 MiB read and
    written take 2 x 8,388,608 / 2e6 = 8.39 µs, so that group is 20 / 10.39 times them. B
    (4,000 GB/s, listed first): 512 bytes 1 µs slower, its own launch, so 1 / (1 + 1,024 / 4e6).
    A shape timed at one version only is not paired."""
    rows = []
    for sku, batch, heads, slower_us in (("b", 1, 1, 1.0), ("a", 1, 1, 2.0), ("a", 2048, 8, 10.0),
                                         ("a", 4096, 4, 20.0), ("a", 8192, 2, 30.0),
                                         ("a", 16, 1, None)):
        shape = {"sku": sku, "batch": batch, "kv_len": 64, "num_heads": 32,
                 "num_kv_heads": heads, "head_dim": 128}
        rows.append({**shape, "backend_version": bench.AFTER, "latency_ms": 0.010})
        if slower_us is not None:
            rows.append({**shape, "backend_version": bench.BEFORE,
                         "latency_ms": 0.010 + slower_us / 1e3})
    gpus = {"b": {"mem_bw_gbs": 4000}, "c": {"mem_bw_gbs": 1}, "a": {"mem_bw_gbs": 2000}}
    got = {(r["sku"], r["written_bytes"]): r
           for r in bench.by_bytes_written(pl.DataFrame(rows), gpus, 2).to_dicts()}
    assert {k: r["shapes"] for k, r in got.items()} == {("a", 512): 1, ("a", 8 * 2**20): 3,
                                                         ("b", 512): 1}
    assert got[("a", 8 * 2**20)]["median_us"] == pytest.approx(20.0)
    assert got[("a", 8 * 2**20)]["over_launch_and_write"] == pytest.approx(
        20.0 / (2.0 + 2 * 8 * 2**20 / 2e6))
    assert got[("a", 512)]["over_launch_and_write"] == pytest.approx(2.0 / (2.0 + 1024 / 2e6))
    assert got[("b", 512)]["over_launch_and_write"] == pytest.approx(1.0 / (1.0 + 1024 / 4e6))


def test_the_difference_is_the_pinned_tables_own(bench, store_home):
    """H100, 4 KiB written a call (batch x KV heads x 128 x 4 = 4,096, e.g. 8 requests of one
    KV head): the median over every shared shape of 0.14.0's decode latency minus 0.19.0's,
    recomputed from the two pinned parquet files."""
    root = SHARED / AIC_ROOT / "h100_sxm" / "attention" / "vllm"

    def read(version: str) -> pl.DataFrame:
        frame = pl.read_parquet(root / version / "generation_attention_perf.parquet")
        if "window_size" in frame.columns:
            frame = frame.filter(pl.col("window_size") == 0)
        return frame.filter(pl.col("kv_cache_dtype") == "bfloat16").group_by(
            "batch_size", "step", "num_heads", "num_key_value_heads", "head_dim").agg(
            pl.col("latency").median())

    shape = ["batch_size", "step", "num_heads", "num_key_value_heads", "head_dim"]
    paired = read("0.14.0").join(read("0.19.0"), on=shape, suffix="_after").filter(
        pl.col("batch_size") * pl.col("num_key_value_heads") * pl.col("head_dim") * 4 == 4096)
    expected = ((paired["latency"] - paired["latency_after"]) * 1e3).median()
    got = bench.table_difference().filter(sku="h100_sxm", written_bytes=4096).row(0, named=True)
    assert got["shapes"] == len(paired) > 100
    assert got["median_us"] == pytest.approx(expected)


ROW = {"dataset": "h100_silicon_fp8", "backend": "all", "n": 45, "version": "0.19.0",
       "sku": "h100_sxm", "headline_ttft_mape": 108.0, "write_ttft_mape": 108.4,
       "headline_tpot_mape": 6.1, "write_tpot_mape": 5.6, "headline_tpot_signed_median": -5.8,
       "write_tpot_signed_median": -5.0, "tpot_added_ms": 0.15}
BENCH = {"before": "0.14.0", "after": "0.19.0", "rows": [ROW, {**ROW, "backend": "vllm"}],
         "difference": [{"sku": "h100_sxm", "written_bytes": 4096, "shapes": 570,
                         "median_us": 1.89, "q25_us": 1.46, "q75_us": 3.92, "positive": 99.5,
                         "over_launch_and_write": 1.09}],
         "listed": [{"dataset": "h100_silicon", "why": "its oracle reads vLLM 0.14.0's tables, "
                     "at or before 0.14.0"}],
         "code_version": "abc", "date": "2026-12-05", "seconds": 60.0}


def test_the_report_shows_the_tables_and_each_replayed_sets_clause(tmp_path):
    path = tmp_path / "write.json"
    assert "No KV-cache-write benchmark" in kv_write(path)[0]
    assert kv_write_measured("h100_silicon_fp8", path) is None
    path.write_text(json.dumps(BENCH))
    text = "\n".join(kv_write(path))
    assert "| h100_sxm | 4 KiB | 570 | 1.9 | 1.5 / 3.9 | 99.5 | 1.1 |" in text
    assert ("| h100_silicon_fp8 | all | 45 | 0.19.0 | 108.0 / 108.4 | 6.1 / 5.6 | -5.8 / -5.0 "
            "| 0.15 |") in text
    assert text.index("| all |") < text.index("| vllm |")
    assert ("Not replayed: `h100_silicon` (its oracle reads vLLM 0.14.0's tables, at or before "
            "0.14.0).") in text
    clause = kv_write_measured("h100_silicon_fp8", path)
    assert "vLLM 0.19.0 attention tables omit" in clause
    assert "108.4 % TTFT and 5.6 % TPOT against 108.0 % and 6.1 %" in clause
    assert "-5.0 % against -5.8 %" in clause
    assert kv_write_measured("h100_silicon", path) is None
    none = tmp_path / "none"
    said = unknowns_measured("h100_silicon_fp8", None, none, none, none, path)
    assert said.startswith(" Measured: ") and clause in said
