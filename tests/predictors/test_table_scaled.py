"""table_scaled: the lookup rules by hand, and a step composed from a tiny home's tables."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from leaderboard_core.contract import Home, NotSupported
from leaderboard_core.specs import load_gpu_specs, load_models, tp_shapes
from predictors import table_scaled
from predictors._roofline import peaks, point_seconds
from predictors.table_scaled import TableScaled, lookup

GEMMS = ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down")


def test_lookup_is_exact_on_the_grid_and_log_log_between():
    table = pl.DataFrame({"message_bytes": [1024, 4096, 16384], "num_gpus": [2, 2, 2],
                          "latency_ms": [0.01, 0.04, 0.09]})
    query = pl.DataFrame({"message_bytes": [4096, 2048, 100, 10**6], "num_gpus": [2, 2, 2, 2]})
    ms, outside = lookup(table, "allreduce", query, {})
    # 2048 is halfway between 1024 and 4096 in log bytes: the geometric mean of their times
    assert ms[:2] == pytest.approx([0.04, np.sqrt(0.01 * 0.04)], rel=1e-12)
    assert ms[2:] == pytest.approx([0.01, 0.09])  # nearest edge outside the grid, flagged
    assert outside.tolist() == [False, False, True, True]


def test_lookup_interpolates_in_two_axes_and_borrows_a_missing_key():
    grid = [(b, kv) for b in (1, 4) for kv in (64, 256)]
    table = pl.DataFrame({"batch": [b for b, _ in grid], "kv_len": [kv for _, kv in grid],
                          "num_heads": 8, "num_kv_heads": 8, "head_dim": 128,
                          "latency_ms": [0.01 * b * kv / 64 for b, kv in grid]})
    query = pl.DataFrame({"batch": [2], "kv_len": [128], "num_heads": [8], "num_kv_heads": [8],
                          "head_dim": [128], "q_len": [1]})
    ms, outside = lookup(table, "attn_decode", query, {})
    assert ms[0] == pytest.approx(0.01 * 2 * 128 / 64, rel=1e-9) and not outside[0]  # log-linear law
    gpu = peaks(load_gpu_specs()["a100_sxm"])
    other = query.with_columns(num_heads=pl.lit(16), num_kv_heads=pl.lit(16))
    borrowed, outside = lookup(table, "attn_decode", other, gpu)
    ratio = point_seconds("attn_decode", other, gpu) / point_seconds("attn_decode", query, gpu)
    assert borrowed[0] == pytest.approx(ms[0] * ratio[0], rel=1e-9) and outside[0]


def test_a_missing_expert_key_borrows_the_same_dtype_at_the_nearest_placement():
    """A fused-MoE key the home never timed (block FP8 with the experts split 8 ways) borrows
    the same dtype's nearest placement (split 4 ways), rescaled by the roofline, not another
    dtype's kernel at the same placement; the choice is the same whatever the rows' order."""
    shape = {"hidden_size": 3072, "inter_size": 1536, "topk": 8, "num_experts": 256, "moe_ep": 1}
    keys = [("fp8", 8, 0.18), ("bfloat16", 8, 0.27), ("fp8_block", 4, 0.40), ("fp8_block", 1, 0.9)]
    table = pl.DataFrame([{**shape, "dtype": d, "moe_tp": tp, "num_tokens": t, "latency_ms": ms * t}
                          for d, tp, ms in keys for t in (1, 64)])
    query = pl.DataFrame([{**shape, "dtype": "fp8_block", "moe_tp": 8, "num_tokens": 64}])
    gpu = peaks(load_gpu_specs()["h200_sxm"])
    ratio = (point_seconds("moe", query, gpu)
             / point_seconds("moe", query.with_columns(moe_tp=pl.lit(4)), gpu))
    assert 0.4 < ratio[0] < 1  # a 4-way split's share of the experts is twice the 8-way's
    for order in (table, table.reverse(), table.sample(fraction=1.0, shuffle=True, seed=1)):
        ms, outside = lookup(order, "moe", query, gpu)
        assert ms[0] == pytest.approx(0.40 * 64 * ratio[0], rel=1e-9) and outside[0]


def test_a_cached_lookup_answers_as_a_fresh_one_across_batches():
    """The replay asks in many small batches; answers kept from earlier batches must be the ones a
    fresh lookup gives, wherever a point sits in its batch."""
    rng = np.random.default_rng(3)
    grid = [(b, kv) for b in (1, 2, 4, 8) for kv in (64, 128, 256, 512)]
    table = pl.DataFrame({"batch": [b for b, _ in grid], "kv_len": [kv for _, kv in grid],
                          "num_heads": 8, "num_kv_heads": 8, "head_dim": 128,
                          "latency_ms": rng.uniform(0.01, 0.1, len(grid))})
    asked = pl.DataFrame({"batch": rng.integers(1, 12, 40), "kv_len": rng.integers(40, 700, 40),
                          "num_heads": 8, "num_kv_heads": 8, "head_dim": 128})
    fresh = [lookup(table, "attn_decode", asked[i:i + 1], {}) for i in range(len(asked))]
    prepared: dict = {}
    first = lookup(table, "attn_decode", asked[:25], {}, prepared)
    again = lookup(table, "attn_decode", asked.reverse(), {}, prepared)  # 25 cached, 15 new
    for got, order in ((first, range(25)), (again, reversed(range(len(asked))))):
        want = np.array([[fresh[i][0][0], fresh[i][1][0]] for i in order])
        assert got[0] == pytest.approx(want[:, 0], rel=1e-9)
        assert got[1].tolist() == want[:, 1].astype(bool).tolist()
    assert 0 < sum(o for _, o in fresh) < len(asked)  # both inside and outside the grid were asked



def test_the_kept_answers_are_bounded_and_the_bound_changes_no_answer(monkeypatch):
    import predictors.table_scaled as table_scaled

    rng = np.random.default_rng(5)
    grid = [(b, kv) for b in (1, 2, 4, 8) for kv in (64, 128, 256, 512)]
    table = pl.DataFrame({"batch": [b for b, _ in grid], "kv_len": [kv for _, kv in grid],
                          "num_heads": 8, "num_kv_heads": 8, "head_dim": 128,
                          "latency_ms": rng.uniform(0.01, 0.1, len(grid))})
    batches = [pl.DataFrame({"batch": rng.integers(1, 12, 9), "kv_len": rng.integers(40, 700, 9),
                             "num_heads": 8, "num_kv_heads": 8, "head_dim": 128})
               for _ in range(6)]
    unbounded: dict = {}
    want = [lookup(table, "attn_decode", b, {}, unbounded)[0] for b in batches]
    monkeypatch.setattr(table_scaled, "MAX_ANSWERED", 12)
    bounded: dict = {}
    for batch, expected in zip(batches, want, strict=True):
        assert lookup(table, "attn_decode", batch, {}, bounded)[0] == pytest.approx(expected,
                                                                                     rel=1e-12)
        assert all(len(kept[-1]) <= 12 for kept in bounded.values())
    assert max(len(kept[-1]) for kept in unbounded.values()) > 12  # the bound was reached

def _tiny_home(model: str, tp: int, tokens: int, ctx: int, batch: int) -> tuple[Home, dict]:
    """A home that measured exactly the points one decode step of ``batch`` requests at
    ``ctx`` reads, each at a made-up time."""
    m, s = load_models()[model], tp_shapes(load_models()[model], tp)
    times = {op: 0.01 * (i + 1) for i, op in enumerate((*GEMMS, "attn_decode", "allreduce"))}
    ops = {op: pl.DataFrame({"m": [tokens, 2 * tokens], "n": [s[op[5:]][0]] * 2,
                             "k": [s[op[5:]][1]] * 2, "dtype": ["bfloat16"] * 2,
                             "latency_ms": [times[op], 9.0]}) for op in GEMMS}
    ops["attn_decode"] = pl.DataFrame({"batch": [batch, 2 * batch], "kv_len": [ctx, ctx],
                                       "q_len": [1, 1], "num_heads": [s["heads"]] * 2,
                                       "num_kv_heads": [s["kv_heads"]] * 2,
                                       "head_dim": [m["head_dim"]] * 2,
                                       "latency_ms": [times["attn_decode"], 9.0]})
    ops["allreduce"] = pl.DataFrame({"message_bytes": [tokens * s["hidden"] * 2, 1],
                                     "num_gpus": [tp, tp], "latency_ms": [times["allreduce"], 9.0]})
    gpu = load_gpu_specs()["a100_sxm"]
    return Home(sku="a100_sxm", gpu=gpu, dataset="tiny", cells=pl.DataFrame(), ops=ops), times


def test_a_step_is_its_measured_points_times_the_layers_and_scaled_by_the_roofline():
    model, tp, batch, ctx = "llama-3-8b", 2, 8, 1023
    home, times = _tiny_home(model, tp, batch, ctx, batch)
    cells = pl.DataFrame({"model": [model], "tp": [tp], "total_tokens": [batch],
                          "num_decode": [batch], "num_prefill": [0], "prefill_tokens": [0],
                          "decode_ctx_sum": [batch * ctx], "q_lens": [[1] * batch],
                          "ctx_lens": [[ctx] * batch], "gt_kind": ["gpu_block"]})
    fitted = TableScaled().fit(home)
    layers = load_models()[model]["num_layers"]
    per_layer = sum(times[op] for op in GEMMS) + times["attn_decode"] + 2 * times["allreduce"]
    assert fitted.predict(cells, home.gpu)[0] == pytest.approx(per_layer * layers, rel=1e-12)
    # a target with twice the compute, memory and link peaks halves every op's roofline time
    d = home.gpu.data
    faster = type(home.gpu)("fast", {**d, "bf16_dense_tflops": 2 * d["bf16_dense_tflops"],
                                     "mem_bw_gbs": 2 * d["mem_bw_gbs"], "interconnect": {
                                         **d["interconnect"], "bw_gbs": 2 * d["interconnect"]["bw_gbs"]}},
                            home.gpu.path)
    assert fitted.predict(cells, faster)[0] == pytest.approx(per_layer * layers / 2, rel=1e-9)


def test_a_serving_step_adds_the_lm_head_read_in_slices_inside_the_grid():
    """Off GPU-block ground truth the step also runs the LM head: m = requests, n = vocabulary
    / TP in the fewest equal slices no wider than the table's widest n, k = hidden."""
    model, tp, batch, ctx = "llama-3-8b", 2, 8, 1023
    home, times = _tiny_home(model, tp, batch, ctx, batch)
    m, s = load_models()[model], tp_shapes(load_models()[model], tp)
    widest = max(int(frame["n"].max()) for name, frame in home.ops.items() if name.startswith("gemm"))
    columns = m["vocab_size"] / tp
    slices = int(np.ceil(columns / widest))
    assert slices > 1  # 128,256 / 2 columns do not fit the tiny grid: the slicing is exercised
    home.ops["gemm_lm_head"] = pl.DataFrame({"m": [batch], "n": [columns / slices],
                                             "k": [s["hidden"]], "dtype": ["bfloat16"],
                                             "latency_ms": [0.5]})
    step = pl.DataFrame({"model": [model] * 2, "tp": [tp] * 2, "total_tokens": [batch] * 2,
                         "num_requests": [batch] * 2, "num_decode": [batch] * 2,
                         "num_prefill": [0] * 2, "prefill_tokens": [0] * 2,
                         "decode_ctx_sum": [batch * ctx] * 2, "q_lens": [[1] * batch] * 2,
                         "ctx_lens": [[ctx] * batch] * 2, "gt_kind": ["gpu_block", "serving"]})
    kernels, served = TableScaled().fit(home).predict(step, home.gpu)
    assert served - kernels == pytest.approx(slices * 0.5, rel=1e-9)
    assert TableScaled(lm_head=False).fit(home).predict(step, home.gpu)[1] == pytest.approx(kernels)


