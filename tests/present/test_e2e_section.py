"""The e2e family's section: its GPU-mean leaves out another board of the home's chip, and every
set without a number says why."""

from __future__ import annotations

import json

import polars as pl

from leaderboard.present import e2e_section


def run(predictor: str, dataset: str, sku: str, mape: float | None, valid: bool = True) -> dict:
    phases = {} if mape is None else {"e2e": {"mape": mape, "bias": -mape, "n": 10}}
    return {"predictor": predictor, "dataset": dataset, "sku": sku, "split": "unseen",
            "home_sku": "a100_sxm", "valid": valid, "phases": json.dumps(phases),
            "invalid_reasons": [] if valid else ["predict returned NaN"]}


def test_the_gpu_mean_is_over_chips_no_predictor_was_fitted_on_and_reasons_are_listed():
    runs = pl.DataFrame([
        run("p", "a100sxm40_e2e", "a100_sxm40", 10.0),  # the home's chip: shown, not averaged
        run("p", "mi300x_e2e", "mi300x", 40.0), run("p", "h100_e2e", "h100_sxm", 20.0),
        run("q", "mi300x_e2e", "mi300x", None, valid=False), run("q", "h100_e2e", "h100_sxm", 5.0),
    ])
    oracle = pl.DataFrame([run("table_scaled", "h100_e2e", "h100_sxm", 22.0)])
    outcomes = {("q", "a100sxm40_e2e"): "not supported: no tables of the 40 GB board"}
    text = "\n".join(e2e_section.section(runs, oracle, outcomes))
    assert "| p | 10.0 (-10.0) | 20.0 (-20.0) | 40.0 (-40.0) | 30.0 |" in text
    assert "| q | n/s | 5.0 (-5.0) | INVALID | — |" in text
    assert "| oracle (h100_e2e) | — | 22.0 (-22.0) | — | — |" in text
    assert "- q on `a100sxm40_e2e`: not supported: no tables of the 40 GB board" in text
    assert "- q on `mi300x_e2e`: INVALID: predict returned NaN" in text
    assert "end-to-end MAPE 22.0 %" in text and "(h100_e2e, mi300x_e2e;" in text
