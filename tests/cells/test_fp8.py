"""FP8 steps: the ``_vidur_fp8`` cells recomputed from the raw upstream parquet rows, their
lineage's precisions, ours' FP8 GEMM by hand, and NotSupported for a bf16-only predictor."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from conftest import requires_shared
from op_points import GEMM_POINT
from test_cells_vidur import AIC, _cells, _heads, _one, _raw, check_random_cells

from leaderboard.cells import families
from leaderboard.cells.schema import CELL_SCHEMA, derive
from leaderboard.run.evaluate import RunSpec, run
from leaderboard_core.contract import Home, NotSupported
from leaderboard_core.specs import load_gpu_specs
from predictors.ours import Ours, config, ops
from predictors.ours.ops import Switches

# The GPUs whose FP8 table passes the build's check from vLLM 0.19.0 (fp8_check): H100 and
# H200 at 0.19.0, GB200 at 0.24.0; B200's and L40S's fail at every version from there.
FP8_SETS = ["h100_vidur_fp8", "h200_vidur_fp8", "gb200_vidur_fp8"]


def test_the_two_word_suffix_is_the_family():
    assert families.suffix_of("h200_vidur_fp8") == "vidur_fp8"
    assert families.suffix_of("h200_vidur") == "vidur"
    assert families.of("gb200_vidur_fp8").home == "h100_vidur_fp8"


@requires_shared
def test_hand_computed_fp8_mixed_cell(real_store):
    """A Qwen3-8B TP4 mixed cell on H100: FP8 GEMM rows, bf16 attention and all-reduce rows,
    read from the upstream parquet files by hand."""
    cell = _cells(real_store, "h100_vidur_fp8").filter(
        model="qwen3-8b", tp=4, phase="mixed").sort("cell_id").row(0, named=True)
    gemm, attn, ar = _raw("h100_sxm", "0.19.0", "fp8")
    t, n_dec, n_pre = cell["total_tokens"], cell["num_decode"], cell["num_prefill"]
    ctx, length = max(cell["ctx_lens"]), (t - n_dec) // n_pre
    per_layer = (_one(gemm, m=t, n=1536, k=4096) + _one(gemm, m=t, n=4096, k=1024)
                 + _one(gemm, m=t, n=6144, k=4096) + _one(gemm, m=t, n=4096, k=3072)
                 + _one(_heads(attn["generation"], 8, 2), batch_size=n_dec, step=ctx)
                 + _one(_heads(attn["context"], 8, 2), batch_size=n_pre, isl=length, step=0)
                 + 2 * _one(ar, num_gpus=4, message_size=t * 4096))
    assert cell["gt_ms"] == pytest.approx(36 * per_layer, rel=1e-9)
    assert cell["gemm_dtype"] == "fp8"
    bf16 = _cells(real_store, "h100_vidur").filter(cell_id=cell["cell_id"])
    assert bf16.is_empty() or bf16["gt_ms"][0] != pytest.approx(cell["gt_ms"])


@requires_shared
def test_random_fp8_cells_recomputed_from_raw_parquet(real_store):
    for name in FP8_SETS:
        assert len(_cells(real_store, name)) >= 1000, name
    check_random_cells(real_store, FP8_SETS, seed=11, gemm_dtype="fp8")


@requires_shared
def test_fp8_lineage_holds_fp8_gemms_and_bf16_attention_only(real_store):
    for name in FP8_SETS:
        rows = real_store.sql(f"SELECT op, table_name, key FROM cell_lineage WHERE dataset = '{name}'")
        seen = set()
        for op, table, key in rows:
            k = json.loads(key)
            if table == "gemm":
                assert k["dtype"] == "fp8", (name, op, k)
            else:
                assert k["dtype"] == "bfloat16", (name, op, k)
                assert table != "attention" or k["kv_dtype"] == "bfloat16", (name, op, k)
            seen.add(table)
        assert seen >= {"gemm", "attention"}, name
    dtypes = dict(real_store.sql("SELECT dataset LIKE '%_fp8', string_agg(DISTINCT gemm_dtype) "
                                 "FROM cells GROUP BY ALL"))
    assert dtypes == {True: "fp8", False: "bf16"}


def test_ours_fp8_gemm_by_hand():
    """Every factor off: max(FLOP / peak, bytes / bandwidth) on H100's datasheet."""
    h100 = load_gpu_specs()["h100_sxm"]
    dev, c = config.Device.of(h100, config.load_constants()), config.load_constants()
    off = Switches(**dict.fromkeys(Switches.__dataclass_fields__, False))
    m, n, k = np.array([4096.0, 1.0]), np.array([4096.0, 4096.0]), np.array([4096.0, 4096.0])
    fp8 = ops.gemm(m, n, k, dev, c, off, np.array([True, True]))["seconds"]
    bf16 = ops.gemm(m, n, k, dev, c, off)["seconds"]
    # 2*4096^3 FLOP at 1978.9 TF/s; one token: (4096 + 4096^2) bytes in, 2*4096 out at 3.35 TB/s
    assert fp8 == pytest.approx([2 * 4096**3 / 1978.9e12, (4096 + 4096**2 + 2 * 4096) / 3.35e12])
    assert bf16 == pytest.approx([2 * 4096**3 / 989.4e12, 2 * (4096 + 4096**2 + 4096) / 3.35e12])


