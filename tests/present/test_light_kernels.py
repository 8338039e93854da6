"""The light-kernel benchmark reads each op of a layer at the measured point nearest the step's
shape and token count (Vidur's H100 points, or a GPU's own vLLM profile), adds the sampler where
the replay's host time does not hold it, and the report shows its rows and each set's clause."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from conftest import load_benchmark

from leaderboard.present.serving_light import light_kernels, light_kernels_measured
from leaderboard.present.serving_unknowns import unknowns_measured
from leaderboard_core.specs import load_models

OPS = ("input_layernorm", "post_attention_layernorm", "add", "attn_rope", "mlp_act")
TOKENS = (1, 8, 64)


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("light_kernels")


def _points() -> pl.DataFrame:
    """Llama-2-7B at TP1 and Llama-2-70B at TP2, each op at three token counts, every latency
    its own: (config) * 1000 + (op) * 10 + (token index)."""
    rows = [{"op": op, "model": model, "tp": tp, "num_tokens": t,
             "latency_ms": float(1000 * c + 10 * o + i)}
            for c, (model, tp) in enumerate((("llama-2-7b", 1), ("llama-2-70b", 2)), 1)
            for o, op in enumerate(OPS) for i, t in enumerate(TOKENS)]
    return pl.DataFrame(rows)


def test_each_op_is_read_at_the_nearest_shape_and_token_count(bench):
    """Llama-3.1-8B at TP1: its norms and add (hidden 4096) are Llama-2-7B's (4096, not 8192);
    its rope ((32 + 8) heads x 128 = 5120) Llama-2-70B's at TP2 ((64 + 8) / 2 x 128 = 4608,
    not 7B's 8192); its activation (2 x 14336 = 28672 wide) 70B's at TP2 (2 x 28672 / 2).
    Tokens 3 and 5 read 8 (log-nearer than 1 and 64), 100 and 10,000 read 64 (the largest)."""
    light = bench.LightKernels(_points(), load_models())
    tokens = [1, 3, 5, 100, 10_000]
    cells = pl.DataFrame({"model": ["llama-3.1-8b"] * 5, "tp": [1] * 5, "total_tokens": tokens})
    picked = [0, 1, 1, 2, 2]
    per_layer = [sum((1000 + 10 * OPS.index(op) + i) for op in OPS[:3])
                 + (2000 + 10 * OPS.index("attn_rope") + i) + (2000 + 10 * OPS.index("mlp_act") + i)
                 for i in picked]
    assert light.step_ms(cells) == pytest.approx(32 * np.array(per_layer, float))


def test_an_moe_model_counts_its_activation_on_its_dense_layers_only(bench):
    """DeepSeek-V3: 61 layers, the first 3 dense (``first_k_dense_replace``): every op but the
    activation runs 61 times a step, the activation 3 times; rows of two models come back in
    their own order."""
    light = bench.LightKernels(_points(), load_models())
    cells = pl.DataFrame({"model": ["deepseek-v3", "llama-3.1-8b"], "tp": [2, 1],
                          "total_tokens": [8, 1]})
    ops = light.layer_ms("deepseek-v3", 2, np.array([8]))
    expected = 61 * sum(ops[op][0] for op in OPS if op != "mlp_act") + 3 * ops["mlp_act"][0]
    got = light.step_ms(cells)
    assert got[0] == pytest.approx(expected)
    assert got[1] == pytest.approx(light.step_ms(cells[1:])[0])


ROW = {"dataset": "h100_silicon", "backend": "all", "n": 288, "sampling_added": 198,
       "sampler_source": "rtx4090",
       "light_source": "vidur h100_sxm", "headline_ttft_mape": 40.8, "light_ttft_mape": 39.1,
       "sampled_ttft_mape": 39.4, "headline_tpot_mape": 15.0, "light_tpot_mape": 8.7,
       "sampled_tpot_mape": 8.2, "headline_tpot_signed_median": -14.5,
       "light_tpot_signed_median": -3.2, "sampled_tpot_signed_median": -2.9,
       "headline_tpot_gap_per_client_us": 40.0, "light_tpot_gap_per_client_us": 31.5,
       "sampled_tpot_gap_per_client_us": None}


def test_the_report_shows_the_rows_and_each_sets_clause(tmp_path):
    path = tmp_path / "light.json"
    assert "No light-kernel benchmark" in light_kernels(path)[0]
    assert light_kernels_measured("h100_silicon", path) is None
    path.write_text(json.dumps({"rows": [ROW, {**ROW, "backend": "vllm", "n": 90}],
                                "code_version": "abc", "date": "2026-12-05", "seconds": 12.0}))
    text = "\n".join(light_kernels(path))
    assert ("| h100_silicon | all | 288 | vidur h100_sxm | 198 | 40.8 / 39.1 / 39.4 | "
            "15.0 / 8.7 / 8.2 | -14.5 / -3.2 / -2.9 | 40.0 / 31.5 / — |") in text
    assert "| h100_silicon | vllm | 90 |" in text
    assert text.index("| all |") < text.index("| vllm |")
    clause = light_kernels_measured("h100_silicon", path)
    assert "(vidur h100_sxm)" in clause
    assert "39.1 % TTFT and 8.7 % TPOT against 40.8 % and 15.0 %" in clause
    assert "-3.2 % against -14.5 %" in clause
    assert "the rtx4090 sampler on 198 of its 288 targets too 39.4 % and 8.2 %" in clause
    assert light_kernels_measured("h200_silicon_fp8", path) is None
    said = unknowns_measured("h100_silicon", None, tmp_path / "none", tmp_path / "none", path)
    assert said.startswith(" Measured: ") and clause in said
    path.write_text(json.dumps({"rows": [{**ROW, "sampling_added": 0}], "code_version": "abc",
                                "date": "2026-12-05", "seconds": 12.0}))
    none_added = light_kernels_measured("h100_silicon", path)
    assert none_added.endswith("no sampler is added, as the replay's host time of every one of "
                               "its runs already holds sampling") and "39.4" not in none_added


def test_only_layers_built_alike_are_read_and_a_replicated_kv_head_counts(bench):
    """Qwen3-235B-A22B at TP 8 holds 64 / 8 query heads and one replicated KV head of its 4:
    rope over (8 + 1) x 128 = 1152 elements a token, Llama-2-70B's at TP 8 exactly (8 + 1),
    where a count that dropped the replica (1024) would take Llama-2-7B's at TP 8 ((4 + 4) x
    128). phi-2 (LayerNorm, parallel block) is never read: MiniMax-M2.5's norms (hidden 3072)
    lie nearer its 2560 than Llama-2-7B's 4096, and read Llama-2-7B's."""
    points = pl.DataFrame([
        {"op": op, "model": model, "tp": tp, "num_tokens": 1, "latency_ms": ms}
        for model, tp, ms in (("llama-2-7b", 8, 1.0), ("llama-2-70b", 8, 2.0), ("phi-2", 1, 3.0))
        for op in OPS if not (model == "phi-2" and op == "post_attention_layernorm")])
    light = bench.LightKernels(points, load_models())
    picks = light._nearest_configs("qwen3-235b-a22b", 8)
    assert picks["attn_rope"] == ("attn_rope", "llama-2-70b", 8)
    assert all(model != "phi-2" for _, model, _ in picks.values())
    assert light._nearest_configs("minimax-m2.5", 8)["input_layernorm"] == \
        ("input_layernorm", "llama-2-7b", 8)
    # hidden 4096: Llama-2-7B's norms (4096), not phi-2's (2560) nor 70B's (8192)
    assert picks["input_layernorm"] == ("input_layernorm", "llama-2-7b", 8)
    with pytest.raises(ValueError, match="no measured light kernels of a layer built as phi-2's"):
        bench.LightKernels(points.filter(pl.col("model") != "phi-2"), load_models()) \
            ._nearest_configs("phi-2", 1)


def test_a_vllm_profile_counts_its_norm_twice_a_layer_and_is_read_for_its_own_gpu(bench):
    """LLMServingSim's vLLM profile times one RMSNorm call, which a layer makes twice, and no
    add: Llama-3.1-8B's 32 layers give 32 x (2 norm + rope + act). A set on the RTX 4090 reads
    the GPU's own profile, one on any other GPU Vidur's H100 points; the v0 profile's ops
    (``input_layernorm`` of another source) are not read."""
    ops = {"layernorm": 1.0, "rotary_emb": 10.0, "act_fn": 100.0, "sampler": 1000.0}
    points = pl.DataFrame([
        {"source": "llmservingsim", "sku": "rtx4090", "op": op, "model": "llama-3.1-8b", "tp": 1,
         "num_tokens": 1, "latency_ms": ms} for op, ms in ops.items()] + [
        {"source": "vidur", "sku": "h100_sxm", "op": "add", "model": "llama-2-7b", "tp": 1,
         "num_tokens": 1, "latency_ms": 5.0}])
    source, own = bench.light_source(points, "rtx4090")
    assert source == "llmservingsim" and set(own["op"]) == {"layernorm", "rotary_emb", "act_fn"}
    light = bench.LightKernels(own, load_models(), bench.LAYER_OPS[source])
    cells = pl.DataFrame({"model": ["llama-3.1-8b"], "tp": [1], "total_tokens": [1]})
    assert light.step_ms(cells) == pytest.approx([32 * (2 * 1.0 + 10.0 + 100.0)])
    source, other = bench.light_source(points, "h200_sxm")
    assert source == "vidur" and other["op"].to_list() == ["add"]


def test_the_sampler_reads_the_nearest_request_count_of_one_profile(bench):
    """Measured at 1, 16 and 256 sequences: 3 requests read 1 (log-nearer than 16), 5 read 16,
    2,000 read 256, the largest. A second profile (another GPU) is never pooled in."""
    points = pl.DataFrame({"sku": "rtx4090", "model": "llama-3.1-8b", "tp": 1,
                           "num_tokens": [256, 1, 16], "latency_ms": [0.3, 0.025, 0.03]})
    sampler = bench.Sampler(points)
    cells = pl.DataFrame({"num_requests": [3, 5, 2000]})
    assert sampler.step_ms(cells) == pytest.approx([0.025, 0.03, 0.3])
    assert sampler.profile == {"sku": "rtx4090", "model": "llama-3.1-8b", "tp": 1}
    with pytest.raises(ValueError, match="expected one sampler profile, found 2"):
        bench.Sampler(pl.concat([points, points.with_columns(sku=pl.lit("rtx_pro_6000"))]))


def test_held_and_other_targets_are_predicted_apart_and_put_back_in_place(bench):
    """Rows 0, 2 and 3 held, 1 and 4 not: each part goes to ``predict`` with its own timer, in
    its own order, and every row gets its own part's answer back (here the row number, plus
    100 for the held timer's)."""
    targets = pl.DataFrame({"run": ["a", "b", "a", "c", "b"]}).with_row_index("_target")
    held = pl.Series([True, False, True, True, False])
    calls = []

    def predict(part, timer):
        calls.append((part["_target"].to_list(), timer))
        at = part["_target"].to_numpy().astype(float)
        return at + (100 if timer == "held" else 0), -at

    ttft, tpot = bench.predict_parts(targets, held, ("held", "other"), predict)
    assert calls == [([0, 2, 3], "held"), ([1, 4], "other")]
    assert ttft.tolist() == [100.0, 1.0, 102.0, 103.0, 4.0]
    assert tpot.tolist() == [-0.0, -1.0, -2.0, -3.0, -4.0]
