"""``ours``'s home calibration (predictors/ours/calibrate.py) recovers constants it did not see,
from synthetic op points generated at known values."""

from __future__ import annotations

import copy

import numpy as np
import polars as pl
import pytest

from leaderboard_core.contract import Home
from leaderboard_core.specs import load_gpu_specs
from predictors.ours import calibrate, config, factors, ops

A100 = load_gpu_specs()["a100_sxm"]
TRUE_COLLECTIVES = {"custom_floor_s": 6e-6, "custom_eta": 0.7, "nccl_step_s": 5e-6,
                    "nccl_eta": 0.55}


def _allreduce_home(truth: dict) -> tuple[Home, pl.DataFrame]:
    """All-reduces on the A100 switch at TP2/4/8 from 4 KiB to 64 MiB, and TP3 (no custom
    kernel, NCCL at every size) from 4 KiB to 1 MiB, each timed as NCCL Simple where NCCL runs:
    what the home measures. At TP3 below a few hundred KiB the priced LL protocol is faster than
    this Simple truth, so a fit that let LL stand in could not reach it."""
    sizes = 2.0 ** np.arange(12, 27, 2)
    tp = np.concatenate([np.full(len(sizes), p) for p in (2.0, 4.0, 8.0)] + [np.full(5, 3.0)])
    size = np.concatenate([sizes, sizes, sizes, sizes[:5]])
    simple = {**truth, "collectives": {**truth["collectives"], **factors.NCCL_SIMPLE_ONLY}}
    seconds = ops.allreduce(size, tp, config.Device.of(A100, truth), simple,
                            calibrate.FULL)["seconds"]
    points = pl.DataFrame({"message_bytes": size, "num_gpus": tp, "latency_ms": seconds * 1e3})
    return Home(sku="a100_sxm", gpu=A100, dataset="synthetic", cells=pl.DataFrame()), points


TRUE_KERNELS = {("clock", "home_f_clk"): 0.9, ("gemm", "duty_c"): 3.0, ("gemm", "floor_s"): 6e-6,
                ("memory_law", "dram"): 0.75, ("memory_law", "l2"): 1.2,
                ("attention", "prefill_eta"): 0.5, ("attention", "prefill_floor_s"): 9e-6,
                ("attention", "prefill_cta_s"): 3e-6, ("attention", "decode_eta"): 1.0,
                ("attention", "decode_knee"): 0.08, ("attention", "decode_floor_s"): 1.2e-5,
                ("attention", "decode_split_floor_s"): 4e-6, ("attention", "decode_cta_s"): 2.5e-6}


def _truth() -> dict:
    truth = copy.deepcopy(config.load_constants())
    truth["collectives"].update(TRUE_COLLECTIVES)
    for (section, key), value in TRUE_KERNELS.items():
        truth[section][key] = value
    return truth


def _timed(frame: pl.DataFrame, seconds: np.ndarray) -> pl.DataFrame:
    return frame.with_columns(latency_ms=pl.Series(seconds * 1e3))


def _kernel_ops(truth: dict) -> dict[str, pl.DataFrame]:
    """The home's kernels at ``truth``: GEMMs of five Llama shapes at m = 1 to 16,384 (QKV
    takes two of them), prefill attention of 1 to 8 equal prompts of 64 to 4,096 tokens, and
    decode attention of 1 to 1,024 requests at 128 to 8,192 tokens of context."""
    dev, full = config.Device.of(A100, truth), calibrate.FULL
    shapes = {"gemm_qkv": [(6144, 4096), (1280, 8192)], "gemm_o": [(4096, 4096)],
              "gemm_gate_up": [(28672, 4096)], "gemm_down": [(4096, 14336)]}
    frames = {}
    for op, nk in shapes.items():
        g = pl.DataFrame([{"m": 2**i, "n": n, "k": k} for i in range(15) for n, k in nk])
        m, n, k = (g[x].to_numpy().astype(float) for x in "mnk")
        frames[op] = _timed(g, ops.gemm(m, n, k, dev, truth, full)["seconds"])
    heads = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128}
    p = pl.DataFrame([{"batch": b, "q_len": 2**i, **heads} for b in (1, 2, 4, 8)
                      for i in range(6, 13)])
    b, q = p["batch"].to_numpy().astype(float), p["q_len"].to_numpy().astype(float)
    frames["attn_prefill"] = _timed(p, ops.prefill_attention(q, 0 * q, 32 * b, 8 * b, 128, dev,
                                                             truth, full)["seconds"])
    d = pl.DataFrame([{"batch": 2**i, "kv_len": 2**j, **heads} for i in range(11)
                      for j in range(7, 14, 2)])
    b, kv = d["batch"].to_numpy().astype(float), d["kv_len"].to_numpy().astype(float)
    frames["attn_decode"] = _timed(d, ops.decode_attention(b, kv, 32, 8, 128, dev, truth,
                                                           full)["seconds"])
    return frames


