"""The _vidur and _vidur19 step datasets: one measured kernel per call, recomputed from the raw
upstream parquet rows (never from the builder's lineage), snapping and replay rules by hand."""

from __future__ import annotations

import random

import polars as pl
import pytest
from conftest import SHARED, requires_shared

from leaderboard.cells import vidur_method
from leaderboard.cells.grid import Grid, Point
from leaderboard.cells.scheduler import Replay, Request, requests_from_trace
from leaderboard.cells.snapping import Snapped, StepShape, nearest_log, snap
from leaderboard.cells.traces import TraceError, check_rows
from leaderboard.ingest.tables import TABLES
from leaderboard_core.specs import load_models

SIX = ["a100_vidur", "h100_vidur", "h200_vidur", "l40s_vidur", "b200_vidur", "gb200_vidur"]
FOUR = ["h100_vidur19", "h200_vidur19", "b200_vidur19", "gb200_vidur19"]
AIC = SHARED / "ai-dynamo__aiconfigurator/aic-core/src/aiconfigurator_core/systems/data"


def _cells(real_store, name: str) -> pl.DataFrame:
    rows = real_store.sql(f"SELECT * FROM cells WHERE dataset = '{name}'")
    cols = [c[0] for c in real_store.sql("DESCRIBE cells")]
    return pl.DataFrame(rows, schema=cols, orient="row")


@requires_shared
def test_every_set_meets_the_floor(real_store):
    for name in SIX + FOUR:
        cells = _cells(real_store, name)
        phases = dict(cells.group_by("phase").len().iter_rows())
        assert len(cells) >= 2000 or name in FOUR, name
        assert min(phases.get(p, 0) for p in ("prefill", "decode", "mixed")) >= 300, (name, phases)
        assert (cells["gt_ms"] > 0).all() and (cells["gt_kind"] == "gpu_block").all()
        assert cells["warm_share"].is_between(0, 1).all()


@requires_shared
def test_one_attention_point_per_kind_and_a_uniform_workload(real_store):
    twice = real_store.sql("""SELECT dataset, cell_id, op, count(*) FROM cell_lineage
                              WHERE op LIKE 'attn_%' GROUP BY ALL HAVING count(*) > 1""")
    assert twice == []
    # The workload is what was measured: one decode context and one prompt length per cell.
    mixed_lengths = real_store.sql(
        """SELECT dataset, cell_id FROM (SELECT dataset, cell_id, unnest(q_lens) AS q,
                  unnest(ctx_lens) AS c FROM cells WHERE dataset LIKE '%_vidur%')
           GROUP BY ALL HAVING count(DISTINCT c) FILTER (q = 1 AND c > 0) > 1
               OR count(DISTINCT q) FILTER (NOT (q = 1 AND c > 0)) > 1
               OR max(c) FILTER (NOT (q = 1 AND c > 0)) > 0""")
    assert mixed_lengths == []


@requires_shared
def test_mixed_steps_are_labelled_composed_and_counted_in_the_card(real_store):
    """A cell holding both a prompt (from an empty cache) and a decode is composed of two
    separately timed attention points, which V1's FlashAttention runs as one kernel."""
    for name in [*SIX, *FOUR, "h100_vidur_fp8"]:
        cells = _cells(real_store, name)
        both = [any(q == 1 and c > 0 for q, c in zip(qs, cs, strict=True))
                and any(not (q == 1 and c > 0) for q, c in zip(qs, cs, strict=True))
                for qs, cs in zip(cells["q_lens"], cells["ctx_lens"], strict=True)]
        assert cells["composed"].to_list() == both, name
        two_kinds = {cid for (cid,) in real_store.sql(
            f"""SELECT cell_id FROM cell_lineage WHERE dataset = '{name}' AND op LIKE 'attn_%'
                GROUP BY cell_id HAVING count(DISTINCT op) = 2""")}
        assert set(cells.filter("composed")["cell_id"]) == two_kinds, name
        assert 300 <= sum(both) < len(cells), name
        (card,) = real_store.sql(f"SELECT card FROM datasets WHERE name = '{name}'")[0]
        assert f"({sum(both)} here)" in card and "labelled `composed`" in " ".join(card.split())


