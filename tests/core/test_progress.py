"""Nothing long is silent: off a terminal, long work prints what it is doing every few seconds."""

from __future__ import annotations

import fcntl
import threading
import time

import numpy as np
import pytest
from sklearn.ensemble import RandomForestRegressor
from sklearn.model_selection import GridSearchCV

from leaderboard.store import database
from leaderboard_core import paths, progress
from predictors import rf
from predictors.rf import VidurRandomForest
from tests.predictors.test_rf import synthetic_home

TICK = 0.05


@pytest.fixture(autouse=True)
def fast_ticks(monkeypatch):
    monkeypatch.setattr(progress, "EVERY_SECONDS", TICK)
    monkeypatch.setattr(progress, "_shown", True)


def test_lines_say_what_is_done_off_a_terminal(capfd):
    with progress.track("counting sheep", total=3) as bar:
        bar.advance()
        bar.note("sheep 2")
        time.sleep(6 * TICK)
    err = capfd.readouterr().err.splitlines()
    assert len(err) >= 3
    assert all(line.startswith("counting sheep: 1/3, sheep 2 (") for line in err)


def test_short_work_and_silenced_processes_print_nothing(capfd):
    with progress.track("quick", total=1) as bar:
        bar.advance()
    progress.show(False)
    with progress.track("silenced"):
        time.sleep(4 * TICK)
    assert capfd.readouterr().err == ""


def test_waiting_on_another_build_says_so(capfd):
    paths.store_path().parent.mkdir(parents=True, exist_ok=True)
    with open(paths.store_path().parent / ".build.lock", "w") as other_builder:
        fcntl.flock(other_builder, fcntl.LOCK_EX)  # another open file: flock blocks this process too
        got_lock = threading.Event()

        def wait_for_build():
            with database._build_lock():
                got_lock.set()

        waiter = threading.Thread(target=wait_for_build)
        waiter.start()
        time.sleep(6 * TICK)
        assert not got_lock.is_set()
        fcntl.flock(other_builder, fcntl.LOCK_UN)
        waiter.join(5)
    assert got_lock.is_set()
    err = capfd.readouterr().err
    assert "waiting for another process to finish building the store" in err


def test_forest_fits_report_each_regressor(capfd, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_SECONDS", 0.001)
    home = synthetic_home()
    VidurRandomForest().fit(home)
    err = capfd.readouterr().err.splitlines()
    # 6 regressors for TP1 (4 GEMMs, 2 attentions) and 7 for TP2 (with the all-reduce)
    assert any(line.startswith("rf_verbatim: reduced-grid forests on synthetic: ") for line in err)
    assert any("/13, qwen3-8b TP2 allreduce (3 points)" in line for line in err)


def test_counted_search_is_vidurs_search(monkeypatch):
    """Counting folds changes no choice: the same forest as GridSearchCV on -MAPE, every fitted
    fold heard (one forest a fold: one feature, so its trees hold every depth and split size)."""
    tiny_grid = {"n_estimators": [5, 10], "max_depth": [2, 8], "min_samples_split": [2, 5]}
    monkeypatch.setitem(rf.GRIDS, "full", tiny_grid)
    rng = np.random.default_rng(0)
    x = rng.integers(1, 4096, size=(40, 1)).astype(np.float64)
    y = 0.01 + x[:, 0] * 1e-4 * rng.uniform(0.8, 1.2, size=40)
    heard = []
    counted = rf.fit_forest(x, y, "full", 0, lambda done, total: heard.append((done, total)))
    plain = GridSearchCV(RandomForestRegressor(random_state=0), tiny_grid,
                         scoring="neg_mean_absolute_percentage_error", cv=10).fit(x, y)
    assert counted.get_params() == plain.best_estimator_.get_params()
    np.testing.assert_array_equal(counted.predict(x), plain.best_estimator_.predict(x))
    assert heard == [(i, 10) for i in range(1, 11)]  # 10 folds


def test_a_silenced_process_and_a_runs_child_never_import_rich():
    """rich is imported only where a bar or line may be shown: every sealed child imports the
    progress module (through its job), and paid about 30 ms a run for rich before."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = ("import sys\nfrom leaderboard.seal import child, job\n"
            "from leaderboard_core import progress\nprogress.show(False)\n"
            "with progress.track('silenced', total=1) as bar:\n    bar.advance()\n"
            "assert 'rich' not in sys.modules, 'rich imported'\n"
            "progress.show(True)\n"
            "with progress.track('shown', total=1) as bar:\n    bar.advance()\n"
            "print('rich' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=paths.REPO_ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"  # shown, it is imported (and draws)