def test_fit_constants_recovers_every_fitted_leaf():
    """From op points generated at known values (none of them the committed ones), every
    ``fitted on home`` leaf comes back, and ``op_rows`` counts the points."""
    truth = _truth()
    _, allreduce = _allreduce_home(truth)
    home = Home(sku="a100_sxm", gpu=A100, dataset="synthetic", cells=pl.DataFrame(),
                ops={**_kernel_ops(truth), "allreduce": allreduce})
    fitted = calibrate.fit_constants(home, config.load_constants())
    for (section, key), value in TRUE_KERNELS.items():
        assert fitted[section][key] == pytest.approx(value, rel=1e-3), key
    for key, value in TRUE_COLLECTIVES.items():
        assert fitted["collectives"][key] == pytest.approx(value, rel=1e-3), key
    assert fitted["home"]["op_rows"] == sum(len(f) for f in home.ops.values())


def test_allreduce_fit_prices_the_homes_nccl_points_as_simple_only(monkeypatch):
    """Without the Simple-only guard, LL (priced from NCCL's own latencies) stands in for the
    TP3 small messages and the fitted NCCL step latency is wrong."""
    home, points = _allreduce_home(_truth())
    monkeypatch.setattr(factors, "NCCL_SIMPLE_ONLY", {})
    c = copy.deepcopy(config.load_constants())
    calibrate.fit_allreduce(points, c, home)
    assert c["collectives"]["nccl_step_s"] != pytest.approx(TRUE_COLLECTIVES["nccl_step_s"],
                                                            rel=0.05)


