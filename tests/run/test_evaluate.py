"""The evaluation loop: the home split, blind prediction, leakage, validity and the run folder."""

from __future__ import annotations

import json
import re
import shutil

import duckdb
import polars as pl
import probe_predictors
import pytest

from leaderboard.run import run_inputs
from leaderboard.run.evaluate import RunSpec, run
from leaderboard.run.split import split
from leaderboard.seal import landlock, sandbox, talk
from leaderboard_core import paths
from leaderboard_core.contract import NotSupported
from predictors import registry

PROBES = {"spy": probe_predictors.Spy, "peeks_at_ground_truth": probe_predictors.Peek,
          "negative": probe_predictors.Negative, "reads_prefill": probe_predictors.ReadsPrefill,
          "reads_op_points": probe_predictors.ReadsOpPoints,
          "splits_badly": probe_predictors.SplitsBadly,
          "splits_misshapen": probe_predictors.SplitsMisshapen,
          "hoards_reading": probe_predictors.HoardsReading, **probe_predictors.CHEATS}
# The spies write what they saw to their cache, after a reading too, which a run undoes
# (sandbox_talk.put_back); the probes fixture lets them keep it, and the undoing is tested on
# its own.
PUT_BACK = talk.put_back


@pytest.fixture
def probes(monkeypatch, store_home):
    """Probe predictors in a scratch registry, against the real store."""
    registry.discover()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    # Blind only the cache comparison around a reading; the cache's key is seeded, so kept.
    monkeypatch.setattr(talk, "put_back", lambda cache, snapshot, before: [])
    for name, cls in PROBES.items():
        registry.register(name)(cls)
    for old in (store_home.home / "predictor-cache").glob("*/llm-leaderboard/spy"):
        shutil.rmtree(old, ignore_errors=True)
    return store_home