def test_ours_fp8_switch_slows_the_tensor_cores_and_adds_the_quantization_floor():
    """With only ``fp8`` (and ``floors``) on: an FP8 GEMM's compute is FLOP / (peak x
    fp8.gemm_eta), its floor the GEMM floor plus fp8.quant_floor_s, both scaled by the clock
    ratio; a BF16 GEMM is untouched by the switch."""
    h100 = load_gpu_specs()["h100_sxm"]
    c = config.load_constants()
    dev = config.Device.of(h100, c)
    only = dict.fromkeys(Switches.__dataclass_fields__, False)
    m, n, k = np.array([8192.0]), np.array([8192.0]), np.array([8192.0])
    on = ops.gemm(m, n, k, dev, c, Switches(**{**only, "fp8": True, "floors": True}), True)
    assert on["compute_s"][0] == pytest.approx(2 * 8192**3 / (1978.9e12 * c["fp8"]["gemm_eta"]))
    scale = c["clock"]["home_boost_mhz"] / 1980  # the floors' clock ratio, home over H100 boost
    assert on["floor_s"][0] == pytest.approx((c["gemm"]["floor_s"] + c["fp8"]["quant_floor_s"])
                                             * scale)
    bf16_on = ops.gemm(m, n, k, dev, c, Switches(**{**only, "fp8": True, "floors": True}))
    bf16_off = ops.gemm(m, n, k, dev, c, Switches(**{**only, "floors": True}))
    assert bf16_on["seconds"][0] == bf16_off["seconds"][0]
    assert 0.3 < c["fp8"]["gemm_eta"] < 1.2 and 0 <= c["fp8"]["quant_floor_s"] < 2e-5



def _fp8_cell() -> pl.DataFrame:
    return derive(pl.DataFrame({"cell_id": ["c"], "model": ["qwen3-8b"], "tp": [1],
                                "q_lens": [[1] * 8], "ctx_lens": [[512] * 8],
                                "gt_kind": ["gpu_block"], "gemm_dtype": ["fp8"]}))


def test_ours_refuses_fp8_on_a_gpu_without_an_fp8_peak():
    gpus = load_gpu_specs()
    assert "fp8_dense_tflops" not in gpus["a100_sxm"].data
    model = Ours().fit(Home("a100_sxm", gpus["a100_sxm"], "x", pl.DataFrame(schema=CELL_SCHEMA)))
    with pytest.raises(NotSupported, match="a100_sxm has no fp8_dense_tflops"):
        model.predict(_fp8_cell(), gpus["a100_sxm"])
    on_h200 = model.predict(_fp8_cell(), gpus["h200_sxm"])
    bf16 = model.predict(_fp8_cell().with_columns(gemm_dtype=pl.lit("bf16")), gpus["h200_sxm"])
    assert 0 < on_h200[0] < bf16[0]  # decode GEMMs stream half the weight bytes


