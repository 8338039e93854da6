"""The serving section: the oracle's bracket, what stops it, the recorded-arrivals oracle, the
closed-loop lengths table and the GPU ranking of one deployment."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest


def test_the_bracket_split_adds_up_to_the_headline_ttft_mape():
    """Three closed loops, one inside the bracket, one above, one below: each side's points
    of MAPE and distance, by hand."""
    from leaderboard.present import serving_oracle as report_oracle

    ends = {"in": (100.0, 150.0, 80.0), "up": (200.0, 150.0, 100.0), "down": (50.0, 100.0, 80.0)}
    rows = pl.DataFrame([{"dataset": "d", "workload_id": w, "gt_ms": gt, "phase": phase,
                          "pred_ms": pred, "signed_pct": (pred - gt) / gt * 100}
                         for w, (gt, lock, steady) in ends.items()
                         for phase, pred in (("ttft", lock), ("ttft_steady", steady))])
    lines = report_oracle.bracket_split(rows)
    # errors 50, 25 and 100 % over 3 targets; above: 200 against 150, below: 50 against 80
    assert "| d | 3 | 58.3 | 1: 16.7 | 1: 8.3 (25.0 % off) | 1: 33.3 (60.0 % off) |" in lines
    assert report_oracle.inside_bracket(rows)["d"] == (3, pytest.approx(100 / 3),
                                                       pytest.approx((25 + 60) / 3))


def test_what_stops_the_oracle_reads_the_missing_tpot_per_client_and_the_misses(tmp_path):
    """Synthetic oracle rows: the engine's TPOT is the oracle's plus 0.1 ms per client (100 µs a
    client), its TTFT 20 % above: the table reads that back and names both goals missed."""
    from leaderboard.present import serving_oracle as report_oracle

    def what_stops_the_oracle(rows):  # without the benchmarks' files
        return report_oracle.what_stops_the_oracle(rows, tmp_path / "no", tmp_path / "no",
                                                   tmp_path / "no", tmp_path / "no")

    c = np.array([8, 16, 64, 128])
    tpot_pred, ttft_pred = 10.0 + 0 * c, 100.0 + 0 * c
    rows = pl.DataFrame({
        "dataset": "h100_silicon", "backend": "vllm", "model": "qwen3-32b", "tp": 2, "isl": 1024,
        "concurrency": np.tile(c, 2), "workload_id": np.tile(np.arange(4), 2),
        "phase": ["tpot"] * 4 + ["ttft"] * 4,
        "pred_ms": np.concatenate([tpot_pred, ttft_pred]),
        "gt_ms": np.concatenate([tpot_pred + 0.1 * c, ttft_pred * 1.25])})
    rows = rows.with_columns(signed_pct=(pl.col("pred_ms") / pl.col("gt_ms") - 1) * 100)
    text = "\n".join(what_stops_the_oracle(rows))
    row = next(line for line in text.splitlines() if line.startswith("| h100_silicon | vllm"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[2] == "4" and cells[4] == "-20.0"  # 100 / 125 - 1
    assert cells[7] == "0.80 / 12.80" and cells[8] == "100.0"
    assert cells[9:] == ["—", "—"]  # no steady-state rows
    assert "TTFT 20.0 % against 12 %" in text and "missed" in text
    # the measured TTFT 5 ms + 2 ms a client above the steady state's: 21 at c 8, 261 at 128
    steady = rows.filter(phase="ttft").with_columns(
        phase=pl.lit("ttft_steady"), pred_ms=pl.col("gt_ms") - 5.0 - 2.0 * pl.col("concurrency"))
    text = "\n".join(what_stops_the_oracle(pl.concat([rows, steady], how="vertical_relaxed")))
    row = next(line for line in text.splitlines() if line.startswith("| h100_silicon | vllm"))
    assert [x.strip() for x in row.strip("|").split("|")][9:] == ["21.00 / 261.00", "2.0"]
    # a second model at the high loads only, with a constant gap: pooled over both, the line
    # would tilt; per (model, TP, isl), the first model's 100 µs and the second's 0 give 50
    other = pl.DataFrame({
        "dataset": "h100_silicon", "backend": "vllm", "model": "llama-3.1-8b", "tp": 2,
        "isl": 1024, "concurrency": [64, 128, 64, 128], "workload_id": [4, 5, 4, 5],
        "phase": ["tpot"] * 2 + ["ttft"] * 2,
        "pred_ms": [10.0, 10.0, 100.0, 100.0], "gt_ms": [30.0, 30.0, 125.0, 125.0]}).with_columns(
        signed_pct=(pl.col("pred_ms") / pl.col("gt_ms") - 1) * 100)
    text = "\n".join(what_stops_the_oracle(pl.concat([rows, other], how="vertical_relaxed")))
    row = next(line for line in text.splitlines() if line.startswith("| h100_silicon | vllm"))
    assert [x.strip() for x in row.strip("|").split("|")][8] == "50.0"


def test_a_recorded_arrivals_oracle_is_read_without_loads_and_with_its_service_time(tmp_path):
    """Recorded arrivals (no concurrency, a prompt length per request): no gap by load, and the
    verdict gives the service time's error, here 20 % and 40 % short: mean 30, median -30; with
    the light-kernel benchmark's JSON, the line ends with what its own GPU's kernels give."""
    from leaderboard.present import serving_oracle as report_oracle

    rows = pl.DataFrame({
        "dataset": "rtx4090_serving", "backend": "vllm", "model": "llama-3.1-8b", "tp": 1,
        "isl": [100, 900] * 3, "concurrency": pl.Series([None] * 6, dtype=pl.Int64),
        "workload_id": [0, 1] * 3, "phase": ["ttft"] * 2 + ["tpot"] * 2 + ["service"] * 2,
        "pred_ms": [1000.0, 2000.0, 10.0, 10.0, 80.0, 60.0],
        "gt_ms": [1000.0, 2000.0, 10.0, 10.0, 100.0, 100.0]}).with_columns(
        signed_pct=(pl.col("pred_ms") / pl.col("gt_ms") - 1) * 100)
    text = "\n".join(report_oracle.what_stops_the_oracle(rows, tmp_path / "no", tmp_path / "no",
                                                         tmp_path / "no", tmp_path / "no"))
    row = next(line for line in text.splitlines() if line.startswith("| rtx4090_serving | vllm"))
    assert [x.strip() for x in row.strip("|").split("|")][7:] == ["—"] * 4
    assert "`rtx4090_serving` (recorded arrivals, not held to the `_silicon` goal): TTFT and " \
           "TPOT within its thresholds" in text and "met" not in text
    assert "service time (first token minus first scheduled, TTFT without the queue) is 30.0 % " \
           "MAPE, signed median -30.0 %" in text
    light = tmp_path / "light.json"
    light.write_text(json.dumps({"rows": [{
        "dataset": "rtx4090_serving", "backend": "all", "n": 300, "sampling_added": 300,
        "light_source": "llmservingsim rtx4090", "sampler_source": "rtx4090",
        **{f"{name}_{metric}": value for name, shift in (("headline", 0.0), ("light", -2.0),
                                                         ("sampled", -2.5))
           for metric, value in (("ttft_mape", 8.0 + shift), ("tpot_mape", 5.0 + shift),
                                 ("tpot_signed_median", -3.0 - shift))}}]}))
    text = "\n".join(report_oracle.what_stops_the_oracle(rows, tmp_path / "no", tmp_path / "no",
                                                         light, tmp_path / "no"))
    line = next(x for x in text.splitlines() if x.startswith("`rtx4090_serving`"))
    assert ("MAPE, signed median -30.0 %. Measured: the light kernels (llmservingsim rtx4090) "
            "added to every step (`benchmarks/light_kernels.py`) give 6.0 % TTFT and 3.0 % TPOT "
            "against 8.0 % and 5.0 %") in line
    assert line.endswith("the rtx4090 sampler on 300 of its 300 targets too 5.5 % and 2.5 %.")


def test_the_bracket_counts_measured_ttfts_between_lockstep_and_steady_state():
    """Three closed-loop targets with both bounds (lockstep 8, steady 5 ms): measured 6 lies
    between them, 9 above, 4 below: one in three, off the bracket by 0, 1/9 and 1/4 of the
    measured. A target without its steady row is not counted."""
    from leaderboard.present.serving_oracle import inside_bracket

    rows = pl.DataFrame({
        "dataset": "h200_silicon_fp8", "workload_id": ["a", "b", "c", "a", "b", "c", "d"],
        "phase": ["ttft"] * 3 + ["ttft_steady"] * 3 + ["ttft"],
        "gt_ms": [6.0, 9.0, 4.0, 6.0, 9.0, 4.0, 6.0],
        "pred_ms": [8.0, 8.0, 8.0, 5.0, 5.0, 5.0, 8.0]})
    n, share, off = inside_bracket(rows)["h200_silicon_fp8"]
    assert n == 3 and share == pytest.approx(100 / 3)
    assert off == pytest.approx(100 * (0 + 1 / 9 + 1 / 4) / 3)
    # the bracket is the interval either way round
    flipped = rows.with_columns(pred_ms=pl.when(pl.col("phase") == "ttft").then(5.0).otherwise(8.0))
    assert inside_bracket(flipped)["h200_silicon_fp8"] == (3, pytest.approx(100 / 3),
                                                           pytest.approx(off))
    assert inside_bracket(rows.filter(pl.col("phase") == "ttft")) == {}


def test_the_closed_loop_lengths_table_shows_each_length_and_the_best_per_set(tmp_path):
    """Two sets, lengths (4, 0) (4, 2) (10, 0) (10, 2): a length the benchmark did not replay
    shows as a dash; the best length per set is the lowest TTFT MAPE over every backend
    together, the shorter loop on a tie, and is within the goal only at 12 % or less."""
    from leaderboard.present.serving_unknowns import closed_loop_lengths

    def row(dataset, backend, waves, dropped, ttft, tpot=5.0, n=3):
        return {"dataset": dataset, "backend": backend, "waves": waves, "dropped": dropped,
                "n": n, "ttft_mape": ttft, "tpot_mape": tpot}

    bench = {"waves": [4, 10], "dropped": [0, 2], "seconds": 1.0, "code_version": "abc",
             "date": "2026-12-03", "rows": [
                 row("b_set", "all", 4, 0, 30.0), row("b_set", "all", 10, 0, 11.0),
                 row("b_set", "all", 10, 2, 11.0), row("b_set", "vllm", 10, 0, 11.0, n=2),
                 row("a_set", "all", 4, 0, 50.0), row("a_set", "all", 4, 2, 40.0, 9.0),
                 row("a_set", "all", 10, 0, 45.0), row("a_set", "all", 10, 2, 41.0)]}
    path = tmp_path / "waves.json"
    assert "No closed-loop length benchmark" in closed_loop_lengths(path)[0]
    path.write_text(json.dumps(bench))
    lines = closed_loop_lengths(path)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines
            if line.startswith("| ") and not line.startswith(("| dataset", "| ---"))]
    assert [r[:3] for r in rows] == [["a_set", "all", "3"], ["b_set", "all", "3"],
                                     ["b_set", "vllm", "2"]]
    assert rows[1][3:] == ["30.0 / 5.0", "—", "11.0 / 5.0", "11.0 / 5.0"]
    assert rows[2][3:] == ["—", "—", "11.0 / 5.0", "—"]
    best = [line for line in lines if line.startswith("- ")]
    assert best == ["- `a_set`: at best 40.0 % TTFT, 9.0 % TPOT (4 waves, first 2 dropped), "
                    "outside the 12 % TTFT goal.",
                    "- `b_set`: at best 11.0 % TTFT, 5.0 % TPOT (10 waves), within the 12 % "
                    "TTFT goal."]


def test_the_serving_ranking_pairs_one_deployment_on_two_gpus_only():
    """A load measured with vLLM on H200 and B200 is one pair; TRT-LLM's run of the same model,
    precision, TP and load on B200 pairs with nothing (another engine), nor does an
    expert-parallel run beside a split one. Measured B200 faster; one predictor says so (correct),
    the other says H200 (wrong)."""
    from leaderboard.present.serving_section import sku_ranking

    load = {"model": "llama-3.1-70b", "precision": "fp8", "tp": 2, "isl": 1024, "osl": 1024,
            "concurrency": 8, "phase": "tpot", "valid": True, "split": "unseen"}
    rows = []
    for predictor, b200_pred in (("right", 8.0), ("wrong", 12.0)):
        rows += [{**load, "predictor": predictor, "sku": "h200_sxm", "backend": "vllm",
                  "moe_ep": None, "gt_ms": 10.0, "pred_ms": 10.0},
                 {**load, "predictor": predictor, "sku": "b200_sxm", "backend": "vllm",
                  "moe_ep": None, "gt_ms": 7.0, "pred_ms": b200_pred},
                 {**load, "predictor": predictor, "sku": "b200_sxm", "backend": "trtllm",
                  "moe_ep": None, "gt_ms": 20.0, "pred_ms": 5.0},
                 {**load, "predictor": predictor, "sku": "gb200", "backend": "vllm",
                  "moe_ep": 2, "gt_ms": 30.0, "pred_ms": 1.0}]
    text = "\n".join(sku_ranking(pl.DataFrame(rows)))
    assert "Loads measured on more than one GPU: 1." in text and ": 0 such." in text
    assert "| right | 1 | 1 | 1 | 0 | 0 |" in text and "| wrong | 1 | 1 | 0 | 1 | 0 |" in text
    # B200 ran the load again at another vLLM version (measured 9, predicted 8 by both): one
    # B200 result at the means (8 measured; 8 and 10 predicted), still one pair each
    again = [{**r, "gt_ms": 9.0, "pred_ms": 8.0} for r in rows
             if r["sku"] == "b200_sxm" and r["backend"] == "vllm"]
    text = "\n".join(sku_ranking(pl.DataFrame(rows + again)))
    assert "Loads measured on more than one GPU: 1." in text and ": 1 such." in text
    assert "| right | 1 | 1 | 1 | 0 | 0 |" in text and "| wrong | 1 | 1 | 0 | 0 | 1 |" in text
