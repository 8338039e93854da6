"""The metric registry: metrics.json keys stay as they were, a registered metric joins every
summary and the CLI table, a duplicate name is refused."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from leaderboard import cli
from leaderboard.score import metrics
from leaderboard.score.metrics import Metric, register_metric


def test_summary_keys_and_values_recomputed_from_the_errors():
    signed = np.array([-10.0, 20.0, 5.0, -40.0])
    out = metrics.summarize(signed)
    assert list(out) == ["n", "mape", "median_ape", "p90_ape", "bias"]
    assert out["n"] == 4 and out["mape"] == pytest.approx(18.75)
    assert out["median_ape"] == pytest.approx(15.0) and out["bias"] == pytest.approx(-6.25)
    assert metrics.summarize(np.array([]))["mape"] is None


def test_a_registered_metric_joins_summaries_and_the_table(capsys):
    register_metric(Metric("max_ape", "max APE %", lambda s: float(np.abs(s).max()),
                           levels=("step",)))
    try:
        frame = pl.DataFrame({"signed_pct": [-30.0, 10.0, 2.0], "phase": ["decode", "decode",
                                                                          "prefill"]})
        phases = metrics.by_phase(frame, ("all", "prefill", "decode"))
        assert phases["decode"]["max_ape"] == 30.0 and phases["prefill"]["max_ape"] == 2.0
        assert "max_ape" not in metrics.summarize(np.array([1.0]), level="op")
        cli.print_metrics({"predictor": "p", "dataset": "d", "split": "unseen",
                           "home_datasets": ["h"], "home_points_used": "full_grid",
                           "valid": True, "phases": phases, "invalid_reasons": [],
                           "fit_seconds": 1.0, "predict_cells_per_s": 1.0, "sandbox": "process",
                           "profiled_rows": 0, "reading_cap": 16}, "folder")
        assert "max APE %" in capsys.readouterr().out
    finally:
        metrics.unregister_metric("max_ape")


def test_all_leaves_out_composed_cells_and_their_phase_keeps_them():
    frame = pl.DataFrame({"signed_pct": [-10.0, 20.0, 40.0, -80.0],
                          "phase": ["decode", "prefill", "mixed", "mixed"],
                          "warm_share": [0.0, 0.5, 0.0, 0.0],
                          "composed": [False, False, True, False]})
    phases = metrics.by_phase(frame)
    assert phases["all"]["n"] == 3 and phases["all"]["mape"] == pytest.approx(110 / 3)
    assert phases["all_cold"]["n"] == 2 and phases["all_cold"]["mape"] == pytest.approx(45.0)
    assert phases["mixed"]["n"] == 2 and phases["mixed"]["mape"] == pytest.approx(60.0)
    unlabelled = metrics.by_phase(frame.drop("composed"))
    assert unlabelled["all"]["n"] == 4 and unlabelled["all"]["mape"] == pytest.approx(37.5)


def test_a_metric_twice_is_refused():
    with pytest.raises(ValueError, match="already registered.*Did you mean 'mape'"):
        register_metric(Metric("mape", "again", np.mean))


def test_replayed_and_traffic_leave_out_the_filler_and_weigh_by_replay_count():
    """By hand: filler (weight 0) is in all but not in replayed; traffic counts a cell as often
    as the replay produced it; a composed cell is in neither."""
    predictions = pl.DataFrame({
        "phase": ["decode", "decode", "prefill", "mixed"],
        "signed_pct": [10.0, -30.0, 50.0, 99.0], "composed": [False, False, False, True],
        "weight": [3, 1, 0, 5]})
    phases = metrics.by_phase(predictions)
    assert phases["all"]["mape"] == pytest.approx((10 + 30 + 50) / 3)
    assert phases["replayed"]["mape"] == pytest.approx((10 + 30) / 2)
    assert phases["traffic"]["mape"] == pytest.approx((3 * 10 + 30) / 4)
    assert phases["traffic"]["bias"] == pytest.approx((3 * 10 - 30) / 4)
    assert phases["traffic"]["n"] == 4 and phases["replayed"]["n"] == 2
    without = metrics.by_phase(predictions.drop("weight"))
    assert "replayed" not in without and "traffic" not in without
