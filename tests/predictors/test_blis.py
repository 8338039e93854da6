"""BLIS's blackbox step line: the fit recovers a known line, worked by hand; off-home is
NotSupported with BLIS's own reason."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_distserve import cells

from leaderboard_core.contract import Home, NotSupported
from leaderboard_core.specs import load_gpu_specs
from predictors.blis_blackbox import BlisBlackbox

SPECS = load_gpu_specs()
BETA = (2.0, 0.01, 0.05)  # ms, ms per prefill token, ms per decode token


def _by_hand(batches) -> np.ndarray:
    out = []
    for q, ctx in batches:
        prefill = sum(n for n, c in zip(q, ctx, strict=True) if not (n == 1 and c > 0))
        decode = sum(1 for n, c in zip(q, ctx, strict=True) if n == 1 and c > 0)
        out.append(BETA[0] + BETA[1] * prefill + BETA[2] * decode)
    return np.array(out)


BATCHES = ([([n], [0]) for n in (16, 128, 512, 2048)]
           + [([1] * b, [300] * b) for b in (1, 8, 32, 128)]
           + [([256, 1, 1], [0, 40, 90]), ([64, 64, 1], [0, 0, 500])])


def _home(composed_gt: float | None = None) -> Home:
    frame = cells(BATCHES)
    gt = _by_hand(BATCHES)
    composed = [False] * len(BATCHES)
    if composed_gt is not None:  # a composed cell far off the line must change nothing
        frame, gt = pl.concat([frame, cells([([512, 1], [0, 60])])]), np.append(gt, composed_gt)
        composed.append(True)
    return Home(sku="a100_sxm", gpu=SPECS["a100_sxm"], dataset="synthetic",
                cells=frame.with_columns(gt_ms=pl.Series(gt), composed=pl.Series(composed)))


def test_the_fit_recovers_the_line_and_prices_a_new_iteration_by_hand():
    model = BlisBlackbox().fit(_home(composed_gt=1e4))
    np.testing.assert_allclose(model.betas_[("a100_sxm", "llama-3-8b", 1)], BETA, rtol=1e-6)
    new = [([1000, 1, 1, 1], [0, 10, 20, 30])]  # 2 + 0.01 * 1000 + 0.05 * 3 = 12.15 ms
    assert model.predict(cells(new), SPECS["a100_sxm"]) == pytest.approx([12.15])
    assert model.profiled_rows_ == len(BATCHES)


def test_another_gpu_or_an_unfitted_model_is_not_supported():
    model = BlisBlackbox().fit(_home())
    with pytest.raises(NotSupported, match="trained per .model, GPU, TP, vLLM version. on a100_sxm"):
        model.predict(cells(BATCHES[:1]), SPECS["h200_sxm"])
    with pytest.raises(NotSupported, match="no coefficients for llama-3-8b TP2"):
        model.predict(cells(BATCHES[:1], tp=2), SPECS["a100_sxm"])


def _roofline_home(mfu: float = 0.4) -> Home:
    """Home op points whose measured times are their FLOP at ``mfu`` of the A100's bf16 peak."""
    peak = SPECS["a100_sxm"]["bf16_dense_tflops"] * 1e12
    gemm = pl.DataFrame({"m": [16, 256, 4096, 16384], "n": [4096, 6144, 14336, 4096],
                         "k": [4096, 4096, 4096, 14336], "dtype": "bfloat16"})
    heads = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128}
    prefill = pl.DataFrame({"batch": [1, 1, 4], "q_len": [128, 2048, 8192], "kv_len": 0, **heads})
    decode = pl.DataFrame({"batch": [1, 64, 256], "kv_len": [512, 2048, 8192], "q_len": 1,
                           **heads})
    flops = {"gemm": 2 * gemm["m"] * gemm["n"] * gemm["k"],
             "attn_prefill": 4 * prefill["batch"] * prefill["q_len"] * prefill["q_len"] / 2 * 32 * 128,
             "attn_decode": 4 * decode["batch"] * decode["kv_len"] * 32 * 128}
    ops = {name: frame.with_columns(latency_ms=flops[name] / (peak * mfu) * 1e3)
           for name, frame in (("gemm", gemm), ("attn_prefill", prefill), ("attn_decode", decode))}
    return Home(sku="a100_sxm", gpu=SPECS["a100_sxm"], dataset="synthetic", ops=ops,
                cells=cells(BATCHES).with_columns(gt_ms=pl.lit(1.0)))


def test_roofline_mfu_tables_are_rebuilt_from_the_home_points():
    from predictors.blis_roofline import BlisRoofline

    model = BlisRoofline().fit(_roofline_home(mfu=0.4))
    for family in ("gemm", "attn_prefill", "attn_decode"):
        np.testing.assert_allclose(model.tables_[family]["mfu"], 0.4, rtol=1e-9)


def _step_cells(batches) -> pl.DataFrame:
    """Cells with the columns the store derives (leaderboard/cells/schema.py)."""
    frame = cells(batches)
    return frame.with_columns(num_prefill=pl.col("num_requests") - pl.col("num_decode"),
                              prefill_tokens=pl.col("total_tokens") - pl.col("num_decode"))


def test_roofline_a_compute_bound_prefill_scales_with_the_peak_and_mixed_takes_the_max():
    from predictors.blis_roofline import BlisRoofline

    model = BlisRoofline().fit(_roofline_home())
    a100, h200 = SPECS["a100_sxm"], SPECS["h200_sxm"]
    big = _step_cells([([8192], [0])])  # every kernel compute-bound on both GPUs at this size
    ratio = model.predict(big, h200)[0] / model.predict(big, a100)[0]
    assert ratio == pytest.approx(a100["bf16_dense_tflops"] / h200["bf16_dense_tflops"], rel=1e-9)
    prefill, decode = _step_cells([([512], [0])]), _step_cells([([1] * 8, [700] * 8)])
    mixed = _step_cells([([512] + [1] * 8, [0] + [700] * 8)])
    assert model.predict(mixed, h200)[0] == pytest.approx(
        max(model.predict(prefill, h200)[0], model.predict(decode, h200)[0]))
