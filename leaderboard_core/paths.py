"""Where the suite reads and writes outside the repository.

Everything written outside the repo lives under one home directory: the user cache by default,
or ``$LEADERBOARD_HOME`` when set, so that tests and CI can move all of it with one variable.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from leaderboard_core import guard

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
DATASETS_DIR = REPO_ROOT / "datasets"
SHARED_UPSTREAM = REPO_ROOT.parent / "shared" / "data" / "upstream"
# The suite's Python packages: the harness, the vocabulary both sides share, the predictors.
CODE_PACKAGES = ("leaderboard", "leaderboard_core", "predictors")


def from_user(value: str | os.PathLike) -> Path:
    """A path a user typed, taken from the working folder as every command line takes it (an
    absolute path stays as it is; a default of the suite's conf is absolute already)."""
    return Path(value).expanduser().resolve()


def home() -> Path:
    """The suite's home: ``$LEADERBOARD_HOME`` or the user cache directory."""
    env = os.environ.get("LEADERBOARD_HOME")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("llm-leaderboard"))


def store_path() -> Path:
    guard.check("locate the store")
    return home() / "store" / "leaderboard.duckdb"


def source_cache() -> Path:
    """Downloaded upstream files, laid out as ``<owner>__<repo>/<path>`` like ../shared."""
    return home() / "sources"
