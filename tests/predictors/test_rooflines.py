"""Fidelity of the datasheet baselines (genz, genz_calibrated, llm_viewer, liminal) on synthetic
cells, against counts and times worked out by hand from baselines.md §3-§5."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from leaderboard.cells.schema import derive
from leaderboard_core.contract import Home, NotSupported
from leaderboard_core.specs import load_gpu_specs
from predictors import registry
from predictors._roofline import ring_allreduce_s
from predictors.genz import operator_table
from predictors.liminal import Liminal
from predictors.llm_viewer import cell_ops, prefill_request_ops
from predictors.steps import Steps

GPUS = load_gpu_specs()
A100, H100, L40S = GPUS["a100_sxm"], GPUS["h100_sxm"], GPUS["l40s"]
GIB = 2**30


def cells(*steps: tuple[str, int, list[int], list[int]], gt_ms: list[float] | None = None):
    """Cells of (model, tp, q_lens, ctx_lens), with optional ground truth."""
    rows = [{"cell_id": f"c{i}", "workload_id": f"w{i}", "sku": "toy", "model": model, "tp": tp,
             "q_lens": q, "ctx_lens": ctx, "gt_ms": gt_ms[i] if gt_ms else None}
            for i, (model, tp, q, ctx) in enumerate(steps)]
    return derive(pl.DataFrame(rows, schema_overrides={"gt_ms": pl.Float64}))


# A mix of memory-bound decode and compute-bound prefill, so two efficiencies are identifiable.
MIXED_STEPS = [("llama-2-7b", 1, [1] * b, [c] * b) for b in (1, 8, 64) for c in (256, 2048)] + [
    ("llama-3-8b", 4, [q], [0]) for q in (1024, 4096, 8192)] + [
    ("llama-3-8b", 4, [512, 1, 1], [1024, 300, 700])]


# --- LLM-Viewer -------------------------------------------------------------------------------

def test_llm_viewer_counts_llama2_7b_decode_by_hand():
    """b = 1, s = 1024 on Llama-2-7B (h 4096, 32 heads, d 128, f 11008), bf16, TP1."""
    ops = {k: (float(o[0]), float(b[0]))
           for k, (o, b) in cell_ops(Steps.from_cells(cells(("llama-2-7b", 1, [1], [1024])))).items()}
    assert ops["q"] == (2 * 4096 * 4096, 2 * (4096 * 4096 + 4096 + 4096))
    assert ops["k"] == ops["v"] == ops["o"] == ops["q"]  # MHA: k, v and o are h x h too
    assert ops["gate"] == ops["up"] == (2 * 4096 * 11008, 2 * (4096 * 11008 + 4096 + 11008))
    assert ops["down"] == ops["up"]
    assert ops["decode_qk"] == (2 * 1024 * 128 * 32, 2 * (128 * 32 + 1024 * 32 + 1024 * 128 * 32))
    assert ops["decode_sv"] == ops["decode_qk"]
    assert ops["decode_softmax"] == (5 * 32 * 1024, 2 * 2 * 32 * 1024)
    assert ops["attn_norm"] == (7 * 4096, 2 * 2 * 4096)
    assert ops["mlp_add"] == (4096, 2 * 2 * 4096)
    assert ops["mlp_act"] == (2 * 4096, 3 * 2 * 4096)  # the quirk: sized by h, not f
    # Every op is memory-bound on the A100, so the step is L x bytes / 2,039e9 B/s.
    layer_bytes = (4 * 2 * (4096 * 4096 + 2 * 4096) + 3 * 2 * (4096 * 11008 + 4096 + 11008)
                   + 2 * 2 * (128 * 32 + 1024 * 32 + 1024 * 128 * 32) + 2 * 2 * 32 * 1024
                   + 4 * 2 * 2 * 4096 + 3 * 2 * 4096)
    pred = registry.build("llm_viewer").predict(cells(("llama-2-7b", 1, [1], [1024])), A100)
    assert pred[0] == pytest.approx(32 * layer_bytes / 2039e9 * 1e3, rel=1e-12)


def test_llm_viewer_prefill_quirk_and_chunk_adaptation():
    """Llama-3-8B (32 q heads, 8 kv heads): prefill qk loads its queries with n_kv heads; a chunk
    of 256 tokens on 768 cached scores 256 x 1024 pairs against 1024 keys (§4.3)."""
    ops = prefill_request_ops(Steps.from_cells(cells(("llama-3-8b", 1, [512, 256], [0, 768]))))
    flops, moved = ops["prefill_qk"]
    assert flops.tolist() == [2 * 512 * 512 * 128 * 32, 2 * 256 * 1024 * 128 * 32]
    assert moved.tolist() == [2 * (512 * 128 * 8 + 512 * 512 * 32 + 512 * 128 * 8),
                              2 * (256 * 128 * 8 + 256 * 1024 * 32 + 1024 * 128 * 8)]


def test_llm_viewer_ring_allreduce_uses_half_the_pcie_link_in_decimal_gbs():
    step = cells(("llama-3-8b", 4, [1] * 64, [1000] * 64))
    plain = registry.build("llm_viewer").predict(step, L40S)
    with_ar = registry.build("llm_viewer", {"ring_allreduce": True}).predict(step, L40S)
    # 2 per layer x 32 layers of: 5 us + 6 x 1 us + 1.5 x (2 x 64 x 4096 B) / 32e9 B/s.
    per_allreduce = 5e-6 + 6e-6 + 1.5 * 2 * 64 * 4096 / 32e9
    assert (with_ar - plain)[0] == pytest.approx(2 * 32 * per_allreduce * 1e3, rel=1e-12)


# --- GenZ -------------------------------------------------------------------------------------

def test_genz_binary_gbs_scales_memory_bound_time_only():
    decode = cells(("llama-2-7b", 1, [1] * 4, [512, 900, 1500, 3000]))  # every op memory-bound
    prefill = cells(("llama-2-7b", 1, [8192], [0]))  # every op compute-bound
    binary, decimal = registry.build("genz"), registry.build("genz", {"binary_bw": False})
    ratio = decimal.predict(decode, A100) / binary.predict(decode, A100)
    assert ratio[0] == pytest.approx(GIB / 1e9, rel=1e-12)
    assert decimal.predict(prefill, A100)[0] == pytest.approx(binary.predict(prefill, A100)[0],
                                                               rel=1e-12)


def test_ring_allreduce_formula_value():
    # 1 MiB over 4 GPUs at GenZ's H100 link (450 GiB/s), 1 us hop latency, 5 us fixed.
    seconds = ring_allreduce_s(np.array([2.0**20, 2.0**20]), np.array([4.0, 1.0]), 450 * GIB,
                               1e-6, 5e-6)
    assert seconds[0] == pytest.approx(11e-6 + 1.5 / (450 * 1024), rel=1e-12)
    assert seconds[1] == 0.0  # no collective without a TP group


def test_genz_collectives_use_one_direction_of_the_gpu_link():
    table = operator_table(Steps.from_cells(cells(("llama-3-8b", 4, [128], [0]))), H100)
    # H100 NVLink 900 GB/s bidirectional -> 450 per direction, read as GiB/s (GenZ's unit).
    per_allreduce = 5e-6 + 6 * 1e-6 + 1.5 * (2 * 128 * 4096) / (450 * GIB)
    assert table.collective_s[0] == pytest.approx(2 * 32 * per_allreduce, rel=1e-12)


def test_genz_decode_attention_counts_context_not_beam_width():
    """Two decode requests on Llama-2-7B: QKV/O count weights only, attention K+V of 3000 tokens."""
    table = operator_table(Steps.from_cells(cells(("llama-2-7b", 1, [1, 1], [1000, 2000]))), A100,
                           binary_bw=False)
    weight_elements = 4096 * 3 * 4096 + 4096 * 4096
    ffn_elements = (2 * 4096 + 4096 * 22016 + 2 * 22016) + (2 * 11008 + 4096 * 11008 + 2 * 4096)
    kv_elements = 2 * 32 * 128 * 3000
    expected_s = 32 * 2 * (weight_elements + ffn_elements + kv_elements) / 2039e9
    assert table.step_ms(1.0, 1.0)[0] == pytest.approx(expected_s * 1e3, rel=1e-12)


# --- GenZ calibrated --------------------------------------------------------------------------

def synthetic_home(compute_efficiency: float, memory_efficiency: float) -> Home:
    blind = cells(*MIXED_STEPS)
    truth = registry.build("genz", {"compute_efficiency": compute_efficiency,
                                    "memory_efficiency": memory_efficiency}).predict(blind, A100)
    with_truth = cells(*MIXED_STEPS, gt_ms=truth.tolist())
    unmeasured = cells(("llama-2-7b", 1, [1], [100]))  # no gt_ms: must be ignored
    return Home(sku="a100_sxm", gpu=A100, dataset="toy_home",
                cells=pl.concat([with_truth, unmeasured]))


def test_genz_calibrated_recovers_known_efficiencies_from_home_rows():
    fitted = registry.build("genz_calibrated").fit(synthetic_home(0.62, 0.41))
    assert (fitted.compute_efficiency_, fitted.memory_efficiency_) == (0.62, 0.41)
    assert fitted.home_mape_ < 1e-9 and fitted.profiled_rows_ == len(MIXED_STEPS)
    shared = registry.build("genz_calibrated", {"shared_efficiency": True}).fit(
        synthetic_home(0.62, 0.41))
    assert shared.compute_efficiency_ == shared.memory_efficiency_


def test_genz_calibrated_applies_home_efficiencies_to_target_peaks_blind():
    fitted = registry.build("genz_calibrated").fit(synthetic_home(0.62, 0.41))
    target = cells(*MIXED_STEPS, gt_ms=[1.0] * len(MIXED_STEPS))
    other_truth = target.with_columns(gt_ms=pl.col("gt_ms") * 7.0)
    pred = fitted.predict(target, H100)
    np.testing.assert_array_equal(fitted.predict(other_truth, H100), pred)
    same = registry.build("genz", {"compute_efficiency": 0.62, "memory_efficiency": 0.41})
    np.testing.assert_allclose(pred, same.predict(target, H100), rtol=1e-12)


# --- LIMINAL ----------------------------------------------------------------------------------

def fitted_liminal(**params) -> Liminal:
    return registry.build("liminal", params).fit(Home(sku="a100_sxm", gpu=A100, dataset="toy_home",
                                                      cells=cells(*MIXED_STEPS)))


def test_liminal_decode_step_by_hand():
    """Llama-2-7B TP1, two decode requests with contexts 1000 and 3000, on the A100."""
    weights = 4096 * 96 * 128 + 32 * 128 * 4096 + 4096 * 22016 + 11008 * 4096  # elements
    memory_s = 2 * (weights + 2 * 4000 * 32 * 128) / 2039e9
    compute_s = (2 * 2 * weights + 4 * 4000 * 32 * 128) / 312e12
    assert memory_s > compute_s
    pred = fitted_liminal().predict(cells(("llama-2-7b", 1, [1, 1], [1000, 3000])), A100)
    assert pred[0] == pytest.approx(32 * memory_s * 1e3, rel=1e-12)
    assert pred[0] == pytest.approx(7.3806, rel=1e-4)


def test_liminal_tau_sync_is_fitted_on_home_allreduce_points():
    sizes = np.array([2.0**17, 2.0**19, 2.0**21, 2.0**22, 2.0**20, 2.0**18])
    gpus = np.array([2.0, 2.0, 4.0, 4.0, 8.0, 8.0])
    transfer_s = 2 * (gpus - 1) / gpus * sizes / 300e9  # A100: 600 GB/s bidirectional -> 300
    points = pl.DataFrame({"message_bytes": sizes.astype(int), "num_gpus": gpus.astype(int),
                           "latency_ms": (12e-6 + 1.7 * transfer_s) * 1e3})
    home = Home(sku="a100_sxm", gpu=A100, dataset="toy_home", cells=cells(*MIXED_STEPS),
                ops={"allreduce": points})
    fitted = registry.build("liminal").fit(home)
    assert fitted.tau_sync_s_ == pytest.approx(12e-6, rel=1e-6)
    assert fitted.profiled_rows_ == len(points)
    assert fitted_liminal().tau_sync_s_ == pytest.approx(5e-6)  # no points: the default
    # Llama-3-8B TP2, 8 decode requests of 1000 tokens on the H100 (3,350 GB/s, NVLink 450 per
    # direction): per GPU 16 q heads, 4 kv heads, FFN 7168.
    weights = 4096 * 24 * 128 + 16 * 128 * 4096 + 4096 * 2 * 7168 + 7168 * 4096
    memory_s = 2 * (weights + 2 * 8000 * 4 * 128) / 3350e9
    sync_s = 2 * (12e-6 + 2 * 1 / 2 * 2 * 8 * 4096 / 450e9)
    pred = fitted.predict(cells(("llama-3-8b", 2, [1] * 8, [1000] * 8)), H100)
    assert pred[0] == pytest.approx(32 * (memory_s + sync_s) * 1e3, rel=1e-6)


def test_liminal_prefill_is_a_flag_not_a_silent_default():
    decode, mixed = (cells(("llama-3-8b", 4, [1] * 8, [900] * 8)),
                     cells(("llama-3-8b", 4, [512, 1], [0, 900])))
    strict = fitted_liminal(extend_to_prefill=False)
    np.testing.assert_array_equal(strict.predict(decode, H100), fitted_liminal().predict(decode, H100))
    with pytest.raises(NotSupported):
        strict.predict(mixed, H100)
    without_prefill = cells(("llama-3-8b", 4, [1], [900]))
    assert fitted_liminal().predict(mixed, H100)[0] > fitted_liminal().predict(without_prefill, H100)[0]


def test_llm_viewer_times_an_op_level_prefill_point_as_prefill():
    """The op-level sets name the phase ``attn_prefill``: one request of 1024 new tokens must
    get the s^2 score count of prefill (QK and SV: 2*s^2*d*heads each), not decode's s."""
    gpu = load_gpu_specs()["a100_sxm"]
    s, heads, kv_heads, d = 1024, 32, 8, 128
    point = pl.DataFrame({"op_family": ["attention"], "phase": ["attn_prefill"], "m": [None],
                          "n": [None], "k": [None], "batch": [1], "num_heads": [heads],
                          "num_kv_heads": [kv_heads], "head_dim": [d], "q_len": [s],
                          "kv_len": [0]})
    flops = float(gpu["bf16_dense_tflops"]) * 1e12
    qk_s = 2 * s * s * d * heads / flops  # compute-bound at this size on any datasheet
    got_s = registry.build("llm_viewer", {}).predict_ops(point, gpu)[0] / 1e3
    assert got_s >= 2 * qk_s  # QK plus SV at least; the decode reading is ~1000x smaller
