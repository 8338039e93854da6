"""``ours`` end to end on synthetic cells: registration, ladder, any spec, wall-clock mode."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from leaderboard_core.contract import Home, Reading
from leaderboard_core.specs import GpuSpec, load_gpu_specs
from predictors import registry
from predictors.ours import FACTORS, LADDER, config
from predictors.ours.step import blocks


def cells(rows: list[tuple], kind: str = "gpu_block") -> pl.DataFrame:
    """(model, tp, q_lens, ctx_lens) per row, with the derived columns Steps reads."""
    out = []
    for i, (model, tp, q, c) in enumerate(rows):
        dec = [x for x, y in zip(c, q, strict=True) if y == 1 and x > 0]
        phase = "decode" if len(dec) == len(q) else "prefill" if not dec else "mixed"
        out.append({"cell_id": f"c{i}", "model": model, "tp": tp, "q_lens": q, "ctx_lens": c,
                    "num_requests": len(q), "num_decode": len(dec), "total_tokens": sum(q),
                    "decode_ctx_sum": sum(dec), "phase": phase, "gt_kind": kind})
    return pl.DataFrame(out)


MIX = cells([("llama-3-8b", 4, [1] * 40, [511] * 20 + [1023] * 20),
             ("qwen3-8b", 2, [512, 1, 1], [0, 2047, 15]),
             ("llama-3.2-3b", 1, [4096], [0]),
             ("llama-2-70b", 8, [1] * 3, [600, 700, 900])])


def home(sku="a100_sxm") -> Home:
    return Home(sku=sku, gpu=load_gpu_specs()[sku], dataset="synthetic", cells=MIX)


def test_ours_and_every_rung_are_registered_with_their_switches():
    names = registry.names()
    assert "ours" in names and all(f"ours_{r}" in names for r in LADDER)
    r0 = registry.build("ours_r0_roofline")
    assert not any(r0.get_params().values())
    r3 = registry.build("ours_r3_delivery")
    assert [f for f, on in r3.get_params().items() if on] == list(FACTORS[:3])
    assert all(registry.build("ours").get_params().values())
    assert registry.build("ours_r2_waves", {"l2_memory": True}).l2_memory
    r8, r9 = (registry.build(f"ours_{r}").get_params() for r in ("r8_routing", "r9_fp8"))
    assert not r8["fp8"] and {f for f in r8 if r8[f] != r9[f]} == {"fp8"}
    assert not any(registry.build(f"ours_{r}").fp8 for r in LADDER[:-1])


def test_every_constant_has_a_provenance():
    constants = config.load_constants()
    assert constants["home"]["sku"] == "a100_sxm" and constants["home"]["op_rows"] > 0
    assert 0.5 < constants["clock"]["home_f_clk"] <= 1.0


@pytest.mark.parametrize("name", ["ours", *(f"ours_{r}" for r in LADDER)])
def test_finite_positive_on_every_known_gpu(name):
    model = registry.build(name).fit(home())
    for gpu in load_gpu_specs().values():
        pred = model.predict(MIX, gpu)
        assert pred.shape == (len(MIX),) and np.all(np.isfinite(pred) & (pred > 0)), gpu.sku


def test_a_gpu_the_project_has_never_seen():
    made_up = GpuSpec("ampere_like", {
        "sku": "ampere_like", "arch": "ampere", "sm_count": 84, "boost_clock_mhz": 1700,
        "bf16_dense_tflops": 150.0, "mem_bw_gbs": 900, "l2_mb": 6, "mem_gb": 48,
        "interconnect": {"kind": "pcie", "bw_gbs": 64}}, Path("ampere_like.yaml"))
    unknown_arch = GpuSpec("future", {**made_up.data, "sku": "future", "arch": "rubin"},
                           Path("future.yaml"))
    model = registry.build("ours").fit(home())
    for gpu in (made_up, unknown_arch):
        pred = model.predict(MIX, gpu)
        assert np.all(np.isfinite(pred) & (pred > 0))
    a100 = model.predict(MIX, load_gpu_specs()["a100_sxm"])
    assert np.all(model.predict(MIX, made_up) > a100)  # half the compute, under half the memory


def test_faster_gpu_is_faster_and_h100_h200_compute_ties():
    model = registry.build("ours").fit(home())
    gpus = load_gpu_specs()
    prefill = cells([("llama-3.2-3b", 1, [8192], [0])])
    a100, h100, h200 = (model.predict(prefill, gpus[s])[0] for s in ("a100_sxm", "h100_sxm",
                                                                       "h200_sxm"))
    assert h100 < a100 and h200 <= h100
    assert h200 == pytest.approx(h100, rel=0.05)  # same compute peak: a large prefill nearly ties


def test_a_steps_attention_is_one_kernel_per_kind_timed_as_its_measured_point():
    """A step of 4 prompts of 512 tokens and one of 40 decodes (20 at 511, 20 at 1023 cached) runs
    one prefill kernel of batch 4 and one decode kernel of batch 40 at the mean context, 767:
    per layer, exactly what predict_ops gives those two measured points (llama-3-8b TP4: 8 query
    and 2 KV heads per GPU). A sum of four single-prompt kernels is more: four floors."""
    model, gpu = registry.build("ours").fit(home()), load_gpu_specs()["h100_sxm"]
    step = cells([("llama-3-8b", 4, [512] * 4 + [1] * 40, [0] * 4 + [511] * 20 + [1023] * 20)])
    parts = model.components(step, gpu)
    point = dict(op_family=["attention"] * 3, phase=["attn_prefill", "attn_decode", "attn_prefill"],
                 batch=[4, 40, 1], q_len=[512, 1, 512], kv_len=[0, 767, 0], num_heads=[8] * 3,
                 num_kv_heads=[2] * 3, head_dim=[128] * 3, m=[None] * 3, n=[None] * 3, k=[None] * 3)
    prefill4, decode40, prefill1 = model.predict_ops(pl.DataFrame(point), gpu) / 1e3
    layers = 32
    assert parts["attn_prefill"][0] == pytest.approx(prefill4 * layers, rel=1e-9)
    assert parts["attn_decode"][0] == pytest.approx(decode40 * layers, rel=1e-9)
    assert parts["attn_prefill"][0] < 4 * prefill1 * layers


def test_gpu_block_cells_get_no_wall_clock_terms():
    model = registry.build("ours").fit(home())
    parts = model.components(MIX, load_gpu_specs()["h100_sxm"])
    for term in ("light_kernels", "lm_head", "host_floor"):
        assert not parts[term].any()
    off = registry.build("ours", {"wall_clock": False}).fit(home())
    assert off.predict(MIX, load_gpu_specs()["h100_sxm"]) == pytest.approx(
        model.predict(MIX, load_gpu_specs()["h100_sxm"]))


def test_wall_clock_deploy_reading_recovers_the_host_floor():
    gpu = load_gpu_specs()["h100_sxm"]
    sweep = [("llama-2-70b", 8, [1] * b, [576] * b) for b in (1, 2, 4, 8, 16)]
    other = [("llama-2-70b", 8, [512] * 2, [0, 0]), ("llama-2-70b", 4, [1] * 4, [576] * 4)]
    target = cells(sweep + other, kind="wall_clock")
    model = registry.build("ours").fit(home())
    request = model.request_reading(target, gpu, budget=16)
    assert request.cells == ("c0", "c1", "c2", "c3", "c4")  # only the first config's decode sweep
    assert model.request_reading(target, gpu, budget=3).cells == ("c0", "c2", "c4")  # spread
    truth = model.predict(target, gpu) + 1e3 * (0.02 + 0.0005 * (target["num_requests"].to_numpy() - 1))
    read = target.with_columns(gt_ms=pl.Series(truth)).filter(pl.col("cell_id").is_in(["c0", "c4"]))
    model.take_reading(Reading(read), gpu)
    assert model.host_floor_ == pytest.approx((0.02, 0.0005), rel=1e-6)
    assert model.predict(target, gpu) == pytest.approx(truth)
    assert registry.build("ours").request_reading(MIX, gpu, 16) is None  # none on gpu_block targets
    assert registry.build("ours").request_reading(target, gpu, 0) is None  # nor without a budget


def test_blocks_change_no_prediction():
    """``predict`` times a block of cells at a time; a cell's time must not depend on which
    block it lands in, nor on the mixed wall-clock and gpu_block cells beside it."""
    mixed = pl.concat([MIX, cells([("llama-2-70b", 8, [1] * 3, [600, 700, 900])],
                                  kind="wall_clock")])
    many = pl.concat([mixed] * 48_000)  # 2.4M requests: two blocks of at most 2^21
    assert len(blocks(many["num_requests"].to_numpy())) == 2
    assert blocks(np.array([3, 0, 5]), 4) == [(0, 2), (2, 3)]
    assert blocks(np.array([], dtype=np.int64)) == [(0, 0)]
    model = registry.build("ours").fit(home())
    gpu = load_gpu_specs()["h200_sxm"]
    whole = np.tile(model.predict(mixed, gpu), 48_000)
    assert np.array_equal(model.predict(many, gpu), whole)


def test_device_reads_architecture_and_topology_from_the_datasheet():
    gpus, c = load_gpu_specs(), config.load_constants()
    droop = c["clock"]["home_f_clk"]
    l40s, h100 = config.Device.of(gpus["l40s"], c), config.Device.of(gpus["h100_sxm"], c)
    assert l40s.f_clk == droop  # the home's droop, not another board's reading
    assert l40s.split_kv and not h100.split_kv  # sm89 takes the split-KV path, sm90 does not
    assert (l40s.topology, h100.topology) == ("pcie_host", "nvswitch")
    assert l40s.floor_scale == pytest.approx(1410 / 2520)
    assert h100.floor_scale == pytest.approx(1410 / 1980) and h100.cta_cap == 132
    assert config.Device.of(gpus["a100_sxm"], c).floor_scale == 1.0
    assert config.Device.of(gpus["a40"], c).topology == "nvlink_bridge"
    bad = GpuSpec("x", {**gpus["l40s"].data, "interconnect": {"kind": "pcie", "bw_gbs": 64,
                                                               "topology": "pcie_hots"}},
                  Path("x.yaml"))
    with pytest.raises(ValueError, match="pcie_hots"):
        config.Device.of(bad, c)


def test_predict_ops_times_a_prefill_point_as_prefill():
    """The harness names op phases ``attn_prefill``; a prefill point must be timed as causal
    attention: q=8192, 32 heads of 128 is 4 x 8192 x 4096 x 32 x 128 FLOPs, at least 1.76 ms
    at the A100's 312 TFLOP/s peak."""
    point = pl.DataFrame({"op_family": ["attention"], "phase": ["attn_prefill"], "m": [None],
                          "n": [None], "k": [None], "batch": [1], "q_len": [8192], "kv_len": [0],
                          "num_heads": [32], "num_kv_heads": [8], "head_dim": [128]})
    model = registry.build("ours").fit(home())
    flops = 4 * 8192 * 4096 * 32 * 128
    assert model.predict_ops(point, load_gpu_specs()["a100_sxm"])[0] >= flops / 312e12 * 1e3


