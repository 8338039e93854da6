"""What fit sees: the home's whole measured grid or the points behind its cells, and several
homes at once, each home GPU's rows normalised by its own datasheet."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pytest

from leaderboard.run import run_inputs
from leaderboard.run.evaluate import RunSpec, run
from leaderboard.run.run_inputs import load_inputs
from leaderboard.run.split import split
from leaderboard_core.contract import Home
from leaderboard_core.specs import load_gpu_specs, load_models, tp_shapes
from predictors import registry
from predictors.rf import in_first_home_units
from tests.predictors.test_rooflines import MIXED_STEPS, cells

GPUS = load_gpu_specs()
A100, H100 = GPUS["a100_sxm"], GPUS["h100_sxm"]
KEYS = {"gemm_qkv": ["m", "n", "k"], "attn_decode": ["batch", "kv_len", "num_heads", "num_kv_heads"],
        "attn_prefill": ["batch", "q_len", "num_heads", "num_kv_heads"],
        "allreduce": ["num_gpus", "message_bytes"]}


def test_full_grid_is_the_stores_whole_home_grid_and_holds_every_cell_point(store_home):
    grid = load_inputs(RunSpec("genz", "a100_vidur", {}, home_points="full_grid"))
    behind = load_inputs(RunSpec("genz", "a100_vidur", {}, home_points="behind_cells"))
    assert grid.home_points == "full_grid" and behind.home_points == "behind_cells"
    assert list(grid.home.ops) == list(behind.home.ops)
    for op, keys in KEYS.items():
        full, used = grid.home.ops[op], behind.home.ops[op]
        assert len(full) > len(used)
        # every point behind the training cells is in the grid, at the same latency
        joined = used.join(full, on=keys, how="left", suffix="_grid")
        assert joined["latency_ms_grid"].null_count() == 0
        np.testing.assert_array_equal(joined["latency_ms"], joined["latency_ms_grid"])
    # the held-out cells' points too: they are in-sample under full_grid
    con = duckdb.connect(str(store_home.path), read_only=True)
    held = grid.target["cell_id"].to_list()
    heldout_gemms = con.execute(
        "SELECT DISTINCT CAST(json_extract(key, '$.m') AS BIGINT), "
        "CAST(json_extract(key, '$.n') AS BIGINT) FROM cell_lineage "
        "WHERE dataset = 'a100_vidur' AND op = 'gemm_qkv' AND list_contains(?, cell_id)",
        [held]).fetchall()
    in_grid = set(grid.home.ops["gemm_qkv"].select("m", "n").iter_rows())
    assert heldout_gemms and set(heldout_gemms) <= in_grid
    # recounted from the raw table: bf16 GEMMs of the home version at one QKV shape
    model, tp = grid.home.cells.select("model", "tp").row(0)
    n, k = tp_shapes(load_models()[model], tp)["qkv"]
    (raw,) = con.execute(
        "SELECT count(DISTINCT m) FROM gemm WHERE source = 'aiconfigurator' AND sku = 'a100_sxm' "
        "AND backend_version = '0.14.0' AND dtype = 'bfloat16' AND n = ? AND k = ?",
        [n, k]).fetchone()
    assert raw == len(grid.home.ops["gemm_qkv"].filter(n=n, k=k)) > 0


def test_held_out_shapes_holds_out_whole_configurations_and_every_shape_they_read(store_home):
    """Out-of-sample home: no (model, TP) is on both sides, and no GEMM (n, k), head layout or
    all-reduce (TP, bytes) that a scored cell's lineage names is left in any op of fit's grid;
    the rest of the training configurations' grid is."""
    out = load_inputs(RunSpec("genz", "a100_vidur", {}, home_points="held_out_shapes"))
    full = load_inputs(RunSpec("genz", "a100_vidur", {}, home_points="full_grid"))
    configs = lambda cells: set(cells.select("model", "tp").iter_rows())  # noqa: E731
    held, trained = configs(out.target), configs(out.home.cells)
    assert held and trained and not held & trained
    assert (out.home.points, full.home.points) == ("held_out_shapes", "full_grid")
    # a training configuration may leave whole (its cells read a held-out shape), none joins
    assert held | trained <= configs(full.home.cells) | configs(full.target)
    con = duckdb.connect(str(store_home.path), read_only=True)
    read = pl.DataFrame(con.execute(
        "SELECT op, key FROM cell_lineage WHERE dataset = 'a100_vidur' AND list_contains(?, cell_id)",
        [out.target["cell_id"].to_list()]).fetchall(), schema=["op", "key"], orient="row")
    shapes = {"gemm": ["n", "k"], "attn": ["num_heads", "num_kv_heads"],
              "allreduce": ["num_gpus", "message_bytes"]}
    trained_read = pl.DataFrame(con.execute(
        "SELECT op, key FROM cell_lineage WHERE dataset = 'a100_vidur' AND list_contains(?, cell_id)",
        [out.home.cells["cell_id"].to_list()]).fetchall(), schema=["op", "key"], orient="row")
    for family, keys in shapes.items():
        def shapes_in(frame, family=family, keys=keys):
            keyed = frame.filter(pl.col("op").str.starts_with(family))["key"].str.json_decode(
                infer_schema_length=None).struct.unnest()
            return set(keyed.select(keys).iter_rows())
        scored = shapes_in(read)
        assert scored, family
        # no training cell's ground truth is made of a held-out shape either
        assert not shapes_in(trained_read) & scored, family
        for op, points in out.home.ops.items():
            if op.startswith(family):
                left = set(points.select(keys).iter_rows())
                assert not left & scored, op
                # everything else the training configurations read stays
                wanted = full.home.ops[op].join(pl.DataFrame(sorted(scored), schema=keys,
                                                             orient="row"), on=keys, how="anti")
                assert len(points) == len(wanted.filter(trained_shapes(op, trained))) > 0, op


