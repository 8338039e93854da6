"""The store built from the real upstream data in ../shared (built once per session)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from leaderboard import data
from leaderboard.ingest import ADAPTERS, sources
from leaderboard.ingest.tables import TABLES
from leaderboard.store import database
from leaderboard_core import paths
from leaderboard_core.specs import load_gpu_specs

EXPECTED = {
    "aiconfigurator": ["a100_sxm", "h100_sxm", "h200_sxm", "l40s", "b200_sxm", "gb200"],
    "vidur": ["a100_80gb_pcie", "a40", "h100_sxm"],
    "splitwise": ["a100_sxm", "h100_sxm"],
    "llmservingsim": ["h100_sxm", "rtx_a6000", "rtx3090", "rtx4090"],
    "neusight": ["a100_40gb_pcie", "a100_80gb_pcie", "h100_sxm", "l4", "p100", "p4", "t4",
                 "v100"],
}
ACCEPTANCE = [f"{source}.{sku}" for source, skus in EXPECTED.items() for sku in skus]


@pytest.fixture(scope="module")
def listed(real_store) -> list[dict]:
    """``list --json`` on the real store, parsed (run once for the module)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LEADERBOARD_HOME", str(real_store.home))
    mp.delenv("LEADERBOARD_SOURCES", raising=False)
    mp.delenv("LEADERBOARD_GPU_SPECS", raising=False)
    try:
        return data.list_datasets(include_all=True)
    finally:
        mp.undo()


def test_list_json_prints_only_a_json_array(store_home, capsys):
    assert data.main(["list", "--json"]) == 0
    out, _ = capsys.readouterr()
    entries = json.loads(out)  # fails on anything but one JSON document
    assert isinstance(entries, list) and entries
    assert out.lstrip().startswith("[") and out.rstrip().endswith("]")
    for entry in entries:
        assert {"name", "kind", "sku", "rows", "version"} <= set(entry)
        assert entry["kind"] in {"ops", "cells", "serving"}
        assert isinstance(entry["rows"], int) and entry["rows"] > 0
        assert isinstance(entry["version"], str) and len(entry["version"]) == 16
        assert entry["sku"], entry["name"]
        assert entry["pinned"] is True
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names))


def test_list_all_adds_traces_and_coefficients(listed, store_home):
    everything = {e["name"]: e for e in listed}
    assert {e["name"] for e in data.list_datasets()} < set(everything)
    assert everything["vidur"]["kind"] == "traces"
    assert everything["distserve.a100_sxm"]["kind"] == "coefficients"


@pytest.mark.parametrize("name", ACCEPTANCE)
def test_acceptance_entry_listed(listed, name):
    by_name = {e["name"]: e for e in listed}
    assert name in by_name, f"{name} missing from list --json"
    entry = by_name[name]
    source, sku = name.split(".", 1)
    assert entry["kind"] == "ops" and entry["sku"] == sku and entry["source"] == source
    assert entry["rows"] > 0


def test_every_aiconfigurator_sku_folder_is_listed(listed, real_store):
    skus = {sku for (sku,) in real_store.sql(
        "SELECT DISTINCT split_part(rel, '/', 7) FROM sources WHERE rel LIKE "
        "'ai-dynamo__aiconfigurator/%/systems/data/%/%/%/%/%.parquet'")}
    assert skus == set(EXPECTED["aiconfigurator"])
    assert {e["sku"] for e in listed if e["source"] == "aiconfigurator"} == skus


@pytest.mark.parametrize("table", list(TABLES))
def test_provenance_is_never_null(real_store, table):
    (n,) = real_store.sql(f'SELECT count(*) FROM "{table}"')[0]
    assert n > 0, f"{table} is empty"
    # traces belong to no GPU; LLM-Inference-Bench also measured hardware no spec describes
    sku_check = "" if table in ("request_traces", "e2e_runs") else " OR sku IS NULL"
    (bad,) = real_store.sql(
        f'SELECT count(*) FROM "{table}" WHERE source IS NULL OR file IS NULL OR '
        f"file_sha256 IS NULL OR backend_version IS NULL OR pinned IS NULL{sku_check}")[0]
    assert bad == 0
    # every row's file and sha256 are one of the build's verified source files
    (orphans,) = real_store.sql(
        f'SELECT count(*) FROM (SELECT DISTINCT file, file_sha256 FROM "{table}") t '
        "ANTI JOIN sources s ON t.file = s.rel AND t.file_sha256 = s.sha256")[0]
    assert orphans == 0


