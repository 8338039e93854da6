"""The secondary cell families (splitwise wall clock, Vidur's and LLMServingSim's profiles) and
the op-level datasets, built from the real store and checked against the raw upstream files."""

from __future__ import annotations

import csv
import statistics

import duckdb
import polars as pl
import pytest

from leaderboard.cells.ops import op_datasets, op_points
from leaderboard.cells.profiles import build_llmservingsim, build_vidurprof
from leaderboard.cells.schema import CELL_SCHEMA, LINEAGE_SCHEMA
from leaderboard.cells.wallclock import build_splitwise
from leaderboard.ingest.tables import TABLES
from leaderboard_core import paths
from leaderboard_core.contract import VIDUR_OPS

BUILDERS = (build_splitwise, build_vidurprof, build_llmservingsim)
UPSTREAM = paths.SHARED_UPSTREAM


def _read_csv(rel: str) -> list[dict]:
    with open(UPSTREAM / rel, newline="") as handle:
        return list(csv.DictReader(handle))


def _build_all(path) -> dict:
    with duckdb.connect(str(path), read_only=True) as con:
        return {s.name: s for build in BUILDERS for s in build(con)}


@pytest.fixture(scope="module")
def sets(real_store) -> dict:
    return _build_all(real_store.path)


def _cell(cell_set, **where) -> dict:
    rows = cell_set.cells.filter(**where).to_dicts()
    assert len(rows) == 1, f"{cell_set.name}: {len(rows)} cells match {where}"
    return rows[0]


def test_dataset_names_and_phases(sets):
    assert sorted(sets) == sorted([
        "a100_splitwise", "h100_splitwise", "a100_vidurprof", "a40_vidurprof", "h100_vidurprof",
        "h100_llmservingsim", "a6000_llmservingsim", "rtx3090_llmservingsim",
        "rtx4090_llmservingsim"])
    rtx4090 = dict(sets["rtx4090_llmservingsim"].cells.group_by("phase").len().iter_rows())
    assert set(rtx4090) == {"prefill", "decode", "mixed"}
    assert set(sets["h100_vidurprof"].cells["phase"]) == {"prefill"}