@pytest.mark.parametrize("dataset, home, says", [
    ("h200_vidur", None, "scores one home on its own held-out configurations"),
    ("a100_vidur", ["a100_vidur", "h100_vidur"], "scores one home"),
    ("h100_vidur_moe", None, "needs the measured op grid of home h100_vidur_moe")])
def test_held_out_shapes_refuses_what_it_cannot_hold_out(store_home, dataset, home, says):
    with pytest.raises(ValueError, match=says):
        load_inputs(RunSpec("genz", dataset, {}, home=home, home_points="held_out_shapes"))


def trained_shapes(op: str, configs: set[tuple[str, int]]) -> pl.Expr:
    """The points of ``op`` that the (model, TP) configurations read, from their shapes: a
    GEMM's (n, k), a head layout, every message size at a TP degree above one."""
    models = load_models()
    shapes = [(tp_shapes(models[name], tp), tp) for name, tp in configs]
    if op == "allreduce":
        return pl.col("num_gpus").is_in([tp for _, tp in shapes if tp > 1])
    if op.startswith("gemm"):
        pairs = {shape[op.removeprefix("gemm_")] for shape, _ in shapes}
        cols = ("n", "k")
    else:
        pairs = {(shape["heads"], shape["kv_heads"]) for shape, _ in shapes}
        cols = ("num_heads", "num_kv_heads")
    return pl.any_horizontal([(pl.col(cols[0]) == a) & (pl.col(cols[1]) == b) for a, b in pairs])


