"""Dataset families as data: a toy family registered here (one module) with one conf file
reaches the store, ``data list``, the homes, the rerun's run specs and the report."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest

from leaderboard import data
from leaderboard.cells import families
from leaderboard.cells.common import cell_set
from leaderboard.cells.families import DatasetFamily, register_family
from leaderboard.present.leaderboard_table import main_leaderboard
from leaderboard.run import config, homes, roster
from leaderboard.run.homes import with_family
from leaderboard.store.catalog import StoreCatalog
from leaderboard_core import paths
from predictors import registry
from tests.conftest import TinySources

TOY_GT_MS = {"a100_toy": (2.0, 4.0), "h200_toy": (1.0, 3.0)}


def toy_builder(con):
    """Two decode steps per GPU (synthetic: a unit test of the plumbing, not a dataset)."""
    sets = []
    for name, gts in TOY_GT_MS.items():
        sku = "a100_sxm" if name.startswith("a100") else "h200_sxm"
        cells = [{"cell_id": f"{name}-{i}", "workload_id": f"w{i}", "sku": sku,
                  "model": "llama-3.1-8b", "tp": 1, "q_lens": [1] * (i + 1),
                  "ctx_lens": [128] * (i + 1), "gt_ms": gt, "gt_kind": "measured",
                  "source": "toy"} for i, gt in enumerate(gts)]
        sets.append(cell_set(name, sku, cells, [], card=""))
    return sets


@pytest.fixture
def toy(tiny, tmp_path, monkeypatch):
    register_family(DatasetFamily("toy", "step", "cells", "toy steps", builder=toy_builder))
    conf = tmp_path / "conf"
    shutil.copytree(paths.CONF_DIR, conf)
    (conf / "dataset" / "h200_toy.yaml").write_text("name: h200_toy\nhome: null\n")
    monkeypatch.setattr(paths, "CONF_DIR", conf)
    tiny.gemm([{"m": 8, "n": 1024, "k": 1024, "gemm_dtype": "bfloat16", "latency": 1.0}])
    tiny.build(["aiconfigurator"])
    yield
    families.unregister_family("toy")


def test_a_family_twice_is_refused_with_the_registered_names():
    with pytest.raises(ValueError, match="already registered.*valid names: vidur"):
        register_family(DatasetFamily("vidur", "step", "cells", "again"))
    with pytest.raises(ValueError, match="Did you mean 'vidur19'"):
        families.get("vidur91")


def test_toy_family_reaches_list_homes_rerun_and_report(toy, capsys):
    assert data.main(["list", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["h200_toy"]["rows"] == 2 and listed["a100_toy"]["kind"] == "cells"
    assert "h200_toy" in config.dataset_names()
    with StoreCatalog() as catalog:
        rows = catalog.datasets()
    assert TinySources.sql("SELECT card FROM datasets WHERE name = 'h200_toy'")[0][0] == (
        "h200_toy: toy steps dataset on the h200_sxm.")
    assert homes.home_of("h200_toy", None, rows) == "a100_toy"
    specs = roster.run_specs(paths.REPO_ROOT / "unused")
    assert sorted(s.predictor for s in specs if s.dataset == "h200_toy") == registry.names()
    assert all(s.home is None for s in specs if s.dataset.endswith("_toy"))  # no two-home run
    # run atlases only where the site shows them: the main family's default-home runs
    assert not any(s.atlas for s in specs if s.dataset.endswith("_toy"))
    assert all(s.atlas == (s.dataset.endswith(f"_{families.MAIN}") and s.home is None
                           and s.home_points == "full_grid") for s in specs)
    runs = pl.DataFrame([
        {"predictor": "p", "dataset": d, "split": split, "valid": True, "profiled_rows": 0,
         "sandbox": "process", "invalid_reasons": [],
         "phases": json.dumps({"all": {"mape": mape}, "decode": {"mape": mape}})}
        for d, split, mape in (("a100_toy", "home_heldout", 5.0), ("h200_toy", "unseen", 12.5))])
    text = "\n".join(main_leaderboard(with_family(runs)))  # as render gives it
    assert "### toy: decode" in text and "| p | 5.0 | 12.5 | 12.5 |" in text