def test_a_block_scaled_fp8_checkpoint_reads_the_block_tables_for_projections_and_experts():
    """MiniMax-M2.5's FP8 checkpoint scales per 128 x 128 block: an FP8 step reads the
    ``fp8_block`` GEMM and fused-MoE rows, never the per-tensor ``fp8`` ones beside them."""
    model, tp, ep, batch, ctx = "minimax-m2.5", 4, 4, 16, 2048
    spec, s = load_models()[model], tp_shapes(load_models()[model], tp)
    assert spec["fp8_scaling"] == "block"
    both = {"dtype": ["fp8", "fp8_block"]}
    ops = {f"gemm_{op}": pl.DataFrame({"m": [batch] * 2, "n": [s[op][0]] * 2,
                                       "k": [s[op][1]] * 2, **both, "latency_ms": [5.0, t]})
           for op, t in (("qkv", 0.011), ("o", 0.007))}
    ops["moe"] = pl.DataFrame({"num_tokens": [batch] * 2, "hidden_size": [spec["hidden_size"]] * 2,
                               "inter_size": [spec["moe_intermediate_size"]] * 2,
                               "topk": [spec["experts_per_token"]] * 2,
                               "num_experts": [spec["num_experts"]] * 2, "moe_tp": [1] * 2,
                               "moe_ep": [ep] * 2, **both, "latency_ms": [5.0, 0.05]})
    ops["attn_decode"] = pl.DataFrame({"batch": [batch], "kv_len": [ctx], "q_len": [1],
                                       "num_heads": [s["heads"]], "num_kv_heads": [s["kv_heads"]],
                                       "head_dim": [spec["head_dim"]], "latency_ms": [0.02]})
    ops["allreduce"] = pl.DataFrame({"message_bytes": [batch * s["hidden"] * 2], "num_gpus": [tp],
                                     "latency_ms": [0.004]})
    gpu = load_gpu_specs()["h200_sxm"]
    home = Home(sku="h200_sxm", gpu=gpu, dataset="tiny", cells=pl.DataFrame(), ops=ops)
    step = pl.DataFrame({"model": [model], "tp": [tp], "moe_ep": [ep], "total_tokens": [batch],
                         "num_decode": [batch], "num_prefill": [0], "prefill_tokens": [0],
                         "decode_ctx_sum": [batch * ctx], "gemm_dtype": ["fp8"],
                         "gt_kind": ["gpu_block"]})
    layers = spec["num_layers"]  # every layer routes: no dense FFN
    want = layers * (0.011 + 0.007 + 0.02 + 2 * 0.004 + 0.05)
    assert TableScaled().fit(home).predict(step, gpu)[0] == pytest.approx(want, rel=1e-9)
    per_tensor = {**ops, **{op: ops[op].filter(pl.col("dtype") == "fp8")
                            for op in ("gemm_qkv", "gemm_o")}}
    refused = TableScaled().fit(Home(sku="h200_sxm", gpu=gpu, dataset="tiny",
                                     cells=pl.DataFrame(), ops=per_tensor))
    with pytest.raises(NotSupported, match="no fp8_block GEMMs"):
        refused.predict(step, gpu)


