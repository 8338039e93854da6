"""A run goes stale only where the code that made it changed: its predictor's own files (and the
conf folder its package owns), or the harness. Worked on a copy of the tree, edited file by file."""

from __future__ import annotations

import shutil

import pytest

from leaderboard_core import paths, versioning

MODULES = ("predictors.rf", "predictors.ours", "predictors.ours_reading", "predictors.llm_viewer",
           "predictors.table_scaled", "predictors.genz")


def _clear() -> None:
    versioning.code_hash.cache_clear()
    versioning.harness_hash.cache_clear()


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of the code packages and conf/, standing in for the repository."""
    for folder in (*paths.CODE_PACKAGES, "conf"):
        shutil.copytree(paths.REPO_ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(paths, "CONF_DIR", tmp_path / "conf")
    _clear()
    yield tmp_path
    _clear()


def _hashes() -> dict[str, str]:
    _clear()
    return {m: versioning.predictor_code_hash(m) for m in MODULES}


def _stale_after(path, edit: str = "\nEDITED = 1\n") -> set[str]:
    before = _hashes()
    path.write_text(path.read_text() + edit)
    after = _hashes()
    return {m for m in MODULES if before[m] != after[m]}


def test_editing_one_predictor_stales_only_its_runs(tree):
    assert _stale_after(tree / "predictors" / "rf.py") == {"predictors.rf"}


def test_editing_a_predictor_package_stales_it_and_its_importers(tree):
    # ours_reading imports ours: both go stale, no other predictor does
    assert _stale_after(tree / "predictors" / "ours" / "factors.py") == {
        "predictors.ours", "predictors.ours_reading"}


def test_a_conf_folder_a_predictor_package_owns_stales_that_package_only(tree):
    constants = tree / "conf" / "ours" / "constants.yaml"
    assert _stale_after(constants, "\n# a comment changes the bytes\n") == {
        "predictors.ours", "predictors.ours_reading"}


def test_editing_the_scoring_code_stales_every_run(tree):
    assert _stale_after(tree / "leaderboard" / "score" / "metrics.py") == set(MODULES)
    assert _stale_after(tree / "predictors" / "base.py") == set(MODULES)  # every one imports it


def test_a_presentation_module_stales_nothing(tree):
    report = tree / "predictors" / "ours" / "report.py"
    assert versioning.is_presentation(report.read_text())
    assert _stale_after(report) == set()


def test_an_outside_predictor_hashes_the_files_its_module_imports(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "mine.py").write_text("import helper\nfrom predictors.base import Predictor\n")
    (folder / "helper.py").write_text("X = 1\n")
    (folder / "unrelated.py").write_text("Y = 1\n")
    first = versioning.predictor_code_hash("mine", str(folder))
    (folder / "unrelated.py").write_text("Y = 2\n")
    assert versioning.predictor_code_hash("mine", str(folder)) == first
    (folder / "helper.py").write_text("X = 2\n")
    assert versioning.predictor_code_hash("mine", str(folder)) != first
    files = versioning.module_files("mine", [paths.REPO_ROOT, folder])
    assert folder / "helper.py" in files and paths.REPO_ROOT / "predictors" / "base.py" in files