def test_an_e2e_row_without_a_gpu_is_hardware_no_spec_names(real_store):
    """Every LLM-Inference-Bench row whose hardware label a GPU spec lists has that GPU; the
    rows without one (SambaNova, Gaudi, the 'Intel PVC GPU' label) name no spec's label."""
    from leaderboard.ingest.inference_bench import labels
    from leaderboard_core.specs import load_gpu_specs

    sku_of = labels(load_gpu_specs())
    rows = real_store.sql("SELECT DISTINCT hardware, sku FROM e2e_runs")
    assert rows and {h: s for h, s in rows if s is not None} == {
        h: s for h, s in sku_of.items() if h in {h for h, _ in rows}}
    assert {"Intel PVC GPU", "Habana Gaudi2"} <= {h for h, s in rows if s is None}
    assert not {h for h, s in rows if s is None} & set(sku_of)


def test_latencies_are_finite_and_positive(real_store):
    for name, spec in TABLES.items():
        for col in spec.measured:
            (bad,) = real_store.sql(f'SELECT count(*) FROM "{name}" WHERE NOT isfinite("{col}") '
                                    f'OR "{col}" IS NULL OR "{col}" <= 0')[0]
            assert bad == 0, f"{name}.{col}"


def test_every_pinned_file_is_recorded(real_store):
    rows = real_store.sql("SELECT count(*), bool_and(pinned), count(DISTINCT rel) FROM sources")
    n, all_pinned, distinct = rows[0]
    assert all_pinned and n == distinct
    ingested_pins = [p for p in sources.load_pins()
                     if any(a.matches(p.rel) for a in ADAPTERS.values())]
    assert n == len(ingested_pins)


def test_report_counts_match_the_store(real_store):
    report = real_store.report
    for table in TABLES:
        assert report.rows[table] == real_store.sql(f'SELECT count(*) FROM "{table}"')[0][0]
    counted = {(k, r, s): n for k, r, s, n in real_store.sql(
        "SELECT kind, reason, source, count(*) FROM quarantine GROUP BY ALL")}
    assert report.quarantined == counted
    assert sum(report.quarantined.values()) == real_store.sql("SELECT count(*) FROM quarantine")[0][0]


def test_splitwise_synthetic_rows_quarantined(real_store):
    assert real_store.report.quarantined[("known_bad", "synthetic_rows", "splitwise")] == 420
    rows = real_store.sql("SELECT sku, table_name, count(*) FROM quarantine "
                          "WHERE reason = 'synthetic_rows' GROUP BY ALL")
    assert rows == [("h100-80gb-pcap", "step_wallclock", 420)]
    assert real_store.sql("SELECT DISTINCT sku FROM step_wallclock ORDER BY 1") == [
        ("a100_sxm",), ("h100_sxm",)]


def test_h100_mha_conflict_quarantined_both_copies(real_store):
    """aiconfigurator 0.14.0 H100 prefill: batch 32, isl 2048, 8/8 heads, bf16 KV: 2.2x apart."""
    where = ("source = 'aiconfigurator' AND sku = 'h100_sxm' AND table_name = 'attention' "
             "AND row->>'backend_version' = '0.14.0' AND row->>'phase' = 'prefill' "
             "AND (row->>'batch')::INT = 32 AND (row->>'q_len')::INT = 2048 "
             "AND (row->>'num_heads')::INT = 8 AND (row->>'num_kv_heads')::INT = 8 "
             "AND row->>'kv_dtype' = 'bfloat16' AND row->>'dtype' = 'bfloat16'")
    rows = real_store.sql(f"SELECT kind, reason, (row->>'latency_ms')::DOUBLE FROM quarantine "
                          f"WHERE {where}")
    assert len(rows) == 2
    assert {(k, r) for k, r, _ in rows} == {("conflict", "duplicate_conflict")}
    latencies = sorted(lat for _, _, lat in rows)
    assert 2.1 < latencies[1] / latencies[0] < 2.3
    (kept,) = real_store.sql(
        "SELECT count(*) FROM attention WHERE source = 'aiconfigurator' AND sku = 'h100_sxm' "
        "AND backend_version = '0.14.0' AND phase = 'prefill' AND batch = 32 AND q_len = 2048 "
        "AND num_heads = 8 AND num_kv_heads = 8 AND kv_dtype = 'bfloat16' "
        "AND dtype = 'bfloat16'")[0]
    assert kept == 0


