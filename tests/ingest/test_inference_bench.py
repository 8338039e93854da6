"""LLM-Inference-Bench's files: copies of one run across figure files merge or are quarantined,
and files of another setting are listed as not read."""

from __future__ import annotations

import hashlib
from pathlib import Path

import polars as pl

from leaderboard.ingest import inference_bench
from leaderboard.ingest.base import IngestContext
from leaderboard.ingest.quarantine import validate
from leaderboard.ingest.sources import SourceFile
from leaderboard.ingest.tables import conform
from leaderboard_core.specs import load_gpu_specs, load_models

HEADER = "Hardware,Num of Hardware,Framework,Model,Input Output Length,Batch Size,Latency,Throughput\n"


def source(tmp_path: Path, name: str, text: str) -> SourceFile:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return SourceFile(inference_bench.ROOT + name, path, hashlib.sha256(text.encode()).hexdigest(),
                      True, "argonne-lcf/LLM-Inference-Bench", "0" * 40, "BSD-3-Clause")


def test_conflicting_copies_are_quarantined_and_agreeing_ones_merged(tmp_path):
    """One H100 run in the full set and in a figure file: 2.0 s and 2.1 s agree (the median,
    2,050 ms, is kept and counted), 3.0 s and 5.0 s (1.67x) conflict and both copies go to the
    quarantine; a KV-cache-off file is not read, and says why."""
    row = "Nvidia H100 GPU,1,vLLM,meta-llama/Llama-2-7b-hf,{isl},16,{s},1\n"
    files = [
        source(tmp_path, "All_results.csv",
               HEADER + row.format(isl=128, s=2.0) + row.format(isl=256, s=3.0)),
        source(tmp_path, "Fig_10/All_results.csv",
               HEADER + row.format(isl=128, s=2.1) + row.format(isl=256, s=5.0)),
        source(tmp_path, "Fig_2_a/All_results.csv", HEADER.replace("Latency", "KV Cache,Latency")),
    ]
    ctx = IngestContext(load_gpu_specs(), load_models())
    frames = [conform(df, table) for table, df in inference_bench.ingest(files, ctx)]
    kept = validate(pl.concat(frames), "e2e_runs", ctx.quarantine)
    assert kept.select("isl", "latency_ms", "sku", "model").rows() == [
        (128, 2050.0, "h100_sxm", "llama-2-7b")]
    quarantined = ctx.quarantine.table()
    assert quarantined["reason"].to_list() == ["duplicate_conflict"] * 2
    assert ctx.quarantine.merged_duplicates == {("e2e_runs", "inference_bench", "h100_sxm"): 2}
    assert ctx.skipped == [(files[2].rel, inference_bench.NOT_READ["Fig_2_a/"])]


def test_first_token_rows_keep_their_one_output_token_and_versions_follow_the_platform(tmp_path):
    ttft = source(tmp_path, "Fig_21/all_results_TTFT.csv",
                  "Hardware,Num of Hardware,Framework,Model,Input Length,Output Length,Batch Size,"
                  "Latency\n\nAMD MI300X GPU,1,vLLM,meta-llama/Meta-Llama-3-8B,1024,1,16,2.5\n"
                  "Intel PVC GPU,1,vLLM,Qwen/Qwen2-7B,1024,1,16,9.0\n")
    ctx = IngestContext(load_gpu_specs(), load_models())
    (_, frame), = inference_bench.ingest([ttft], ctx)
    assert frame.select("sku", "model", "isl", "osl", "latency_ms", "backend_version").rows() == [
        ("mi300x", "llama-3-8b", 1024, 1, 2500.0, "0.6.1"),
        (None, "qwen2-7b", 1024, 1, 9000.0, "unknown")]  # the PVC rows map to no GPU


def test_a_cell_that_is_not_a_number_quarantines_its_row_and_names_the_file(tmp_path):
    """A latency of 'n/a' and a device count of 'two' are each one row in the quarantine (the
    build goes on); the row beside them is read as before."""
    text = (HEADER + "Nvidia H100 GPU,1,vLLM,meta-llama/Llama-2-7b-hf,128,16,n/a,1\n"
            "Nvidia H100 GPU,two,vLLM,meta-llama/Llama-2-7b-hf,256,16,3.0,1\n"
            "Nvidia H100 GPU,1,vLLM,meta-llama/Llama-2-7b-hf,512,16,4.0,1\n"
            "Nvidia H100 GPU,2.0,vLLM,meta-llama/Llama-2-7b-hf,1024,16,5.0,1\n"
            "Nvidia H100 GPU,1.5,vLLM,meta-llama/Llama-2-7b-hf,2048,16,6.0,1\n")
    ctx = IngestContext(load_gpu_specs(), load_models())
    (_, frame), = inference_bench.ingest([source(tmp_path, "All_results.csv", text)], ctx)
    # "2.0" devices beside "two" in the same column is still 2; "1.5" devices is not a count
    assert frame.select("isl", "devices", "latency_ms").rows() == [(512, 1, 4000.0),
                                                                   (1024, 2, 5000.0)]
    quarantined = ctx.quarantine.table()
    assert quarantined["reason"].to_list() == ["unparsed_number"] * 3
    assert all("All_results.csv" in d for d in quarantined["detail"])
    assert ['"latency_ms": null' in r for r in quarantined["row"]] == [True, False, False]