def test_a_step_that_names_an_fp8_kv_cache_reads_the_fp8_kv_attention_rows():
    """The oracle's home holds each attention point over a BF16 and an FP8 KV cache. A step
    that names ``kv_dtype`` fp8 reads the FP8-KV rows, prefill and decode alike; one that names
    bfloat16, or none (every headline step), reads the BF16 rows, never a blend of the two."""
    model, tp, batch, ctx = "llama-3-8b", 2, 8, 1023
    home, times = _tiny_home(model, tp, batch, ctx, batch)
    s = tp_shapes(load_models()[model], tp)
    heads = {"num_heads": s["heads"], "num_kv_heads": s["kv_heads"], "head_dim": 128}
    home.ops["attn_decode"] = pl.DataFrame([
        {"batch": batch, "kv_len": ctx, "q_len": 1, **heads, "kv_dtype": kv, "latency_ms": ms}
        for kv, ms in (("bfloat16", 0.05), ("fp8", 0.03))])
    home.ops["attn_prefill"] = pl.DataFrame([
        {"batch": 1, "q_len": 512, "kv_len": 0, **heads, "kv_dtype": kv, "latency_ms": ms}
        for kv, ms in (("bfloat16", 0.4), ("fp8", 0.1))])
    mixed = {"model": [model], "tp": [tp], "total_tokens": [batch + 512], "num_requests": [batch + 1],
             "num_decode": [batch], "num_prefill": [1], "prefill_tokens": [512],
             "decode_ctx_sum": [batch * ctx], "gt_kind": ["gpu_block"]}
    fitted = TableScaled().fit(home)
    named = {kv: fitted.predict(pl.DataFrame({**mixed, "kv_dtype": [kv]}), home.gpu)[0]
             for kv in ("bfloat16", "fp8")}
    unnamed = fitted.predict(pl.DataFrame(mixed), home.gpu)[0]
    layers = load_models()[model]["num_layers"]
    assert unnamed == named["bfloat16"]
    bf16_only = {**home.ops, **{op: home.ops[op].filter(kv_dtype="bfloat16").drop("kv_dtype")
                                for op in ("attn_decode", "attn_prefill")}}
    before = TableScaled().fit(Home(sku=home.sku, gpu=home.gpu, dataset="tiny", cells=pl.DataFrame(),
                                    ops=bf16_only))
    assert unnamed == before.predict(pl.DataFrame(mixed), home.gpu)[0]  # as a BF16-only home
    assert named["bfloat16"] - named["fp8"] == pytest.approx(layers * ((0.05 - 0.03) + (0.4 - 0.1)),
                                                             rel=1e-9)


