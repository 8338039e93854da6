"""Seal v3: the routes that went around the child, through the harness's own process and
through what the report ranks. Each probe tries one as a cheat with a ``predictors_path``
folder would; a sealed harness answers with a refusal, an INVALID run or a run that is not
rankable, never a ranked run near 0 % MAPE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest
from outside_source import toy

from leaderboard.run import config, rankable, run_inputs
from leaderboard.run.evaluate import RunSpec, run
from leaderboard.run.inputs import InputError
from leaderboard.seal import job as sandbox_job
from leaderboard.seal import predictor_index, sandbox, scan
from leaderboard.seal.walls import SealRefused
from leaderboard_core import paths


@pytest.fixture
def folder(tmp_path):
    """A ``predictors_path`` folder, taken out of the index again after the test."""
    mine = tmp_path / "mine"
    mine.mkdir()
    yield mine
    if str(mine) in predictor_index._FOLDERS:
        predictor_index._FOLDERS.remove(str(mine))
    predictor_index._described.cache_clear()


def _env(home) -> dict:
    return {**os.environ, "LEADERBOARD_HOME": str(home)}


# ---------------------------------------------- 1. the harness imports no submitted code


def test_a_predictors_path_never_enters_the_harness_import_path(folder):
    (folder / "toy.py").write_text(toy("toy_path"))
    before = list(sys.path)
    predictor_index.include(folder)
    assert sys.path == before
    assert "toy_path" in predictor_index.names()  # described by a sealed child
    assert "toy" not in sys.modules


@pytest.mark.slow
def test_a_hydra_plugin_in_the_folder_never_runs_in_the_harness(store_home, folder, tmp_path):
    """Hydra imports every ``hydra_plugins.*`` package on ``sys.path``; one in the folder must
    never run in the process that scores (its import-time note stays empty)."""
    marker = tmp_path / "plugin-ran-in"
    plugin = folder / "hydra_plugins" / "cheat"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text(
        f"import os\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n")
    (folder / "toy.py").write_text(toy("toy_plugin"))
    out = subprocess.run([sys.executable, "-m", "leaderboard", "predictor=toy_plugin",
                          f"predictors_path={folder}", "dataset=h200_vidur",
                          f"runs_dir={tmp_path / 'runs'}"], capture_output=True, text=True,
                         cwd=paths.REPO_ROOT, timeout=300, env=_env(store_home.home))
    assert out.returncode == 0, out.stderr
    assert not marker.exists(), f"a hydra plugin of the folder ran in {marker.read_text()}"


def test_the_working_folder_as_predictors_path_is_refused(folder, monkeypatch):
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(ValueError, match="on the harness's own import path"):
        predictor_index.include(folder)


@pytest.mark.parametrize("arg", ["--config-dir=/tmp/x", "-cd", "hydra.searchpath=[file:///x]",
                                 "+hydra.callbacks.x._target_=os.getcwd",
                                 "hydra.launcher._target_=os.getcwd",
                                 # the hostile review's: an abbreviated flag, Hydra's unpickling
                                 # rerun, and an environment switched after the checks
                                 "--config-d", "--experimental-rerun", "--cfg", "--info",
                                 "hydra.job.env_set.LEADERBOARD_HOME=/x", "+x._target_=eval"])
def test_config_folders_and_targets_of_ones_own_are_refused(arg):
    with pytest.raises(InputError, match="runs no code it was handed"):
        config.refuse_config_doors([arg])
    config.refuse_config_doors(["hydra/launcher=local", "hydra.launcher.n_jobs=4", "-m",
                                "hydra.sweep.dir=/tmp/s", "dataset=h200_vidur"])


@pytest.mark.slow
def test_hydras_unpickling_rerun_never_runs(tmp_path):
    """``--experimental-rerun FILE`` would ``pickle.load`` FILE in the harness; a pickle whose
    load leaves a note shows it never does."""
    import pickle

    marker = tmp_path / "unpickled"

    class Note:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "config.pickle").write_bytes(pickle.dumps(Note()))
    out = subprocess.run([sys.executable, "-m", "leaderboard", "--experimental-rerun",
                          str(tmp_path / "config.pickle")], capture_output=True, text=True,
                         cwd=paths.REPO_ROOT, timeout=120)
    assert out.returncode == 2 and "--experimental-rerun is not taken" in out.stderr
    assert not marker.exists()


# ---------------------------------------------- 2. a run's predictor is the registered class


def test_a_folder_cannot_take_a_built_in_name(store_home, folder):
    (folder / "mine.py").write_text(toy("ours"))
    predictor_index.include(folder)
    with pytest.raises(ValueError, match="'ours' is already registered by predictors.ours.Ours; "
                                         "mine.Toy cannot take it"):
        predictor_index.index()


def test_a_folder_cannot_repoint_a_built_in_name_behind_the_registry(store_home, folder):
    (folder / "mine.py").write_text(toy("toy_repoint") + textwrap.dedent('''
        from predictors import registry
        registry.discover()
        registry._REGISTRY["llm_viewer"] = Toy
    '''))
    predictor_index.include(folder)
    with pytest.raises(ValueError, match="'llm_viewer' is registered by the suite"):
        predictor_index.index()


def test_the_child_refuses_a_class_other_than_the_described_one():
    job = {"include": [], "predictor": {"name": "ours", "module": "predictors.llm_viewer",
                                        "qualname": "LLMViewer"}}
    with pytest.raises(RuntimeError, match="not the described predictors.llm_viewer"):
        sandbox_job._resolve(job)


def test_a_built_in_run_registers_no_folder(folder):
    (folder / "toy.py").write_text(toy("toy_child"))
    predictor_index.include(folder)
    index = predictor_index.index()
    assert predictor_index.child_folders(index["ours"]) == ()
    assert predictor_index.child_folders(index["toy_child"]) == (str(folder),)


# ---------------------------------------------- 3, 4. only the default run on the store's data


@pytest.mark.slow
def test_raised_reading_caps_are_not_rankable(store_home, tmp_path):
    spec = RunSpec("ours_reading", "h200_vidur", {}, runs_dir=tmp_path / "runs",
                   reading_max_points=100_000, reading_max_fraction=1.0)
    metrics = run(spec).metrics
    assert metrics["rankable"] is False
    assert metrics["unrankable_because"][0].startswith("reading: caps max_points=100000")
    default = run(RunSpec("ours_reading", "h200_vidur", {}, runs_dir=tmp_path / "runs")).metrics
    sealed = default["sealed"]
    assert default["rankable"] is sealed and default["inputs_digest"] == metrics["inputs_digest"]


def test_the_rankable_rules(store_home):
    """Worked by hand on one run's inputs: each rule alone makes the run unrankable."""
    from leaderboard.run.run_inputs import load_inputs

    spec = RunSpec("ours", "h200_vidur", {})
    inputs = load_inputs(spec)
    defaults = {"a": 1.0}
    assert rankable.reasons(spec, inputs, {"a": 1.0}, defaults, True, "x") == []
    cases = {
        "unsealed": ({}, {"a": 1.0}, False),
        "split": ({"seed": 7}, {"a": 1.0}, True),
        "home_points": ({"home_points": "behind_cells"}, {"a": 1.0}, True),
        "params": ({}, {"a": 2.0}, True),
        "reading": ({"reading_max_points": 17}, {"a": 1.0}, True),
    }
    for part, (changes, params, sealed) in cases.items():
        changed = RunSpec("ours", "h200_vidur", {}, **changes)
        found = rankable.reasons(changed, inputs, params, defaults, sealed, "process")
        assert [r.partition(":")[0] for r in found] == [part], (part, found)
    two = load_inputs(RunSpec("ours", "h200_vidur", {}, home=["a100_vidur", "h100_vidur"]))
    found = rankable.reasons(spec, two, {"a": 1.0}, defaults, True, "x")
    assert found == ["home: a100_vidur+h100_vidur (default a100_vidur)"]
    assert rankable.protocol_only(found) and not rankable.protocol_only(["params: a=2"])


