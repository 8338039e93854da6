"""The Hugging Face export: round trip, the card, atomicity, and failing fast without the hub."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from leaderboard.present import hub_export
from leaderboard.run import evaluate, run_inputs
from leaderboard.store.catalog import StoreCatalog
from leaderboard.store.hub_catalog import HubCatalog, HubError
from leaderboard_core.contract import PredictorCard
from predictors import registry
from predictors.base import Predictor

ONLY = ["h200_vidur", "h100_splitwise", "h200_sxm_ops", "gb200_silicon"]
HOMES = ["a100_vidur", "a100_splitwise", "a100_sxm_ops"]  # added by --only, to fit on
@pytest.fixture(scope="module")
def exported(real_store, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hub") / "export"
    saved = os.environ.get("LEADERBOARD_HOME")
    os.environ["LEADERBOARD_HOME"] = str(real_store.home)
    try:  # no oracle run in runs_dir: the serving card says how to make one
        hub_export.export(path, only=ONLY, quiet=True, runs_dir=path.parent / "no-runs")
    finally:
        os.environ["LEADERBOARD_HOME"] = saved or ""
    return path


def front_matter(path: Path) -> dict:
    return yaml.safe_load(path.read_text().split("---\n")[1])


def test_round_trip_gives_the_store_frames(exported, store_home):
    hub = HubCatalog(str(exported))
    with StoreCatalog() as local:
        rows = local.datasets()
        assert hub.datasets() == {n: rows[n] for n in sorted(ONLY + HOMES)}
        for name in ONLY + HOMES:
            if rows[name]["kind"] == "cells":
                for read in ("cells", "lineage"):
                    want, got = getattr(local, read)(name), getattr(hub, read)(name)
                    assert len(got) > 0 and got.schema == want.schema and got.equals(want), \
                        (name, read)
            elif rows[name]["kind"] == "serving":
                want, got = local.serving_targets(name), hub.serving_targets(name)
                assert len(got) > 0 and got.schema == want.schema and got.equals(want), name
            else:
                want, got = local.op_points(name), hub.op_points(name)
                assert len(got) > 0 and got.schema == want.schema and got.equals(want), name
        assert hub.coefficients().equals(local.coefficients())
        assert hub.cells("h200_sxm_ops").is_empty()  # like the store: op datasets have no cells


def test_card_lists_every_config_with_version_and_license(exported, real_store):
    meta = front_matter(exported / "README.md")
    folders = {f"{p.parent.name}/{p.name}" for p in exported.glob("*/*.parquet")}
    listed = {c["config_name"]: c["data_files"][0] for c in meta["configs"]}
    assert {f["path"] for f in listed.values()} == folders
    cells = [n for n in ONLY + HOMES if not n.endswith(("_ops", "_silicon"))]
    ops = [n for n in ONLY + HOMES if n.endswith("_ops")]
    assert set(listed) == {*ONLY, *HOMES, *(f"{n}_lineage" for n in cells), "coefficients",
                           "catalog", *(n.replace("_ops", "_collectives") for n in ops)}
    assert listed["h200_vidur_lineage"] == {"split": "lineage", "path": "h200_vidur/lineage.parquet"}
    assert listed["gb200_silicon"] == {"split": "targets", "path": "gb200_silicon/targets.parquet"}
    assert meta["license"] == ["apache-2.0", "mit"]
    body = (exported / "README.md").read_text()
    (version,), = real_store.sql("SELECT version FROM datasets WHERE name = 'h200_vidur'")
    (commit,), = real_store.sql("SELECT DISTINCT commit FROM sources "
                                "WHERE repo = 'ai-dynamo/aiconfigurator'")
    row = next(line for line in body.splitlines() if line.startswith("| `h200_vidur` |"))
    assert f"`{version}`" in row and f"ai-dynamo/aiconfigurator@{commit[:7]}" in row
    assert "Apache-2.0" in row and "microsoft/vidur@" in row  # its replayed traces: MIT
    assert (exported / "h200_vidur" / "card.md").read_text().startswith("# h200_vidur")


def test_card_has_a_column_dictionary_features_and_a_citation(exported):
    """Every column of every exported config is in the card's dictionary with its type and a
    unit and meaning (none left as ?), and in the header's features with the same type."""
    import pyarrow.parquet as pq

    meta = front_matter(exported / "README.md")
    body = (exported / "README.md").read_text()
    features = {c["config_name"]: {f["name"]: f for f in c["features"]}
                for c in meta["dataset_info"]}
    for config in meta["configs"]:
        schema = pq.read_schema(exported / config["data_files"][0]["path"])
        assert set(features[config["config_name"]]) == set(schema.names), config["config_name"]
        for name in schema.names:
            assert f"| `{name}` |" in body, name
    assert "| ? |" not in body
    assert features["h200_vidur"]["q_lens"] == {"name": "q_lens", "sequence": "int64"}
    assert features["h200_vidur"]["gt_ms"]["dtype"] == "float64"
    assert "| `gt_ms` | float64 | ms |" in body
    assert "@software{llm_step_leaderboard," in body and "license = {MIT}" in body


