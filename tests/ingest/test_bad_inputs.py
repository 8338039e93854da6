"""Small synthetic inputs for every bad input the build must handle, and for a new GPU folder.

Each test writes a tiny sources root (see ``tiny`` in conftest): the pin list and ../shared are
hidden, so only the files written here are ingested, as unpinned local sources.
"""

from __future__ import annotations

import json
import math
import shutil

import polars as pl
import pytest
import yaml

from leaderboard import data
from leaderboard.ingest import BuildError, sources
from leaderboard.ingest.aiconfigurator import ROOT as AIC_ROOT
from leaderboard.ingest.quarantine import DUPLICATE_TOLERANCE
from leaderboard.ingest.sources import SourceError
from leaderboard.store import database
from leaderboard_core import paths
from leaderboard_core.specs import SpecError

AIC = ["aiconfigurator"]


def _gemm_row(m: int, latency: float | None, n: int = 1024, k: int = 1024) -> dict:
    return {"m": m, "n": n, "k": k, "gemm_dtype": "bfloat16", "latency": latency}


def _quarantine(tiny, reason: str) -> list[dict]:
    rows = tiny.sql(f"SELECT row FROM quarantine WHERE reason = '{reason}'")
    return [json.loads(r) for (r,) in rows]


# ------------------------------------------------------------------------- invalid latencies


def test_nan_zero_negative_latencies_are_quarantined(tiny):
    tiny.gemm([_gemm_row(1, 1.0), _gemm_row(2, math.nan), _gemm_row(3, None),
               _gemm_row(4, math.inf), _gemm_row(5, 0.0), _gemm_row(6, -0.5), _gemm_row(7, 2.0)])
    report = tiny.build(AIC)
    assert report.quarantined == {("invalid", "nan_latency", "aiconfigurator"): 3,
                                  ("invalid", "nonpositive_latency", "aiconfigurator"): 2}
    assert report.rows["gemm"] == 2
    assert tiny.sql("SELECT m, latency_ms FROM gemm ORDER BY m") == [(1, 1.0), (7, 2.0)]
    assert sorted(r["m"] for r in _quarantine(tiny, "nan_latency")) == [2, 3, 4]
    assert sorted(r["m"] for r in _quarantine(tiny, "nonpositive_latency")) == [5, 6]
    counted = dict(tiny.sql("SELECT reason, count(*) FROM quarantine GROUP BY ALL"))
    assert counted == {"nan_latency": 3, "nonpositive_latency": 2}
    # every input row is either stored or quarantined: nothing silently dropped
    assert report.rows["gemm"] + sum(report.quarantined.values()) == 7


# -------------------------------------------------------------------------------- duplicates


def test_agreeing_duplicates_merge_to_their_median(tiny):
    tiny.gemm([_gemm_row(8, 1.0), _gemm_row(8, 1.2), _gemm_row(8, 1.1),  # within 1.25x
               _gemm_row(16, 1.0), _gemm_row(16, DUPLICATE_TOLERANCE),   # exactly at the bound
               _gemm_row(32, 3.0)])
    report = tiny.build(AIC)
    assert report.quarantined == {}
    assert report.merged_duplicates == {("gemm", "aiconfigurator", "h100_sxm"): 5}
    rows = tiny.sql("SELECT m, latency_ms, statistic FROM gemm ORDER BY m")
    assert rows == [(8, pytest.approx(1.1), "median_of_duplicates"),
                    (16, pytest.approx((1.0 + DUPLICATE_TOLERANCE) / 2), "median_of_duplicates"),
                    (32, 3.0, "median")]


def test_conflicting_duplicates_are_all_quarantined(tiny):
    tiny.gemm([_gemm_row(8, 1.0), _gemm_row(8, 1.3), _gemm_row(8, 1.1),  # 1.3x apart
               _gemm_row(64, 2.0)])
    report = tiny.build(AIC)
    assert report.quarantined == {("conflict", "duplicate_conflict", "aiconfigurator"): 3}
    assert tiny.sql("SELECT m FROM gemm") == [(64,)]
    quarantined = _quarantine(tiny, "duplicate_conflict")
    assert sorted(r["latency_ms"] for r in quarantined) == [1.0, 1.1, 1.3]
    (detail,) = {d for (d,) in tiny.sql("SELECT DISTINCT detail FROM quarantine")}
    assert "3 copies" in detail and "1.3" in detail