def test_each_attention_point_carries_its_own_cells_kv_dtype():
    """Cells of one model that name different KV dtypes: each decode and prefill point keeps
    the dtype of the cell it came from, whichever cells have a decode or a prefill."""
    from predictors._step_ops import step_points

    cells = pl.DataFrame({"model": ["llama-3-8b"] * 3, "tp": [1] * 3, "total_tokens": [4, 300, 8],
                          "num_requests": [4, 1, 8], "num_decode": [4, 0, 7],
                          "num_prefill": [0, 1, 1], "prefill_tokens": [0, 300, 1],
                          "decode_ctx_sum": [400, 0, 700], "kv_dtype": ["fp8", "bfloat16", "int8"]})
    parts = {family: (i.tolist(), query) for family, i, _, query in step_points(cells, load_models())
             if family.startswith("attn")}
    assert parts["attn_decode"][0] == [0, 2]
    assert parts["attn_decode"][1]["kv_dtype"].to_list() == ["fp8", "int8"]
    assert parts["attn_prefill"][0] == [1, 2]
    assert parts["attn_prefill"][1]["kv_dtype"].to_list() == ["bfloat16", "int8"]
    unnamed = step_points(cells.drop("kv_dtype"), load_models())
    assert not any("kv_dtype" in query.columns for *_, query in unnamed)
    with pytest.raises(ValueError, match="1 llama-3-8b cells name no kv_dtype"):
        step_points(cells.with_columns(kv_dtype=pl.Series(["fp8", None, "fp8"])), load_models())