def test_rows_digest_ignores_order_and_sees_one_changed_value():
    frame = pl.DataFrame({"cell_id": ["a", "b", "c"], "gt_ms": [1.0, 2.0, 3.0]})
    shuffled = frame.reverse().select("gt_ms", "cell_id")
    assert run_inputs.rows_digest(frame) == run_inputs.rows_digest(shuffled)
    edited = frame.with_columns(pl.when(pl.col("cell_id") == "b").then(2.5)
                                .otherwise(pl.col("gt_ms")).alias("gt_ms"))
    assert run_inputs.rows_digest(edited) != run_inputs.rows_digest(frame)


# ---------------------------------------------- 5. no command imports predictor modules


@pytest.mark.slow
def test_report_sections_and_explain_import_no_predictor_module(store_home):
    script = textwrap.dedent('''
        import sys, tempfile
        from leaderboard.present import cells_explained, sections
        from leaderboard.run import evaluate, homes
        from leaderboard.score import results
        runs_dir = tempfile.mkdtemp()
        evaluate.run(evaluate.RunSpec("ours", "h200_vidur", {}, runs_dir=runs_dir))
        runs = homes.with_family(results.load_runs(runs_dir).pl())
        assert any("ours" in line for line in sections.predictor_sections(runs))
        model, chosen = cells_explained.explained_cells("ours", "h200_vidur")
        assert model.explained[chosen[0]]["pred"] > 0
        loaded = sorted(m for m in sys.modules if m.startswith("predictors.")
                        and m not in ("predictors.registry", "predictors.base"))
        print(loaded)
    ''')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=paths.REPO_ROOT, timeout=300, env=_env(store_home.home))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ---------------------------------------------- 6. no copy of the store where a child reads