def test_two_homes_fit_on_both_and_a_home_is_never_unseen(store_home, tmp_path):
    homes = ["a100_vidur", "h100_vidur"]
    h100 = load_inputs(RunSpec("genz", "h100_vidur", {}, home=homes))
    assert h100.home.gpus.keys() == {"a100_sxm", "h100_sxm"}
    assert set(h100.home.cells["sku"]) == {"a100_sxm", "h100_sxm"}
    assert {s for f in h100.home.ops.values() for s in f["sku"]} == {"a100_sxm", "h100_sxm"}
    with duckdb.connect(str(store_home.path), read_only=True) as con:
        all_h100 = con.sql("SELECT * FROM cells WHERE dataset = 'h100_vidur'").pl()
    train, heldout = split(all_h100, "workload_id", 0, 0.3)
    assert sorted(h100.target["cell_id"]) == sorted(heldout["cell_id"])
    assert not set(h100.target["cell_id"]) & set(h100.home.cells["cell_id"])
    metrics = run(RunSpec("genz", "h100_vidur", {}, home=homes, runs_dir=tmp_path)).metrics
    assert metrics["split"] == "home_heldout" and metrics["home_datasets"] == homes
    assert metrics["home_points"] == "full_grid"
    mixed = (heldout["phase"] == "mixed").sum()
    assert metrics["phases"]["mixed"]["n"] == mixed > 0
    assert metrics["phases"]["all"]["n"] == len(heldout) - mixed
    one = run(RunSpec("genz", "h100_vidur", {}, runs_dir=tmp_path)).metrics
    assert one["split"] == "unseen"
    assert one["phases"]["all"]["n"] == (all_h100["phase"] != "mixed").sum()
    # Another dataset of a home GPU is scored whole, but not as a GPU never seen.
    same_gpu = run(RunSpec("genz", "h100_vidur19", {}, home=homes, runs_dir=tmp_path)).metrics
    assert same_gpu["split"] == "home_gpu" and same_gpu["sku"] == "h100_sxm"
    with pytest.raises(ValueError, match="twice"):
        load_inputs(RunSpec("genz", "h200_vidur", {}, home=["a100_vidur", "a100_vidur"]))


def two_gpu_home(a100_cells: pl.DataFrame, h100_cells: pl.DataFrame, **ops) -> Home:
    return Home(sku="a100_sxm", gpu=A100, dataset="a+h", gpus={"a100_sxm": A100, "h100_sxm": H100},
                cells=pl.concat([a100_cells.with_columns(sku=pl.lit("a100_sxm")),
                                 h100_cells.with_columns(sku=pl.lit("h100_sxm"))]), ops=ops)


def test_rf_scales_each_homes_points_to_the_first_homes_datasheet():
    """A GEMM point measured on the H100 becomes its A100 time by the roofline-time ratio,
    worked by hand: m=16 is memory-bound on both, m=8192 compute-bound on both."""
    def gemm_s(m, n, k, gpu):
        return max(2 * m * n * k / (gpu["bf16_dense_tflops"] * 1e12),
                   2 * (n * k + m * k + m * n) / (gpu["mem_bw_gbs"] * 1e9))

    points = pl.DataFrame({"m": [16, 8192], "n": [4096] * 2, "k": [4096] * 2,
                           "latency_ms": [0.05, 1.2], "sku": ["h100_sxm"] * 2})
    home = two_gpu_home(cells(*MIXED_STEPS), cells(*MIXED_STEPS), gemm_qkv=points)
    scaled = in_first_home_units(home)["gemm_qkv"]["latency_ms"].to_list()
    for got, (m, ms) in zip(scaled, [(16, 0.05), (8192, 1.2)], strict=True):
        assert got == pytest.approx(ms * gemm_s(m, 4096, 4096, A100) / gemm_s(m, 4096, 4096, H100),
                                    rel=1e-12)
    assert scaled[0] == pytest.approx(0.05 * H100["mem_bw_gbs"] / A100["mem_bw_gbs"], rel=1e-12)
    assert scaled[1] == pytest.approx(1.2 * H100["bf16_dense_tflops"] / A100["bf16_dense_tflops"],
                                      rel=1e-12)


def test_genz_calibrated_fits_shared_efficiencies_over_two_home_gpus():
    """Truth on each GPU from its own datasheet at (0.57, 0.83): only a fit that times each
    home's cells on its own GPU recovers both exactly."""
    def truth_on(gpu):
        blind = cells(*MIXED_STEPS)
        ms = registry.build("genz", {"compute_efficiency": 0.57, "memory_efficiency": 0.83}
                            ).predict(blind, gpu)
        return cells(*MIXED_STEPS, gt_ms=ms.tolist())

    fitted = registry.build("genz_calibrated").fit(two_gpu_home(truth_on(A100), truth_on(H100)))
    assert (fitted.compute_efficiency_, fitted.memory_efficiency_) == (0.57, 0.83)
    assert fitted.home_mape_ < 1e-9 and fitted.profiled_rows_ == 2 * len(MIXED_STEPS)