READ_CELLS = MIX.with_columns(source=pl.lit("aiconfigurator")).drop("gt_kind")


def test_ours_reading_asks_for_three_groups_of_small_points():
    """On MIX (hand-derived): the pure decode kernels with the least KV to stream (llama-2-70b
    TP8's 3 requests at 2,200 KV tokens x 1 KV head, before llama-3-8b TP4's 40 at 30,700 x 2);
    the GEMMs of the smallest step (3 tokens, llama-2-70b TP8) with the most weights: gate/up
    2 x 28672 / 8 = 7168 x 8192, down 8192 x 28672 / 8 = 3584, QKV (64 + 16) x 128 / 8 = 1280 x
    8192; each TP degree's smallest all-reduce, tokens x hidden x 2 bytes: TP2 514 x 4096,
    TP4 40 x 4096, TP8 3 x 8192. Cells from another source get no request."""
    gpu = load_gpu_specs()["h100_sxm"]
    model = registry.build("ours_reading").fit(home())
    request = model.request_reading(READ_CELLS, gpu, budget=16)
    by_op = [(p["op"], p.get("batch"), p.get("m"), p.get("n"), p.get("k"), p.get("num_gpus"),
              p.get("message_bytes")) for p in request.op_points]
    assert by_op == [("attn_decode", 3, None, None, None, None, None),
                     ("attn_decode", 40, None, None, None, None, None),
                     ("gemm_gate_up", None, 3, 7168, 8192, None, None),
                     ("gemm_down", None, 3, 8192, 3584, None, None),
                     ("gemm_qkv", None, 3, 1280, 8192, None, None),
                     ("allreduce", None, None, None, None, 2, 514 * 4096 * 2),
                     ("allreduce", None, None, None, None, 4, 40 * 4096 * 2),
                     ("allreduce", None, None, None, None, 8, 3 * 8192 * 2)]
    assert len(model.request_reading(READ_CELLS, gpu, budget=5).op_points) == 5
    assert model.request_reading(READ_CELLS.with_columns(source=pl.lit("vidur")), gpu, 16) is None


