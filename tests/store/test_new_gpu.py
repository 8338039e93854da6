"""A GPU added as a newcomer would add it: a spec file of a made-up vendor and architecture and
a measured aiconfigurator folder, no conf file of its own. Its datasets build, are listed, take
their family's default home and run."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from leaderboard import data
from leaderboard.ingest import sources
from leaderboard.ingest.aiconfigurator import ROOT as AIC_ROOT
from leaderboard.run import config
from leaderboard.run.evaluate import RunSpec, run
from leaderboard.store import database
from leaderboard_core import paths

# A small real sources root: the two homes' and one measured GPU's tables (the new GPU is the
# H200's folder under another name), Vidur's traces and the one recorded serving trace.
COPIED = [f"{AIC_ROOT}/a100_sxm", f"{AIC_ROOT}/h100_sxm", "microsoft__vidur/data/processed_traces",
          "casys-kaist__LLMServingSim/bench/examples/RTX4090/Llama-3.1-8B/vllm"]
FAMILY_HOMES = {"newgpu_vidur": "a100_vidur", "newgpu_vidur19": "h100_vidur19",
                "newgpu_vidur_fp8": "h100_vidur_fp8", "newgpu_ops": "a100_sxm_ops"}


@pytest.fixture
def new_gpu(tmp_path, monkeypatch):
    shared = paths.SHARED_UPSTREAM
    if not (shared / AIC_ROOT / "h200_sxm").is_dir():
        pytest.skip(f"needs the measured tables under {shared}")
    root = tmp_path / "sources"
    for rel in COPIED:
        shutil.copytree(shared / rel, root / rel)
    shutil.copytree(shared / AIC_ROOT / "h200_sxm", root / AIC_ROOT / "newgpu")
    spec = yaml.safe_load((paths.CONF_DIR / "gpu" / "h200_sxm.yaml").read_text())
    spec |= {"sku": "newgpu", "short_name": "newgpu", "vendor": "acme", "arch": "zen9"}
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "newgpu.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setattr(paths, "SHARED_UPSTREAM", tmp_path / "no-shared")
    monkeypatch.setattr(sources, "load_pins", lambda *args, **kwargs: [])
    monkeypatch.setenv("LEADERBOARD_SOURCES", str(root))
    monkeypatch.setenv("LEADERBOARD_GPU_SPECS", str(specs))
    database.build(quiet=True)
    return root, specs


@pytest.mark.slow
@pytest.mark.long
def test_a_new_gpu_of_an_unknown_architecture_runs_on_every_family(new_gpu, tmp_path, capsys):
    root, specs = new_gpu
    assert not list((paths.CONF_DIR / "dataset").glob("newgpu*"))

    assert data.main(["list", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name, home in FAMILY_HOMES.items():
        assert listed[name]["arch"] == "zen9" and listed[name]["home"] == home, listed[name]
    config.check_names([f"dataset={','.join(FAMILY_HOMES)}"])  # accepted without a conf file

    for dataset, home in FAMILY_HOMES.items():
        predictor = "llm_viewer" if dataset.endswith("_ops") else "ours"
        result = run(RunSpec(predictor, dataset, {}, runs_dir=tmp_path / "runs",
                             sources_root=str(root), gpu_specs=str(specs)))
        assert result.metrics["valid"], (dataset, result.metrics["invalid_reasons"])
        assert result.metrics["home_datasets"] == [home] and result.metrics["split"] == "unseen"
        assert result.metrics["phases"]["all"]["n"] > 0