def test_an_fp8_kv_step_borrows_only_an_fp8_kv_layout_and_is_refused_where_there_is_none():
    """A decode step over an FP8 cache at a head layout the FP8-KV table lacks borrows the
    FP8-KV table of another layout, rescaled by the roofline, never the BF16 kernel of its
    own layout, though that shares more of the key (the roofline ratio does not see KV bytes,
    so that would price it as BF16); a home with no FP8-KV point refuses it. An op-level point
    still borrows across KV dtypes."""
    grid = [(b, kv) for b in (1, 8) for kv in (256, 2048)]

    def rows(heads: int, kv_heads: int, kv_dtype: str, ms: float) -> list[dict]:
        return [{"batch": b, "kv_len": kv, "num_heads": heads, "num_kv_heads": kv_heads,
                 "head_dim": 128, "kv_dtype": kv_dtype, "latency_ms": ms * b * kv / 256}
                for b, kv in grid]

    table = pl.DataFrame(rows(32, 8, "bfloat16", 0.05) + rows(16, 4, "fp8", 0.02))
    query = pl.DataFrame({"batch": [4], "kv_len": [1024], "num_heads": [32], "num_kv_heads": [8],
                          "head_dim": [128], "q_len": [1], "kv_dtype": ["fp8"]})
    gpu = peaks(load_gpu_specs()["h100_sxm"])
    ms, outside = lookup(table, "attn_decode", query, gpu, never_borrowed=("kv_dtype",))
    ratio = point_seconds("attn_decode", query, gpu) / point_seconds(
        "attn_decode", query.with_columns(num_heads=pl.lit(16), num_kv_heads=pl.lit(4)), gpu)
    assert ratio[0] > 1  # twice the heads read and compute more
    assert ms[0] == pytest.approx(0.02 * 4 * 1024 / 256 * ratio[0], rel=1e-9) and outside[0]
    # op-level: the BF16 kernel of its own layout shares more of the key than either FP8 one
    loose, _ = lookup(table, "attn_decode", query, gpu)
    assert loose[0] == pytest.approx(0.05 * 4 * 1024 / 256, rel=1e-9)
    with pytest.raises(NotSupported, match="no attn_decode point at kv_dtype fp8"):
        lookup(table.filter(kv_dtype="bfloat16"), "attn_decode", query, gpu,
               never_borrowed=("kv_dtype",))
    with pytest.raises(NotSupported, match="attn_decode points record no kv_dtype"):
        lookup(table.drop("kv_dtype"), "attn_decode", query, gpu, never_borrowed=("kv_dtype",))


