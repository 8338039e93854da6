"""The repository is citable: a licence, a CITATION.cff that parses and names the licence and
version pyproject gives, and a changelog with the release scheme."""

from __future__ import annotations

import tomllib

import yaml

from leaderboard_core import paths


def test_citation_parses_and_agrees_with_pyproject():
    citation = yaml.safe_load((paths.REPO_ROOT / "CITATION.cff").read_text())
    project = tomllib.loads((paths.REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert citation["cff-version"] == "1.2.0"
    for key in ("title", "authors", "version", "license", "message"):
        assert citation.get(key), key
    assert citation["license"] == project["license"]
    assert citation["version"] == project["version"]


def test_licence_and_changelog_exist():
    assert "MIT License" in (paths.REPO_ROOT / "LICENSE").read_text()
    changelog = (paths.REPO_ROOT / "CHANGELOG.md").read_text()
    assert "harness-v" in changelog and "## Unreleased" in changelog