def test_distserve_scaled_recovers_first_home_coefficients_from_two_homes():
    """Cells of Llama-2-7B TP1 (no published fit) timed on each GPU by the scaled model of
    known A100 coefficients: the two-home fit returns those coefficients."""
    a, b, c, da, db, dc = 4.0, 0.02, 3e-6, 6.0, 1e-4, 0.01
    steps = ([("llama-2-7b", 1, [q], [0]) for q in (128, 512, 1024, 2048, 4096)]
             + [("llama-2-7b", 1, [1] * n, [ctx] * n) for n in (1, 8, 32, 64) for ctx in (256, 2048)]
             + [("llama-2-7b", 1, [1] * n, [ctx] * n) for n in (96, 128, 192) for ctx in (512, 1024)])

    def timed(gpu):
        compute = 312 / gpu["bf16_dense_tflops"]
        bandwidth = 2039 / gpu["mem_bw_gbs"]
        gt = [bandwidth * a + compute * (b * sum(q) + c * sum(x * x for x in q)) if ctx == [0]
              else bandwidth * (da + db * sum(x + 1 for x in ctx)) + dc * len(q)
              for _, _, q, ctx in steps]
        return cells(*steps, gt_ms=gt)

    fitted = registry.build("distserve_scaled").fit(two_gpu_home(timed(A100), timed(H100)))
    row = fitted.coefficients_.filter(model="llama-2-7b", tp=1).row(0, named=True)
    expected = {"pf_a": a, "pf_b": b, "pf_c": c, "small_a": da, "small_b": db, "small_c": dc,
                "large_a": da, "large_b": db, "large_c": dc}
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, rel=1e-6), key


def test_a_family_without_an_op_grid_fits_on_the_points_behind_its_cells(store_home):
    """Splitwise's A100 is an a100_sxm, but its steps were not built from the aiconfigurator
    grid's version: no full grid there, and the run says so."""
    assert load_inputs(RunSpec("genz", "h100_splitwise", {})).home_points == "behind_cells"
    assert load_inputs(RunSpec("genz", "h100_vidurprof", {})).home_points == "behind_cells"
    assert load_inputs(RunSpec("genz", "h200_vidur", {})).home_points == "full_grid"
    with pytest.raises(ValueError, match="home_points must be one of"):
        load_inputs(RunSpec("genz", "h200_vidur", {}, home_points="everything"))


def test_a_home_keeps_which_points_it_holds_through_the_sandbox_and_a_merge(tmp_path):
    """``Home.points`` is what ours reads to refit: the bundle the sandboxed child gets and a
    merged home of several must carry it."""
    from leaderboard.run import homes
    from leaderboard.seal.bundle import read_home, write_home

    gpu = load_gpu_specs()["a100_sxm"]
    home = Home(sku="a100_sxm", gpu=gpu, dataset="synthetic", cells=pl.DataFrame({"model": ["m"]}),
                ops={"gemm_qkv": pl.DataFrame({"m": [1], "latency_ms": [0.5]})},
                points="held_out_shapes")
    write_home(home, tmp_path)
    assert read_home(tmp_path).points == "held_out_shapes"
    h100 = Home(sku="h100_sxm", gpu=load_gpu_specs()["h100_sxm"], dataset="other",
                cells=pl.DataFrame({"model": ["m"]}), points="held_out_shapes")
    assert homes.merge([home, h100]).points == "held_out_shapes"
    full = Home(sku="h100_sxm", gpu=load_gpu_specs()["h100_sxm"], dataset="other",
                cells=pl.DataFrame({"model": ["m"]}), points="full_grid")
    with pytest.raises(ValueError, match="different op points"):
        homes.merge([home, full])