def test_predict_keeps_a_steps_kv_dtype_and_predict_ops_borrows_across_it():
    """The wiring: a step over an FP8 cache reads the FP8-KV kernel of another head layout
    (rescaled), not its own layout's BF16 kernel, through ``predict``; an op-level point over
    an FP8 cache still reads the BF16 kernel of its own layout, through ``predict_ops``."""
    model, tp, batch, ctx = "llama-3-8b", 2, 8, 1023
    home, times = _tiny_home(model, tp, batch, ctx, batch)
    s = tp_shapes(load_models()[model], tp)
    own = {"num_heads": s["heads"], "num_kv_heads": s["kv_heads"]}
    other = {"num_heads": 2 * s["heads"], "num_kv_heads": 2 * s["kv_heads"]}
    home.ops["attn_decode"] = pl.DataFrame([
        {"batch": b, "kv_len": kv, "q_len": 1, **heads, "head_dim": 128, "kv_dtype": dtype,
         "latency_ms": ms * (b / batch) * (kv / ctx)}
        for heads, dtype, ms in ((own, "bfloat16", 0.05), (other, "fp8", 0.03))
        for b in (batch, 2 * batch) for kv in (ctx, 2 * ctx)])
    step = pl.DataFrame({"model": [model], "tp": [tp], "total_tokens": [batch],
                         "num_requests": [batch], "num_decode": [batch], "num_prefill": [0],
                         "prefill_tokens": [0], "decode_ctx_sum": [batch * ctx],
                         "gt_kind": ["gpu_block"]})
    fitted = TableScaled().fit(home)
    query = pl.DataFrame({"batch": [batch], "kv_len": [ctx], "q_len": [1], **own, "head_dim": [128]})
    gpu = peaks(home.gpu)
    ratio = point_seconds("attn_decode", query, gpu) / point_seconds(
        "attn_decode", query.with_columns(**{k: pl.lit(v) for k, v in other.items()}), gpu)
    fp8, bf16 = (fitted.predict(frame, home.gpu)[0]
                 for frame in (step.with_columns(kv_dtype=pl.lit("fp8")), step))
    layers = load_models()[model]["num_layers"]
    assert fp8 - bf16 == pytest.approx(layers * (0.03 * ratio[0] - 0.05), rel=1e-9)
    point = query.with_columns(phase=pl.lit("attn_decode"), kv_dtype=pl.lit("fp8"))
    assert fitted.predict_ops(point, home.gpu)[0] == pytest.approx(0.05, rel=1e-9)


def test_the_distinct_query_rows_are_numpys_in_its_order():
    rng = np.random.default_rng(3)
    q = np.log(rng.integers(1, 9, (5_000, 3)).astype(np.float64))  # many repeats
    unique, back = table_scaled._unique_rows(q)
    expected, inverse = np.unique(q, axis=0, return_inverse=True)
    np.testing.assert_array_equal(unique, expected)
    np.testing.assert_array_equal(back, inverse.ravel())
    np.testing.assert_array_equal(unique[back], q)