class Probe(Predictor):
    """Predicts from everything fit received, so any difference in what a catalog gives shows."""

    card = PredictorCard("analytical", "test", "probe", False)

    def fit(self, home):
        self.scale_ = float(sum(f["latency_ms"].mean() for f in home.ops.values())
                            + len(home.published) + home.cells["gt_ms"].mean())
        return self

    def predict(self, cells, gpu):
        return cells["total_tokens"].to_numpy() * self.scale_ + np.sqrt(cells["num_requests"])


def test_a_run_scores_the_same_from_the_export(exported, store_home, tmp_path, monkeypatch):
    registry.discover()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("hub_probe")(Probe)
    spec = evaluate.RunSpec("hub_probe", "h200_vidur", {}, runs_dir=tmp_path)
    local, local_home = evaluate.run(spec), run_inputs.load_inputs(spec).home
    monkeypatch.setattr(run_inputs.StoreCatalog, "current",
                        classmethod(lambda cls, *args: HubCatalog(str(exported))))
    from_hub, hub_home = evaluate.run(spec), run_inputs.load_inputs(spec).home
    assert list(hub_home.ops) == list(local_home.ops) and len(hub_home.ops) > 3
    assert all(hub_home.ops[op].equals(local_home.ops[op]) for op in local_home.ops)
    assert from_hub.metrics["valid"], from_hub.metrics["invalid_reasons"]
    assert from_hub.metrics["phases"] == local.metrics["phases"]
    assert from_hub.metrics["dataset_version"] == local.metrics["dataset_version"]
    assert from_hub.predictions.equals(local.predictions)


def test_only_names_are_checked(store_home, tmp_path):
    with pytest.raises(ValueError, match="Did you mean 'h200_vidur'"):
        hub_export.export(tmp_path / "x", only=["h200_vidru"], quiet=True)
    assert not (tmp_path / "x").exists()


