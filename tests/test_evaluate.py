"""The evaluation loop: the home split, blind prediction, leakage, validity and the run folder."""

from __future__ import annotations

import json
import re

import duckdb
import numpy as np
import polars as pl
import pytest

from leaderboard import paths, store
from leaderboard.evaluate import RunSpec, run
from leaderboard.split import split
from predictors import registry
from predictors.base import NotSupported, Predictor, PredictorCard

CARD = PredictorCard("analytical", "test", "probe", False)
SEEN: dict = {}


@pytest.fixture
def probes(monkeypatch, store_home):
    """Probe predictors in a scratch registry, against the real store."""
    registry.discover()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    SEEN.clear()

    @registry.register("spy")
    class Spy(Predictor):
        card = CARD

        def fit(self, home):
            SEEN["home"] = home
            return super().fit(home)

        def predict(self, cells, gpu):
            SEEN["cells"], SEEN["gpu"] = cells, gpu
            return np.full(len(cells), 1.0)

        def predict_ops(self, points, gpu):
            SEEN["points"] = points
            return np.full(len(points), 0.01)

    @registry.register("peeks_at_ground_truth")
    class Peek(Predictor):
        card = CARD

        def predict(self, cells, gpu):
            return cells["gt_ms"].to_numpy()

    @registry.register("opens_the_store")
    class Opener(Predictor):
        card = CARD

        def __init__(self, stage: str = "predict"):
            self.stage = stage

        def fit(self, home):
            if self.stage == "fit":
                store.connect()
            return super().fit(home)

        def predict(self, cells, gpu):
            with store.connect() as con:
                truth = con.execute("SELECT gt_ms FROM cells LIMIT 1").fetchall()
            return np.full(len(cells), truth[0][0])

    @registry.register("negative")
    class Negative(Predictor):
        card = CARD

        def predict(self, cells, gpu):
            return np.where(np.arange(len(cells)) == 0, -1.0, 1.0)

    @registry.register("reads_a_deploy_row")
    class Deploy(Predictor):
        card = CARD

        def deploy_rows(self, cells):
            return (cells["phase"] == "prefill").to_numpy()

        def calibrate(self, reading, gpu):
            self.floor_ = float(reading["gt_ms"].min())

        def predict(self, cells, gpu):
            SEEN["scored"] = cells
            return np.full(len(cells), self.floor_)

    return store_home


def _run(tmp_path, predictor, dataset, **kw):
    return run(RunSpec(predictor, dataset, kw.pop("params", {}), runs_dir=tmp_path / "runs", **kw))


def test_split_is_disjoint_seeded_and_the_same_on_every_gpu():
    cells = pl.DataFrame({"workload_id": [f"w{i}" for i in range(2000)]})
    train, test = split(cells, "workload_id", 0, 0.3)
    assert not set(train["workload_id"]) & set(test["workload_id"])
    assert len(train) + len(test) == 2000 and 500 < len(test) < 700
    assert split(cells.reverse(), "workload_id", 0, 0.3)[1]["workload_id"].sort().equals(
        test["workload_id"].sort())
    assert not split(cells, "workload_id", 1, 0.3)[1]["workload_id"].sort().equals(
        test["workload_id"].sort())
    with pytest.raises(ValueError, match="test_fraction"):
        split(cells, "workload_id", 0, 1.5)


def test_home_is_scored_on_held_out_cells_only_and_fit_sees_none(probes, tmp_path):
    """With home_points=behind_cells fit sees exactly the points behind the training cells
    (the default, full_grid, is tested in test_homes.py)."""
    result = _run(tmp_path, "spy", "a100_vidur", home_points="behind_cells")
    home, scored = SEEN["home"], result.predictions["cell_id"]
    assert result.metrics["split"] == "home_heldout" and result.metrics["valid"]
    assert not set(home.cells["cell_id"]) & set(scored)
    assert set(home.cells["sku"]) == {"a100_sxm"}
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        SEEN["cells"]["gt_ms"]
    with duckdb.connect(str(paths.store_path()), read_only=True) as con:
        lineage = con.sql("SELECT cell_id, op, key FROM cell_lineage WHERE dataset = 'a100_vidur'").pl()
    train = lineage.filter(pl.col("cell_id").is_in(home.cells["cell_id"].implode()))
    heldout_only = set(lineage["key"]) - set(train["key"])
    assert heldout_only, "the split should leave some measured points to held-out cells only"
    seen_points = sum(len(f) for f in home.ops.values())
    # one measured point may serve two ops (a GEMM shape shared by two configurations)
    assert seen_points == len(set(train.select("op", "key").iter_rows()))
    assert result.metrics["home_points"] == "behind_cells"