@pytest.fixture
def fake_store(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "store").mkdir(parents=True)
    with duckdb.connect(str(home / "store" / "leaderboard.duckdb")) as con:
        con.execute("CREATE TABLE cells AS SELECT 'c' AS cell_id, 1.5 AS gt_ms")
    monkeypatch.setenv("LEADERBOARD_HOME", str(home))
    scan.measurement_copies.cache_clear()
    return home / "store" / "leaderboard.duckdb"


def _refused(folder) -> str:
    scan.measurement_copies.cache_clear()
    with pytest.raises(SealRefused) as refused:
        sandbox.checked_code([str(folder)])
    return str(refused.value)


@pytest.mark.parametrize("how", ["hard link", "copy", "duckdb", "parquet", "arrow"])
def test_a_copy_of_the_store_or_a_table_of_it_is_refused(fake_store, folder, how):
    target = folder / "weights.bin"  # the name says nothing: files are told by content
    if how == "hard link":
        os.link(fake_store, target)
    elif how == "copy":
        target.write_bytes(fake_store.read_bytes())
    elif how == "duckdb":
        with duckdb.connect(str(folder / "other.db")) as con:
            con.execute("CREATE TABLE t AS SELECT 1 AS x")
        target = folder / "other.db"
    else:
        frame = pl.DataFrame({"cell_id": ["c"], "gt_ms": [1.5]})
        frame.write_parquet(target) if how == "parquet" else frame.write_ipc(target)
    message = _refused(folder)
    assert str(target) in message
    assert {"hard link": "a hard link of", "copy": "a copy of", "duckdb": "a DuckDB database",
            "parquet": "measured times (gt_ms)", "arrow": "measured times (gt_ms)"}[how] in message


def test_a_table_named_as_one_is_found_in_the_installation_too(fake_store, tmp_path):
    """Outside the submitted code (the Python installation, the system folders) files are told
    by their first bytes only when named as tables: a hub export written there is found."""
    site = tmp_path / "site-packages" / "share"
    site.mkdir(parents=True)
    pl.DataFrame({"cell_id": ["c"], "gt_ms": [1.5]}).write_parquet(site / "cells.parquet")
    found = scan.measurement_copies((str(tmp_path / "site-packages"),), (), ())
    assert found == [(str(site / "cells.parquet"), "a table with measured times (gt_ms)")]


def test_a_hub_export_into_a_folder_a_child_reads_is_refused(store_home):
    from leaderboard.present import hub_export

    inside = Path(sys.prefix) / "share" / "lb-export"
    with pytest.raises(ValueError, match="which a predictor's child may read"):
        hub_export.export(inside, only=["h200_vidur"], quiet=True)
    assert not inside.exists()


def test_a_datasheet_from_elsewhere_is_not_rankable(store_home, tmp_path):
    from leaderboard.run.run_inputs import load_inputs

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "h200_sxm.yaml").write_text((paths.CONF_DIR / "gpu" / "h200_sxm.yaml").read_text())
    spec = RunSpec("ours", "h200_vidur", {}, gpu_specs=str(specs))
    inputs = load_inputs(spec)
    found = rankable.reasons(spec, inputs, {}, {}, True, "x")
    assert found and found[0].startswith("gpu_specs: h200_sxm's datasheet is")


def test_a_table_without_measured_times_is_readable(fake_store, folder):
    pl.DataFrame({"n": [1], "k": [2]}).write_parquet(folder / "shapes.parquet")
    scan.measurement_copies.cache_clear()
    sandbox.checked_code([str(folder)])


# ---------------------------------------------- 7. bounded in time and size


SLEEPER = toy("NAME") + '''

    def fit(self, home):
        import time
        time.sleep(60)
        return self
'''


@pytest.mark.slow
def test_a_fit_that_sleeps_is_killed_and_invalid(store_home, folder, tmp_path):
    (folder / "sleeper.py").write_text(SLEEPER.replace("NAME", "toy_sleeper"))
    predictor_index.include(folder)
    started = time.monotonic()
    metrics = run(RunSpec("toy_sleeper", "h200_vidur", {}, runs_dir=tmp_path / "runs",
                          stage_seconds=3)).metrics
    assert time.monotonic() - started < 45
    assert not metrics["valid"]
    assert any("timed out in fit after 3 s" in r for r in metrics["invalid_reasons"])