def test_mha_zero_kv_heads_normalized_and_merged(tiny):
    def mha(heads: int, kv: int, latency: float, batch: int = 4) -> dict:
        return {"batch_size": batch, "isl": 1024, "num_heads": heads, "num_key_value_heads": kv,
                "latency": latency}

    tiny.context_attention([
        mha(8, 0, 1.00), mha(8, 8, 1.10),            # twins that agree: one row, median
        mha(16, 0, 1.00), mha(16, 16, 2.20),         # twins 2.2x apart: both quarantined
        mha(32, 8, 0.50),                            # GQA: untouched
    ])
    report = tiny.build(AIC)
    rows = tiny.sql("SELECT num_heads, num_kv_heads, latency_ms, statistic FROM attention "
                    "ORDER BY num_heads")
    assert rows == [(8, 8, pytest.approx(1.05), "median_of_duplicates"), (32, 8, 0.5, "median")]
    assert report.merged_duplicates == {("attention", "aiconfigurator", "h100_sxm"): 2}
    assert report.quarantined == {("conflict", "duplicate_conflict", "aiconfigurator"): 2}
    conflict = _quarantine(tiny, "duplicate_conflict")
    assert {(r["num_heads"], r["num_kv_heads"]) for r in conflict} == {(16, 16)}
    assert sorted(r["latency_ms"] for r in conflict) == [1.0, 2.2]
    assert tiny.sql("SELECT count(*) FROM attention WHERE num_kv_heads = 0") == [(0,)]


# --------------------------------------------------------------------------- faster than DRAM