@pytest.mark.parametrize("hardware,sku,tp,batch,prompt,tokens", [
    ("h100-80gb", "h100_sxm", 4, 1, 512, 128),  # the sweeps' shared centre point
    ("a100-80gb", "a100_sxm", 2, 16, 512, 128),
    ("a100-80gb", "a100_sxm", 8, 1, 8192, 128),
])
def test_splitwise_gt_is_median_of_raw_repeats(sets, hardware, sku, tp, batch, prompt, tokens):
    raw = [r for r in _read_csv("Mutinifni__splitwise-sim/data/perf_model.csv")
           if (r["model"], r["hardware"], int(r["tensor_parallel"]), int(r["batch_size"]),
               int(r["prompt_size"]), int(r["token_size"]))
           == ("llama2-70b", hardware, tp, batch, prompt, tokens)]
    assert raw
    name = sku.split("_")[0] + "_splitwise"
    for phase, column, ctx in (("prefill", "prompt_time", 0),
                               ("decode", "token_time", prompt + tokens // 2)):
        values = [float(r[column]) for r in raw]
        cell = _cell(sets[name], cell_id=f"{phase}/llama-2-70b/tp{tp}/b{batch}/p{prompt}/t{tokens}")
        assert cell["gt_ms"] == pytest.approx(statistics.median(values), rel=1e-12)
        assert cell["gt_spread_ms"] == pytest.approx(max(values) - min(values), rel=1e-12)
        assert cell["gt_kind"] == "wall_clock" and cell["num_requests"] == batch
        assert cell["ctx_lens"] == [ctx] * batch


def test_splitwise_workloads_match_across_gpus(sets):
    a100, h100 = sets["a100_splitwise"].cells, sets["h100_splitwise"].cells
    assert set(a100["workload_id"]) == set(h100["workload_id"])
    assert a100.select("cell_id", "workload_id").sort("cell_id").equals(
        h100.select("cell_id", "workload_id").sort("cell_id"))


def test_vidurprof_cell_is_hand_sum_of_mlp_csv(sets):
    raw = _read_csv("microsoft__vidur/data/profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv")
    row = next(r for r in raw if r["num_tokens"] == "512" and r["num_tensor_parallel_workers"] == "2")
    expected = 32 * sum(float(row[f"time_stats.{op}.median"]) for op in VIDUR_OPS)
    cell = _cell(sets["h100_vidurprof"], model="llama-2-7b", tp=2, total_tokens=512)
    assert cell["gt_ms"] == pytest.approx(expected, rel=1e-9)
    assert cell["q_lens"] == [512] and cell["ctx_lens"] == [0]


def test_vidurprof_same_workloads_across_gpus(sets):
    ids = {n: set(sets[f"{n}_vidurprof"].cells["workload_id"]) for n in ("a100", "a40", "h100")}
    assert ids["a40"] == ids["h100"]
    assert ids["h100"] < ids["a100"]  # the A100 also has the Llama-3 profiles


def test_rtx4090_mixed_cell_is_hand_sum_of_raw_files(sets):
    base = "casys-kaist__LLMServingSim/profiler/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16/tp1/"
    dense = {r["layer"]: float(r["time_us"]) for r in _read_csv(base + "dense.csv")
             if r["tokens"] == "80"}
    attn = next(float(r["time_us"]) for r in _read_csv(base + "attention.csv")
                if (r["prefill_chunk"], r["kv_prefill"], r["n_decode"], r["kv_decode"])
                == ("64", "128", "16", "1024"))
    per_layer = (2 * dense["layernorm"] + dense["qkv_proj"] + dense["rotary_emb"]
                 + dense["o_proj"] + dense["gate_up_proj"] + dense["act_fn"] + dense["down_proj"]
                 + attn)
    cells = sets["rtx4090_llmservingsim"].cells.filter(phase="mixed", total_tokens=80)
    cell = next(c for c in cells.to_dicts()
                if c["q_lens"] == [64] + [1] * 16 and c["ctx_lens"] == [128] + [1024] * 16)
    assert cell["gt_ms"] == pytest.approx(32 * per_layer / 1e3, rel=1e-9)


def test_cells_follow_the_schema(sets):
    for s in sets.values():
        assert s.cells.schema == pl.Schema(CELL_SCHEMA), s.name
        assert s.lineage.schema == pl.Schema(LINEAGE_SCHEMA), s.name
        assert s.cells["cell_id"].is_unique().all(), s.name
        # one measured attention row per mixed batch here: nothing stands in for a kernel
        assert not s.cells["composed"].any(), s.name
        assert (s.cells["gt_ms"] > 0).all(), s.name
        assert set(s.lineage["cell_id"]) == set(s.cells["cell_id"]), s.name
        # The phase label agrees with the schema's own reading of the composition.
        by_phase = s.cells.group_by("phase").agg(
            pre=pl.col("num_prefill").min(), dec=pl.col("num_decode").min(),
            pre_max=pl.col("num_prefill").max(), dec_max=pl.col("num_decode").max())
        for phase, pre, dec, pre_max, dec_max in by_phase.iter_rows():
            assert {"prefill": dec_max == 0, "decode": pre_max == 0,
                    "mixed": pre > 0 and dec > 0}[phase], (s.name, phase)
        counts = dict(s.cells.group_by("phase").len().iter_rows())
        for phase in ("prefill", "decode", "mixed"):
            assert f"| {phase} | {counts.get(phase, 0)} |" in s.card, (s.name, phase)
        assert "sha256 `" in s.card, s.name


def test_gpu_block_gt_is_the_sum_of_its_lineage(sets):
    for s in sets.values():
        if s.cells["gt_kind"].unique().to_list() != ["gpu_block"]:
            continue
        sums = s.lineage.group_by("cell_id").agg(
            total=(pl.col("latency_ms") * pl.col("count")).sum())
        joined = s.cells.join(sums, on="cell_id", how="left")
        rel = ((joined["gt_ms"] - joined["total"]).abs() / joined["gt_ms"]).max()
        assert rel <= 1e-9, s.name


def test_lineage_keys_name_measured_store_rows(sets, real_store):
    lineage = pl.concat([s.lineage for s in sets.values()])
    with duckdb.connect(str(real_store.path), read_only=True) as con:
        for table, rows in lineage.group_by("table_name"):
            spec = TABLES[table[0]]
            dtypes = {c: pl.String if spec.schema[c] == pl.Categorical else spec.schema[c]
                      for c in spec.key}
            decoded = rows.select("key", "latency_ms").unique().with_columns(
                pl.col("key").str.json_decode(pl.Struct(dtypes))).unnest("key")
            store = con.sql(f"SELECT {', '.join(spec.key)}, {', '.join(spec.measured)} "
                            f"FROM {table[0]}").pl()
            matched = decoded.join(store, on=spec.key, how="left", nulls_equal=True)
            assert matched.height == decoded.height, f"{table[0]}: a key names several rows"
            hit = pl.any_horizontal(pl.col(m) == pl.col("latency_ms") for m in spec.measured)
            assert matched.select(hit.fill_null(False).all()).item(), \
                f"{table[0]}: a lineage row has no store row with its key and latency"


def test_building_twice_gives_identical_sets(sets, real_store):
    again = _build_all(real_store.path)
    for name, s in sets.items():
        assert s.cells.equals(again[name].cells), name
        assert s.lineage.equals(again[name].lineage), name
        assert s.card == again[name].card, name


def test_op_datasets_count_every_point_at_the_vidur_version(real_store):
    with duckdb.connect(str(real_store.path), read_only=True) as con:
        entries = {d["name"]: d for d in op_datasets(con)}
        assert sorted(entries) == ["a100_sxm_ops", "b200_sxm_ops", "gb200_ops", "h100_sxm_ops",
                                   "h200_sxm_ops", "l40s_ops"]
        for name, d in entries.items():
            assert d["version"] == ("0.19.0" if d["sku"] == "b200_sxm" else "0.14.0"), name
            expected = {t: con.execute(
                f"SELECT count(*) FROM {t} WHERE source = 'aiconfigurator' AND sku = ? "
                "AND backend_version = ?", [d["sku"], d["version"]]).fetchone()[0]
                for t in ("gemm", "attention")}
            assert d["tables"] == expected and d["rows"] == sum(expected.values()), name
            assert f"version **{d['version']}**" in d["card"]
        points = op_points(con, "l40s_ops")
        assert points.height == entries["l40s_ops"]["rows"]
        assert set(points["op_family"]) == {"gemm", "attention"}
        assert points.columns[:2] == ["op_family", "phase"]
        with pytest.raises(ValueError, match="valid: a100_sxm_ops"):
            op_points(con, "nope_ops")
