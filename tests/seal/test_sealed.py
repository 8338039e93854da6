"""What a user can get wrong before a run, and what interrupted work leaves: parameter values,
GPU specs, leftovers of dead processes, writes outside LEADERBOARD_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from leaderboard.run.evaluate import RunSpec, run
from leaderboard.store import debris
from leaderboard_core import guard, paths
from leaderboard_core.specs import SpecError, load_gpu_specs
from predictors import registry


@pytest.mark.parametrize("params, message", [
    ({"grid": "huge"}, "grid='huge' is not allowed; grid must be one of full, reduced"),
    ({"random_state": "abc"}, "random_state='abc' is not allowed; random_state must be of type int"),
    ({"random_state": True}, "must be of type int"),
])
def test_a_bad_parameter_value_names_the_allowed_values(params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        registry.check_params("rf_verbatim", params)
    registry.check_params("rf_verbatim", {"grid": "full", "random_state": 3})


def test_cli_exits_2_on_a_bad_value_and_writes_no_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "leaderboard", "predictor=rf_verbatim",
                          "predictor.grid=huge", f"runs_dir={tmp_path / 'runs'}"],
                         capture_output=True, text=True, cwd=paths.REPO_ROOT, timeout=120)
    assert out.returncode == 2 and "grid must be one of full, reduced" in out.stderr
    # (the suite's home, beside it, may hold the seal's scan of the readable roots)
    # (Hydra's own log folder, .hydra, is not a run)
    runs = tmp_path / "runs"
    assert not runs.exists() or not [p for p in runs.iterdir() if p.name != ".hydra"]


def test_a_negative_bandwidth_fails_with_the_file_and_field(tmp_path):
    data = yaml.safe_load((paths.CONF_DIR / "gpu" / "h200_sxm.yaml").read_text())
    (tmp_path / "h200_sxm.yaml").write_text(yaml.safe_dump({**data, "mem_bw_gbs": -4800}))
    with pytest.raises(SpecError, match=r"h200_sxm.yaml: mem_bw_gbs = -4800 is outside its "
                                        r"physical range; allowed: a number > 0"):
        load_gpu_specs(tmp_path)
    (tmp_path / "h200_sxm.yaml").write_text(yaml.safe_dump({**data, "l2_mb": 200_000}))
    with pytest.raises(SpecError, match="l2_mb"):
        load_gpu_specs(tmp_path)
    (tmp_path / "h200_sxm.yaml").write_text(yaml.safe_dump({**data, "arch": "Hopper 9"}))
    with pytest.raises(SpecError, match="arch = 'Hopper 9' must be a lower-case name"):
        load_gpu_specs(tmp_path)


def test_an_unknown_architecture_is_accepted_with_a_warning(tmp_path, capsys):
    """A new GPU needs only its spec: an arch the suite does not list is a warning (with the
    closest known name, for a typo), and its physical ranges are still checked."""
    data = yaml.safe_load((paths.CONF_DIR / "gpu" / "h200_sxm.yaml").read_text())
    (tmp_path / "h200_sxm.yaml").write_text(yaml.safe_dump({**data, "arch": "hoper"}))
    assert load_gpu_specs(tmp_path)["h200_sxm"]["arch"] == "hoper"
    assert load_gpu_specs(tmp_path)["h200_sxm"]["arch"] == "hoper"
    err = capsys.readouterr().err
    assert err.count("warning:") == 1  # once per process
    assert "arch = 'hoper' is not one the suite knows" in err and "Did you mean 'hopper'" in err
    (tmp_path / "h200_sxm.yaml").write_text(yaml.safe_dump({**data, "arch": "xe2",
                                                             "vendor": "acme", "sm_count": 0}))
    with pytest.raises(SpecError, match="sm_count = 0 is outside"):
        load_gpu_specs(tmp_path)


def test_leftovers_of_dead_processes_are_removed_and_counted(tmp_path, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store_dir, runs = paths.home() / "store", tmp_path / "runs"
    store_dir.mkdir(parents=True)
    (runs / f".20260101-x.{dead.pid}.partial").mkdir(parents=True)
    (runs / f".20260101-y.{os.getpid()}.partial").mkdir()  # a live run: kept
    for name in (f".leaderboard.duckdb.{dead.pid}.tmp", f".leaderboard.duckdb.{dead.pid}.tmp.wal"):
        (store_dir / name).write_bytes(b"x")
    (paths.home() / "sandbox" / f"{dead.pid}-abcdef12").mkdir(parents=True)
    assert debris.sweep(runs) == 4
    assert [p.name for p in runs.iterdir()] == [f".20260101-y.{os.getpid()}.partial"]
    assert not list(store_dir.iterdir()) and not list((paths.home() / "sandbox").iterdir())
    assert debris.sweep(runs) == 0


@pytest.mark.long
def test_a_run_writes_nothing_outside_its_home(store_home, tmp_path, monkeypatch):
    user = tmp_path / "user"
    (user / ".cache").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.setenv("XDG_CACHE_HOME", str(user / ".cache"))
    os.chmod(user / ".cache", 0o555)
    try:
        result = run(RunSpec("rf_scaled", "h200_vidur", {}, runs_dir=tmp_path / "runs"))
    finally:
        os.chmod(user / ".cache", 0o755)
    assert result.metrics["valid"], result.metrics["invalid_reasons"]
    assert not list((user / ".cache").iterdir())
    assert list((store_home.home / "predictor-cache").rglob("rf-*.pickle"))


def test_the_child_imports_the_suite_from_this_tree_before_any_installed_copy(tmp_path):
    """A virtual environment installed from another checkout points its site-packages there,
    which the child may not read: the child's path must name this tree before them, and the
    suite it imports must be this one."""
    from leaderboard.seal import sandbox  # noqa: PLC0415 - the harness side, as a run uses it

    probe = ("import json, sys, sysconfig, leaderboard; print(leaderboard.__file__); "
             "print(json.dumps([sysconfig.get_path('purelib'), sysconfig.get_path('platlib')]));"
             "print('\\n'.join(sys.path))")
    out = subprocess.run([sys.executable, "-c", probe], env=sandbox.scratch_env(str(tmp_path)),
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    module, installed, *entries = out.stdout.splitlines()
    assert Path(module).resolve().parent == paths.REPO_ROOT / "leaderboard"
    site = [entries.index(p) for p in json.loads(installed) if p in entries]
    assert entries.index(str(paths.REPO_ROOT)) < min(site, default=len(entries))


def test_the_innermost_folder_decides_what_an_open_records(tmp_path):
    """The child records opens in watched folders, not in those it may use (allowed) or where
    libraries scan metadata (quiet), however they nest; a link counts where it points."""
    data, repo, cache = tmp_path / "data", tmp_path / "data" / "repo", tmp_path / "data" / "cache"
    for folder in (repo / "results", cache):
        folder.mkdir(parents=True)
    (data / "store.duckdb").write_text("")
    (tmp_path / "link").symlink_to(data / "store.duckdb")
    roots = guard.watch_roots([str(data), str(repo / "results")], [str(cache)], [str(repo)])
    assert guard.recorded(data / "store.duckdb", roots)
    assert guard.recorded(tmp_path / "link", roots)
    assert guard.recorded(repo / "results" / "runs" / "x" / "predictions.parquet", roots)
    assert not guard.recorded(repo / "pkg.egg-info" / "entry_points.txt", roots)
    assert not guard.recorded(cache / "fit.pkl", roots)
    assert not guard.recorded(tmp_path / "elsewhere.txt", roots)
    # a folder both watched and allowed (LEADERBOARD_HOME set to a folder the child reads) is
    # allowed, whichever list names it first
    for tie in (guard.watch_roots([str(repo)], [], [str(repo)]),
                guard.watch_roots([str(repo)], [str(repo)])):
        assert not guard.recorded(repo / "pkg.egg-info" / "PKG-INFO", tie)