def test_ours_never_scores_the_gpu_its_fp8_constants_came_from_as_unseen():
    """The FP8 constants are fitted on the H100: FP8 cells on an H100 that is not the run's home
    are refused (BF16 cells there, or the switch off, are not), and a several-GPU home holding
    FP8 GEMM points is refused rather than refitted as BF16."""
    gpus = load_gpu_specs()
    cell = _fp8_cell()
    model = Ours().fit(Home("a100_sxm", gpus["a100_sxm"], "x", pl.DataFrame(schema=CELL_SCHEMA)))
    with pytest.raises(NotSupported, match="fitted on h100_sxm"):
        model.predict(cell, gpus["h100_sxm"])
    assert model.predict(cell.with_columns(gemm_dtype=pl.lit("bf16")), gpus["h100_sxm"])[0] > 0
    off = Ours(fp8=False).fit(Home("a100_sxm", gpus["a100_sxm"], "x",
                                   pl.DataFrame(schema=CELL_SCHEMA)))
    assert off.predict(cell, gpus["h100_sxm"])[0] > 0
    as_home = Ours().fit(Home("h100_sxm", gpus["h100_sxm"], "x", pl.DataFrame(schema=CELL_SCHEMA)))
    assert as_home.predict(cell, gpus["h100_sxm"])[0] > 0
    gemm = pl.DataFrame({"m": [1], "n": [4096], "k": [4096], "dtype": ["fp8"], "latency_ms": [0.01],
                         "sku": ["h100_sxm"]})
    two = Home("h100_sxm", gpus["h100_sxm"], "x+y", pl.DataFrame(schema=CELL_SCHEMA),
               ops={op: gemm for op in ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down",
                                        "attn_prefill", "attn_decode", "allreduce")},
               gpus={"h100_sxm": gpus["h100_sxm"], "h200_sxm": gpus["h200_sxm"]})
    with pytest.raises(NotSupported, match="holds FP8 GEMM points"):
        Ours().fit(two)


def test_ours_never_scores_the_gpu_its_home_constants_came_from_as_unseen():
    """The frozen BF16 constants are fitted on the A100: with another GPU as the run's home, an
    A100 target is refused on steps and on op points alike (refitted on another GPU's points,
    it is scored: tests/predictors/test_ours_calibrate.py)."""
    gpus = load_gpu_specs()
    bf16 = _fp8_cell().with_columns(gemm_dtype=pl.lit("bf16"))
    on_h100 = Ours().fit(Home("h100_sxm", gpus["h100_sxm"], "x", pl.DataFrame(schema=CELL_SCHEMA)))
    with pytest.raises(NotSupported, match=r"home constants were fitted on a100_sxm \(a100_vidur\)"):
        on_h100.predict(bf16, gpus["a100_sxm"])
    with pytest.raises(NotSupported, match="fitted on a100_sxm"):
        on_h100.predict_ops(GEMM_POINT, gpus["a100_sxm"])
    assert on_h100.predict(bf16, gpus["h200_sxm"])[0] > 0
    at_home = Ours().fit(Home("a100_sxm", gpus["a100_sxm"], "x", pl.DataFrame(schema=CELL_SCHEMA)))
    assert at_home.predict(bf16, gpus["a100_sxm"])[0] > 0
    assert at_home.predict_ops(GEMM_POINT, gpus["a100_sxm"])[0] > 0


def test_ours_fp8_switch_off_prices_an_fp8_gemm_as_before():
    """With ``fp8`` off, an FP8 GEMM is the BF16 formula at the FP8 peak: the same as with it on
    at gemm_eta 1 and no quantization floor."""
    h100 = load_gpu_specs()["h100_sxm"]
    c = config.load_constants()
    neutral = {**c, "fp8": {**c["fp8"], "gemm_eta": 1.0, "quant_floor_s": 0.0}}
    dev = config.Device.of(h100, c)
    m = np.array([1.0, 64.0, 1024.0, 8192.0])
    n, k = np.full(4, 6144.0), np.full(4, 4096.0)
    off = ops.gemm(m, n, k, dev, c, Switches(fp8=False), True)["seconds"]
    np.testing.assert_array_equal(off, ops.gemm(m, n, k, dev, neutral, Switches(), True)["seconds"])
    assert (ops.gemm(m, n, k, dev, c, Switches(), True)["seconds"] > off).all()


@requires_shared
def test_a_bf16_only_predictor_is_not_supported_on_fp8(store_home, tmp_path):
    with pytest.raises(NotSupported, match=r"'llm_viewer' prices bf16 GEMMs only; dataset "
                                           r"h200_vidur_fp8 holds fp8"):
        run(RunSpec("llm_viewer", "h200_vidur_fp8", {}, runs_dir=tmp_path / "runs"))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@requires_shared
