"""Mixture-of-experts: model shapes against the measured tables, the ``_vidur_moe`` cells
recomputed from the raw upstream parquet rows, memory with every expert, and predictors that do
not price MoE layers answering NotSupported before they run."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import yaml
from conftest import requires_shared
from test_cells_vidur import AIC, _cells, _one, _raw, attention_and_allreduce

from leaderboard.cells import memory
from leaderboard.cells.vidur_method import CONFIG
from leaderboard.run.run_inputs import require_card_scope
from leaderboard_core import specs
from leaderboard_core.contract import NotSupported, PredictorCard
from leaderboard_core.specs import load_models
from tests.predictors.test_rooflines import cells as _moe_cells

MOE_SETS = ["h100_vidur_moe", "h200_vidur_moe", "b200_vidur_moe", "gb200_vidur_moe"]
POWER_LAW_SETS = ["a100_vidur_moe_powerlaw", "h100_vidur_moe_powerlaw", "l40s_vidur_moe_powerlaw"]


def _moe_raw(sku: str, version: str, routing: str = "balanced") -> pl.DataFrame:
    return pl.read_parquet(AIC / sku / f"moe/vllm/{version}/moe_perf.parquet").filter(
        moe_dtype="bfloat16", moe_ep_size=1, distribution=routing)


def _moe_configs() -> list[dict]:
    return yaml.safe_load(CONFIG.read_text())["families"]["vidur_moe"]["configs"]


def _recompute(cell: dict, raw, moe: pl.DataFrame, model: dict) -> float:
    """One MoE cell from its workload and the raw rows: QKV and O GEMMs, the attention kernels,
    one fused-MoE row and two all-reduces per layer (every layer of these models is MoE)."""
    gemm, attn, ar = raw
    tp, t, h, d = cell["tp"], sum(cell["q_lens"]), model["hidden_size"], model["head_dim"]
    heads, kvh = model["num_heads"] // tp, model["num_kv_heads"] // tp
    layer = _one(gemm, m=t, n=(heads + 2 * kvh) * d, k=h) + _one(gemm, m=t, n=h, k=heads * d)
    layer += _one(moe, num_tokens=t, hidden_size=h, inter_size=model["moe_intermediate_size"],
                  topk=model["experts_per_token"], num_experts=model["num_experts"],
                  moe_tp_size=tp)
    return model["num_layers"] * (layer + attention_and_allreduce(cell, attn, ar, model))


@requires_shared
def test_hand_computed_mixtral_decode_cell(real_store):
    """A Mixtral-8x7B TP2 decode cell on H100, every number read from the parquet files."""
    cell = _cells(real_store, "h100_vidur_moe").filter(
        model="mixtral-8x7b", tp=2, phase="decode").sort("cell_id").row(0, named=True)
    gemm, attn, ar = _raw("h100_sxm", "0.14.0")
    moe = _moe_raw("h100_sxm", "0.14.0")
    t, ctx = cell["total_tokens"], max(cell["ctx_lens"])
    # Mixtral-8x7B: hidden 4096, 32 q / 8 kv heads of 128, 8 experts of 14336, top-2, 32 layers.
    per_layer = (_one(gemm, m=t, n=3072, k=4096) + _one(gemm, m=t, n=4096, k=2048)
                 + _one(moe, num_tokens=t, hidden_size=4096, inter_size=14336, topk=2,
                        num_experts=8, moe_tp_size=2)
                 + _one(attn["generation"], batch_size=t, step=ctx, num_heads=16,
                        num_key_value_heads=4)
                 + 2 * _one(ar, num_gpus=2, message_size=t * 4096))
    assert cell["gt_ms"] == pytest.approx(32 * per_layer, rel=1e-9)
    ops = {op for (op,) in real_store.sql(
        f"SELECT DISTINCT op FROM cell_lineage WHERE cell_id = '{cell['cell_id']}' "
        "AND dataset = 'h100_vidur_moe'")}
    assert ops == {"gemm_qkv", "gemm_o", "moe", "attn_decode", "allreduce"}


@requires_shared
def test_random_moe_cells_recomputed_from_raw_parquet(real_store):
    models, rng = load_models(), random.Random(3)
    for name in [*MOE_SETS, *POWER_LAW_SETS]:
        cells = _cells(real_store, name)
        sku, version = cells["sku"][0], cells["backend_version"][0]
        raw, moe = _raw(sku, version), _moe_raw(sku, version, cells["moe_routing"][0])
        for i in rng.sample(range(len(cells)), 4):
            cell = cells.row(i, named=True)
            assert cell["gt_ms"] == pytest.approx(
                _recompute(cell, raw, moe, models[cell["model"]]), rel=1e-9), (name, cell["cell_id"])


@requires_shared
def test_moe_sets_meet_the_floor_and_the_a100_has_none(real_store):
    for name in MOE_SETS:
        cells = _cells(real_store, name)
        assert len(cells) >= 1000 and (cells["gt_kind"] == "gpu_block").all(), name
        assert set(cells["model"]) == {c["model"] for c in _moe_configs()}, name
    names = {n for (n,) in real_store.sql("SELECT name FROM datasets")}
    assert "a100_vidur_moe" not in names  # no balanced table at 0.14.0, none later


@requires_shared
def test_every_composed_model_shape_is_one_the_tables_time():
    """aiconfigurator timed each MoE model's own expert shape; a wrong field in conf/model
    (expert count, top-k, expert width) would find no table."""
    moe = pl.read_parquet(AIC / "h100_sxm/moe/vllm/0.14.0/moe_perf.parquet")
    measured = set(moe.select("hidden_size", "inter_size", "topk", "num_experts").unique()
                   .iter_rows())
    models = load_models()
    for name in {c["model"] for c in _moe_configs()} | {"qwen3-235b-a22b", "minimax-m2.5",
                                                         "deepseek-v3", "kimi-k2.5"}:
        m = models[name]
        assert (m["hidden_size"], m["moe_intermediate_size"], m["experts_per_token"],
                m["num_experts"]) in measured, name


def test_published_expert_counts():
    """The experts and top-k of each model, as its published config.json states them."""
    published = {"mixtral-8x7b": (8, 2, 0), "mixtral-8x22b": (8, 2, 0),
                 "qwen3-30b-a3b": (128, 8, 0), "qwen3-235b-a22b": (128, 8, 0),
                 "minimax-m2.5": (256, 8, 0), "deepseek-v3": (256, 8, 1), "kimi-k2.5": (384, 8, 1),
                 "gpt-oss-120b": (128, 4, 0)}  # num_local_experts 128, num_experts_per_tok 4
    models = load_models()
    for name, want in published.items():
        m = models[name]
        assert (m["num_experts"], m["experts_per_token"], m["shared_experts"]) == want, name
    assert {n for n, m in models.items() if specs.is_moe(m)} == set(published)


def test_weights_count_every_expert():
    """Total parameters as published: Mixtral-8x7B 46.7 B, Qwen3-30B-A3B 30.5 B (bf16 bytes)."""
    models = load_models()
    assert memory.weight_bytes(models["mixtral-8x7b"], 1) / 2 == pytest.approx(46.7e9, rel=0.01)
    assert memory.weight_bytes(models["qwen3-30b-a3b"], 1) / 2 == pytest.approx(30.5e9, rel=0.01)
    # TP shards every expert: two GPUs hold half of the layers' weights each.
    m = models["mixtral-8x7b"]
    assert memory.layer_weight_bytes(m, 2) == pytest.approx(memory.layer_weight_bytes(m, 1) / 2,
                                                            rel=1e-3)


@pytest.mark.parametrize("change, message", [
    ({"num_experts": None}, "needs all of"),
    ({"experts_per_token": 9}, "experts_per_token = 9"),
    ({"dense_layers": 32}, "leaves no MoE layer"),
    ({"attention": "sparse"}, "attention = 'sparse'"),
    ({"attention": "mla"}, "an MLA model needs"),
    ({"fp8_scaling": "blocks"}, "fp8_scaling = 'blocks' is not one of tensor, block. Did you mean 'block'"),
])
def test_bad_moe_fields_name_the_field(change, message):
    model = dict(load_models()["mixtral-8x7b"])
    for key, value in change.items():
        if value is None:
            model.pop(key)
        else:
            model[key] = value
    with pytest.raises(specs.SpecError, match=message):
        specs._validate_layers(Path("conf/model/x.yaml"), model)


def _inputs(model: str) -> SimpleNamespace:
    cells = pl.DataFrame({"model": [model], "gemm_dtype": ["bf16"]})
    return SimpleNamespace(target_row={"name": "t"}, target=cells, home_rows=[{"name": "h"}],
                           home=SimpleNamespace(cells=cells, models=load_models()))


def test_a_dense_card_is_not_supported_on_moe_models():
    dense = PredictorCard(kind="analytical", reference="r", description="d",
                          needs_profiled_rows=False)
    card = {"precisions": list(dense.precisions), "layers": list(dense.layers)}
    with pytest.raises(NotSupported, match="mixture-of-experts models \\(mixtral-8x7b\\)"):
        require_card_scope("p", card, _inputs("mixtral-8x7b"))
    require_card_scope("p", card, _inputs("qwen3-8b"))  # dense: fine
    require_card_scope("p", {**card, "layers": ["dense", "moe"]}, _inputs("mixtral-8x7b"))
    with pytest.raises(ValueError, match="not among"):
        PredictorCard(kind="analytical", reference="r", description="d",
                      needs_profiled_rows=False, layers=("ssm",))


@requires_shared
def test_ours_moe_op_within_its_band_on_the_home(real_store):
    """ours prices the fused-MoE kernel from physics only: on the H100 cells its median
    predicted/measured MoE time per cell lies within x0.8-x1.25 (measured: 1.04)."""
    from leaderboard.cells.schema import CELL_SCHEMA
    from leaderboard_core.contract import Home
    from leaderboard_core.specs import load_gpu_specs
    from predictors.ours import Ours

    cells = _cells(real_store, "h100_vidur_moe")
    lineage = pl.DataFrame(real_store.sql(
        "SELECT cell_id, latency_ms * count FROM cell_lineage WHERE dataset = 'h100_vidur_moe' "
        "AND op = 'moe'"), schema=["cell_id", "ms"], orient="row")
    gpus = load_gpu_specs()
    model = Ours().fit(Home("a100_sxm", gpus["a100_sxm"], "a100_vidur", pl.DataFrame(schema=CELL_SCHEMA)))
    predicted = model.predict_by_op(cells.drop("gt_ms"), gpus["h100_sxm"])["moe"]
    ratio = pl.DataFrame({"cell_id": cells["cell_id"], "p": predicted}).join(lineage, on="cell_id")
    assert 0.8 < float(np.median(ratio["p"] / ratio["ms"])) < 1.25


def test_liminal_prices_a_mixtral_decode_at_its_active_experts_by_hand():
    """Mixtral-8x7B TP2, 4 decodes at 1,000 tokens of context, on the H100: memory-bound. Per
    layer the attention weights, the touched experts' weights (4 tokens x top-2 = 8 rows touch
    all 8 experts) and the KV cache are read; the sync is two ring all-reduces with tau 0."""
    from leaderboard_core.specs import load_gpu_specs
    from predictors.liminal import Liminal

    h100 = load_gpu_specs()["h100_sxm"]
    model = Liminal()
    model.tau_sync_s_ = 0.0
    pred = model.predict(_moe_cells(("mixtral-8x7b", 2, [1] * 4, [1000] * 4)), h100)[0]
    attention_w = 4096 * (16 + 2 * 4) * 128 + 16 * 128 * 4096
    experts_w = 8 * 3 * 4096 * (14336 // 2)
    kv = 2 * 4 * 1000 * 4 * 128
    memory_s = 2 * (attention_w + experts_w + kv) / 3350e9
    link = 900e9 / 2  # one direction of the H100's 900 GB/s NVLink
    sync_s = 2 * (2 * (2 - 1) / 2 * 2 * 4 * 4096 / link)
    assert pred == pytest.approx(32 * (memory_s + sync_s) * 1e3, rel=1e-9)


def test_genz_routes_every_token_through_top_k_experts():
    """A prefill of 4,096 tokens on Qwen3-30B-A3B (TP1) is compute-bound: GenZ's expert MACs are
    tokens x top-k x 3 x hidden x width, its attention projections tokens x (qkv + o) x hidden,
    and no dense FFN runs (every layer is MoE)."""
    from leaderboard_core.specs import load_gpu_specs
    from predictors.genz import operator_table
    from predictors.steps import Steps

    h100 = load_gpu_specs()["h100_sxm"]
    table = operator_table(Steps.from_cells(_moe_cells(("qwen3-30b-a3b", 1, [4096], [0]))), h100)
    h, t = 2048, 4096
    expert_macs = t * 8 * 3 * h * 768
    projection_macs = t * (32 + 2 * 4) * 128 * h + t * h * 32 * 128
    attention_macs = 2 * 32 * 128 * t * t  # Logit + Attend, no causal halving (GenZ)
    flops = 2 * (expert_macs + projection_macs + attention_macs) * 48
    assert float(table.compute_s.sum()) == pytest.approx(flops / 989.4e12, rel=1e-9)


def _silicon_row(**change) -> dict:
    row = {"mode": "agg", "model": "minimax-m2.5", "precision": "fp8", "backend": "vllm",
           "sku": "h200_sxm", "tp": 4, "pp": 1, "attention_dp": 1, "moe_ep": 1,
           "concurrency": 8, "batch_size": 8}
    return {**row, **change}


@pytest.mark.parametrize("change, says", [
    ({}, None),
    ({"moe_ep": 4, "moe_tp": 1}, None),  # experts spread whole over the attention's 4 GPUs
    ({"moe_ep": 2, "moe_tp": 2}, "experts over TP2 x EP2 beside attention over TP4"),
    ({"moe_ep": 4, "moe_tp": 1, "tp": 2}, "experts over TP1 x EP4 beside attention over TP2"),
    ({"backend": "sglang"}, "MoE on sglang"),
    ({"model": "kimi-k2.5", "precision": "int4"}, "MLA attention and 1 shared experts"),
    ({"model": "qwen3-235b-a22b", "tp": 1}, "weights alone above 90% of TP1 x 141 GiB"),
    ({"model": "qwen3-235b-a22b", "tp": 2}, None),  # 235 GB of FP8 on two 141 GiB GPUs
    ({"model": "qwen3-235b-a22b", "tp": 2, "moe_tp": 4}, "experts over TP4 beside attention"),
    # its sliding window is refused before its MXFP4 (FP4) experts; TRT-LLM before either
    ({"model": "gpt-oss-120b", "precision": "fp4", "tp": 1}, "sliding-window attention"),
    ({"model": "gpt-oss-120b", "precision": "fp8", "backend": "trtllm"}, "MoE on trtllm"),
    ({"model": "gpt-oss-120b", "precision": "fp8", "tp": 2}, "sliding-window attention"),
    # a dense row whose TP does not shard its heads is left out with the reason, not a crash
    ({"model": "llama-3.1-8b", "precision": "bf16", "tp": 3},
     "32 attention heads, which TP 3 does not divide"),
])
def test_which_moe_serving_runs_are_replayed(change, says):
    from leaderboard.cells.serving_targets import exclusion
    from leaderboard_core.specs import load_gpu_specs

    why = exclusion(_silicon_row(**change), load_gpu_specs(), load_models())
    assert why == says if says is None else says in why


@requires_shared
def test_moe_serving_sets_hold_replayable_moe_runs_only(real_store):
    models = load_models()
    rows = real_store.sql("SELECT dataset, model, precision, backend, count(*) FROM "
                          "serving_targets WHERE dataset LIKE '%_silicon_moe' GROUP BY ALL")
    # H100's are its expert-parallel MiniMax-M2.5 runs (TP4, EP4)
    assert {r[0] for r in rows} == {"h100_silicon_moe", "h200_silicon_moe", "b200_silicon_moe"}
    assert all(specs.is_moe(models[m]) and p == "fp8" and b == "vllm" for _, m, p, b, _ in rows)
    dense = real_store.sql("SELECT DISTINCT model FROM serving_targets WHERE dataset NOT LIKE "
                           "'%_silicon_moe'")
    assert not any(specs.is_moe(models[m]) for (m,) in dense if m)


@requires_shared
def test_an_moe_serving_card_lists_its_runs_vllm_versions_oldest_first(real_store):
    """The card says which vLLM versions its runs are of (the oracle's tables are of 0.19.0):
    every version of the set's targets with its count, in release order."""
    for dataset in ("h200_silicon_moe", "b200_silicon_moe"):
        counts = real_store.sql("SELECT backend_version, count(*) FROM serving_targets WHERE "
                                f"dataset = '{dataset}' GROUP BY ALL")
        in_order = sorted(counts, key=lambda row: [int(x) for x in row[0].split(".")])
        (card,) = real_store.sql(f"SELECT card FROM datasets WHERE name = '{dataset}'")[0]
        listed = ", ".join(f"{version} ({n})" for version, n in in_order)
        assert f"This set's runs by vLLM version (count): {listed}." in card
        assert len(in_order) > 1  # the ordering is tested on more than one version


def _run(predictor, dataset, family, split, mape=None, why=None):
    import json
    phases = {} if mape is None else {p: {"mape": mape, "n": 10}
                                      for p in ("all", "prefill", "decode", "ttft", "tpot")}
    return {"predictor": predictor, "dataset": dataset, "family": family, "split": split,
            "valid": why is None, "invalid_reasons": [f"NotSupported: {why}"] if why else [],
            "phases": json.dumps(phases)}


def test_the_moe_section_tables_each_family_and_names_who_declines():
    from leaderboard.present import moe as report_moe

    runs = pl.DataFrame([
        _run("ours", "h100_vidur_moe", "vidur_moe", "home_heldout", 12.0),
        _run("ours", "h200_vidur_moe", "vidur_moe", "unseen", 10.0),
        _run("ours", "b200_vidur_moe", "vidur_moe", "unseen", 20.0),
        _run("rf_scaled", "h200_vidur_moe", "vidur_moe", "unseen", why="prices dense layers only"),
    ])
    serving = pl.DataFrame([_run("ours", "h200_silicon_moe", "silicon_moe", "unseen", 27.5)])
    outcomes = {("genz", "h200_silicon_moe"): "not supported: predictor 'genz' prices bf16 GEMMs "
                "only; dataset h200_silicon_moe holds fp8 GEMM steps"}
    text = "\n".join(report_moe.section(runs, serving, outcomes))
    assert "| ours | 12.0 | 20.0 | 10.0 | 15.0 |" in text  # home, b200, h200, their mean
    assert "- rf_scaled: prices dense layers only (1 sets)" in text
    assert "- genz: predictor 'genz' prices bf16 GEMMs only (1 sets)" in text
    assert "| ours | 27.5 / 27.5 |" in text
    assert report_moe.section(runs.head(0), serving.head(0)) == []


@requires_shared
def test_no_kept_cell_needs_more_memory_than_a_server_may_use(real_store):
    """Every cell of the step sets fits: weights (every expert) plus the bf16 KV cache of its
    requests within 90 % of the GPU's memory, recomputed from the model fields by hand; and the
    MoE card counts the workloads dropped for memory."""
    from leaderboard_core.specs import load_gpu_specs

    models, gpus = load_models(), load_gpu_specs()
    for name in ["l40s_vidur", "h100_vidur", *MOE_SETS, "a100_vidur_moe_powerlaw",
                 "l40s_vidur_moe_powerlaw"]:
        cells = _cells(real_store, name)
        limit = 0.9 * gpus[cells["sku"][0]]["mem_gb"] * 2**30
        for cell in cells.iter_rows(named=True):
            m, tp = models[cell["model"]], cell["tp"]
            h, d = m["hidden_size"], m["head_dim"]
            attention = h * (m["num_heads"] + 2 * m["num_kv_heads"]) * d + m["num_heads"] * d * h
            ffn = (m.get("num_experts", 0) + m.get("shared_experts", 0)) * 3 * h * m.get(
                "moe_intermediate_size", 0) + h * m.get("num_experts", 0) if "num_experts" in m \
                else 3 * h * m["intermediate_size"]
            weights = 2 * (m["num_layers"] * (attention + ffn) + 2 * m["vocab_size"] * h) / tp
            tokens = sum(cell["q_lens"]) + sum(cell["ctx_lens"])
            kv = tokens * m["num_layers"] * 2 * max(m["num_kv_heads"] // tp, 1) * d * 2
            assert weights + kv <= limit * 1.0001, (name, cell["cell_id"])
    (card,) = real_store.sql("SELECT card FROM datasets WHERE name = 'h100_vidur_moe'")[0]
    assert "Dropped as impossible:" in card