def test_a_bundle_frame_is_the_same_bytes_whatever_memory_lay_under_its_nulls(tmp_path):
    """A home bundle's bytes name its predictor cache: the same rows must give the same file,
    or a run refits what it had cached (the values under nulls used to vary by process)."""
    import pyarrow as pa

    from leaderboard.seal.bundle import read_frame, write_frame

    def with_under_null(value: float, text: str) -> pl.DataFrame:
        validity = pa.py_buffer(bytes([0b101]))  # rows 0 and 2 valid, row 1 null
        data = pa.py_buffer(np.array([1.0, value, 3.0]).tobytes())
        offsets = np.array([0, 3, 3 + len(text), 6 + len(text)], dtype=np.int32).tobytes()
        return pl.from_arrow(pa.table({
            "x": pa.Array.from_buffers(pa.float64(), 3, [validity, data]),
            "name": pa.Array.from_buffers(pa.string(), 3, [validity, pa.py_buffer(offsets),
                                                           pa.py_buffer(f"abc{text}def".encode())]),
            "none": pa.Array.from_buffers(pa.float64(), 3, [pa.py_buffer(bytes([0])), data])}))

    one, other = with_under_null(7.0, "zz"), with_under_null(-9.0, "yyyyyy")
    assert one.equals(other)
    one.write_ipc(tmp_path / "raw-one.arrow")
    other.write_ipc(tmp_path / "raw-other.arrow")
    # polars writes what lies under a null as it is: without the cleaning the files differ
    assert (tmp_path / "raw-one.arrow").read_bytes() != (tmp_path / "raw-other.arrow").read_bytes()
    write_frame(one, tmp_path / "one.arrow")
    write_frame(other, tmp_path / "other.arrow")
    assert (tmp_path / "one.arrow").read_bytes() == (tmp_path / "other.arrow").read_bytes()
    assert read_frame(tmp_path / "one.arrow").equals(one)


