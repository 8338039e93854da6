"""The e2e family's targets: one per usable vLLM row, from the GPU's spec alone, and every other
row accounted for with its reason."""

from __future__ import annotations

import hashlib

import duckdb
import polars as pl
import yaml

from leaderboard.cells import static_batches
from leaderboard.ingest import inference_bench
from leaderboard.ingest.base import IngestContext
from leaderboard.ingest.quarantine import validate
from leaderboard.ingest.sources import SourceFile
from leaderboard.ingest.tables import conform
from leaderboard_core import paths
from leaderboard_core.specs import load_gpu_specs, load_models

ROWS = """Hardware,Num of Hardware,Framework,Model,Input Output Length,Batch Size,Latency,Throughput
New GPU X,1,vLLM,meta-llama/Meta-Llama-3-8B,128,16,1.0,1
New GPU X,1,vLLM,mistralai/Mixtral-8x7B-v0.1,128,16,2.0,1
New GPU X,1,TensorRT-LLM,meta-llama/Meta-Llama-3-8B,128,16,0.5,1
AMD MI250 GPU,2,vLLM,meta-llama/Llama-2-7b-hf,128,16,3.0,1
Intel PVC GPU,1,vLLM,meta-llama/Llama-2-7b-hf,128,16,9.0,1
Other GPU,1,vLLM,meta-llama/Llama-2-7b-hf,128,16,4.0,1
New GPU X,1,vLLM,facebook/opt-13b,128,16,5.0,1
"""
FIRST_TOKEN = """Hardware,Num of Hardware,Framework,Model,Input Length,Output Length,Batch Size,Latency
New GPU X,1,vLLM,meta-llama/Meta-Llama-3-8B,1024,1,16,0.25
"""


def store_of(tmp_path, gpus) -> duckdb.DuckDBPyConnection:
    """The e2e_runs table a build would write from ``ROWS`` and ``FIRST_TOKEN``."""
    files = []
    for name, text in (("All_results.csv", ROWS), ("Fig_21/all_results_TTFT.csv", FIRST_TOKEN)):
        path = tmp_path / "up" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        files.append(SourceFile(inference_bench.ROOT + name, path,
                                hashlib.sha256(text.encode()).hexdigest(), True,
                                "argonne-lcf/LLM-Inference-Bench", "0" * 40, "BSD-3-Clause"))
    ctx = IngestContext(gpus, load_models())
    frames = [conform(df, table) for table, df in inference_bench.ingest(files, ctx)]
    runs = validate(pl.concat(frames), "e2e_runs", ctx.quarantine)
    con = duckdb.connect()
    con.register("runs", runs.to_arrow())
    con.execute("CREATE TABLE e2e_runs AS SELECT * FROM runs")
    con.execute("CREATE TABLE quarantine (table_name VARCHAR)")
    con.execute("CREATE TABLE sources (rel VARCHAR, repo VARCHAR, commit VARCHAR)")
    return con


def test_a_gpu_of_this_source_builds_from_its_spec_alone(tmp_path):
    """A GPU no code names (``newgpu``: the MI300X's spec under another name and the upstream
    label ``New GPU X``, in an extra spec folder) gets its ``<short>_e2e`` set from the CSV rows
    alone: one target per vLLM row, a one-token row a TTFT target. An MI250 device is two dies
    (two devices: TP 4). A Mixtral row, a model without offline defaults, a PVC row and a label
    no spec lists are left out with their reasons; other frameworks' rows are not targets."""
    spec = yaml.safe_load((paths.CONF_DIR / "gpu" / "mi300x.yaml").read_text())
    spec.update(sku="newgpu", short_name="newgpu", upstream_labels={"inference_bench": "New GPU X"})
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "newgpu.yaml").write_text(yaml.safe_dump(spec))
    gpus = load_gpu_specs(tmp_path / "specs")
    built = {name: (sku, targets, card) for name, sku, targets, card in
             static_batches.build(store_of(tmp_path, gpus), gpus)}
    assert sorted(built) == ["mi250_e2e", "newgpu_e2e"]
    sku, targets, card = built["newgpu_e2e"]
    assert sku == "newgpu"
    assert targets.select("isl", "osl", "gt_e2e_ms", "gt_ttft_ms", "load", "tp").rows() == [
        (128, 128, 1000.0, None, "static", 1), (1024, 1, None, 250.0, "static", 1)]
    assert built["mi250_e2e"][1]["tp"].to_list() == [4]
    for why in ("mixture-of-experts", "another setup, not labelled here",
                "no conf/gpu spec for the hardware", "no max_model_len for opt-13b"):
        assert why in card, why
    assert "| TensorRT-LLM | 1 |" in card  # every framework counted in the store's rows
    assert card.count("| target |") == 2  # coverage: the two groups of rows used
