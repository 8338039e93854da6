"""aiconfigurator's in-sample reference: what it is asked for each target, its errors worked by
hand, the section beside the oracle, and (where its own virtualenv exists) a live estimate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import platformdirs
import polars as pl
import pytest

from leaderboard.present import aiconfigurator_section as reference

MODELS = {
    "dense": {"hf_id": "meta-llama/Llama-3.1-8B", "aliases": ["meta-llama/Meta-Llama-3.1-8B"]},
    "moe": {"hf_id": "Qwen/Qwen3-235B-A22B", "num_experts": 128, "fp8_scaling": "block"},
}


def _targets(**over) -> pl.DataFrame:
    row = {"target_id": "t1", "dataset": "h100_silicon", "sku": "h100_sxm", "model": "dense",
           "backend": "vllm", "isl": 1024, "osl": 128, "concurrency": 8, "tp": 2, "moe_ep": None,
           "gemm_dtype": "bf16", "load": "closed"}
    return pl.DataFrame([{**row, **over}])


def test_a_dense_bf16_target_is_asked_as_its_closed_loop_with_every_name_of_its_model():
    (asked,) = reference.requests(_targets(), MODELS)
    assert asked == {"target_id": "t1", "dataset": "h100_silicon",
                     "model_aliases": ["meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"],
                     "system": "h100_sxm", "backend": "vllm", "isl": 1024, "osl": 128,
                     "concurrency": 8, "tp": 2, "moe_tp": None, "moe_ep": None,
                     "gemm_quant": "bfloat16", "moe_quant": None}


def test_an_fp8_moe_target_names_its_block_scales_and_where_its_experts_sit():
    split = reference.requests(_targets(model="moe", gemm_dtype="fp8", moe_ep=1, tp=4), MODELS)[0]
    spread = reference.requests(_targets(model="moe", gemm_dtype="fp8", moe_ep=4, tp=4), MODELS)[0]
    assert (split["gemm_quant"], split["moe_quant"]) == ("fp8_block", "fp8_block")
    assert (split["moe_tp"], split["moe_ep"]) == (4, 1)  # each expert split over the group
    assert (spread["moe_tp"], spread["moe_ep"]) == (1, 4)  # whole experts spread over it
    dense_fp8 = reference.requests(_targets(gemm_dtype="fp8"), MODELS)[0]
    assert (dense_fp8["gemm_quant"], dense_fp8["moe_quant"]) == ("fp8", None)


def test_recorded_arrivals_and_gpus_without_tables_are_not_asked():
    assert reference.requests(_targets(load="recorded"), MODELS) == []
    assert reference.requests(_targets(sku="rtx4090"), MODELS) == []


def test_the_errors_are_the_answers_against_the_measured_targets_by_hand():
    estimates = [{"target_id": "a", "dataset": "d", "ttft_ms": 110.0, "tpot_ms": 9.0},
                 {"target_id": "b", "dataset": "d", "ttft_ms": 60.0, "tpot_ms": 12.0},
                 {"target_id": "c", "dataset": "d", "error": "no model config"}]
    measured = pl.DataFrame({"dataset": ["d"] * 6,
                             "cell_id": ["a:ttft", "a:tpot", "b:ttft", "b:tpot", "c:ttft",
                                         "c:tpot"],
                             "gt_ms": [100.0, 10.0, 50.0, 10.0, 80.0, 8.0]})
    found = {r["metric"]: r for r in reference.errors(estimates, measured).iter_rows(named=True)}
    # TTFT: +10 % and +20 %; TPOT: -10 % and +20 %; c asked, never answered
    assert found["ttft"]["asked"] == 3 and found["ttft"]["answered"] == 2
    assert found["ttft"]["mape"] == pytest.approx(15.0)
    assert found["tpot"]["mape"] == pytest.approx(15.0)
    assert found["tpot"]["median_signed"] == pytest.approx(5.0)


def test_the_section_sits_beside_the_oracle_and_says_it_is_never_ranked(tmp_path):
    path = tmp_path / "reference.json"
    path.write_text(json.dumps({
        "aiconfigurator": "0.12.0", "database_versions": {"vllm": "0.24.0"}, "made": "2026-12-07",
        "code_version": "abcdef123456789",
        "estimates": [{"target_id": "a", "dataset": "h100_silicon", "ttft_ms": 110.0,
                       "tpot_ms": 9.0}]}))
    predictions = pl.DataFrame({"dataset": ["h100_silicon"] * 2, "cell_id": ["a:ttft", "a:tpot"],
                                "gt_ms": [100.0, 10.0]})
    oracle = pl.DataFrame({"dataset": ["h100_silicon"], "phases": [json.dumps(
        {"ttft": {"mape": 7.5}, "tpot": {"mape": 3.25}})]})
    text = "\n".join(reference.section(oracle, predictions, path))
    assert "never ranked" in text and "vllm 0.24.0" in text
    assert "| h100_silicon | 1 of 1 | 10.0 | 10.0 | 10.0 | -10.0 | 7.5 | 3.2 |" in text.replace(
        "3.25", "3.2")
    assert reference.section(oracle, predictions, tmp_path / "none.json") == []


@pytest.mark.slow
def test_the_pinned_release_estimates_a_target_in_its_own_environment():
    # where `python -m leaderboard.reference` put it on this machine (the user's suite home,
    # not the test's own)
    home = Path(platformdirs.user_cache_dir("llm-leaderboard"))
    python = home / "venvs" / f"aiconfigurator-{reference.VERSION}" / "bin" / "python"
    if not python.is_file() or subprocess.run([python, "-c", "import aiconfigurator"],
                                              capture_output=True).returncode:
        pytest.skip(f"aiconfigurator {reference.VERSION} is not installed in {python.parent.parent}"
                    " (python -m leaderboard.reference installs it there, from the registry)")
    from leaderboard.reference import estimate

    asked = reference.requests(_targets(), MODELS)
    (answer,) = estimate(python, asked)
    assert answer["model_path"] == "meta-llama/Meta-Llama-3.1-8B"  # the name it ships a config of
    assert 0 < answer["tpot_ms"] < answer["ttft_ms"] < 10_000 and answer["database_version"]
