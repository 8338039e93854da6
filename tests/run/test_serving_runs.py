"""Serving runs: TTFT and TPOT scored, the oracle's home and points, an FP8 set, a card's oracle
error."""

from __future__ import annotations

import numpy as np
import polars as pl
import probe_predictors
import pytest

from leaderboard.run.evaluate import RunSpec, run
from leaderboard.serving.replay import closed_loop
from leaderboard.serving.scheduler import Policy
from leaderboard_core.specs import load_models
from predictors import registry


@pytest.fixture
def constant(monkeypatch, store_home):
    registry.discover()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    # a module-level class: the sandboxed child imports it by module, as any predictor
    registry.register("two_ms_steps")(probe_predictors.TwoMsSteps)


@pytest.mark.long  # replays all 288 loads of h100_silicon's three backends (about 20 s)
def test_a_serving_run_scores_ttft_and_tpot(constant, tmp_path):
    result = run(RunSpec("two_ms_steps", "h100_silicon", {}, runs_dir=tmp_path / "runs"))
    assert result.metrics["level"] == "serving" and result.metrics["valid"]
    assert set(result.metrics["phases"]) == {"ttft", "tpot", "ttft_steady"}
    ttft = result.predictions.filter(pl.col("phase") == "ttft").sort("workload_id")
    steady = result.predictions.filter(pl.col("phase") == "ttft_steady").sort("workload_id")
    # the steady-state bound is scored against the same measured TTFT
    assert steady["gt_ms"].to_list() == ttft["gt_ms"].to_list()
    tpot = result.predictions.filter(pl.col("phase") == "tpot")
    # Every step is 2 ms; TRT-LLM decodes every running request each step, so its TPOT is
    # exactly 2 ms; SGLang's prefill-only steps stall the decodes they interrupt, and vLLM
    # recomputes what it preempts when the KV cache fills, so theirs are never less.
    trtllm = tpot.filter(pl.col("backend") == "trtllm")["pred_ms"].to_numpy()
    np.testing.assert_allclose(trtllm, 2.0)
    for backend in ("sglang", "vllm"):
        stalled = tpot.filter(pl.col("backend") == backend)["pred_ms"].to_numpy()
        assert (stalled >= 2.0 - 1e-9).all(), backend
    assert (tpot.filter(pl.col("backend") == "sglang")["pred_ms"] > 2.01).any()
    gt = tpot["gt_ms"].to_numpy()
    assert result.metrics["phases"]["tpot"]["median_ape"] == pytest.approx(
        np.median(np.abs(tpot["pred_ms"].to_numpy() - gt) / gt * 100))


def test_the_oracle_fits_on_the_same_gpus_kernels_of_the_sets_precision():
    """The oracle's home is the same GPU's step set of the serving set's precision, read at that
    set's own version (not only the ``_ops`` set's): a GPU with no op grid, or no step set of
    that precision, has none."""
    from leaderboard.run.oracle import oracle_home

    def row(kind, sku, version):
        return {"kind": kind, "sku": sku, "backend_versions": [version]}

    rows = {"h100_silicon": row("serving", "h100_sxm", "0.12.0"),
            "h100_silicon_fp8": row("serving", "h100_sxm", "0.12.0"),
            "rtx4090_serving": row("serving", "rtx4090", "0.10.0"),
            "h100_vidur": row("cells", "h100_sxm", "0.14.0"),
            "h200_vidur": row("cells", "h200_sxm", "0.14.0"),
            "h100_vidur_fp8": row("cells", "h100_sxm", "0.19.0"),
            "h100_sxm_ops": row("ops", "h100_sxm", "0.14.0")}
    rows = {name: {"name": name, **r} for name, r in rows.items()}
    assert oracle_home("h100_silicon", rows) == "h100_vidur"
    assert oracle_home("h100_silicon_fp8", rows) == "h100_vidur_fp8"  # 0.19.0, not the grid's
    assert oracle_home("rtx4090_serving", rows) is None  # no kernel table of the GPU
    # LLMServingSim's profile of the GPU: a vLLM profiler's (a release) serves; v0's does not
    rows["rtx4090_llmservingsim"] = {"name": "rtx4090_llmservingsim",
                                     **row("cells", "rtx4090", "unknown")}
    assert oracle_home("rtx4090_serving", rows) is None
    rows["rtx4090_llmservingsim"]["backend_versions"] = ["0.19.0"]
    assert oracle_home("rtx4090_serving", rows) == "rtx4090_llmservingsim"
    rows["b200_silicon_fp8"] = {**rows["h100_silicon_fp8"], "name": "b200_silicon_fp8",
                                "sku": "b200_sxm"}
    rows["b200_vidur"] = {**rows["h100_vidur"], "name": "b200_vidur", "sku": "b200_sxm"}
    rows["b200_sxm_ops"] = {**rows["h100_sxm_ops"], "name": "b200_sxm_ops", "sku": "b200_sxm"}
    assert oracle_home("b200_silicon_fp8", rows) is None  # no FP8 step set of the B200
    # MoE runs: the FP8 family's version where the GPU has one, else the MoE family's set
    rows["h100_silicon_moe"] = {**rows["h100_silicon_fp8"], "name": "h100_silicon_moe"}
    rows["b200_silicon_moe"] = {**rows["b200_silicon_fp8"], "name": "b200_silicon_moe"}
    rows["h100_vidur_moe"] = {**rows["h100_vidur"], "name": "h100_vidur_moe"}
    assert oracle_home("h100_silicon_moe", rows) == "h100_vidur_fp8"
    assert oracle_home("b200_silicon_moe", rows) is None
    rows["b200_vidur_moe"] = {**rows["b200_vidur"], "name": "b200_vidur_moe",
                              "backend_versions": ["0.19.0"]}
    assert oracle_home("b200_silicon_moe", rows) == "b200_vidur_moe"
    del rows["h100_sxm_ops"]
    assert oracle_home("h100_silicon", rows) is None  # no measured op grid of the GPU
    assert oracle_home("h100_silicon_fp8", rows) is None
    assert oracle_home("h100_silicon_moe", rows) is None


