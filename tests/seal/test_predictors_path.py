"""A predictor from a folder outside the repo (``predictors_path=DIR``) runs as any other, sealed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from outside_source import toy

from leaderboard_core import paths

# Importing this module runs it: it notes every process that could write outside its sandbox.
OUTSIDE = '''
import os

try:
    with open("MARKER_PATH", "a") as marker:
        marker.write(f"{os.getpid()}\\n")
except OSError:
    pass
''' + toy("toy_outside")


@pytest.mark.slow
def test_a_predictor_outside_the_repo_runs_sealed(store_home, tmp_path):
    """Its module is imported only in sealed children, never in the process that holds the
    ground truth: the module's own note of the processes that imported it stays empty."""
    folder, marker = tmp_path / "mine", tmp_path / "imported_by"
    folder.mkdir()
    (folder / "toy_outside.py").write_text(OUTSIDE.replace("MARKER_PATH", str(marker)))
    out = subprocess.run([sys.executable, "-m", "leaderboard", "predictor=toy_outside",
                          "predictor.us_per_token=2.0", f"predictors_path={folder}",
                          "dataset=h200_vidur", f"runs_dir={tmp_path / 'runs'}"],
                         capture_output=True, text=True, cwd=paths.REPO_ROOT, timeout=300,
                         env={**os.environ, "LEADERBOARD_HOME": str(store_home.home)})
    assert out.returncode == 0, out.stderr
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.name != ".hydra"]  # Hydra logs
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["valid"] and metrics["predictor"] == "toy_outside", metrics["invalid_reasons"]
    assert metrics["params"] == {"us_per_token": 2.0}
    assert metrics["sandbox"] in ("namespaces+landlock", "landlock", "namespaces", "process")
    if metrics["sandbox"].endswith("landlock"):
        assert not marker.exists(), f"imported unsealed by pids {marker.read_text().split()}"


def test_a_missing_predictors_path_names_the_folder(tmp_path):
    out = subprocess.run([sys.executable, "-m", "leaderboard", "predictor=toy_outside",
                          f"predictors_path={tmp_path / 'nowhere'}"], capture_output=True,
                         text=True, cwd=paths.REPO_ROOT, timeout=120)
    assert out.returncode == 2 and "nowhere is not a directory" in out.stderr


SLY = {  # a module that tries the store when imported, and swallows the refusal
    "opens the file": "with open(STORE, 'rb') as f:\n        f.read(16)",
    "asks the guard": "from leaderboard_core import paths\n    paths.store_path()",
}


@pytest.mark.parametrize("how", SLY)
def test_a_module_that_reaches_for_the_store_when_imported_stops_the_commands(store_home,
                                                                            tmp_path, how):
    """Importing a module runs it, in the child that describes the predictors (whose defaults
    then reach every run): that child is sealed and watched as a run's child, so a module that
    tries the store, by a plain open (the audit hook) or through the suite (the seal), and
    swallows the refusal is named, and nothing runs."""
    from leaderboard.seal import predictor_index  # noqa: PLC0415 - the harness side of describing

    folder = tmp_path / "sly"
    folder.mkdir()
    store = store_home.home / "store" / "leaderboard.duckdb"
    attempt = SLY[how].replace("STORE", repr(str(store)))
    (folder / "sly.py").write_text(f"try:\n    {attempt}\nexcept Exception:\n    pass\n"
                                   + OUTSIDE.replace("toy_outside", "sly"))
    first = f"open {store}" if how == "opens the file" else "locate the store during the import"
    with pytest.raises(ValueError, match=f"reached for sealed data when imported .*first: {first}"):
        predictor_index._described((str(folder),))


def test_a_predictors_path_in_or_around_the_measurements_is_refused(store_home, tmp_path):
    from leaderboard.seal import predictor_index  # noqa: PLC0415 - the harness side

    for folder in (store_home.home / "mine", store_home.home.parent):
        with pytest.raises(ValueError, match="where measurements lie"):
            predictor_index.include(folder)