def test_interrupted_export_leaves_no_folder(store_home, tmp_path, monkeypatch):
    def fail(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(hub_export, "render_readme", fail)  # after every parquet file is written
    with pytest.raises(RuntimeError, match="disk full"):
        hub_export.export(tmp_path / "fresh", only=["a100_splitwise"], quiet=True)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "README.md").write_text("previous export")
    (tmp_path / "old" / hub_export.EXPORT_MARKER).write_text("")
    with pytest.raises(RuntimeError, match="disk full"):
        hub_export.export(tmp_path / "old", only=["a100_splitwise"], overwrite=True, quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    assert (tmp_path / "old" / "README.md").read_text() == "previous export"
    with pytest.raises(FileExistsError, match="hub.overwrite=true"):
        hub_export.export(tmp_path / "old", only=["a100_splitwise"], quiet=True)


def test_overwrite_never_replaces_a_folder_it_did_not_write(tmp_path):
    """hub.overwrite=true on a mistyped path (a home folder, /tmp) must not remove it."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not an earlier export"):
        hub_export.export(mine, only=["a100_splitwise"], overwrite=True, quiet=True)
    assert (mine / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_a_missing_local_folder_is_named(tmp_path):
    with pytest.raises(HubError, match="no exported dataset folder"):
        HubCatalog(str(tmp_path / "nowhere"))


def run_isolated(script: str, tmp_path: Path, **env: str) -> tuple[str, float]:
    """Run ``script`` in a fresh interpreter: Hugging Face reads its settings at import time."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    clean.update(LEADERBOARD_HOME=str(tmp_path / "home"), HF_HOME=str(tmp_path / "hf"), **env)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=clean, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    return done.stdout, elapsed


FAIL_ON_HUB_ID = """
    from leaderboard.store.hub_catalog import HubCatalog, HubError
    try:
        HubCatalog("someone/llm-steps").cells("h200_vidur")
    except HubError as exc:
        print(exc)
"""


def test_an_unreachable_hub_fails_within_seconds(tmp_path, closed_url):
    out, elapsed = run_isolated(FAIL_ON_HUB_ID, tmp_path, HF_ENDPOINT=closed_url)
    assert elapsed < 10, f"took {elapsed:.1f} s; the Hugging Face client alone retries ~20 s"
    assert f"cannot reach the Hugging Face Hub at {closed_url}" in out
    assert "'someone/llm-steps'" in out and "leaderboard.hub hub.export=PATH" in out
    assert "HF_HUB_OFFLINE=1" in out


def test_a_silent_hub_is_given_up_after_the_probe_timeout(tmp_path):
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        out, elapsed = run_isolated(FAIL_ON_HUB_ID, tmp_path, HF_ENDPOINT=url)
    assert elapsed < 10 and "timed out" in out and "gave up after 3 s" in out


def test_offline_fails_at_once_and_still_reads_a_local_export(tmp_path, closed_url, exported,
                                                             real_store):
    script = FAIL_ON_HUB_ID + f"""
    import time
    started = time.perf_counter()
    try:
        HubCatalog("someone/llm-steps").cells("h200_vidur")
    except HubError:
        print(f"failed in {{time.perf_counter() - started:.2f}} s")
    print(HubCatalog({str(exported)!r}).datasets()["h200_vidur"]["version"])
    """
    out, elapsed = run_isolated(script, tmp_path, HF_HUB_OFFLINE="1", HF_ENDPOINT=closed_url)
    assert "HF_HUB_OFFLINE is set and it is not in the local cache" in out
    failed_in = float(out.split("failed in ")[1].split(" s")[0])
    assert failed_in < 1.0 and elapsed < 10  # no retries against the closed endpoint
    (version,), = real_store.sql("SELECT version FROM datasets WHERE name = 'h200_vidur'")
    assert out.strip().endswith(version)


def test_the_old_export_form_becomes_overrides_with_a_notice(capsys):
    from leaderboard.hub import legacy_overrides

    assert legacy_overrides(["export", "/tmp/x", "--only", "a", "b", "--overwrite",
                             "sources.root=/s"]) == [
        "hub.export=/tmp/x", "hub.overwrite=true", "sources.root=/s", "hub.only=[a,b]"]
    assert "is deprecated" in capsys.readouterr().err


def test_hub_help_lists_its_overrides(capsys):
    from leaderboard import hub

    with pytest.raises(SystemExit):
        hub.main(["--help"])
    out = capsys.readouterr().out
    assert "overrides (hub.*)" in out and "overwrite: false" in out


def test_a_serving_run_scores_the_same_from_the_export(exported, store_home, tmp_path,
                                                       monkeypatch):
    spec = evaluate.RunSpec("ours", "gb200_silicon", {}, runs_dir=tmp_path)
    local = evaluate.run(spec)
    monkeypatch.setattr(run_inputs.StoreCatalog, "current",
                        classmethod(lambda cls, *args: HubCatalog(str(exported))))
    from_hub = evaluate.run(spec)
    assert from_hub.metrics["valid"] and from_hub.metrics["level"] == "serving"
    assert from_hub.metrics["dataset_version"] == local.metrics["dataset_version"]
    assert from_hub.predictions.drop("run_id", strict=False).equals(
        local.predictions.drop("run_id", strict=False))
    with pytest.raises(HubError, match="not a serving dataset"):
        HubCatalog(str(exported)).serving_targets("h200_vidur")
    named = evaluate.run(evaluate.RunSpec("ours", "gb200_silicon", {}, runs_dir=tmp_path,
                                          hub_repo=str(exported)))  # dataset=hf's own route
    assert named.metrics["level"] == "serving", "a hub export's serving set scored as cells"
    assert named.predictions.drop("run_id", strict=False).equals(
        local.predictions.drop("run_id", strict=False))


def test_a_serving_card_ends_with_its_oracle_or_says_how_to_make_one(exported):
    """The exported card of a serving set carries the replay's own error, as `data card` prints
    it: here no oracle run exists in runs_dir, so it names the command that makes one."""
    card = (exported / "gb200_silicon" / "card.md").read_text()
    assert "## The replay's own error, measured" in card
    assert "No current oracle run of gb200_silicon" in card and "split.home_points=every_shape" in card
    homes = list(exported.glob("*_vidur*/card.md"))  # step sets carry no oracle section
    assert homes and all("The replay's own error" not in p.read_text() for p in homes)


@pytest.mark.slow
def test_an_edited_export_is_not_rankable(exported, store_home, tmp_path):
    """Seal v3, route 4: an export anyone can edit is ranked only when it holds the store's own
    rows. The unedited export is rankable (where the seal holds); with one ``gt_ms`` rewritten
    the run says why it is not, although the catalog still claims the store's version."""
    spec = lambda repo: evaluate.RunSpec("ours", "h200_vidur", {}, runs_dir=tmp_path / "runs",  # noqa: E731
                                         hub_repo=str(repo))
    honest = evaluate.run(spec(exported)).metrics
    assert not any(r.startswith("data:") for r in honest["unrankable_because"])
    edited = tmp_path / "edited"
    shutil.copytree(exported, edited)
    cells = pl.read_parquet(edited / "h200_vidur" / "cells.parquet")
    cells.with_columns(pl.col("gt_ms") * 1.01).write_parquet(edited / "h200_vidur" / "cells.parquet")
    cheat = evaluate.run(spec(edited)).metrics
    assert cheat["rankable"] is False and cheat["dataset_version"] == honest["dataset_version"]
    assert cheat["unrankable_because"][-1].endswith("the hub's target rows differ from the store's")
    assert cheat["inputs_digest"] != honest["inputs_digest"]