def test_a_module_that_sleeps_at_import_stops_describing(folder, monkeypatch):
    (folder / "slow.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(predictor_index, "DESCRIBE_SECONDS", 3)
    predictor_index.include(folder)
    started = time.monotonic()
    with pytest.raises(ValueError, match="describing child timed out after 3 s"):
        predictor_index.index()
    assert time.monotonic() - started < 30


def test_an_answer_too_large_or_too_deep_is_an_error(folder, monkeypatch):
    """A module writes on the describing child's answer pipe itself (its descriptor is in
    ``sys.argv``): a JSON array nested 200,000 deep, then the child's own answer follows."""
    (folder / "deep.py").write_text("import os, sys\nos.write(int(sys.argv[3]), b'[' * 200_000)\n")
    predictor_index.include(folder)
    with pytest.raises(ValueError, match="answered no JSON object"):  # never a RecursionError
        predictor_index.index()
    monkeypatch.setattr(predictor_index, "MAX_ANSWER", 100)
    predictor_index._FOLDERS.remove(str(folder))
    predictor_index._described.cache_clear()
    with pytest.raises(ValueError, match="answered more than 100 bytes"):
        predictor_index.index()


def test_a_prediction_file_larger_than_the_run_needs_is_not_read(tmp_path):
    import numpy as np

    from leaderboard.seal import child_files
    np.save(tmp_path / "pred.npy", np.ones(10_000))
    assert len(child_files.load_array(tmp_path / "pred.npy", 10_000)) == 10_000
    with pytest.raises(FileNotFoundError, match="too big"):
        child_files.load_array(tmp_path / "pred.npy", 100)


# ---------------------------------------------- 8. readings only on step targets


@pytest.mark.slow
def test_an_op_level_run_has_no_reading_budget(store_home, tmp_path):
    metrics = run(RunSpec("llm_viewer", "h200_sxm_ops", {}, runs_dir=tmp_path / "runs")).metrics
    assert metrics["reading_cap"] == 0
    from leaderboard.run import readings
    from leaderboard_core.contract import ReadingRefused

    supplier = readings.Supplier(pl.DataFrame({"cell_id": ["a"]}), pl.DataFrame(), 0)
    with pytest.raises(ReadingRefused):
        supplier(readings.ReadingRequest(cells=("a",)))
    json.dumps(metrics)  # the record stays plain JSON


# ---------------------------------------------- the answers carried in the predictor's files

MEMORIZED = '''
import json
from pathlib import Path

import numpy as np

from leaderboard_core.contract import PredictorCard
from predictors.base import Predictor
from predictors.registry import register

ANSWERS = json.loads((Path(__file__).parent / "answers.json").read_text())


@register("NAME")
class Memorized(Predictor):
    card = PredictorCard(kind="analytical", reference="a cheat", description="public answers",
                         needs_profiled_rows=False)

    def predict(self, cells, gpu):
        return np.array([ANSWERS.get(c, 1.0) * 1.01 for c in cells["cell_id"]])
'''


@pytest.mark.slow
def test_answers_carried_in_the_folder_score_but_are_not_ranked(store_home, folder, tmp_path):
    """The visible GPUs' measurements are public: a folder can carry them (here as a JSON file
    beside the module, 1 % off). The run is sealed and VALID, and held unranked as implausible."""
    answers = dict(store_home.sql("SELECT cell_id, gt_ms FROM cells WHERE dataset = 'h200_vidur'"))
    (folder / "answers.json").write_text(json.dumps(answers))
    (folder / "memorized.py").write_text(MEMORIZED.replace("NAME", "memorized"))
    predictor_index.include(folder)
    metrics = run(RunSpec("memorized", "h200_vidur", {}, runs_dir=tmp_path / "runs")).metrics
    assert metrics["valid"] and metrics["phases"]["all"]["mape"] == pytest.approx(1.0, abs=0.01)
    assert metrics["rankable"] is False
    assert [r.partition(":")[0] for r in metrics["unrankable_because"]] == ["implausible"]


def test_the_implausibility_floor_by_hand():
    low, honest = {"all": {"mape": 1.9, "n": 500}}, {"all": {"mape": 5.3, "n": 500}}
    assert rankable.implausible("unseen", low)[0].startswith("implausible: all 1.90 %")
    assert rankable.implausible("unseen", honest) == []
    assert rankable.implausible("home_gpu", low)  # a serving set of the home GPU is not the home
    assert rankable.implausible("home_heldout", low) == []  # in-sample on the home is allowed
    serving = {"ttft": {"mape": 1.0, "n": 40}, "tpot": {"mape": 9.0, "n": 40}}
    assert rankable.implausible("unseen", serving)[0].startswith("implausible: ttft 1.00 %")
    one_phase = {"all": {"mape": 6.0, "n": 900}, "decode": {"mape": 0.5, "n": 400}}
    assert "decode 0.50 %" in rankable.implausible("unseen", one_phase)[0]
    few = {"tpot": {"mape": 1.5, "n": 2}}  # two targets can land there by chance
    assert rankable.implausible("unseen", few) == []
