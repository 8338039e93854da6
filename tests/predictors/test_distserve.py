"""DistServe baseline: fidelity to the released coefficients, the relative-error refit, scaling."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pytest

from leaderboard_core.contract import Home, NotSupported
from leaderboard_core.specs import load_gpu_specs
from predictors import registry
from predictors.distserve import DistServe, DistServeScaled, relative_lstsq

SPECS = load_gpu_specs()
A100, H200 = SPECS["a100_sxm"], SPECS["h200_sxm"]
# Known coefficients the synthetic home cells are generated from (prefill, small, large).
TRUE = {"pf": (3.0, 0.02, 1.5e-6), "small": (5.0, 5e-5, 0.03), "large": (4.0, 9e-5, 0.045)}


def cells(batches: list[tuple[list[int], list[int]]], model: str = "llama-3-8b", tp: int = 1
          ) -> pl.DataFrame:
    """Cells with the derived columns the store has: a decode request has q = 1 and ctx > 0."""
    rows = []
    for i, (q, ctx) in enumerate(batches):
        decode = [c for n, c in zip(q, ctx, strict=True) if n == 1 and c > 0]
        phase = "decode" if len(decode) == len(q) else "prefill" if not decode else "mixed"
        rows.append({"cell_id": f"c{i:04d}", "model": model, "tp": tp, "phase": phase,
                     "q_lens": q, "ctx_lens": ctx, "num_requests": len(q),
                     "num_decode": len(decode), "decode_ctx_sum": sum(decode),
                     "total_tokens": sum(q)})
    return pl.DataFrame(rows)


def true_ms(frame: pl.DataFrame, small_below: int = 95) -> np.ndarray:
    """The generating formula, written out independently of the predictor."""
    out = []
    for q, ctx in frame.select("q_lens", "ctx_lens").iter_rows():
        pf = [n for n, c in zip(q, ctx, strict=True) if not (n == 1 and c > 0)]
        dec = [c for n, c in zip(q, ctx, strict=True) if n == 1 and c > 0]
        if pf:
            a, b, c = TRUE["pf"]
            out.append(a + b * sum(pf) + c * sum(n * n for n in pf))
        else:
            a, b, c = TRUE["small" if len(dec) < small_below else "large"]
            out.append(a + b * sum(x + 1 for x in dec) + c * len(dec))
    return np.array(out)


def synthetic_home(small_below: int = 95, mixed_gt: float = 1e6) -> Home:
    rng = np.random.default_rng(0)
    batches = [([int(n)] * k, [0] * k) for n in (16, 128, 512, 2048) for k in (1, 2, 3)]
    batches += [([1] * b, rng.integers(10, 4000, b).tolist()) for b in (1, 4, 16, 32, 64, 94,
                                                                        95, 96, 128, 160, 192)]
    batches += [([256, 1, 1], [0, 100, 200])]  # mixed: must inform nothing
    frame = cells(batches)
    gt = np.where(frame["phase"] == "mixed", mixed_gt, true_ms(frame, small_below))
    return Home(sku="a100_sxm", gpu=A100, dataset="synthetic",
                cells=frame.with_columns(gt_ms=pl.Series(gt)))


def coefficients(predictor: DistServe, model: str = "llama-3-8b", tp: int = 1) -> dict:
    row = predictor.coefficients_.filter((pl.col("model") == model) & (pl.col("tp") == tp))
    return {term: tuple(row[f"{term}_{c}"].item() for c in "abc") for term in TRUE}


def test_published_opt13b_coefficients_give_distserves_values(real_store):
    with duckdb.connect(str(real_store.path), read_only=True) as con:
        published = con.sql("SELECT * FROM coefficients").pl()
    opt13b_tp1 = {term: published.filter(
        (pl.col("model") == "opt-13b") & (pl.col("tp") == 1) & (pl.col("engine") == "distserve")
        & (pl.col("term") == term))["coefficients"].str.json_decode().item().to_list()
        for term in ("prefill", "decoding_smallbs", "decoding_largebs")}
    # baselines.md §6.3, as printed there (4 significant digits).
    assert opt13b_tp1["prefill"] == pytest.approx([18.10, 0.10191, 7.122e-6], rel=1e-3)
    assert opt13b_tp1["decoding_smallbs"] == pytest.approx([19.93, 6.269e-4, 0.03851], rel=1e-3)
    assert opt13b_tp1["decoding_largebs"] == pytest.approx([7.166, 5.798e-4, 0.1583], rel=1e-3)

    home = Home(sku="a100_sxm", gpu=A100, dataset="none", cells=pl.DataFrame(), published=published)
    batches = cells([([512, 256], [0, 0]), ([1] * 32, [1000] * 32), ([1] * 128, [500] * 128)],
                    model="opt-13b")
    pred = DistServe().fit(home).predict(batches, H200)
    # By hand: 18.10 + 0.10191*768 + 7.122e-6*(512²+256²) = 98.70;
    # 19.93 + 6.269e-4*32*1001 + 0.03851*32 = 41.25 (B < 95: small);
    # 7.166 + 5.798e-4*128*501 + 0.1583*128 = 64.61 (B ≥ 95: large).
    assert pred == pytest.approx([98.70, 41.25, 64.61], rel=2e-4)
    with_todo = DistServe(prefill_todo_ms=True).fit(home).predict(batches, H200)
    assert with_todo - pred == pytest.approx([1.0, 0.0, 0.0])
    # Published OPT pairs are taken as released, never refitted; vLLM's fits differ.
    vllm = DistServe(published_engine="vllm").fit(home).predict(batches, H200)
    assert vllm[0] == pytest.approx(22.05 + 0.1405 * 768 + 8.08e-6 * 327680, rel=2e-3)


def test_relative_least_squares_recovers_known_coefficients_and_ignores_mixed_cells():
    home = synthetic_home(small_below=96)  # B = 95 generated by the small fit, as DistServe fits
    predictor = DistServe().fit(home)
    fitted = coefficients(predictor)
    for term, truth in TRUE.items():
        assert fitted[term] == pytest.approx(truth, rel=1e-8), term
    assert predictor.coefficients_["origin"].to_list() == ["refit"]
    assert predictor.profiled_rows_ == len(home.cells) - 1  # every pure row, not the mixed one
    assert predictor.trained_on_ == "a100_sxm"


def test_threshold_flag_moves_batch_95_between_fits():
    home = synthetic_home(small_below=95)  # B = 95 generated by the large fit, as DistServe predicts
    consistent = coefficients(DistServe(verbatim_threshold=False).fit(home))
    assert consistent["small"] == pytest.approx(TRUE["small"], rel=1e-8)
    assert consistent["large"] == pytest.approx(TRUE["large"], rel=1e-8)
    at_95 = cells([([1] * 95, [99] * 95)])
    la, lb, lc = TRUE["large"]  # the simulator predicts B = 95 with the large-batch fit
    expected = la + lb * 95 * 100 + lc * 95
    assert DistServe(verbatim_threshold=False).fit(home).predict(at_95, A100) == pytest.approx(
        [expected], rel=1e-8)
    verbatim = coefficients(DistServe().fit(home))  # fits B = 95 as small: no exact recovery
    assert verbatim["small"] != pytest.approx(TRUE["small"], rel=1e-3)


def test_relative_lstsq_minimises_relative_not_absolute_error():
    rng = np.random.default_rng(1)
    x = np.column_stack([np.ones(40), rng.uniform(1, 1e3, 40), rng.uniform(1, 100, 40)])
    y = x @ [2.0, 0.01, 0.3] * rng.uniform(0.8, 1.2, 40)
    beta = relative_lstsq(x, y)
    scaled = x / y[:, None]
    assert scaled.T @ (scaled @ beta - 1.0) == pytest.approx(np.zeros(3), abs=1e-9)
    plain = np.linalg.lstsq(x, y, rcond=None)[0]
    assert not np.allclose(beta, plain, rtol=1e-3)
    assert relative_lstsq(x[:2], y[:2]) is None  # fewer rows than coefficients
    collinear = x.copy()
    collinear[:, 2] = 64.0  # one batch size: intercept and c'·B cannot be told apart
    assert relative_lstsq(collinear, y) is None


def test_missing_large_batch_rows_fall_back_to_the_small_batch_fit():
    home = synthetic_home()
    small_only = home.cells.filter(pl.col("num_decode") < 95)
    predictor = DistServe().fit(Home(sku="a100_sxm", gpu=A100, dataset="s", cells=small_only))
    fitted = coefficients(predictor)
    assert fitted["large"] == fitted["small"]
    assert fitted["small"] == pytest.approx(TRUE["small"], rel=1e-8)
    assert "uses the small-batch fit" in predictor.fit_notes_["llama-3-8b TP1"][0]


def test_unknown_or_unfittable_model_tp_raises_not_supported_naming_it():
    home = synthetic_home()
    predictor = DistServe().fit(home)
    with pytest.raises(NotSupported, match="qwen3-8b TP2") as err:
        predictor.predict(cells([([64], [0])], model="qwen3-8b", tp=2), H200)
    assert "llama-3-8b TP1" in str(err.value)  # says what it does support
    few_prefill = home.cells.filter((pl.col("phase") != "prefill") | (pl.col("total_tokens") < 40))
    starved = DistServe().fit(Home(sku="a100_sxm", gpu=A100, dataset="s", cells=few_prefill))
    with pytest.raises(NotSupported, match=r"llama-3-8b TP1.*pure-prefill rows cannot fit"):
        starved.predict(cells([([64], [0])]), H200)


def test_mixed_step_modes():
    home = synthetic_home(small_below=96)
    mixed = cells([([256, 1, 1], [0, 100, 200])])
    a, b, c = TRUE["pf"]
    prefill = a + b * 256 + c * 256 ** 2
    assert DistServe(mixed="prefill_only").fit(home).predict(mixed, A100) == pytest.approx([prefill])
    _, b_dec, c_dec = TRUE["small"]
    additive = prefill + b_dec * (101 + 201) + c_dec * 2  # decode part without its intercept
    assert DistServe().fit(home).predict(mixed, A100) == pytest.approx([additive])
    with pytest.raises(ValueError, match="mixed must be one of"):
        DistServe(mixed="sum").fit(home)


def test_scaled_equals_verbatim_on_the_home_spec_and_rescales_by_datasheet():
    home = synthetic_home(small_below=96)
    batch = cells([([512], [0]), ([1] * 8, [1000] * 8), ([1] * 128, [300] * 128)])
    verbatim = DistServe().fit(home)
    scaled = DistServeScaled().fit(home)
    assert np.array_equal(scaled.predict(batch, A100), verbatim.predict(batch, A100))
    assert np.array_equal(verbatim.predict(batch, H200), verbatim.predict(batch, A100))
    flops = A100["bf16_dense_tflops"] / H200["bf16_dense_tflops"]
    bw = A100["mem_bw_gbs"] / H200["mem_bw_gbs"]
    (pa, pb, pc), (sa, sb, sc), (la, lb, lc) = TRUE.values()
    expected = [bw * pa + flops * (pb * 512 + pc * 512 ** 2),
                bw * (sa + sb * 8 * 1001) + sc * 8,
                bw * (la + lb * 128 * 301) + lc * 128]
    assert scaled.predict(batch, H200) == pytest.approx(expected, rel=1e-8)


def test_both_variants_are_registered_profiled_predictors():
    assert {"distserve", "distserve_scaled"} <= set(registry.names())
    for name in ("distserve", "distserve_scaled"):
        predictor = registry.build(name, {"mixed": "prefill_only"})
        assert predictor.card.kind == "profiled" and predictor.mixed == "prefill_only"
