"""A stale store is announced and built, or refused with the command to run; never rebuilt
silently."""

from __future__ import annotations

import pytest

from leaderboard.store import database
from leaderboard_core import paths

ROW = {"m": 8, "n": 1024, "k": 1024, "gemm_dtype": "bfloat16", "latency": 1.0}


@pytest.fixture
def stale(tiny):
    tiny.gemm([ROW])
    tiny.build(["aiconfigurator"])
    tiny.gemm([ROW, {**ROW, "m": 16, "latency": 2.0}])  # the inputs change after the build
    assert not database.is_fresh()
    return tiny


def test_a_refused_stale_store_names_the_build_command(stale, monkeypatch):
    monkeypatch.setenv(database.STALE_ENV, "refuse")
    before = paths.store_path().stat().st_mtime_ns
    with pytest.raises(database.StaleStore, match="is stale.*python -m leaderboard.data build"):
        database.ensure()
    assert paths.store_path().stat().st_mtime_ns == before


def test_a_stale_store_is_announced_then_built(stale, capsys):
    database.ensure()
    assert "is stale (its inputs changed): building it now" in capsys.readouterr().err
    assert database.is_fresh()
