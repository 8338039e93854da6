"""Expert parallelism (``_vidur_moe_ep``): cells recomputed from the raw upstream rows with the
experts spread over the TP group, the collector's token split the family relies on, and the
predictors' per-GPU share of an expert-parallel MoE layer, by hand."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest
import yaml
from conftest import requires_shared
from test_cells_vidur import AIC, _cells, _one, _raw, attention_and_allreduce

from leaderboard.cells.vidur_method import CONFIG
from leaderboard.run.run_inputs import require_card_scope
from leaderboard_core.contract import NotSupported, PredictorCard, expert_groups
from leaderboard_core.specs import load_gpu_specs, load_models
from predictors._roofline import point_seconds
from predictors.steps import Steps
from tests.predictors.test_rooflines import cells as _cells_of

EP_SETS = ["h100_vidur_moe_ep", "h200_vidur_moe_ep", "b200_vidur_moe_ep", "gb200_vidur_moe_ep"]


def _ep_raw(sku: str, version: str) -> pl.DataFrame:
    return pl.read_parquet(AIC / sku / f"moe/vllm/{version}/moe_perf.parquet").filter(
        moe_dtype="bfloat16", moe_tp_size=1, distribution="balanced")


def _family() -> dict:
    return yaml.safe_load(CONFIG.read_text())["families"]["vidur_moe_ep"]


@requires_shared
def test_hand_computed_expert_parallel_mixtral_decode(real_store):
    """A Mixtral-8x7B TP2 decode cell of h100_vidur_moe_ep: per layer the QKV and O GEMMs, the
    decode attention, the fused-MoE row timed with 4 whole experts per GPU (moe_tp 1, moe_ep 2)
    and two all-reduces; every number read from the vLLM 0.19.0 parquet files."""
    cell = _cells(real_store, "h100_vidur_moe_ep").filter(
        model="mixtral-8x7b", tp=2, phase="decode").sort("cell_id").row(0, named=True)
    assert cell["moe_ep"] == 2 and cell["backend_version"] == "0.19.0"
    gemm, attn, ar = _raw("h100_sxm", "0.19.0")
    t, ctx = cell["total_tokens"], max(cell["ctx_lens"])
    per_layer = (_one(gemm, m=t, n=3072, k=4096) + _one(gemm, m=t, n=4096, k=2048)
                 + _one(_ep_raw("h100_sxm", "0.19.0"), num_tokens=t, hidden_size=4096,
                        inter_size=14336, topk=2, num_experts=8, moe_ep_size=2)
                 + _one(attn["generation"], batch_size=t, step=ctx, num_heads=16,
                        num_key_value_heads=4)
                 + 2 * _one(ar, num_gpus=2, message_size=t * 4096))
    assert cell["gt_ms"] == pytest.approx(32 * per_layer, rel=1e-9)
    keys = [k for (k,) in real_store.sql(
        f"SELECT key FROM cell_lineage WHERE dataset = 'h100_vidur_moe_ep' AND op = 'moe' "
        f"AND cell_id = '{cell['cell_id']}'")]
    assert len(keys) == 1 and '"moe_tp":1,"moe_ep":2' in keys[0]


@requires_shared
def test_random_expert_parallel_cells_recomputed_from_raw_parquet(real_store):
    models, rng = load_models(), random.Random(5)
    for name in EP_SETS:
        cells = _cells(real_store, name)
        sku, version = cells["sku"][0], cells["backend_version"][0]
        (gemm, attn, ar), moe = _raw(sku, version), _ep_raw(sku, version)
        assert (cells["moe_ep"] == cells["tp"]).all(), name
        for i in rng.sample(range(len(cells)), 4):
            cell = cells.row(i, named=True)
            model, tp, t = models[cell["model"]], cell["tp"], sum(cell["q_lens"])
            d, h = model["head_dim"], model["hidden_size"]
            heads, kvh = model["num_heads"] // tp, model["num_kv_heads"] // tp
            layer = (_one(gemm, m=t, n=(heads + 2 * kvh) * d, k=h) + _one(gemm, m=t, n=h, k=heads * d)
                     + _one(moe, num_tokens=t, hidden_size=h,
                            inter_size=model["moe_intermediate_size"],
                            topk=model["experts_per_token"], num_experts=model["num_experts"],
                            moe_ep_size=tp))
            expected = model["num_layers"] * (layer + attention_and_allreduce(cell, attn, ar, model))
            assert cell["gt_ms"] == pytest.approx(expected, rel=1e-9), (name, cell["cell_id"])


@requires_shared
def test_the_family_version_times_vllms_expert_parallel_share():
    """At vLLM 0.19.0 the collector runs vLLM's expert-parallel path: all the tokens routed over
    all the experts, one GPU's E / EP computed. So Mixtral at 8192 tokens takes about half the
    EP1 kernel at EP2 and about half the EP4 kernel at EP8 (one expert, T/4 rows, against two
    with T/2), where tokens split ceil(T / EP) per GPU, each to min(top-k, local experts), would
    give about a quarter. H200's 0.14.0 table shows neither (EP2 above EP1): not used."""
    assert _family()["version"] == "0.19.0"

    def mixtral(sku: str, version: str) -> dict[int, float]:
        rows = _ep_raw(sku, version).filter(num_tokens=8192, hidden_size=4096, inter_size=14336,
                                            topk=2, num_experts=8)
        return dict(rows.group_by("moe_ep_size").agg(pl.col("latency").median()).iter_rows())

    for sku in _family()["gpus"]:
        ms = mixtral(sku, "0.19.0")
        assert 0.45 < ms[2] / ms[1] < 0.75 and 0.5 < ms[8] / ms[4] < 0.85, (sku, ms)
    old = mixtral("h200_sxm", "0.14.0")
    assert old[2] / old[1] > 1.0


