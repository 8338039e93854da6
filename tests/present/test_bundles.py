"""A results bundle is verified by rerunning it from its own code: an honest bundle merges, one
whose numbers were edited after the run is refused whole (the second hostile review of seal v3
forged such a bundle and had it ranked)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from outside_source import toy

from leaderboard.present import bundles
from leaderboard.run.evaluate import RunSpec, run
from leaderboard.score import results
from leaderboard.seal import predictor_index
from leaderboard_core.versioning import module_files


@pytest.fixture
def honest(store_home, tmp_path):
    """A bundle of one real, sealed run of a predictor from a folder outside the repository."""
    folder = Path(tempfile.mkdtemp(prefix="mine-"))
    (folder / "toy_bundled.py").write_text(toy("toy_bundled"))
    predictor_index.include(folder)
    try:
        metrics = run(RunSpec("toy_bundled", "h200_vidur", {}, runs_dir=tmp_path / "runs")).metrics
        described = predictor_index.get("toy_bundled")
        claimed = {"toy_bundled": {"card": described["card"], "code_hash": metrics["code_hash"],
                                   "folder": folder.name}}
        code = module_files(described["module"], [folder])
        yield tmp_path / "runs" / metrics["run_id"], claimed, code, folder
    finally:
        for included in [f for f in predictor_index.included() if f.startswith(tempfile.gettempdir())]:
            predictor_index._FOLDERS.remove(included)
        predictor_index._described.cache_clear()


def _merge(bundle: Path, into: Path, scratch: Path) -> bundles.Merged:
    predictor_index._FOLDERS.clear()  # the receiving side knows only the bundle's code
    predictor_index._described.cache_clear()
    return bundles.merge([bundle], into, results.store_versions(), {}, None,
                         lambda files, runs: bundles.verify_by_rerun(files, runs, scratch, 1))


@pytest.mark.slow
def test_an_honest_bundle_reproduces_and_an_edited_one_is_refused(honest, tmp_path):
    folder, claimed, code, root = honest
    if not json.loads((folder / "metrics.json").read_text())["rankable"]:
        pytest.skip("runs are not sealed here (no bubblewrap or Landlock): none is rankable")
    good = bundles.write([folder], tmp_path / "good.tar.gz", claimed, code, root)
    merged = _merge(good, tmp_path / "m1", tmp_path / "v1")
    assert merged.notes[0].startswith("merged 1 run(s) of toy_bundled"), merged.notes
    forged = tmp_path / "forged" / folder.name
    forged.mkdir(parents=True)
    metrics = json.loads((folder / "metrics.json").read_text())
    for stats in metrics["phases"].values():
        stats["mape"] = 0.5
    (forged / "metrics.json").write_text(json.dumps(metrics))
    (forged / "predictions.parquet").write_bytes((folder / "predictions.parquet").read_bytes())
    bad = bundles.write([forged], tmp_path / "bad.tar.gz", claimed, code, root)
    refused = _merge(bad, tmp_path / "m2", tmp_path / "v2")
    assert "do not reproduce" in refused.notes[0] and "0.5 in the bundle" in refused.notes[0]
    assert not any((tmp_path / "m2").iterdir())


def test_a_bundle_reruns_from_its_own_code_alone_and_leaves_the_index_as_it_was(
        tmp_path, monkeypatch):
    """The merger's own predictors_path may hold the bundled module (an author merging their
    bundle): while the bundle reruns only its code folder is registered, and afterwards the
    index is the merger's again, without the removed scratch folder."""
    from leaderboard.present import bundles
    from leaderboard.seal import predictor_index

    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setattr(predictor_index, "_FOLDERS", [str(mine)])
    seen = {}

    def reruns(runs, code, scratch, sample):
        seen["during"] = predictor_index.included()
        return None

    monkeypatch.setattr(bundles, "_reruns_differ", reruns)
    files = {"code/token_line.py": b"# the bundled module\n"}
    assert bundles._rerun_differs(files, [], tmp_path / "scratch", 2) is None
    assert seen["during"] == [str((tmp_path / "scratch" / "code").resolve())]
    assert predictor_index.included() == [str(mine)]