def test_ours_refits_where_its_frozen_constants_would_see_held_out_shapes():
    """On a held_out_shapes home fit recovers the constants of the points it is given (here
    generated at known values), never the frozen file's; on any other one-GPU home it keeps the
    file's; without an op it needs, NotSupported names it. Refitted on another GPU's points
    (held-out shapes, or several homes without the A100) it scores the A100; reading the frozen
    A100 constants from another one-GPU home, it refuses to."""
    from leaderboard_core.contract import HELD_OUT_SHAPES, NotSupported
    from predictors.ours import Ours

    truth = _truth()
    _, allreduce = _allreduce_home(truth)
    points = {**_kernel_ops(truth), "allreduce": allreduce}
    frozen = config.load_constants()

    def home(ops, kind):
        return Home(sku="a100_sxm", gpu=A100, dataset="synthetic", cells=pl.DataFrame(
            {"gt_kind": ["gpu_block"]}), ops=ops, points=kind)

    held_out = Ours().fit(home(points, HELD_OUT_SHAPES))
    assert held_out.constants_["gemm"]["duty_c"] == pytest.approx(3.0, rel=1e-3)
    assert held_out.constants_["attention"]["decode_floor_s"] == pytest.approx(1.2e-5, rel=1e-3)
    assert held_out.profiled_rows_ == sum(len(f) for f in points.values()) + frozen["fp8"]["op_rows"]
    kept = Ours().fit(home(points, "full_grid"))
    assert kept.constants_["gemm"]["duty_c"] == frozen["gemm"]["duty_c"]
    # Refitted on another GPU's points, no constant in use came from the A100: it is scored.
    from op_points import GEMM_POINT as gemm_point
    gpus = load_gpu_specs()
    elsewhere = Ours().fit(Home(sku="h100_sxm", gpu=gpus["h100_sxm"], dataset="synthetic",
                                cells=pl.DataFrame({"gt_kind": ["gpu_block"]}), ops=points,
                                points=HELD_OUT_SHAPES))
    assert elsewhere.predict_ops(gemm_point, A100)[0] > 0
    tagged = {op: f.with_columns(sku=pl.lit("h100_sxm")) for op, f in points.items()}
    two_homes = Ours().fit(Home(sku="h100_sxm", gpu=gpus["h100_sxm"], dataset="synthetic+other",
                                cells=pl.DataFrame({"gt_kind": ["gpu_block"]}), ops=tagged,
                                gpus={"h100_sxm": gpus["h100_sxm"], "h200_sxm": gpus["h200_sxm"]}))
    assert two_homes.predict_ops(gemm_point, A100)[0] > 0
    with pytest.raises(NotSupported, match="fitted on a100_sxm"):
        Ours().fit(Home(sku="h100_sxm", gpu=gpus["h100_sxm"], dataset="synthetic",
                        cells=pl.DataFrame({"gt_kind": ["gpu_block"]}), ops=points)
                   ).predict_ops(gemm_point, A100)
    with pytest.raises(NotSupported, match="allreduce"):
        Ours().fit(home({k: v for k, v in points.items() if k != "allreduce"}, HELD_OUT_SHAPES))
    with pytest.raises(ValueError, match="home points 'shapes'"):
        home(points, "shapes")


def test_fit_fp8_recovers_the_fp8_gemm_leaves_and_reads_only_fp8_points():
    """FP8 GEMMs on the H100 generated at known fp8.* values (the other constants held), with
    BF16 points beside them timed far off: the fit returns the known values and counts only
    the FP8 points."""
    h100 = load_gpu_specs()["h100_sxm"]
    truth = copy.deepcopy(config.load_constants())
    truth["fp8"].update(gemm_eta=0.55, quant_floor_s=3e-6)
    dev = config.Device.of(h100, truth)
    g = pl.DataFrame([{"m": 2**i, "n": n, "k": k, "dtype": "fp8"} for i in range(15)
                      for n, k in ((6144, 4096), (4096, 14336))])
    m, n, k = (g[x].to_numpy().astype(float) for x in "mnk")
    fp8 = _timed(g, ops.gemm(m, n, k, dev, truth, calibrate.FULL, fp8=True)["seconds"])
    bf16 = fp8.with_columns(dtype=pl.lit("bfloat16"), latency_ms=pl.col("latency_ms") * 5)
    def home(gemm_qkv: pl.DataFrame) -> Home:
        return Home(sku="h100_sxm", gpu=h100, dataset="synthetic_fp8", cells=pl.DataFrame(),
                    ops={"gemm_qkv": gemm_qkv, "gemm_o": bf16, "gemm_gate_up": bf16,
                         "gemm_down": bf16})

    fitted = copy.deepcopy(config.load_constants())
    assert calibrate.fit_fp8(home(pl.concat([fp8, bf16])), fitted) == len(fp8)
    assert fitted["fp8"]["gemm_eta"] == pytest.approx(0.55, rel=1e-3)
    assert fitted["fp8"]["quant_floor_s"] == pytest.approx(3e-6, rel=1e-3)
    with pytest.raises(ValueError, match="no FP8 GEMM points"):
        calibrate.fit_fp8(home(bf16), fitted)
    with pytest.raises(ValueError, match="no gemm_down points"):
        calibrate.fit_fp8(Home(sku="h100_sxm", gpu=h100, dataset="synthetic_fp8", cells=pl.DataFrame(),
                               ops={o: fp8 for o in ("gemm_qkv", "gemm_o", "gemm_gate_up")}), fitted)