def _reading_points(model, gpu, op: str) -> pl.DataFrame:
    points = [p for p in model.request_reading(READ_CELLS, gpu, budget=16).op_points
              if p["op"].startswith(op)]
    return pl.DataFrame([{k: v for k, v in p.items() if k != "op"} for p in points])


def _unchanged_but(model, before: dict, changed: dict[tuple[str, str], float]) -> None:
    for section, values in before.items():
        for key, value in values.items():
            if (section, key) in changed:
                assert model.constants_[section][key] == pytest.approx(
                    value * changed[section, key]), (section, key)
            else:
                assert model.constants_[section][key] == value, (section, key)


def test_ours_reading_scales_fixed_costs_from_decode_kernels():
    """Decode kernels measured at their modelled streaming plus twice the modelled fixed costs:
    the five fixed-cost constants (floors and per-CTA costs) double, nothing else moves."""
    gpu = load_gpu_specs()["h100_sxm"]
    model = registry.build("ours_reading").fit(home())
    before = copy.deepcopy({k: v for k, v in model.constants_.items() if isinstance(v, dict)})
    points = _reading_points(model, gpu, "attn_decode").with_columns(q_len=pl.lit(1))
    probe = points.with_columns(op_family=pl.lit("attention"), phase=pl.lit("attn_decode"),
                                **{c: pl.lit(None, pl.Int64) for c in ("m", "n", "k")})
    dev = model.device(gpu)
    work = model.op_seconds(probe, replace(dev, floor_scale=0.0))
    fixed = model.op_seconds(probe, dev) - work
    model.take_reading(Reading(pl.DataFrame(), {"attn_decode": points.with_columns(
        latency_ms=pl.Series((work + 2 * fixed) * 1e3))}), gpu)
    assert model.reading_scales_["fixed_costs"] == pytest.approx(2.0)
    _unchanged_but(model, before, {("attention", k): 2.0 for k in (
        "decode_floor_s", "decode_split_floor_s", "decode_cta_s", "prefill_floor_s",
        "prefill_cta_s")})
    assert config.load_constants()["attention"] == before["attention"]  # the cache is untouched


