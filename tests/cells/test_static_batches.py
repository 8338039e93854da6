"""The e2e family's targets: one per usable vLLM row, from the GPU's spec alone, and every other
row accounted for with its reason."""

from __future__ import annotations

import duckdb
import polars as pl
import yaml

from leaderboard.cells import static_batches
from leaderboard_core import paths
from leaderboard_core.specs import load_gpu_specs


def store(rows: list[dict]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    runs = pl.DataFrame([{"framework": "vLLM", "devices": 1, "isl": 128, "osl": 128,
                          "batch_size": 16, "latency_ms": 1000.0, "statistic": "mean",
                          "source": "inference_bench", "file": "x/All_results.csv",
                          "file_sha256": "ab", "backend_version": "0.6.1", **r} for r in rows])
    con.register("runs", runs.to_arrow())
    con.execute("CREATE TABLE e2e_runs AS SELECT * FROM runs")
    con.execute("CREATE TABLE quarantine (table_name VARCHAR)")
    con.execute("CREATE TABLE sources (rel VARCHAR, repo VARCHAR, commit VARCHAR)")
    return con


def test_a_gpu_of_this_source_builds_from_its_spec_alone(tmp_path):
    """A GPU no code names (``newgpu``: the MI300X's spec under another name, in an extra spec
    folder) gets its ``<short>_e2e`` set with one target per row; an MI250 device is two dies
    (TP 2); a Mixtral row, a PVC row and a GPU without a spec are left out with their reasons;
    a one-token row is a TTFT target."""
    spec = yaml.safe_load((paths.CONF_DIR / "gpu" / "mi300x.yaml").read_text())
    spec.update(sku="newgpu", short_name="newgpu")
    (tmp_path / "newgpu.yaml").write_text(yaml.safe_dump(spec))
    gpus = load_gpu_specs(tmp_path)
    con = store([
        {"hardware": "New GPU", "sku": "newgpu", "model": "llama-3-8b",
         "model_path": "meta-llama/Meta-Llama-3-8B"},
        {"hardware": "New GPU", "sku": "newgpu", "model": "llama-3-8b", "osl": 1,
         "isl": 1024, "model_path": "meta-llama/Meta-Llama-3-8B"},
        {"hardware": "New GPU", "sku": "newgpu", "model": "mixtral-8x7b",
         "model_path": "mistralai/Mixtral-8x7B-v0.1"},
        {"hardware": "AMD MI250 GPU", "sku": "mi250_gcd", "model": "llama-2-7b",
         "model_path": "meta-llama/Llama-2-7b-hf", "devices": 2},
        {"hardware": "Intel PVC GPU", "sku": None, "model": "llama-2-7b",
         "model_path": "meta-llama/Llama-2-7b-hf"},
        {"hardware": "Other GPU", "sku": "nospec", "model": "llama-2-7b",
         "model_path": "meta-llama/Llama-2-7b-hf"},
    ])
    built = {name: (sku, targets, card) for name, sku, targets, card in
             static_batches.build(con, gpus)}
    assert sorted(built) == ["mi250_e2e", "newgpu_e2e"]
    sku, targets, card = built["newgpu_e2e"]
    assert sku == "newgpu" and len(targets) == 2
    assert targets.select("osl", "gt_e2e_ms", "gt_ttft_ms", "load", "tp").rows() == [
        (128, 1000.0, None, "static", 1), (1, None, 1000.0, "static", 1)]
    assert built["mi250_e2e"][1]["tp"].to_list() == [4]  # two modules, four dies
    assert "mixture-of-experts" in card and "another setup, not labelled here" in card
    assert "no conf/gpu spec for the hardware" in card
    assert card.count("| target |") == 2  # the coverage table: two groups of rows used
