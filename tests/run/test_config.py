"""Every config in every group composes, and conf/dataset matches the store's datasets."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.core.config_store import ConfigStore

from leaderboard.run.config import dataset_names, load_config
from leaderboard.run.inputs import InputError
from leaderboard.store.catalog import StoreCatalog
from leaderboard_core import paths
from predictors import registry

LAUNCHERS = sorted(p.stem for p in (paths.CONF_DIR / "hydra" / "launcher").glob("*.yaml"))


def test_defaults_compose():
    cfg = load_config(with_hydra=True)
    assert cfg.split.test_fraction == 0.3 and cfg.dataset.name
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    # Hydra's logs land beside the runs (taken from the repository root), never in the folder
    # the command starts from, and under a runs_dir elsewhere when one is given
    for kind in ("run", "sweep"):
        assert cfg.hydra[kind].dir.startswith(str(paths.REPO_ROOT / "results/runs/.hydra") + "/")
    elsewhere = load_config(["runs_dir=/srv/runs"], with_hydra=True)
    assert all(elsewhere.hydra[k].dir.startswith("/srv/runs/.hydra/") for k in ("run", "sweep"))


def test_a_path_you_type_is_taken_from_the_working_folder(tmp_path, monkeypatch):
    from leaderboard.run.run_inputs import RunSpec

    monkeypatch.chdir(tmp_path)
    assert RunSpec("ours", "h200_vidur", {}, runs_dir="mine").runs_dir == tmp_path / "mine"
    assert RunSpec("ours", "h200_vidur", {}).runs_dir == paths.REPO_ROOT / "results" / "runs"
    cfg = load_config(["runs_dir=mine"], with_hydra=True)
    assert cfg.hydra.run.dir.startswith(f"{tmp_path / 'mine'}/.hydra/")
    assert load_config().report.out == str(paths.REPO_ROOT / "RESULTS.md")


@pytest.mark.parametrize("name", registry.names())
def test_every_predictor_node_composes_with_its_defaults(name):
    cfg = load_config([f"predictor={name}"])
    assert cfg.predictor.name == name
    params = {k: v for k, v in cfg.predictor.items() if k != "name"}
    assert params == registry.get(name).default_params()


@pytest.mark.parametrize("name", dataset_names())
def test_every_dataset_node_composes(name):
    hub = ["dataset.name=h200_vidur", "dataset.repo=/tmp/export"] if name == "hf" else []
    cfg = load_config([f"dataset={name}", *hub])
    assert cfg.dataset.name == (name if name != "hf" else "h200_vidur")


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_composes(launcher):
    cfg = load_config([f"hydra/launcher={launcher}"], with_hydra=True)
    assert cfg.hydra.launcher._target_.startswith("hydra_plugins.")


def test_every_scoreable_dataset_has_a_node_and_back(store_home):
    with StoreCatalog() as catalog:
        in_store = set(catalog.datasets())
    assert in_store == set(dataset_names()) - {"hf"}


def test_a_typo_on_the_command_line_names_the_closest_choice(tmp_path):
    done = subprocess.run([sys.executable, "-m", "leaderboard", "predictor=rf_verbatm",
                           f"runs_dir={tmp_path}"], capture_output=True, text=True, timeout=120,
                          cwd=paths.REPO_ROOT)
    assert done.returncode == 2
    assert "Did you mean 'rf_verbatim'?" in " ".join(done.stderr.split())


def test_a_stored_dataset_without_a_config_file_gets_a_node(store_home, monkeypatch):
    """A GPU added through a sources directory has a dataset in the store but no conf file."""
    from leaderboard import cli
    from leaderboard.run import config

    assert "h200_vidur" in config.stored_dataset_names()
    monkeypatch.setattr(config, "stored_dataset_names", lambda: ["h200_vidur", "newgpu_vidur"])
    try:
        cli.check_choices(["predictor=genz", "dataset=newgpu_vidur"])
        cfg = load_config(["dataset=newgpu_vidur"])
        assert cfg.dataset.name == "newgpu_vidur" and cfg.dataset.home is None
        with pytest.raises(SystemExit):
            cli.check_choices(["dataset=newgpu_vidr"])
    finally:
        ConfigStore.instance().repo.get("dataset", {}).pop("newgpu_vidur.yaml", None)


def test_a_misspelt_parameter_names_the_predictors_fields(capsys):
    from leaderboard import cli

    with pytest.raises(SystemExit):
        cli.check_choices(["predictor=genz", "predictor.efficency=0.5"])
    assert "Did you mean 'memory_efficiency'?" in " ".join(capsys.readouterr().err.split())
    cli.check_choices(["predictor=genz", "predictor.memory_efficiency=0.5"])  # a real field passes


@pytest.mark.parametrize("typo, closest", [
    ("dataset.hom=a100_vidur", "home"), ("split.sed=3", "seed"), ("datset=h100_vidur", "dataset"),
    ("report.rerum=true", "rerun")])
def test_a_misspelt_key_names_the_closest_instead_of_appending_it(typo, closest, capsys):
    from leaderboard import cli

    with pytest.raises(SystemExit):
        cli.check_choices(["predictor=genz", "dataset=h100_vidur", typo])
    err = " ".join(capsys.readouterr().err.split())
    assert f"unknown key '{typo.partition('=')[0]}'" in err and f"Did you mean '{closest}'?" in err
    assert "+" not in err  # Hydra's own answer, +key=value, adds a key nothing reads
    # real keys of every kind pass: a group's, a section's, a list value, a sweep, an append
    cli.check_choices(["predictor=genz", "dataset=h100_vidur,l40s_vidur", "split.seed=3",
                       "dataset.home=[a100_vidur,h100_vidur]", "report.rerun=true",
                       "hydra/launcher=joblib", "+extra=1", "predictor.memory_efficiency=0.5",
                       "--cfg=job", "sources.only=[vidur]"])
    # a node's mandatory keys (??? until given) are keys too: the README's hub form
    cli.check_choices(["predictor=genz", "dataset=hf", "dataset.repo=/tmp/export",
                       "dataset.name=h200_vidur"])


def test_a_misspelt_section_or_a_key_below_a_value_is_named():
    from leaderboard.run.config import command_config, unknown_key

    assert "the config has no 'sourcess'; valid names:" in unknown_key(["sourcess.root=/x"])
    assert "Did you mean 'sources'?" in unknown_key(["sourcess.root=/x"])
    assert "'runs_dir' takes a value, not keys" in unknown_key(["runs_dir.x=1"])
    with pytest.raises(InputError, match="report.rerum"):
        command_config(["report.rerum=true"], "prog", "doc", "report", {})


def test_hf_without_repo_and_name_says_what_to_pass(tmp_path):
    done = subprocess.run([sys.executable, "-m", "leaderboard", "predictor=genz", "dataset=hf",
                           f"runs_dir={tmp_path}"], capture_output=True, text=True, timeout=120,
                          cwd=paths.REPO_ROOT)
    assert done.returncode == 2
    assert "dataset=hf needs dataset.name and dataset.repo" in " ".join(done.stderr.split())


def test_explain_takes_overrides_and_the_old_cell_form(capsys):
    from leaderboard.explain import arguments

    assert arguments(["predictor=rf_scaled", "dataset=a100_vidur", "explain.cell=c1"]) == (
        "rf_scaled", "a100_vidur", "c1", None)
    assert arguments(["dataset=h100_vidur", "cell=c2"]) == ("ours", "h100_vidur", "c2", None)
    assert arguments(["dataset=h100_vidur", "explain.worst=3"]) == ("ours", "h100_vidur", None, 3)
    assert "cell is deprecated and goes in the next release; use explain.cell=c2" in capsys.readouterr().err


def test_a_run_spec_follows_the_config_and_its_runs_dir_the_repository(tmp_path):
    from leaderboard.run.evaluate import RunSpec

    cfg = load_config(["predictor=genz", "dataset=h100_vidur", "split.seed=7",
                       "dataset.home=[a100_vidur,h100_vidur]", "reading.max_points=3",
                       "runs_dir=somewhere/runs", "predictor.memory_efficiency=0.5"])
    spec = RunSpec.from_config(cfg)
    assert (spec.predictor, spec.dataset, spec.seed, spec.reading_max_points) == (
        "genz", "h100_vidur", 7, 3)
    assert spec.home == ["a100_vidur", "h100_vidur"] and type(spec.home) is list
    assert spec.params["memory_efficiency"] == 0.5 and "name" not in spec.params
    assert spec.runs_dir == paths.REPO_ROOT / "somewhere" / "runs"
    assert RunSpec("genz", "h100_vidur", {}, runs_dir=tmp_path).runs_dir == tmp_path