def test_gemm_faster_than_dram_is_kept_and_flagged(tiny):
    # 8192^3 bf16 moves 6 * 8192^2 bytes: 0.120 ms at the H100's 3,350 GB/s.
    n = 8192
    floor_ms = 6 * n * n / 3350e9 * 1e3
    tiny.gemm([_gemm_row(n, floor_ms * 0.5, n, n), _gemm_row(n // 2, 5.0, n, n),
               _gemm_row(n // 4, 100.0, n, n)])
    report = tiny.build(AIC)
    assert report.quarantined == {}
    rows = tiny.sql("SELECT m, latency_ms, flags FROM gemm ORDER BY m")
    assert rows == [(n // 4, 100.0, None), (n // 2, 5.0, None),
                    (n, pytest.approx(floor_ms * 0.5), "faster_than_dram")]


def test_a_four_bit_moe_weight_counts_half_a_byte_in_the_dram_floor(tiny):
    """One token routed to 8 of 128 experts (hidden 3,072, expert width 1,536) reads 8 x 3 x
    3,072 x 1,536 weights: at half a byte 16.9 µs at the H100's 3,350 GB/s, at two bytes
    67.6 µs. Timed at 30 µs, the bf16 layer is faster than DRAM; the MXFP4-weight layers,
    with 8-bit or 16-bit activations, are not (a default of two bytes flagged the first)."""
    weights = 8 * 3 * 3072 * 1536
    tokens = 2.0 * 2 * 3072  # the activations in and out, bf16
    floor_ms = {b: (b * weights + tokens) / 3350e9 * 1e3 for b in (0.5, 2.0)}
    assert floor_ms[0.5] < 0.030 < floor_ms[2.0]
    rows = [{"moe_dtype": dtype, "kernel_source": "vllm", "num_tokens": 1, "hidden_size": 3072,
             "inter_size": 1536, "topk": 8, "num_experts": 128, "moe_tp_size": 1,
             "moe_ep_size": 1, "distribution": "balanced", "latency": 0.030}
            for dtype in ("bfloat16", "w4a8_mxfp4_mxfp8", "w4a16_mxfp4")]
    tiny.aic("h100_sxm", "moe", "moe_perf.parquet", pl.DataFrame(rows))
    tiny.build(AIC)
    assert tiny.sql("SELECT dtype, flags FROM moe ORDER BY dtype") == [
        ("bfloat16", "faster_than_dram"), ("w4a16_mxfp4", None), ("w4a8_mxfp4_mxfp8", None)]


def test_a_dtype_of_no_known_size_stops_the_build_and_names_itself(tiny):
    """A guessed size would misplace the DRAM floor of every point of that dtype: an unknown
    GEMM dtype, and a KV cache dtype left empty, each stop the build."""
    tiny.gemm([_gemm_row(8, 1.0), {**_gemm_row(16, 2.0), "gemm_dtype": "fp6_e3m2"}])
    with pytest.raises(BuildError, match=r"gemm_perf.parquet: gemm_dtype 'fp6_e3m2' has no size "
                       r"in bytes; add it to the dtype sizes in leaderboard.ingest.aiconfigurator"):
        tiny.build(AIC)
    tiny.gemm([_gemm_row(8, 1.0)])
    tiny.context_attention([{"batch_size": 1, "isl": 64, "num_heads": 8, "num_key_value_heads": 8,
                             "latency": 0.1, "kv_cache_dtype": kv} for kv in ("bfloat16", None)])
    with pytest.raises(BuildError, match=r"context_attention_perf.parquet: kv_cache_dtype None "
                       r"has no size in bytes"):
        tiny.build(AIC)


# ----------------------------------------------------------------- splitwise synthetic rows


SPLITWISE_HEADER = ("model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,"
                    "prompt_time,token_time,e2e_time,tensor_parallel")


def test_splitwise_synthetic_rows_excluded_with_reason(tiny, capsys):
    lines = [SPLITWISE_HEADER]
    for hardware, scale, repeats in (("a100-80gb", 1.5, 2), ("h100-80gb", 1.0, 3),
                                     ("h100-80gb-pcap", 1.3, 4)):
        for r in range(repeats):
            lines.append(f"llama2-70b,{hardware},512,1,128,1.0,0.7,{100 * scale + r},50.0,"
                         f"7000.0,2")
    tiny.write("Mutinifni__splitwise-sim/data/perf_model.csv", "\n".join(lines) + "\n")

    # The first command that needs the store builds it (all sources: only this file exists).
    assert not paths.store_path().exists()
    assert data.main(["list", "--json", "--all"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    # the op tables, and the wall-clock cell datasets built from them
    assert set(listed) == {"splitwise.a100_sxm", "splitwise.h100_sxm", "a100_splitwise",
                           "h100_splitwise"}
    assert listed["splitwise.h100_sxm"]["rows"] == 3 and listed["splitwise.a100_sxm"]["rows"] == 2
    assert listed["a100_splitwise"]["kind"] == "cells"
    assert all(listed[n]["pinned"] is False for n in ("splitwise.a100_sxm", "splitwise.h100_sxm"))

    rows = tiny.sql("SELECT kind, reason, sku, table_name, detail FROM quarantine")
    assert len(rows) == 4
    assert {r[:4] for r in rows} == {("known_bad", "synthetic_rows", "h100-80gb-pcap",
                                      "step_wallclock")}
    assert "synthetic" in rows[0][4]
    assert tiny.sql("SELECT DISTINCT sku FROM step_wallclock ORDER BY 1") == [
        ("a100_sxm",), ("h100_sxm",)]
    assert tiny.sql("SELECT sku, list(repeat ORDER BY repeat) FROM step_wallclock GROUP BY 1 "
                    "ORDER BY 1") == [("a100_sxm", [0, 1]), ("h100_sxm", [0, 1, 2])]


# ------------------------------------------------------------------------------ corrupt files


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _drop_latency(path):
    pl.read_parquet(path).drop("latency").write_parquet(path)


def _pin_with_wrong_sha(path, tiny, monkeypatch):
    rel = path.relative_to(tiny.root).as_posix()
    repo, file_path = rel.split("/", 1)
    pin = sources.Pin(repo.replace("__", "/"), "c" * 40, file_path, "0" * 64,
                      path.stat().st_size, "Apache-2.0")
    assert pin.rel == rel
    monkeypatch.setattr(sources, "load_pins", lambda *args, **kwargs: [pin])


CORRUPTIONS = {
    "truncated_parquet": (_truncate, BuildError, "cannot read .parquet file"),
    "missing_column": (_drop_latency, BuildError, "missing column(s) latency"),
    "sha_mismatch": (None, SourceError, "sha256 mismatch for pinned file"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_file_fails_build_and_keeps_old_store(tiny, monkeypatch, case):
    path = tiny.gemm([_gemm_row(8, 1.0), _gemm_row(16, 2.0)])
    tiny.build(AIC)
    old_bytes = paths.store_path().read_bytes()
    old_meta = database.read_meta(paths.store_path())

    corrupt, error, problem = CORRUPTIONS[case]
    if corrupt is None:
        _pin_with_wrong_sha(path, tiny, monkeypatch)
    else:
        corrupt(path)
    with pytest.raises(error) as err:
        tiny.build(AIC)
    message = str(err.value)
    assert str(path) in message and problem in message

    assert paths.store_path().read_bytes() == old_bytes
    assert database.read_meta(paths.store_path()) == old_meta
    assert tiny.sql("SELECT m, latency_ms FROM gemm ORDER BY m") == [(8, 1.0), (16, 2.0)]
    leftovers = [p.name for p in paths.store_path().parent.iterdir()
                 if p.name not in {"leaderboard.duckdb", ".build.lock"}]
    assert leftovers == []


def test_corrupt_file_cli_error(tiny, capsys):
    path = tiny.gemm([_gemm_row(8, 1.0)])
    _truncate(path)
    assert data.main(["build"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.lstrip().startswith("error: ") and err.count("error:") == 1 and "Traceback" not in err
    assert str(path) in err and "cannot read .parquet file" in err
    assert not paths.store_path().exists()


def test_misspelled_sources_folder_is_named(tiny, monkeypatch, capsys):
    monkeypatch.setenv("LEADERBOARD_SOURCES", str(tiny.root) + "-typo")
    assert data.main(["build"]) == 2
    err = capsys.readouterr().err
    assert f"LEADERBOARD_SOURCES={tiny.root}-typo: no such folder" in err and "Traceback" not in err


# ------------------------------------------------------------------------------- a new GPU


NEW_GEMM = f"{AIC_ROOT}/newgpu/gemm/vllm/0.14.0/gemm_perf.parquet"


def _new_spec_dir(tmp_path):
    spec = yaml.safe_load((paths.CONF_DIR / "gpu" / "h100_sxm.yaml").read_text())
    spec |= {"sku": "newgpu", "short_name": "newgpu"}
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "newgpu.yaml").write_text(yaml.safe_dump(spec))
    return specs


def test_new_sku_folder_ingested_from_spec_alone(tiny, tmp_path, monkeypatch, capsys):
    path = tiny.root / NEW_GEMM
    tiny.gemm([_gemm_row(8, 1.0), _gemm_row(16, 2.0), _gemm_row(32, 3.0)], sku="newgpu")
    assert path.is_file()
    monkeypatch.setenv("LEADERBOARD_GPU_SPECS", str(_new_spec_dir(tmp_path)))

    assert data.main(["build"]) == 0
    capsys.readouterr()
    assert data.main(["list", "--json", "--all"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["name"] == "aiconfigurator.newgpu" and entry["sku"] == "newgpu"
    assert entry["kind"] == "ops" and entry["rows"] == 3 and entry["pinned"] is False
    assert entry["files"] == [NEW_GEMM]

    sha = sources.sha256_of(path)
    assert tiny.sql("SELECT rel, sha256, pinned, commit FROM sources") == [
        (NEW_GEMM, sha, False, None)]
    assert tiny.sql("SELECT DISTINCT sku, file, file_sha256, pinned, backend_version FROM gemm") == [
        ("newgpu", NEW_GEMM, sha, False, "0.14.0")]


def test_new_sku_without_spec_names_the_file_to_add(tiny, capsys):
    tiny.gemm([_gemm_row(8, 1.0)], sku="newgpu")
    with pytest.raises(SpecError) as err:
        tiny.build(AIC)
    assert "newgpu.yaml" in str(err.value) and NEW_GEMM in str(err.value)
    assert not paths.store_path().exists()

    assert data.main(["build"]) == 2
    _, stderr = capsys.readouterr()
    assert "newgpu.yaml" in stderr and "LEADERBOARD_GPU_SPECS" in stderr


def test_spec_via_config_key(tiny, tmp_path):
    tiny.gemm([_gemm_row(8, 1.0)], sku="newgpu")
    specs = _new_spec_dir(tmp_path)
    report = database.build(gpu_specs=str(specs), only=AIC, quiet=True)
    assert report.rows["gemm"] == 1
    shutil.rmtree(specs)
    with pytest.raises(SpecError, match="newgpu.yaml"):
        database.build(only=AIC, quiet=True)


def test_other_frameworks_in_a_new_sku_folder_are_skipped_and_listed(tiny, tmp_path, monkeypatch,
                                                                     capsys):
    tiny.gemm([_gemm_row(8, 1.0), _gemm_row(16, 2.0)], sku="newgpu")
    folder = tiny.root / AIC_ROOT / "newgpu"
    # trtllm's custom all-reduce has no `backend` column: reading it would stop the build
    trt = folder / "comm/trtllm/1.0.0/custom_allreduce_perf.parquet"
    sgl = folder / "gemm/sglang/0.5.0/gemm_perf.parquet"
    for path, df in ((trt, pl.DataFrame({"num_gpus": [2], "message_size": [1024],
                                         "allreduce_dtype": ["bfloat16"], "latency": [0.01]})),
                     (sgl, pl.DataFrame({"m": [8], "latency": [1.0]}))):
        path.parent.mkdir(parents=True)
        df.write_parquet(path)
    monkeypatch.setenv("LEADERBOARD_GPU_SPECS", str(_new_spec_dir(tmp_path)))

    assert data.main(["build"]) == 0
    assert data.main(["list", "--json", "--all"]) == 0
    out, err = capsys.readouterr()
    (entry,) = json.loads(out)
    assert entry["rows"] == 2 and entry["files"] == [NEW_GEMM]
    skipped = sorted(str(p.relative_to(tiny.root)) for p in (trt, sgl))
    assert [rel for rel, _ in tiny.sql("SELECT rel, reason FROM skipped_files ORDER BY rel")] == skipped
    assert all(f"skipped {rel}" in err.replace("\n", "") for rel in skipped)