def test_every_shape_reads_the_homes_own_version_and_full_grid_the_grids():
    """``full_grid`` reads the points of the ``_ops`` set's version only; ``every_shape`` (the
    oracle's) those of the home's own version, as the store holds them, at every precision and
    with the fused-MoE points, an MoE family's home included."""
    from leaderboard.run import home_grid, homes

    calls = []

    class Store:
        def op_points_at(self, sku, version):
            calls.append((sku, version))
            return pl.DataFrame({
                "op_family": ["gemm", "gemm", "attention", "attention"],
                "phase": [None, None, "decode", "decode"],
                "dtype": ["fp8", "fp8_block", "bfloat16", "bfloat16"],
                "kv_dtype": [None, None, "bfloat16", "fp8"],
                "m": [8, 8, None, None], "n": [1024, 1024, None, None],
                "k": [8192, 8192, None, None], "batch": [1, 1, 4, 4], "q_len": [None, None, 1, 1],
                "kv_len": [None, None, 512, 512], "num_heads": [None, None, 64, 64],
                "num_kv_heads": [None, None, 8, 8], "head_dim": [None, None, 128, 128],
                "window_size": [None, None, 0, 0], "latency_ms": [0.01, 0.015, 0.02, 0.012],
                "flags": [None] * 4, "sku": [sku] * 4, "backend_version": [version] * 4})

        def moe_points_at(self, sku, version):
            return pl.DataFrame({"dtype": ["fp8_block"], "num_tokens": [64], "hidden_size": [3072],
                                 "inter_size": [1536], "topk": [8], "num_experts": [256],
                                 "moe_tp": [1], "moe_ep": [4], "sku": [sku], "version": [version],
                                 "latency_ms": [0.3]})

        def collective_points(self, sku, version):
            return pl.DataFrame({"backend": ["vllm_graph"], "message_bytes": [4096],
                                 "num_gpus": [2], "sku": [sku], "version": [version],
                                 "latency_ms": [0.005]})

    row = {"name": "h100_vidur_fp8", "sku": "h100_sxm", "backend_versions": ["0.19.0"]}
    ops = {"name": "h100_sxm_ops", "sku": "h100_sxm", "backend_versions": ["0.14.0"]}
    rows = {"h100_vidur_fp8": row, "h100_sxm_ops": ops}
    assert homes.points_of("full_grid", [row], rows) == "behind_cells"
    assert homes.points_of("every_shape", [row], rows) == "every_shape"
    grid = home_grid.full_grid(Store(), row, None, {}, "fp8")
    assert calls == [("h100_sxm", "0.19.0")]
    assert grid["gemm_qkv"]["version"].to_list() == ["0.19.0"] * 2
    assert grid["gemm_qkv"]["dtype"].to_list() == ["fp8", "fp8_block"]  # every precision
    # every KV dtype the oracle keys on (the fp8_kv engine choice reads the FP8-KV points)
    assert grid["attn_decode"].select("kv_dtype", "latency_ms").rows() == [("bfloat16", 0.02),
                                                                          ("fp8", 0.012)]
    assert grid["allreduce"]["num_gpus"].to_list() == [2]
    assert grid["moe"].select("dtype", "moe_ep", "latency_ms").row(0) == ("fp8_block", 4, 0.3)
    configs = home_grid.full_grid(Store(), {**row, "backend_versions": ["0.14.0"]},
                                  [("llama-3.1-70b", 1)], load_models(), "fp8")
    assert "moe" not in configs  # the grid of a home's configurations has no experts
    # its cells hold a BF16 cache, and predictors other than the oracle do not key on it
    assert configs["attn_decode"]["kv_dtype"].to_list() == ["bfloat16"]
    moe_home = {"name": "h100_vidur_moe", "sku": "h100_sxm", "backend_versions": ["0.14.0"]}
    rows["h100_vidur_moe"] = moe_home
    assert homes.points_of("every_shape", [moe_home], rows) == "every_shape"
    assert homes.points_of("full_grid", [moe_home], rows) == "behind_cells"  # experts off the grid
    del rows["h100_sxm_ops"]
    assert homes.points_of("every_shape", [moe_home], rows) == "behind_cells"  # no tables
    empty = type("Empty", (Store,), {"op_points_at": lambda self, sku, version:
                                     Store.op_points_at(self, sku, version).clear()})
    with pytest.raises(ValueError, match="has no h100_sxm GEMM and attention points at version 0.19.0"):
        home_grid.full_grid(empty(), row, None, {}, "fp8")