def SPY(real_store):  # noqa: N802 - where the child's spy wrote, seen from the parent
    """The spy's cache folder of its latest run (one folder per predictor and fit input)."""
    found = sorted((real_store.home / "predictor-cache").glob("*/llm-leaderboard/spy"),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else real_store.home / "predictor-cache" / "none"


def seen(real_store, name: str) -> pl.DataFrame:
    return pl.read_ipc(SPY(real_store) / f"{name}.arrow")


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
    result = _run(tmp_path, "spy", "a100_vidur", home_points="behind_cells")
    home_cells, scored = seen(probes, "home_cells"), result.predictions["cell_id"]
    assert result.metrics["split"] == "home_heldout" and result.metrics["valid"]
    assert not set(home_cells["cell_id"]) & set(scored)
    assert set(home_cells["sku"]) == {"a100_sxm"}
    assert "gt_ms" not in seen(probes, "cells").columns
    with duckdb.connect(str(paths.store_path()), read_only=True) as con:
        lineage = con.sql("SELECT cell_id, op, key FROM cell_lineage WHERE dataset = 'a100_vidur'").pl()
    train = lineage.filter(pl.col("cell_id").is_in(home_cells["cell_id"].implode()))
    heldout_only = set(lineage["key"]) - set(train["key"])
    assert heldout_only, "the split should leave some measured points to held-out cells only"
    home = json.loads((SPY(probes) / "home.json").read_text())
    # one measured point may serve two ops (a GEMM shape shared by two configurations)
    assert home["op_points"] == len(set(train.select("op", "key").iter_rows()))
    assert result.metrics["home_points"] == "behind_cells"


def _count(store_home, dataset: str, phase: str = "%") -> int:
    return store_home.sql(f"SELECT count(*) FROM cells WHERE dataset = '{dataset}' "
                          f"AND phase LIKE '{phase}'")[0][0]


def test_unseen_target_gets_only_the_home_and_its_own_datasheet(probes, store_home, tmp_path):
    result = _run(tmp_path, "spy", "h200_vidur")
    assert result.metrics["split"] == "unseen" and result.metrics["home_dataset"] == "a100_vidur"
    assert set(seen(probes, "home_cells")["sku"]) == {"a100_sxm"}
    assert json.loads((SPY(probes) / "gpu.json").read_text())["sku"] == "h200_sxm"
    assert not {"gt_ms", "gt_spread_ms"} & set(seen(probes, "cells").columns)
    # composed (mixed) cells are scored in their phase only, never in "all"
    phases = result.metrics["phases"]
    assert phases["all"]["n"] == _count(store_home, "h200_vidur") - _count(
        store_home, "h200_vidur", "mixed") > 0
    assert phases["mixed"]["n"] == _count(store_home, "h200_vidur", "mixed") > 0


@pytest.mark.parametrize("predictor, reason", [
    ("peeks_at_ground_truth", "ColumnNotFoundError"),
    ("negative", r"1 of \d+ predictions are not finite and positive"),
    # the seven routes to the target's ground truth that once gave VALID 0 % runs
    ("env_store", "KeyError: 'LEADERBOARD_HOME'"),  # the child's environment has none
    ("home_store", "IOException"),  # the child's home is its predictor cache: no store there
    ("thread_store", "LeakageError"),  # the whole child is sealed, every thread
    ("constructor_store", "LeakageError"),  # the constructor runs in the child too
    ("stack_frame", "LookupError: no frame holds the target"),
    ("gc_objects", "LookupError: no live DataFrame holds the target's ground truth"),
])
def test_a_predictor_that_peeks_or_fails_is_invalid(probes, tmp_path, predictor, reason):
    result = _run(tmp_path, predictor, "h200_vidur")
    assert result.metrics["valid"] is False, result.metrics["phases"]
    assert any(re.search(reason, r) for r in result.metrics["invalid_reasons"]), result.metrics
    assert json.loads((result.folder / "metrics.json").read_text())["valid"] is False


@pytest.mark.skipif(not landlock.abi_version(), reason="the kernel has no Landlock")
def test_landlock_refuses_the_raw_upstream_files(probes, tmp_path):
    upstream = paths.SHARED_UPSTREAM
    assert (upstream / "Mutinifni__splitwise-sim" / "data" / "perf_model.csv").is_file()
    result = _run(tmp_path, "raw_upstream", "h100_splitwise", params={"upstream": str(upstream)})
    assert result.metrics["sandbox"].endswith("landlock") and result.metrics["valid"] is False
    assert any("PermissionError" in r for r in result.metrics["invalid_reasons"])


@pytest.mark.parametrize("predictor, dataset, attempt", [
    ("quiet_store", "h100_splitwise", "open the store during the sandboxed fit and predict"),
    ("quiet_upstream", "h100_splitwise", "open .*perf_model.csv"),
    ("quiet_store", "gb200_silicon", "open the store during"),  # serving: a replay, no predict
])
def test_a_predictor_that_swallows_the_refusal_is_still_invalid(probes, tmp_path, predictor,
                                                                dataset, attempt):
    """It reads nothing and predicts a constant, but it tried: the attempt is recorded in the
    child, by the guard or by the audit hook on opens, and the run is INVALID."""
    params = {"upstream": str(paths.SHARED_UPSTREAM)} if predictor == "quiet_upstream" else {}
    result = _run(tmp_path, predictor, dataset, params=params)
    assert result.metrics["valid"] is False, result.metrics
    reasons = [r for r in result.metrics["invalid_reasons"] if "reached for sealed data" in r]
    assert len(reasons) == 1 and re.search(fr"\(1 attempt\(s\); first: {attempt}", reasons[0]), reasons


def test_a_library_scanning_a_watched_working_folder_is_not_an_attempt(probes, tmp_path,
                                                                      monkeypatch):
    """A run started from inside a watched folder (here the suite's home) must not hand that
    folder to the child's import path, where a package-metadata scan would open it (under
    Landlock, which refuses the listing, importlib.metadata opens the folder itself)."""
    monkeypatch.chdir(probes.home)
    monkeypatch.syspath_prepend(str(probes.home))
    folder = tmp_path / "job"
    job = sandbox.job({"module": "m", "qualname": "q", "name": "n"}, {},
                      "step", 0, folder, tmp_path / "cache")
    assert str(probes.home) not in job["sys_path"] and str(probes.home) in job["watch"]
    result = _run(tmp_path, "scans_metadata", "h100_splitwise")
    assert result.metrics["valid"], result.metrics["invalid_reasons"]


def test_the_runs_own_places_are_watched_even_before_they_exist(tmp_path):
    spec = RunSpec("ours", "h100_vidur", {}, runs_dir=tmp_path / "new_runs",
                   sources_root=str(tmp_path / "up"), hub_repo="someone/some-export")
    assert run_inputs._data_roots(spec) == (str(tmp_path / "up"), str(tmp_path / "new_runs"))
    (tmp_path / "export").mkdir()
    spec.hub_repo = str(tmp_path / "export")
    assert str(tmp_path / "export") in run_inputs._data_roots(spec)


def test_the_deploy_reading_is_capped_counted_and_left_out_of_the_score(probes, store_home,
                                                                       tmp_path):
    assert _count(store_home, "h200_vidur") >= 1600  # so the cap is min(16, 1 %) = 16
    result = _run(tmp_path, "reads_prefill", "h200_vidur")
    assert result.metrics["valid"] and result.metrics["profiled_rows"] == 16
    assert result.metrics["reading_cap"] == 16 and result.metrics["deploy_rows"] == 16
    read = set(result.metrics["deploy_row_ids"])
    assert read.isdisjoint(result.predictions["cell_id"])
    assert read.isdisjoint(seen(probes, "scored")["cell_id"])
    assert result.metrics["phases"]["prefill"]["n"] == _count(store_home, "h200_vidur", "prefill") - 16
    with duckdb.connect(str(probes.path), read_only=True) as con:
        floor = con.execute("SELECT min(gt_ms) FROM cells WHERE dataset = 'h200_vidur' AND "
                            "cell_id IN (SELECT unnest($ids))", {"ids": sorted(read)}).fetchone()[0]
    assert result.predictions["pred_ms"].unique().to_list() == [pytest.approx(floor)]


def test_a_reading_kept_in_the_predictor_cache_is_invalid_and_removed(probes, tmp_path,
                                                                     monkeypatch):
    """The cache outlives the run: readings hoarded there would pass the cap over several
    runs. A cache changed after the reading request makes the run INVALID and is put back as it
    was before the reading was answered."""
    monkeypatch.setattr(talk, "put_back", PUT_BACK)
    for _ in range(2):
        result = _run(tmp_path, "hoards_reading", "h200_vidur")
        assert result.metrics["valid"] is False and result.metrics["profiled_rows"] == 2
        assert any("wrote to its cache after it asked for target rows" in r
                   for r in result.metrics["invalid_reasons"])
        caches = list((probes.home / "predictor-cache").glob("hoards_reading-*"))
        # the fit the harness keeps before any reading (sandbox_job._fitted) is all that stays
        assert [p.name for c in caches for p in c.rglob("*") if p.is_file()
                and not p.name.startswith("fitted-")] == []


def test_a_reading_over_the_cap_is_invalid(probes, tmp_path):
    result = _run(tmp_path, "reads_prefill", "h200_vidur", params={"rows": 17})
    assert result.metrics["valid"] is False and result.metrics["phases"] == {}
    assert any("asked for 17 target rows; the cap is 16" in r
               for r in result.metrics["invalid_reasons"])
    assert result.metrics["profiled_rows"] == 0


def test_an_op_point_reading_supplies_exactly_the_requested_points(probes, tmp_path):
    # behind_cells: the probe names the shapes of the home's cells, which h200's cells share
    result = _run(tmp_path, "reads_op_points", "h200_vidur", home_points="behind_cells")
    got = seen(probes, "op_reading")
    assert result.metrics["valid"] and result.metrics["profiled_rows"] == 3 == len(got)
    with duckdb.connect(str(probes.path), read_only=True) as con:
        lineage = con.execute("SELECT cell_id, key, latency_ms FROM cell_lineage WHERE "
                              "dataset = 'h200_vidur' AND op = 'attn_decode'").fetchall()
    shape_fields = [c for c in got.columns if c not in ("latency_ms", "sku", "version")]
    truth, touched = {}, set()
    for cell_id, key, latency in lineage:
        shape = json.loads(key)
        point = tuple(shape[f] for f in shape_fields)
        truth.setdefault(point, set()).add(latency)
        touched |= {(point, cell_id)}
    received = {tuple(r[f] for f in shape_fields): r["latency_ms"] for r in got.iter_rows(named=True)}
    assert len(received) == 3
    for point, latency in received.items():
        assert truth[point] == {latency}  # one measured point per shape, its own ground truth
    read_cells = {cell for point, cell in touched if point in received}
    assert set(result.metrics["deploy_row_ids"]) == read_cells
    assert read_cells.isdisjoint(result.predictions["cell_id"])
    over = _run(tmp_path, "reads_op_points", "h200_vidur", params={"points": 17},
                home_points="behind_cells")
    assert over.metrics["valid"] is False and over.metrics["phases"] == {}
    assert any("asked for 17 target rows; the cap is 16" in r for r in over.metrics["invalid_reasons"])


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
    assert metrics["phases"]["all"]["mape"] == pytest.approx(
        saved.filter(pl.col("phase") != "mixed")["signed_pct"].abs().mean())


def test_op_level_datasets_are_scored_the_same_way(probes, tmp_path):
    result = _run(tmp_path, "spy", "a100_sxm_ops")
    assert result.metrics["level"] == "op" and result.metrics["split"] == "home_heldout"
    assert set(result.metrics["phases"]) == {"all", "gemm", "attn_prefill", "attn_decode"}
    trained = set(json.loads((SPY(probes) / "home.json").read_text())["op_ids"])
    assert trained and trained.isdisjoint(result.predictions["cell_id"])
    assert not {"gt_ms", "latency_ms", "flags"} & set(seen(probes, "points").columns)
    unseen = _run(tmp_path, "spy", "h200_sxm_ops")
    assert unseen.metrics["phases"]["all"]["n"] == len(seen(probes, "points"))
    with pytest.raises(NotSupported, match="predict_ops"):
        _run(tmp_path, "negative", "h200_sxm_ops")


def test_unknown_dataset_gets_the_closest_name(probes, tmp_path):
    with pytest.raises(ValueError, match="Did you mean 'h200_vidur'"):
        _run(tmp_path, "spy", "h200_vidr")



def test_a_split_prediction_is_filed_per_op_and_sums_to_the_step(probes, store_home, tmp_path):
    """ours splits its steps by op (``predict_by_op``): each part lands in the predictions as an
    ``op_ms_<op>`` column, the parts sum to the step prediction, and a predictor without a split
    (the spy) files none."""
    result = _run(tmp_path, "ours", "l40s_vidur")
    saved = pl.read_parquet(result.folder / "predictions.parquet")
    parts = [c for c in saved.columns if c.startswith("op_ms_")]
    assert {"op_ms_gemm_qkv", "op_ms_attn_decode", "op_ms_allreduce"} <= set(parts)
    total = saved.select(pl.sum_horizontal(parts)).to_series()
    assert (total - saved["pred_ms"]).abs().max() < 1e-9 * saved["pred_ms"].max()
    assert saved.filter(pl.col("tp") == 1)["op_ms_allreduce"].eq(0.0).all()
    spy = pl.read_parquet(_run(tmp_path, "spy", "l40s_vidur").folder / "predictions.parquet")
    assert not any(c.startswith("op_ms_") for c in spy.columns)


@pytest.mark.parametrize(("predictor", "note"), [("splits_badly", "ValueError: no split today"),
                                                  ("splits_misshapen", "not one value per cell")])
def test_a_failing_per_op_split_is_noted_and_the_score_stands(probes, tmp_path, predictor, note):
    result = _run(tmp_path, predictor, "l40s_vidur")
    assert result.metrics["valid"] and result.metrics["phases"]["all"]["mape"] is not None
    assert note in result.metrics["by_op_error"]
    saved = pl.read_parquet(result.folder / "predictions.parquet")
    assert not any(c.startswith("op_ms_") for c in saved.columns)


def test_a_gpus_serving_name_without_its_family_suffix_names_that_gpus_sets():
    """``h200_silicon`` is not a set (the H200's serving runs are FP8 and MoE): the error offers
    the H200's own sets, not the closest spelling (``h100_silicon``, another GPU)."""
    from leaderboard_core.naming import closest

    valid = ["h100_silicon", "h100_silicon_fp8", "h200_silicon_fp8", "h200_silicon_moe"]
    assert closest("h200_silicon", valid) == " Did you mean 'h200_silicon_fp8' or 'h200_silicon_moe'?"
    assert closest("h100_silicn", valid) == " Did you mean 'h100_silicon'?"  # a typo: the closest
    assert closest("zzz", valid) == ""
