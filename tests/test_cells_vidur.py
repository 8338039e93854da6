"""The _vidur step datasets: hand-checked composition, lineage, determinism, coverage."""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import SHARED, requires_shared

from leaderboard.cells import vidur_method
from leaderboard.cells.scheduler import Replay, Request
from leaderboard.cells.snapping import binary_batches, fit, nearest_log
from leaderboard.cells.traces import TraceError, check_rows
from leaderboard.specs import load_models

SIX = ["a100_vidur", "h100_vidur", "h200_vidur", "l40s_vidur", "b200_vidur", "gb200_vidur"]
AIC = SHARED / "ai-dynamo__aiconfigurator/aic-core/src/aiconfigurator_core/systems/data"


def _cells(real_store, name: str) -> pl.DataFrame:
    rows = real_store.sql(f"SELECT * FROM cells WHERE dataset = '{name}'")
    cols = [c[0] for c in real_store.sql("DESCRIBE cells")]
    return pl.DataFrame(rows, schema=cols, orient="row")


@requires_shared
def test_six_gpus_share_workloads_and_meet_the_floor(real_store):
    ids = {}
    for name in SIX:
        cells = _cells(real_store, name)
        assert len(cells) >= 2000, name
        ids[name] = set(cells["workload_id"])
        phases = dict(cells.group_by("phase").len().iter_rows())
        assert phases["decode"] >= 300 and phases["mixed"] >= 300, (name, phases)
        assert (cells["gt_ms"] > 0).all() and (cells["gt_kind"] == "gpu_block").all()
    assert all(v == ids["a100_vidur"] for v in ids.values())


@requires_shared
def test_every_cell_is_the_sum_of_its_lineage(real_store):
    gaps = real_store.sql(
        """SELECT c.dataset, c.cell_id, c.gt_ms, sum(l.latency_ms * l.count) AS s
           FROM cells c JOIN cell_lineage l USING (dataset, cell_id)
           WHERE c.dataset LIKE '%_vidur' GROUP BY ALL HAVING abs(s - c.gt_ms) > 1e-9 * c.gt_ms""")
    assert gaps == []
    orphan = real_store.sql("""SELECT count(*) FROM cells c ANTI JOIN cell_lineage l
                               USING (dataset, cell_id) WHERE c.gt_kind = 'gpu_block'""")
    assert orphan == [(0,)]


@requires_shared
def test_lineage_points_exist_in_the_op_tables(real_store):
    rows = real_store.sql("""SELECT key, latency_ms FROM cell_lineage
                             WHERE dataset = 'h100_vidur' AND table_name = 'gemm' LIMIT 50""")
    for key, latency in rows:
        k = json.loads(key)
        found = real_store.sql(
            f"""SELECT latency_ms FROM gemm WHERE source = 'aiconfigurator' AND sku = '{k['sku']}'
                AND backend_version = '{k['version']}' AND dtype = 'bfloat16'
                AND m = {k['m']} AND n = {k['n']} AND k = {k['k']}""")
        assert found == [(latency,)]


@requires_shared
def test_hand_computed_cell_from_raw_parquet(real_store):
    """One Qwen3-8B TP4 decode cell, recomputed from the upstream parquet files directly."""
    cells = _cells(real_store, "h100_vidur").filter(
        (pl.col("model") == "qwen3-8b") & (pl.col("tp") == 4) & (pl.col("phase") == "decode")
        & ~pl.col("composed"))
    cell = cells.row(0, named=True)
    tokens, ctx = cell["total_tokens"], cell["ctx_lens"][0]
    base = AIC / "h100_sxm"
    gemm = pl.read_parquet(base / "gemm/vllm/0.14.0/gemm_perf.parquet").filter(
        pl.col("gemm_dtype") == "bfloat16")
    gen = pl.read_parquet(base / "attention/vllm/0.14.0/generation_attention_perf.parquet")
    ar = pl.read_parquet(base / "comm/vllm/0.14.0/custom_allreduce_perf.parquet")

    def one(df, **where):
        rows = df.filter(pl.all_horizontal([pl.col(c) == v for c, v in where.items()]))
        return float(rows["latency"].median())

    # qwen3-8b: hidden 4096, 32 q / 8 kv heads of 128, intermediate 12288; TP4 shards.
    per_layer = (one(gemm, m=tokens, n=1536, k=4096) + one(gemm, m=tokens, n=4096, k=1024)
                 + one(gemm, m=tokens, n=6144, k=4096) + one(gemm, m=tokens, n=4096, k=3072)
                 + one(gen, batch_size=tokens, step=ctx, num_heads=8, num_key_value_heads=2,
                       kv_cache_dtype="bfloat16")
                 + 2 * one(ar, num_gpus=4, message_size=tokens * 4096, backend="vllm_graph"))
    assert cell["gt_ms"] == pytest.approx(36 * per_layer, rel=1e-9)


def test_composition_needs_every_point():
    model = load_models()["qwen3-8b"]
    grid = vidur_method.Grid("x", "0")
    assert vidur_method.compose(grid, model, 4, [1, 1], [7, 7]) is None


def test_snapping_rules():
    axes = {"m": [1, 2, 4, 8, 16, 32, 48, 64, 512, 1024], "isl": [1, 16, 32, 512, 1024, 1536],
            "kv": [1, 3, 7, 15, 31]}
    assert nearest_log(5, axes["kv"]) == 7 and nearest_log(2, axes["kv"]) == 3
    # 3 decodes = 3 tokens: not a GEMM m, so the newest is dropped.
    assert fit((), (7, 15, 31), axes, lambda t: t in axes["m"]) == ([1, 1], [7, 15])
    # a lone 1536-token chunk moves down to 1024
    assert fit((1536,), (), axes, lambda t: t in axes["m"]) == ([1024], [0])
    assert binary_batches(7, [1, 2, 4, 8]) == [4, 2, 1]
    assert binary_batches(3, [2, 4]) == []


def test_schedulers_conserve_tokens():
    reqs = [Request(300, 3, 0), Request(100, 2, 0), Request(700, 1, 2)]
    for policy, budget in (("vllm", 1024), ("sarathi", 256)):
        fresh = [Request(r.prompt, r.output, r.arrival_step) for r in reqs]
        steps = list(Replay(policy, budget).steps(fresh))
        prefill = sum(s.q for step in steps for s in step if not s.decode)
        decodes = sum(1 for step in steps for s in step if s.decode)
        assert prefill == 1100 and decodes == 6
        assert all(sum(s.q for s in step) <= budget for step in steps)
        mixed = any(any(s.decode for s in st) and any(not s.decode for s in st) for st in steps)
        assert mixed == (policy == "sarathi")


def test_malformed_trace_row_is_named():
    with pytest.raises(TraceError, match=r"trace 'demo' row 1: prompt tokens = -3"):
        check_rows("demo", [10, -3], [5, 5], [0.0, 1.0])
    with pytest.raises(TraceError, match=r"row 0: arrival = nan"):
        check_rows("demo", [10], [5], [float("nan")])