def test_one_gpus_share_of_an_expert_parallel_layer_by_hand():
    """Mixtral-8x7B TP2, 6 decodes: split over the TP group a GPU routes all 6 tokens over the 8
    experts at width 14336 / 2; spread whole (moe_ep 2) it holds 4 experts at full width and
    gets half the tokens."""
    tp_cell = _cells_of(("mixtral-8x7b", 2, [1] * 6, [500] * 6))
    split = Steps.from_cells(tp_cell).experts_per_gpu()
    spread = Steps.from_cells(tp_cell.with_columns(moe_ep=pl.lit(2))).experts_per_gpu()
    assert (split["tokens"][0], split["experts"][0], split["width"][0]) == (6, 8, 7168)
    assert (spread["tokens"][0], spread["experts"][0], spread["width"][0]) == (3, 4, 14336)


def test_balanced_expert_parallelism_moves_no_roofline_work():
    """Under balanced routing the per-GPU expert work is the same either way: 6 decodes x top-2
    = 12 rows touch all 8 experts of width 7168 (split) or 6 rows touch the 4 local experts of
    width 14336 (spread), the same bytes and FLOPs. So a roofline prices both placements alike
    and only the measured kernels tell them apart (LIMINAL here, by hand as in test_moe)."""
    from predictors.liminal import Liminal

    h100 = load_gpu_specs()["h100_sxm"]
    model = Liminal()
    model.tau_sync_s_ = 0.0
    tp_cell = _cells_of(("mixtral-8x7b", 2, [1] * 6, [500] * 6))
    split = model.predict(tp_cell, h100)[0]
    spread = model.predict(tp_cell.with_columns(moe_ep=pl.lit(2)), h100)[0]
    attention_w = 4096 * (16 + 2 * 4) * 128 + 16 * 128 * 4096
    experts_w = 4 * 3 * 4096 * 14336  # the 4 local experts, whole
    kv = 2 * 6 * 500 * 4 * 128
    link = 900e9 / 2
    sync_s = 2 * (2 * (2 - 1) / 2 * 2 * 6 * 4096 / link)
    by_hand = 32 * (2 * (attention_w + experts_w + kv) / 3350e9 + sync_s) * 1e3
    assert spread == pytest.approx(by_hand, rel=1e-9)
    assert split == pytest.approx(spread, rel=1e-12)


def test_a_measured_expert_parallel_point_is_one_gpus_share():
    """point_seconds of an MoE point timed at moe_ep 2 (tokens split, 4 of 8 experts whole)
    equals, by hand, 4096 tokens / 2 x top-2 rows at full width over the 4 local experts."""
    h100 = load_gpu_specs()["h100_sxm"]
    peak = {"flops": 989.4e12, "mem_bw": 3350e9, "link_bw": 450e9}
    point = pl.DataFrame({"num_tokens": [4096], "hidden_size": [4096], "inter_size": [14336],
                          "topk": [2], "num_experts": [8], "moe_tp": [1], "moe_ep": [2]})
    rows, h, w = 2048 * 2, 4096, 14336
    flop = 2 * rows * h * 3 * w
    byte = 2 * (4 * 3 * h * w + 2 * 4096 * h)
    assert point_seconds("moe", point, peak)[0] == pytest.approx(max(flop / peak["flops"],
                                                                     byte / peak["mem_bw"]))
    assert h100["bf16_dense_tflops"] == pytest.approx(989.4)  # the peak used above


def test_a_card_without_moe_ep_is_not_supported_on_expert_parallel_cells():
    cells = pl.DataFrame({"model": ["mixtral-8x7b"], "gemm_dtype": ["bf16"], "moe_ep": [2]})
    inputs = type("Inputs", (), {"target_row": {"name": "t"}, "target": cells,
                                 "home_rows": [{"name": "h"}],
                                 "home": type("Home", (), {"cells": cells, "models": load_models()})})
    card = {"precisions": ["bf16"], "layers": ["dense", "moe"]}
    with pytest.raises(NotSupported, match="expert-parallel MoE steps"):
        require_card_scope("p", card, inputs)
    require_card_scope("p", {**card, "layers": ["dense", "moe", "moe_ep"]}, inputs)
    split = cells.with_columns(moe_ep=pl.lit(None, pl.Int64))
    inputs.target = inputs.home.cells = split
    require_card_scope("p", card, inputs)  # split over the TP group: 'moe' is enough