def test_a_vllm_profile_gives_gemm_and_attention_points_of_the_profiled_model():
    """LLMServingSim's vLLM profile as op points: each projection and the LM head a GEMM of
    Llama-3.1-8B's shapes at the row's TP (hidden 4096, 32 heads and 8 KV heads of 128,
    FFN 14336, vocabulary 128256, worked by hand), in the dtype its attention rows record;
    its prefill and decode attention kept, its mixed rows, light ops, v0 rows and other
    sources' rows left out."""
    from leaderboard.cells.ops import profile_points_at

    con = duckdb.connect()
    con.execute("CREATE TABLE model_ops (source VARCHAR, sku VARCHAR, backend VARCHAR, "
                "backend_version VARCHAR, model VARCHAR, tp BIGINT, op VARCHAR, "
                "num_tokens BIGINT, latency_ms DOUBLE, flags VARCHAR)")
    ops = [("qkv_proj", 1, 64, 0.1), ("o_proj", 1, 64, 0.2), ("gate_up_proj", 1, 64, 0.3),
           ("down_proj", 1, 64, 0.4), ("lm_head", 1, 8, 0.5), ("qkv_proj", 2, 64, 0.6),
           ("o_proj", 2, 64, 0.7), ("gate_up_proj", 2, 64, 0.8), ("down_proj", 2, 64, 0.9),
           ("lm_head", 2, 8, 1.0), ("layernorm", 1, 64, 9.0)]
    con.executemany("INSERT INTO model_ops VALUES ('llmservingsim', 'rtx4090', 'vllm', "
                    "'0.19.0', 'llama-3.1-8b', ?, ?, ?, ?, NULL)",
                    [(tp, op, t, ms) for op, tp, t, ms in ops])
    con.execute("INSERT INTO model_ops VALUES ('llmservingsim', 'rtx4090', 'pytorch', '0.19.0', "
                "'llama-3.1-8b', 1, 'o_proj', 32, 9.0, NULL), ('vidur', 'rtx4090', 'vllm', "
                "'0.19.0', 'llama-3.1-8b', 1, 'o_proj', 32, 9.0, NULL)")
    con.execute("CREATE TABLE attention (source VARCHAR, sku VARCHAR, backend_version VARCHAR, "
                "phase VARCHAR, dtype VARCHAR, kv_dtype VARCHAR, batch BIGINT, q_len BIGINT, "
                "kv_len BIGINT, num_heads BIGINT, num_kv_heads BIGINT, head_dim BIGINT, "
                "window_size BIGINT, latency_ms DOUBLE, flags VARCHAR)")
    con.execute("INSERT INTO attention VALUES "
                "('llmservingsim', 'rtx4090', '0.19.0', 'prefill', 'bfloat16', 'bfloat16', 1, "
                "512, 0, 32, 8, 128, 0, 0.3, NULL), "
                "('llmservingsim', 'rtx4090', '0.19.0', 'decode', 'bfloat16', 'bfloat16', 16, 1, "
                "1024, 32, 8, 128, 0, 0.1, NULL), "
                "('llmservingsim', 'rtx4090', '0.19.0', 'mixed', 'bfloat16', 'bfloat16', 1, 256, "
                "0, 32, 8, 128, 0, 9.0, NULL)")
    points = profile_points_at(con, "rtx4090", "0.19.0", load_models())
    gemm = points.filter(op_family="gemm").sort("latency_ms")
    assert gemm.select("m", "n", "k", "latency_ms").rows() == [
        (64, 6144, 4096, 0.1), (64, 4096, 4096, 0.2), (64, 28672, 4096, 0.3),
        (64, 4096, 14336, 0.4), (8, 128256, 4096, 0.5),
        (64, 3072, 4096, 0.6), (64, 4096, 2048, 0.7), (64, 14336, 4096, 0.8),
        (64, 4096, 7168, 0.9), (8, 64128, 4096, 1.0)]
    assert set(gemm["dtype"]) == {"bfloat16"} and set(gemm["sku"]) == {"rtx4090"}
    attention = points.filter(op_family="attention")
    assert sorted(attention["phase"]) == ["decode", "prefill"]
    assert profile_points_at(con, "rtx4090", "0.18.0", load_models()).is_empty()
    con.execute("UPDATE attention SET dtype = 'float16' WHERE phase = 'decode'")
    with pytest.raises(ValueError, match="dtypes"):
        profile_points_at(con, "rtx4090", "0.19.0", load_models())
    con.execute("UPDATE attention SET dtype = 'bfloat16'")
    with pytest.raises(ValueError, match="model 'llama-3.1-8b', which conf/model"):
        profile_points_at(con, "rtx4090", "0.19.0", {})
    con.execute("DELETE FROM attention WHERE phase IN ('prefill', 'decode')")
    with pytest.raises(ValueError, match="has no prefill or decode attention rows; its GEMMs'"):
        profile_points_at(con, "rtx4090", "0.19.0", load_models())


def test_a_worker_keeps_a_home_for_the_next_target_and_builds_another_for_another_split(
        store_home):
    """The rerun's workers keep the last homes they built (``run_inputs._kept_home``): a second
    target of the same home gets the very same home, a home is never its own unseen target,
    and another seed builds afresh, with the same rows a fresh process would build."""
    unseen = load_inputs(RunSpec("genz", "h200_vidur", {}))
    again = load_inputs(RunSpec("genz", "b200_vidur", {}))
    home = load_inputs(RunSpec("genz", "a100_vidur", {}))
    assert again.home is unseen.home is home.home
    # the home scored on itself gets its held-out cells, never the home's training cells
    trained = set(home.home.cells["cell_id"])
    assert not trained & set(home.target["cell_id"])
    assert len(unseen.target) > len(home.target)
    other = load_inputs(RunSpec("genz", "h200_vidur", {}, seed=1))
    assert other.home is not unseen.home
    assert set(other.home.cells["cell_id"]) != trained
    run_inputs._HOMES.clear()
    fresh = load_inputs(RunSpec("genz", "h200_vidur", {}))
    assert fresh.home is not unseen.home and fresh.digest() == unseen.digest()