def test_ours_reading_scales_memory_efficiency_from_memory_bound_gemms():
    """GEMMs measured at their floor plus their modelled streaming time / 1.25 (a target that
    streams 25 % faster than the home's law says): dram and l2 efficiency x 1.25, nothing else;
    the reading's point time is recomputed by hand from bytes, bandwidth and the memory law."""
    gpu = load_gpu_specs()["h100_sxm"]
    model = registry.build("ours_reading").fit(home())
    before = copy.deepcopy({k: v for k, v in model.constants_.items() if isinstance(v, dict)})
    points = _reading_points(model, gpu, "gemm_")
    m, n, k = (points[x].to_numpy().astype(float) for x in ("m", "n", "k"))
    law, dev = before["memory_law"], model.device(gpu)
    moved = 2.0 * (m * k + n * k + m * n)
    x = moved / (gpu["l2_mb"] * 2**20)
    eta = law["dram"] + (law["l2"] - law["dram"]) / (1 + x ** law["p"])
    floor = before["gemm"]["floor_s"] * dev.floor_scale
    measured = floor + moved / (gpu.mem_bw_bytes_per_s * eta) / 1.25
    model.take_reading(Reading(pl.DataFrame(), {"gemm_gate_up": points.with_columns(
        latency_ms=pl.Series(measured * 1e3))}), gpu)
    assert model.reading_scales_["memory"] == pytest.approx(1.25)
    _unchanged_but(model, before, {("memory_law", "dram"): 1.25, ("memory_law", "l2"): 1.25})


