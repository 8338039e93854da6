"""The per-op atlas: each part of a split prediction against the measured time of its op."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from leaderboard.score import op_atlas, results


def test_per_op_table_by_hand():
    """Two cells of one run. Cell a: GEMM measured 2 x 1.0 ms (two lineage rows), predicted 3.0;
    all-reduce measured 1.0, predicted 0.5. Cell b: GEMM measured 4.0, predicted 4.0, no
    all-reduce in its lineage. Steps: a 3.0 ms, b 4.0 ms (7.0 in all). A part without a lineage
    op (light_kernels) and a null part are not placed."""
    predictions = pl.DataFrame({
        "predictor": ["p", "p"], "dataset": ["x_vidur", "x_vidur"], "split": ["unseen"] * 2,
        "cell_id": ["a", "b"], "gt_ms": [3.0, 4.0], "pred_ms": [3.5, 4.0],
        "op_ms_gemm": [3.0, 4.0], "op_ms_allreduce": [0.5, None],
        "op_ms_light_kernels": [0.0, 0.0]})
    lineage = pl.DataFrame({"dataset": ["x_vidur"] * 4, "cell_id": ["a", "a", "a", "b"],
                            "op": ["gemm", "gemm", "allreduce", "gemm"],
                            "latency_ms": [0.5, 1.0, 0.25, 2.0], "count": [2, 1, 4, 2]})
    table = op_atlas.table(predictions, op_atlas.of_lineage(lineage))
    rows = {r["op"]: r for r in table.iter_rows(named=True)}
    assert set(rows) == {"gemm", "allreduce"}
    assert rows["gemm"]["n"] == 2 and rows["gemm"]["ratio_median"] == pytest.approx(1.25)
    assert rows["gemm"]["mape"] == pytest.approx(25.0)  # |3/2 - 1| and |4/4 - 1|, averaged
    assert rows["gemm"]["share_pct"] == pytest.approx(600 / 7)
    assert rows["allreduce"]["n"] == 1 and rows["allreduce"]["ratio_median"] == pytest.approx(0.5)
    assert rows["allreduce"]["share_pct"] == pytest.approx(100 / 7)


def test_ops_error_by_phase_by_hand():
    """The cells of the test above, a in decode and b in prefill, plus c in decode with no
    all-reduce: GEMM measured 1.0, predicted 1.5, step 2.0 ms. Decode, over a and c: GEMM
    (3 - 2) / 3 and (1.5 - 1) / 2, all-reduce (0.5 - 1) / 3 and nothing for c."""
    predictions = pl.DataFrame({
        "predictor": ["p"] * 3, "dataset": ["x_vidur"] * 3, "split": ["unseen"] * 3,
        "phase": ["decode", "prefill", "decode"], "cell_id": ["a", "b", "c"],
        "gt_ms": [3.0, 4.0, 2.0], "pred_ms": [3.5, 4.0, 1.5],
        "op_ms_gemm": [3.0, 4.0, 1.5], "op_ms_allreduce": [0.5, None, None]})
    lineage = pl.DataFrame({"dataset": ["x_vidur"] * 5, "cell_id": ["a", "a", "a", "b", "c"],
                            "op": ["gemm", "gemm", "allreduce", "gemm", "gemm"],
                            "latency_ms": [0.5, 1.0, 0.25, 2.0, 1.0], "count": [2, 1, 4, 2, 1]})
    rows = {(r["phase"], r["op"]): r for r in op_atlas.by_phase(
        predictions, op_atlas.of_lineage(lineage)).iter_rows(named=True)}
    assert set(rows) == {("decode", "gemm"), ("decode", "allreduce"), ("prefill", "gemm")}
    assert rows["decode", "gemm"]["signed_pct"] == pytest.approx((100 / 3 + 25) / 2)
    assert rows["decode", "allreduce"]["abs_pct"] == pytest.approx(50 / 3 / 2)
    assert rows["decode", "allreduce"]["signed_pct"] == pytest.approx(-50 / 3 / 2)
    assert rows["prefill", "gemm"]["abs_pct"] == 0.0


def test_no_split_predictions_give_no_table():
    plain = pl.DataFrame({"predictor": ["p"], "dataset": ["x_vidur"], "split": ["unseen"],
                          "cell_id": ["a"], "gt_ms": [1.0], "pred_ms": [1.0]})
    assert op_atlas.table(plain, pl.DataFrame()).is_empty()


def test_predictions_of_runs_with_and_without_a_split_load_together(tmp_path):
    """A split run's predictions carry op_ms_* columns, a plain run's do not: both load, the
    plain run's parts are null, and only the valid split run is placed."""
    base = {"cell_id": ["a"], "dataset": ["x_vidur"], "gt_ms": [2.0], "pred_ms": [2.0]}
    folders = []
    for run_id, extra in (("split", {"op_ms_gemm": [2.0]}), ("plain", {})):
        folder = tmp_path / run_id
        folder.mkdir()
        pl.DataFrame({**base, **extra, "run_id": [run_id]}).write_parquet(
            folder / "predictions.parquet")
        folders.append(str(folder))
    runs = pl.DataFrame({"run_id": ["split", "plain"], "predictor": ["p", "q"],
                         "dataset": ["x_vidur"] * 2, "sku": ["x"] * 2, "split": ["unseen"] * 2,
                         "valid": [True, True], "folder": folders})
    loaded = results.load_predictions(runs)
    assert loaded.sort("run_id")["op_ms_gemm"].to_list() == [None, 2.0]
    lineage = pl.DataFrame({"dataset": ["x_vidur"], "cell_id": ["a"], "op": ["gemm"],
                            "latency_ms": [1.0], "count": [2]})
    table = op_atlas.table(loaded, op_atlas.of_lineage(lineage))
    assert table["predictor"].to_list() == ["p"] and table["ratio_median"].to_list() == [1.0]
    invalid = loaded.with_columns(valid=pl.lit(False))
    assert op_atlas.table(invalid, op_atlas.of_lineage(lineage)).is_empty()


@pytest.mark.parametrize("settings", [{}, {"figure.constrained_layout.use": True},
                                      {"figure.autolayout": True}])
def test_annotate_lays_out_once_and_leaves_no_engine_whatever_the_settings(settings):
    """The notes are sized to the laid-out boxes, so nothing may lay the figure out again when
    it is saved: no engine is left, whatever matplotlib settings the user has; a figure
    without an engine is annotated as it stands."""
    import matplotlib  # noqa: PLC0415
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from leaderboard.score import atlas  # noqa: PLC0415

    with matplotlib.rc_context(settings):
        for layout in ("constrained", None):
            fig, ax = plt.subplots(layout=layout)
            atlas.signed_heatmap(ax, np.array([[5.0, -30.0]]), {(0, 0): "+5\nn=3"}, ["b1"],
                                 ["c1", "c2"])
            atlas.annotate(fig)
            assert fig.get_layout_engine() is None
            assert [t.get_text() for t in ax.texts] == ["+5\nn=3"]
            plt.close(fig)