@requires_shared
def test_every_lineage_row_names_exactly_one_measured_row(real_store):
    for table in ("gemm", "attention", "collective", "moe"):
        cols = TABLES[table].key
        on = " AND ".join(f"(k.key->>'{c}') IS NOT DISTINCT FROM t.\"{c}\"::VARCHAR" for c in cols)
        counts = real_store.sql(
            f"""WITH k AS (SELECT DISTINCT key FROM cell_lineage WHERE table_name = '{table}'
                           AND dataset LIKE '%_vidur%')
                SELECT k.key, count(t.latency_ms) FROM k LEFT JOIN "{table}" t ON {on}
                GROUP BY k.key HAVING count(t.latency_ms) <> 1 LIMIT 5""")
        assert counts == [], (table, counts)
        keys = real_store.sql(f"SELECT key FROM cell_lineage WHERE table_name = '{table}' LIMIT 1")
        assert all(f'"{c}"' in keys[0][0] for c in ("dtype", "sku", "backend_version", *(
            ("kv_dtype",) if table == "attention" else ())))


def _raw(sku: str, version: str, gemm_dtype: str = "bfloat16"):
    base = AIC / sku
    gemm = pl.read_parquet(base / f"gemm/vllm/{version}/gemm_perf.parquet").filter(
        gemm_dtype=gemm_dtype)
    attn = {p: pl.read_parquet(base / f"attention/vllm/{version}/{p}_attention_perf.parquet")
            .filter(attn_dtype="bfloat16", kv_cache_dtype="bfloat16", head_dim=128)
            for p in ("context", "generation")}
    ar = pl.read_parquet(base / f"comm/vllm/{version}/custom_allreduce_perf.parquet").filter(
        backend="vllm_graph", allreduce_dtype="bfloat16")
    return gemm, attn, ar


def _one(df: pl.DataFrame, **where) -> float:
    rows = df.filter(**where)
    if "window_size" in rows.columns:
        rows = rows.filter(pl.col("window_size").fill_null(0) == 0)
    assert len(rows), where
    return float(rows["latency"].median())  # the store keeps the median of agreeing copies


def _heads(df, heads, kv_heads):
    kv = pl.when(pl.col("num_key_value_heads") == 0).then(pl.col("num_heads")).otherwise(
        pl.col("num_key_value_heads"))
    return df.filter((pl.col("num_heads") == heads) & (kv == kv_heads))