def _count(store_home, dataset: str, phase: str = "%") -> int:
    return store_home.sql(f"SELECT count(*) FROM cells WHERE dataset = '{dataset}' "
                          f"AND phase LIKE '{phase}'")[0][0]


def test_unseen_target_gets_only_the_home_and_its_own_datasheet(probes, store_home, tmp_path):
    result = _run(tmp_path, "spy", "h200_vidur")
    assert result.metrics["split"] == "unseen" and result.metrics["home_dataset"] == "a100_vidur"
    assert set(SEEN["home"].cells["sku"]) == {"a100_sxm"}
    assert SEEN["gpu"].sku == "h200_sxm"
    assert not {"gt_ms", "gt_spread_ms"} & set(SEEN["cells"].columns)
    assert result.metrics["phases"]["all"]["n"] == _count(store_home, "h200_vidur")


@pytest.mark.parametrize("predictor, params, reason", [
    ("peeks_at_ground_truth", {}, "ColumnNotFoundError"),
    ("opens_the_store", {"stage": "predict"}, "LeakageError"),
    ("opens_the_store", {"stage": "fit"}, "LeakageError"),
    ("negative", {}, r"1 of \d+ predictions are not finite and positive"),
])
def test_a_predictor_that_peeks_or_fails_is_invalid(probes, tmp_path, predictor, params, reason):
    result = _run(tmp_path, predictor, "h200_vidur", params=params)
    assert result.metrics["valid"] is False
    assert any(re.search(reason, r) for r in result.metrics["invalid_reasons"])
    assert json.loads((result.folder / "metrics.json").read_text())["valid"] is False


def test_the_deploy_reading_is_left_out_of_the_score(probes, store_home, tmp_path):
    result = _run(tmp_path, "reads_a_deploy_row", "h200_vidur")
    assert result.metrics["deploy_rows"] == _count(store_home, "h200_vidur", "prefill")
    assert set(result.metrics["deploy_row_ids"]).isdisjoint(result.predictions["cell_id"])
    assert (SEEN["scored"]["phase"] != "prefill").all()
    assert result.metrics["phases"]["prefill"]["n"] == 0


def test_run_folder_and_output_json(probes, store_home, tmp_path):
    out = tmp_path / "copy" / "m.json"
    result = _run(tmp_path, "spy", "l40s_vidur", output_json=str(out))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [result.folder.name]
    assert sorted(p.name for p in result.folder.iterdir()) == [
        "atlas.png", "metrics.json", "predictions.parquet"]
    metrics = json.loads(out.read_text())
    assert metrics == json.loads((result.folder / "metrics.json").read_text())
    for key in ("dataset_version", "home_dataset_version", "code_version", "code_hash"):
        assert metrics[key]
    saved = pl.read_parquet(result.folder / "predictions.parquet")
    assert len(saved) == _count(store_home, "l40s_vidur") and saved["pred_ms"].eq(1.0).all()
    assert metrics["phases"]["all"]["mape"] == pytest.approx(saved["signed_pct"].abs().mean())


def test_op_level_datasets_are_scored_the_same_way(probes, tmp_path):
    result = _run(tmp_path, "spy", "a100_sxm_ops")
    assert result.metrics["level"] == "op" and result.metrics["split"] == "home_heldout"
    assert set(result.metrics["phases"]) == {"all", "gemm", "attn_prefill", "attn_decode"}
    trained = {i for f in SEEN["home"].ops.values() for i in f["cell_id"]}
    assert trained and trained.isdisjoint(result.predictions["cell_id"])
    assert not {"gt_ms", "latency_ms", "flags"} & set(SEEN["points"].columns)
    unseen = _run(tmp_path, "spy", "h200_sxm_ops")
    assert unseen.metrics["phases"]["all"]["n"] == len(SEEN["points"])
    with pytest.raises(NotSupported, match="predict_ops"):
        _run(tmp_path, "negative", "h200_sxm_ops")


def test_unknown_dataset_gets_the_closest_name(probes, tmp_path):
    with pytest.raises(ValueError, match="Did you mean 'h200_vidur'"):
        _run(tmp_path, "spy", "h200_vidr")