def test_ours_reading_scales_collective_latency_from_small_allreduces():
    """All-reduces measured at their volume time plus half the modelled latency: the custom
    floor and NCCL's step latency halve. TP2's 4.2 MB message takes vLLM's one-shot custom
    kernel on an NVSwitch node (below 8 MiB): one floor plus 4210688 / (450 GB/s x
    custom_eta); a message past the one-shot size (512 KiB at TP4, 256 KiB at TP8) runs
    two-shot, or symmetric memory priced the same: two floors plus the ring's 2(P-1)/P."""
    gpu = load_gpu_specs()["h100_sxm"]
    model = registry.build("ours_reading").fit(home())
    before = copy.deepcopy({k: v for k, v in model.constants_.items() if isinstance(v, dict)})
    coll = before["collectives"]
    points = _reading_points(model, gpu, "allreduce").sort("num_gpus")
    size, tp = (points[x].to_numpy().astype(float) for x in ("message_bytes", "num_gpus"))
    link = 450e9  # NVLink 4: 900 GB/s bidirectional, one direction
    one_shot = (tp == 2) | ((tp == 4) & (size < 2**19)) | ((tp == 8) & (size < 2**18))
    volume = np.where(one_shot, tp - 1, 2 * (tp - 1) / tp) * size / link / coll["custom_eta"]
    assert size[0] == 4210688 and (size < 32 * 2**20).all()  # none reaches NCCL on Hopper
    measured = volume + 0.5 * np.where(one_shot, 1, 2) * coll["custom_floor_s"]
    read = points.with_columns(latency_ms=pl.Series(measured * 1e3))
    assert model._latency_need(read, gpu) == pytest.approx([0.5] * len(read))  # each TP's path
    model.take_reading(Reading(pl.DataFrame(), {"allreduce": read}), gpu)
    assert model.reading_scales_["collective_latency"] == pytest.approx(0.5)
    _unchanged_but(model, before, {("collectives", k): 0.5 for k in (
        "custom_floor_s", "nccl_step_s", "nccl_ll_base_s", "nccl_ll_hop_s_nvlink",
        "nccl_ll_hop_s_pcie")})


def test_ours_reading_latency_need_where_nccl_runs_ll():
    """L40S, TP4 and TP8 through the host: 8 KiB all-reduces go to NCCL, whose LL protocol wins
    there. Measured = every latency halved: LL's 6.6 us base and 2(P-1) PCIe hops of 1 us,
    halved, plus LL's volume, the ring's 2(P-1)/P x 8 KiB over 32 GB/s shared by P, at half
    of NCCL's efficiency. The need must read 0.5 on each point, not a blend with Simple's."""
    gpu = load_gpu_specs()["l40s"]
    model = registry.build("ours_reading").fit(home())
    eta = model.constants_["collectives"]["nccl_eta"]
    tp = np.array([4.0, 8.0])
    size = np.full(2, 8192.0)
    volume = tp * 2 * (tp - 1) / tp * size / 32e9 / (eta * 0.5)
    measured = 0.5 * (6.6e-6 + 2 * (tp - 1) * 1e-6) + volume
    points = pl.DataFrame({"message_bytes": size, "num_gpus": tp, "latency_ms": measured * 1e3})
    assert model._latency_need(points, gpu) == pytest.approx([0.5, 0.5])