def test_forests_learn_one_placement_per_configuration():
    cells = pl.DataFrame({"model": ["mixtral-8x7b"] * 3 + ["qwen3-8b"], "tp": [2, 2, 4, 2],
                          "moe_ep": [2, 2, None, None]})
    assert expert_groups(cells) == {("mixtral-8x7b", 2): 2, ("mixtral-8x7b", 4): 1,
                                    ("qwen3-8b", 2): 1}
    with pytest.raises(ValueError, match="both split over the TP group and spread"):
        expert_groups(cells.with_columns(moe_ep=pl.Series([2, None, None, None])))
    assert np.array_equal(list(expert_groups(cells.drop("moe_ep")).values()), [1, 1, 1])


@requires_shared
def test_mla_models_are_blocked_by_the_collective_grid():
    """Why no DeepSeek-V3 or Kimi-K2.5 cell exists: every collective aiconfigurator timed (on
    each GPU, each version) moves a power-of-two message, while their hidden size 7168 = 7 x
    2^10 makes every TP all-reduce of T tokens T x 14,336 bytes, never a power of two; and at
    TP1 even 1-byte weights exceed every GPU's memory."""
    from leaderboard.cells import memory

    sizes = set()
    for path in AIC.glob("*/comm/*/*/*.parquet"):  # vLLM's all-reduce and NCCL's collectives
        frame = pl.read_parquet(path)
        column = "message_size" if "message_size" in frame.columns else None
        assert column, path  # a new table layout would need reading here
        sizes |= set(frame[column].to_list())
    assert sizes and all(s & (s - 1) == 0 for s in sizes)
    models, gpus = load_models(), load_gpu_specs()
    largest = max(float(g["mem_gb"]) for g in gpus.values())
    for name in ("deepseek-v3", "kimi-k2.5"):
        model = models[name]
        assert model["attention"] == "mla" and model["hidden_size"] == 7 * 2**10, name
        # hidden 7 x 2^10: T tokens' bf16 activations are 7 x 2^11 x T bytes, never 2^k
        assert memory.weight_bytes(model, 1, "fp8") > largest * 2**30, name


def test_an_expert_parallel_serving_run_replays_steps_that_say_so():
    """The replay hands the predictor step cells carrying the run's placement (moe_ep), and
    nothing where the experts are split over the TP group."""
    from leaderboard.serving.simulate import with_expert_placement

    seen = []

    def timer(cells: pl.DataFrame) -> np.ndarray:
        seen.append(cells["moe_ep"].to_list() if "moe_ep" in cells.columns else None)
        return np.ones(len(cells))

    steps = pl.DataFrame({"model": ["minimax-m2.5"] * 2, "tp": [4, 4]})
    with_expert_placement(timer, 4)(steps)
    with_expert_placement(timer, None)(steps)
    with_expert_placement(timer, 1)(steps)
    assert seen == [[4, 4], None, None]


def test_a_learner_is_not_supported_where_home_and_target_place_the_experts_differently():
    from leaderboard.run.run_inputs import require_card_scope as scope

    split = pl.DataFrame({"model": ["mixtral-8x7b"], "tp": [2], "gemm_dtype": ["bf16"],
                          "moe_ep": pl.Series([None], dtype=pl.Int64)})
    spread = split.with_columns(moe_ep=pl.lit(2, pl.Int64))
    models = load_models()

    def inputs(home, target):
        return type("Inputs", (), {"target_row": {"name": "h200_vidur_moe_ep"}, "target": target,
                                   "home_rows": [{"name": "h100_vidur_moe"}],
                                   "home": type("Home", (), {"cells": home, "models": models})})

    layers = ["dense", "moe", "moe_ep"]
    learner = {"precisions": ["bf16"], "layers": layers, "needs_profiled_rows": True}
    with pytest.raises(NotSupported, match="mixtral-8x7b TP2's experts split over the TP group "
                                           "where .* spread whole over 2 GPUs"):
        scope("table_scaled", learner, inputs(split, spread))
    scope("table_scaled", learner, inputs(spread, spread))
    scope("ours", {**learner, "needs_profiled_rows": False}, inputs(split, spread))
    # a serving set runs one configuration both ways (each target its own deployment): a home
    # of one placement cannot price the other's runs, and says so rather than failing
    both = pl.concat([split, spread])
    with pytest.raises(NotSupported, match="spread whole over 2 GPUs"):
        scope("table_scaled", learner, inputs(split, both))
    scope("table_scaled", learner, inputs(both, both))
    card = PredictorCard(kind="profiled", reference="r", description="d",
                         needs_profiled_rows=True, layers=tuple(layers))
    assert card.layers == ("dense", "moe", "moe_ep")
