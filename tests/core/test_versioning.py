"""What counts as presentation for the code hash is read from the modules' own marker."""

from __future__ import annotations

import shutil

from leaderboard_core import paths, versioning


def _hash_of(root, monkeypatch) -> str:
    monkeypatch.setattr(paths, "REPO_ROOT", root)
    versioning.code_hash.cache_clear()
    try:
        return versioning.code_hash()
    finally:
        versioning.code_hash.cache_clear()


def test_marked_modules_leave_the_code_hash_alone(tmp_path, monkeypatch):
    for folder in ("leaderboard", "predictors", "conf"):
        shutil.copytree(paths.REPO_ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    before = _hash_of(tmp_path, monkeypatch)
    report = tmp_path / "leaderboard" / "report.py"
    report.write_text(report.read_text() + "\n# a presentation edit\n")
    assert _hash_of(tmp_path, monkeypatch) == before
    metrics = tmp_path / "leaderboard" / "score" / "metrics.py"
    metrics.write_text(metrics.read_text() + "\n# an edit that may change numbers\n")
    assert _hash_of(tmp_path, monkeypatch) != before


def test_the_marker_counts_only_at_module_level():
    assert versioning.is_presentation("x = 1\nPRESENTATION = True\n")
    assert not versioning.is_presentation("def f():\n    PRESENTATION = True\n")