def test_the_fp8_check_recomputed_from_the_raw_parquet(real_store):
    """Each kept FP8 table's large-shape FP8/bf16 ratio, read from the upstream parquet by hand,
    lies within 20 % of the peak ratio; each quarantined one outside it, and none of its FP8 rows
    reached the gemm table or a cell."""
    gpus = load_gpu_specs()
    kept = {("h100_sxm", "0.19.0"), ("h200_sxm", "0.19.0"), ("gb200", "0.24.0")}
    failed = {("h100_sxm", "0.14.0"), ("h200_sxm", "0.14.0"), ("b200_sxm", "0.19.0"),
              ("gb200", "0.19.0"), ("l40s", "0.24.0")}
    for sku, version in kept | failed:
        table = pl.read_parquet(AIC / sku / f"gemm/vllm/{version}/gemm_perf.parquet")
        gemm = {dtype: table.filter(gemm_dtype=dtype) for dtype in ("bfloat16", "fp8")}
        large = [g.filter((pl.col("m") >= 8192) & (pl.col("n") >= 8192) & (pl.col("k") >= 8192))
                 .group_by("m", "n", "k").agg(pl.col("latency").median()) for g in gemm.values()]
        ratio = large[1].join(large[0], on=["m", "n", "k"]).select(
            (pl.col("latency") / pl.col("latency_right")).median()).item()
        peak = gpus[sku]["bf16_dense_tflops"] / gpus[sku]["fp8_dense_tflops"]
        assert (abs(ratio / peak - 1) <= 0.2) == ((sku, version) in kept), (sku, version, ratio)
        stored = real_store.sql(f"SELECT count(*) FROM gemm WHERE sku = '{sku}' AND dtype = 'fp8' "
                                f"AND backend_version = '{version}'")[0][0]
        assert (stored > 0) == ((sku, version) in kept), (sku, version, stored)
    quarantined = {tuple(r) for r in real_store.sql(
        "SELECT DISTINCT sku, json_extract_string(row, '$.backend_version') FROM quarantine "
        "WHERE reason = 'fp8_off_its_peak'")}
    assert failed <= quarantined and not kept & quarantined
    versions = dict(real_store.sql("SELECT dataset, string_agg(DISTINCT backend_version) FROM "
                                   "cells WHERE dataset LIKE '%_fp8' GROUP BY ALL"))
    assert versions == {"h100_vidur_fp8": "0.19.0", "h200_vidur_fp8": "0.19.0",
                        "gb200_vidur_fp8": "0.24.0"}


def test_the_fp8_check_on_a_table_by_hand():
    """A synthetic table: a half-time FP8 table passes, an equal-time one and one at 0.65 fail,
    small shapes are not looked at, and only failing FP8 rows leave the table."""
    from leaderboard.cells import fp8_check
    from leaderboard.ingest.quarantine import Quarantine

    gpus = load_gpu_specs()
    rows = []
    for version, fp8_time in (("1.0", 0.5), ("2.0", 1.0), ("3.0", 0.65)):
        for m in (8192, 16384):
            rows += [{"source": "aiconfigurator", "sku": "h100_sxm", "backend_version": version,
                      "file": "f", "dtype": dtype, "m": m, "n": 8192, "k": 8192,
                      "latency_ms": t} for dtype, t in (("bfloat16", 1.0), ("fp8", fp8_time))]
        rows.append({"source": "aiconfigurator", "sku": "h100_sxm", "backend_version": version,
                     "file": "f", "dtype": "fp8", "m": 16, "n": 8192, "k": 8192,
                     "latency_ms": 9.0})  # small and off: not checked
    gemm = pl.DataFrame(rows)
    checks = fp8_check.table_checks(gemm, gpus)
    assert dict(checks.select("backend_version", "passes").iter_rows()) == {
        "1.0": True, "2.0": False, "3.0": False}
    quarantine = Quarantine()
    left, recorded = fp8_check.quarantine_failing(gemm, gpus, quarantine)
    assert recorded.equals(checks)  # the store keeps the checks the build made, for the cards
    assert sorted(set(left.filter(pl.col("dtype") == "fp8")["backend_version"])) == ["1.0"]
    assert len(left.filter(pl.col("dtype") == "bfloat16")) == 6  # bf16 rows always stay
    assert len(quarantine.table()) == 6 and "median FP8/bf16 GEMM time 1.00" in quarantine.table()[
        "detail"].to_list()[0]