def test_an_fp8_serving_set_replays_fp8_steps_and_a_bf16_only_predictor_declines(store_home,
                                                                                  tmp_path):
    from leaderboard_core.contract import NotSupported

    seen = []

    class Spy:
        def __call__(self, cells):
            seen.append(set(cells["gemm_dtype"]))
            return np.full(len(cells), 2.0)

    policy = Policy("chunked_mixed", 64, 16, 1000, "on_demand")
    closed_loop(policy, 8, 3, 2, 4, "llama-3.1-70b", 2, Spy(), gemm_dtype="fp8",
                idle_burst="first_alone")
    assert seen == [{"fp8"}]
    with pytest.raises(NotSupported, match="prices bf16 GEMMs only; dataset h200_silicon_fp8"):
        run(RunSpec("genz", "h200_silicon_fp8", {}, runs_dir=tmp_path / "runs"))


@pytest.mark.slow
@pytest.mark.long
def test_a_serving_card_ends_with_its_current_oracle_runs_error(store_home, tmp_path):
    """``data card`` of a serving set: before an oracle run it names the command; after one,
    it states the oracle's TTFT MAPE, the mean over the run's own predictions recomputed here;
    a set with no step set of its GPU and precision says it has no oracle."""
    from leaderboard import data

    runs = tmp_path / "runs"
    where = {"sources_root": None, "gpu_specs": None}
    before = data.card("gb200_silicon", runs, **where)
    assert ("No current oracle run of gb200_silicon" in before
            and "dataset.home=gb200_vidur split.home_points=every_shape" in before)
    result = run(RunSpec("table_scaled", "gb200_silicon", {}, runs_dir=runs,
                         home="gb200_vidur", home_points="every_shape"))
    assert result.metrics["valid"]
    ttft = result.predictions.filter(pl.col("phase") == "ttft")
    mape = float((abs(ttft["pred_ms"] / ttft["gt_ms"] - 1)).mean() * 100)
    after = data.card("gb200_silicon", runs, **where)
    row = next(line for line in after.splitlines() if line.startswith("| gb200_silicon | 2 |"))
    assert [x.strip() for x in row.strip("|").split("|")][2] == f"{mape:.1f}"
    assert "has no oracle" in data.card("b200_silicon_fp8", runs, **where)


def test_every_shape_is_refused_to_any_predictor_but_the_oracles():
    """``every_shape`` pools every precision of a GPU's tables; a predictor that does not key
    them by dtype would fit bf16 and FP8 kernels as one, so the run is refused up front."""
    from leaderboard.run.run_inputs import load_inputs

    with pytest.raises(ValueError, match="every_shape is the serving oracle's .*run predictor=rf "
                                         "with split.home_points=full_grid"):
        load_inputs(RunSpec("rf", "h100_silicon", {}, home="h100_vidur", home_points="every_shape"))