def _recompute(cell: dict, raw, model: dict) -> float:
    """A cell's ground truth from its workload and the raw parquet rows alone."""
    gemm, attn, ar = raw
    tp, q = cell["tp"], cell["q_lens"]
    h, d, f = model["hidden_size"], model["head_dim"], model["intermediate_size"]
    heads, kvh = model["num_heads"] // tp, model["num_kv_heads"] // tp
    t = sum(q)
    nk = [((heads + 2 * kvh) * d, h), (h, heads * d), (2 * f // tp, h), (h, f // tp)]
    layer = sum(_one(gemm, m=t, n=n, k=k) for n, k in nk)
    return model["num_layers"] * (layer + attention_and_allreduce(cell, attn, ar, model))


def attention_and_allreduce(cell: dict, attn, ar, model: dict) -> float:
    """One layer's attention kernels and TP all-reduces of a cell, from the raw rows."""
    tp, q, c = cell["tp"], cell["q_lens"], cell["ctx_lens"]
    heads, kvh = model["num_heads"] // tp, model["num_kv_heads"] // tp
    dec = [ctx for qq, ctx in zip(q, c, strict=True) if qq == 1 and ctx > 0]
    pre = [qq for qq, ctx in zip(q, c, strict=True) if not (qq == 1 and ctx > 0)]
    layer = 0.0
    if dec:
        layer += _one(_heads(attn["generation"], heads, kvh), batch_size=len(dec), step=dec[0])
    if pre:
        layer += _one(_heads(attn["context"], heads, kvh), batch_size=len(pre), isl=pre[0], step=0)
    if tp > 1:
        layer += 2 * _one(ar, num_gpus=tp, message_size=sum(q) * model["hidden_size"])
    return layer


@requires_shared
def check_random_cells(real_store, names: list[str], seed: int, gemm_dtype: str = "bfloat16"):
    """Four random cells of each set, their ground truth recomputed from the raw parquet rows."""
    models, rng = load_models(), random.Random(seed)
    for name in names:
        cells = _cells(real_store, name)
        raw = _raw(cells["sku"][0], cells["backend_version"][0], gemm_dtype)
        for i in rng.sample(range(len(cells)), 4):
            cell = cells.row(i, named=True)
            assert cell["gt_ms"] == pytest.approx(
                _recompute(cell, raw, models[cell["model"]]), rel=1e-9), (name, cell["cell_id"])


def test_random_cells_of_every_set_recomputed_from_raw_parquet(real_store):
    check_random_cells(real_store, SIX + FOUR, seed=7)


@requires_shared
def test_hand_computed_mixed_cell(real_store):
    """A Qwen3-8B TP4 mixed cell on H100, from the upstream parquet files by hand."""
    cell = _cells(real_store, "h100_vidur").filter(
        model="qwen3-8b", tp=4, phase="mixed").sort("cell_id").row(0, named=True)
    gemm, attn, ar = _raw("h100_sxm", "0.14.0")
    t = cell["total_tokens"]
    n_dec, ctx = cell["num_decode"], max(cell["ctx_lens"])
    n_pre = cell["num_prefill"]
    length = (t - n_dec) // n_pre
    # qwen3-8b: hidden 4096, 32 q / 8 kv heads of 128, intermediate 12288, 36 layers; TP4.
    per_layer = (_one(gemm, m=t, n=1536, k=4096) + _one(gemm, m=t, n=4096, k=1024)
                 + _one(gemm, m=t, n=6144, k=4096) + _one(gemm, m=t, n=4096, k=3072)
                 + _one(attn["generation"], batch_size=n_dec, step=ctx, num_heads=8,
                        num_key_value_heads=2)
                 + _one(attn["context"], batch_size=n_pre, isl=length, step=0, num_heads=8,
                        num_key_value_heads=2)
                 + 2 * _one(ar, num_gpus=4, message_size=t * 4096))
    assert cell["gt_ms"] == pytest.approx(36 * per_layer, rel=1e-9)


def _grid() -> Grid:
    def p(ms, warm=False):
        return Point("t", "{}", ms, warm)
    # llama-3.2-3b at TP1: qkv (5120, 3072), o (3072, 3072), gate_up (16384, 3072), down (3072, 8192)
    g = Grid("x", "0")
    for n, k in ((5120, 3072), (3072, 3072), (16384, 3072), (3072, 8192)):
        g.gemm[(48, n, k)] = p(1.0)
    g.decode[(16, 255, 24, 8)] = p(2.0, warm=True)
    g.decode[(16, 511, 24, 8)] = p(2.5)
    g.prefill[(1, 32, 24, 8)] = p(3.0)
    return g


def test_compose_a_mixed_step_by_hand():
    model = load_models()["llama-3.2-3b"]
    q, c = [32] + [1] * 16, [0] + [255] * 16
    total, warm, lineage = vidur_method.compose(_grid(), model, 1, q, c)
    assert total == pytest.approx(28 * (4 * 1.0 + 2.0 + 3.0))
    assert warm == pytest.approx(2.0 / 9.0)
    assert sorted(op for op, *_ in lineage).count("attn_decode") == 1
    # two decode contexts or a prompt with prior context are not one measured point
    assert vidur_method.compose(_grid(), model, 1, q, [0] + [255] * 15 + [511]) is None
    assert vidur_method.compose(_grid(), model, 1, q, [7] + [255] * 16) is None


def test_snapping_rules():
    axes = {"m": [1, 2, 4, 8, 16, 32, 48, 64, 512, 1024], "isl": [1, 16, 32, 512, 1024],
            "kv": [1, 3, 7, 15, 31], "decode_batch": [1, 2, 4, 8, 16], "prefill_batch": [1, 2]}
    ok = set(axes["m"]).__contains__
    assert nearest_log(5, axes["kv"]) == 7 and nearest_log(2, axes["kv"]) == 3
    # 13 decodes at mean context 14 -> one kernel of 16 at 15 (8 + 4 + 1 sub-batches no more)
    assert snap(StepShape(13, 14, 0, 0, False), axes, ok) == Snapped(16, 15, 0, 0)
    # mixed stays mixed: 14 decodes + a 30-token prompt -> 16 + 32 = 48 tokens
    assert snap(StepShape(14, 6, 1, 30, False), axes, ok) == Snapped(16, 7, 1, 32)
    # a chunk with prior context was never measured: dropped
    assert snap(StepShape(14, 6, 1, 30, True), axes, ok) is None
    # no neighbour within a factor of two of the token count: dropped, not stretched
    assert snap(StepShape(3, 6, 1, 300, False), axes, ok) is None


def test_chunked_prompts_are_carried_never_clipped():
    steps = list(Replay("sarathi", 256).steps([Request(1000, 2, 0), Request(100, 1, 0)]))
    chunks = [s for step in steps for s in step if not s.decode]
    assert sum(s.q for s in chunks) == 1100
    assert [s.ctx for s in chunks if s.q + s.ctx > 100] == [0, 256, 512, 768]  # the long prompt
    assert [r.prompt for r in requests_from_trace([5000, 10], [1, 1], [0, 0], None)] == [5000, 10]
    # whole-prompt prefill: a prompt over the budget is left out (vLLM rejects it), not clipped
    assert [r.prompt for r in requests_from_trace([5000, 10], [1, 1], [0, 0], 2048)] == [10]


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


def test_a_load_scale_compresses_the_arrivals_and_labels_the_trace():
    import duckdb

    from leaderboard.cells import traces
    from leaderboard.cells.scheduler import STEP_SECONDS

    con = duckdb.connect()
    con.execute("CREATE TABLE request_traces (trace VARCHAR, request_idx BIGINT, "
                "prefill_tokens BIGINT, decode_tokens BIGINT, arrived_at_s DOUBLE)")
    con.execute("INSERT INTO request_traces VALUES ('t', 0, 100, 5, 0.0), ('t', 1, 200, 5, 1.0), "
                "('t', 2, 300, 5, 2.0)")
    cfg = {"requests_per_trace": 10, "seed": 0, "arrival_rate_per_s": 1.0}
    at = [r.arrival_step for r in traces.trace_requests(con, "t", cfg, None)]
    fast = [r.arrival_step for r in traces.trace_requests(con, "t", cfg, None, load_scale=4)]
    assert at == [0, round(1 / STEP_SECONDS), round(2 / STEP_SECONDS)]
    assert fast == [0, round(0.25 / STEP_SECONDS), round(0.5 / STEP_SECONDS)]
    assert traces.trace_label("t", 1) == "t" and traces.trace_label("t", 4) == "t@4x"
    assert traces.base_trace("t@4x") == traces.base_trace("t") == "t"
    with pytest.raises(traces.TraceError, match="load_scales: 0"):
        traces.trace_requests(con, "t", cfg, None, load_scale=0)