def test_symm_mem_tables_follow_the_compute_capability():
    """vLLM keys its all-reduce size tables by compute capability: Hopper (9.0) and datacenter
    Blackwell (10.0) take theirs, Ampere (8.0) none."""
    constants, specs = config.load_constants(), load_gpu_specs()
    tables = {sku: config.Device.of(specs[sku], constants).allreduce_tables
              for sku in ("h100_sxm", "b200_sxm", "a100_sxm")}
    assert tables["h100_sxm"]["custom_max_mib"][8] == 0.25
    assert tables["b200_sxm"]["symm_max_mib"][2] == 8
    assert tables["a100_sxm"] == {}


def test_layer_op_ground_truth_is_priced_as_gemms_and_light_kernels(monkeypatch):
    """Cells from Vidur's own profiles (source "vidur") sum one layer's GEMMs and light kernels,
    with no attention kernel and no all-reduce: ours prices exactly that there, and the full
    step elsewhere. Blocks mixing both kinds give every block the same terms."""
    import predictors.ours as ours_module
    from predictors.ours.step import blocks as real_blocks

    gpu = load_gpu_specs()["a100_sxm"]
    model = registry.build("ours").fit(home())
    both = pl.concat([MIX.with_columns(source=pl.lit("vidur")),
                      MIX.with_columns(source=pl.lit("aiconfigurator"))])
    monkeypatch.setattr(ours_module, "blocks", lambda n: real_blocks(n, 50))  # several blocks
    parts = model.components(both, gpu)
    layer_ops = np.arange(len(both)) < len(MIX)
    for name in ("attn_prefill", "attn_decode", "allreduce"):
        assert (parts[name][layer_ops] == 0).all()
    assert (parts["light_kernels"][layer_ops] > 0).all() and (parts["light_kernels"][~layer_ops] == 0).all()
    assert (parts["allreduce"][~layer_ops][MIX["tp"].to_numpy() > 1] > 0).all()
    for name in ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down"):  # the GEMMs are the same
        np.testing.assert_array_equal(parts[name][layer_ops], parts[name][~layer_ops])
    predicted = model.predict(both, gpu) / 1e3
    gemms = sum(parts[k] for k in ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down"))
    np.testing.assert_allclose(predicted[layer_ops], (gemms + parts["light_kernels"])[layer_ops])
    rung = registry.build("ours_r5_floors").fit(home())
    assert set(rung.components(both, gpu)) == set(rung.components(MIX, gpu))


def test_ours_reading_refuses_a_negative_point_count():
    with pytest.raises(ValueError, match=r"gemm_points=-1 is not allowed; gemm_points must be "
                                         r"in \[0, inf\]"):
        registry.build("ours_reading", {"gemm_points": -1})
    none = registry.build("ours_reading", {"decode_points": 0, "gemm_points": 0,
                                           "allreduce_points": 0}).fit(home())
    assert none.request_reading(READ_CELLS, load_gpu_specs()["h100_sxm"], 16) is None


def test_explain_names_the_allreduce_path_and_nccl_protocol():
    """explain's all-reduce row says which path priced it: vLLM's one-shot custom kernel for 40
    tokens x 4,096 x 2 bytes = 320 KiB at TP4 on an A100 switch (below 512 KiB); NCCL through
    the host for 3 x 8,192 x 2 = 48 KiB at TP8 on an L40S, in LL (6.6 + 14 x 1 us plus the
    volume, against Simple's 14 fitted steps). Its time is the step's all-reduce term per call."""
    specs, model = load_gpu_specs(), registry.build("ours").fit(home())
    for i, sku, label in ((0, "a100_sxm", "nvswitch vLLM custom one-shot"),
                          (3, "l40s", "pcie_host NCCL LL")):
        cell, gpu = MIX[i], specs[sku]
        (row,) = [r for r in model.explain(cell, gpu)[0]["rows"] if r["op"].startswith("allreduce")]
        assert row["op"].endswith(label) and row["count"] == "2"
        layers = {"llama-3-8b": 32, "llama-2-70b": 80}[cell["model"][0]]
        assert float(row["us"]) == pytest.approx(
            model.components(cell, gpu)["allreduce"][0] * 1e6 / layers / 2, abs=0.06)