def test_no_mha_key_is_stored_with_zero_kv_heads(real_store):
    (zero,) = real_store.sql("SELECT count(*) FROM attention WHERE num_kv_heads = 0")[0]
    assert zero == 0
    merged = real_store.report.merged_duplicates
    assert merged.get(("attention", "aiconfigurator", "h100_sxm"), 0) > 0


def test_faster_than_dram_rows_kept_and_flagged(real_store):
    rows = dict(real_store.sql("SELECT sku, count(*) FROM gemm WHERE flags = 'faster_than_dram' "
                               "GROUP BY ALL"))
    assert rows.get("l40s", 0) > 0


def test_versions_are_stored(real_store):
    meta = database.read_meta(real_store.path)
    assert meta["builder_version"] == database.BUILDER_VERSION
    assert len(meta["store_version"]) == 16 and len(meta["inputs_fingerprint"]) == 16
    versions = dict(real_store.sql("SELECT table_name, version FROM table_versions"))
    assert set(versions) == set(TABLES) and all(len(v) == 16 for v in versions.values())


@pytest.mark.long
def test_rebuild_gives_identical_versions(real_store, tmp_path, monkeypatch, capsys):
    """A second full build (via the CLI, in a fresh home) has the same versions and rows."""
    monkeypatch.setenv("LEADERBOARD_HOME", str(tmp_path / "second"))
    assert data.main(["build"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "store built" in err
    second = tmp_path / "second" / "store" / "leaderboard.duckdb"
    for query in ("SELECT name, version, rows FROM datasets ORDER BY name",
                  "SELECT table_name, version, rows FROM table_versions ORDER BY 1"):
        assert _sql(second, query) == real_store.sql(query)
    assert database.read_meta(second)["store_version"] == database.read_meta(
        real_store.path)["store_version"]
    assert database.is_fresh()


def _sql(path: Path, query: str) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(query).fetchall()


def test_store_is_reused_when_fresh(store_home):
    before = store_home.path.stat().st_mtime_ns
    assert database.is_fresh()
    assert database.ensure() == store_home.path
    assert store_home.path.stat().st_mtime_ns == before


def test_sliding_window_decode_points_are_flagged_on_the_window_they_read(real_store):
    """A decode kernel under a sliding window streams min(kv_len, window) cached tokens, so it is
    flagged only when faster than DRAM allows for that many (recomputed here from the rows)."""
    rows = real_store.sql(
        "SELECT a.batch, a.kv_len, a.window_size, a.num_kv_heads, a.head_dim, a.kv_dtype, "
        "a.latency_ms, a.flags, a.sku FROM attention a WHERE a.phase = 'decode' "
        "AND a.window_size > 0 AND a.source = 'aiconfigurator'")
    assert rows, "the store should hold sliding-window decode points"
    gpus = load_gpu_specs()
    for batch, kv, window, kv_heads, d, kv_dtype, ms, flags, sku in rows:
        width = 1.0 if "8" in kv_dtype else 2.0
        floor_ms = batch * min(kv, window) * d * 2 * width * kv_heads / gpus[sku].mem_bw_bytes_per_s * 1e3
        assert (flags == "faster_than_dram") == (ms < floor_ms), (sku, batch, kv, window)


def test_a_failed_build_leaves_nothing_and_a_retry_in_the_same_process_builds(tiny, monkeypatch):
    """A build that fails late (in the cells) leaves no store and no temp file, and the next
    build in the same process starts from an empty database, not the failed one's tables."""
    from leaderboard import cells

    tiny.gemm([{"m": 8, "n": 4096, "k": 4096, "gemm_dtype": "bfloat16", "latency": 0.01}])

    def fails(*args, **kwargs):
        raise RuntimeError("cells failed")

    with monkeypatch.context() as patched:
        patched.setattr(cells, "build_all", fails)
        # Kept, as a caller that reports the error keeps its traceback (and the frames in it).
        with pytest.raises(RuntimeError, match="cells failed") as failed:
            tiny.build(["aiconfigurator"])
    target = paths.store_path()
    assert not target.exists() and not list(target.parent.glob(f".{target.name}.*"))
    report = tiny.build(["aiconfigurator"])
    assert report.rows["gemm"] == 1 and tiny.sql("SELECT count(*) FROM gemm") == [(1,)]
    assert failed.value.args == ("cells failed",)
