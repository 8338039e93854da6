"""Every command, with a table of bad inputs a user controls: each exits 2 with one line naming
the value and the fix, never a traceback; Ctrl-C exits 130 with one line; a bad run folder is
skipped by the results loader with a line naming it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from leaderboard.score import results
from leaderboard_core import paths

EXTERNAL = '''
from leaderboard_core.contract import PredictorCard
from predictors.base import Predictor
from predictors.registry import register


@register("toy_typed")
class ToyTyped(Predictor):
    card = PredictorCard(kind="analytical", reference="a test", description="a constant",
                         needs_profiled_rows=False)

    def __init__(self, alpha: float = 1.0):  # the class, not a string: no __future__ import
        self.alpha = alpha

    def predict(self, cells, gpu):
        import numpy as np
        return np.full(len(cells), self.alpha)
'''


def _run(*argv: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=paths.REPO_ROOT)


def _many(argvs: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Each command run as a user would; three at a time, as most of each is interpreter start."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(lambda argv: _run(*argv), argvs))


def _refusal_problem(done: subprocess.CompletedProcess, *fragments: str) -> str | None:
    output = done.stdout + done.stderr
    flat = " ".join(done.stderr.split())
    if done.returncode != 2 or "Traceback" in output:
        return f"rc {done.returncode}: {output[-1500:]}"
    missing = [f for f in fragments if f not in flat]
    return f"no {missing} in: {flat[-1500:]}" if missing else None


def _one_line_refusal(done: subprocess.CompletedProcess, *fragments: str) -> None:
    problem = _refusal_problem(done, *fragments)
    assert problem is None, problem


# (argv, what the one line must say); none of these opens the store
NO_STORE = [
    (["leaderboard", "reading.max_fraction=abc"], ["reading.max_fraction='abc'", "a number"]),
    (["leaderboard", "reading.max_points=-1"], ["reading.max_points=-1", "at least 0"]),
    (["leaderboard", "split.seed=abc"], ["split.seed='abc'", "a whole number"]),
    (["leaderboard", "split.home_points=all"], ["one of full_grid, behind_cells"]),
    (["leaderboard", "predictor=genz", "predictor.compute_efficiency=-1"],
     ["compute_efficiency=-1 is not allowed", "in [0.001, 1.0]"]),
    (["leaderboard", "predictor=ours_reading", "predictor.decode_points=-3"],
     ["decode_points=-3 is not allowed"]),
    (["leaderboard", "predictor=distserve", "predictor.mixed=both"],
     ["mixed must be one of additive, prefill_only"]),
    (["leaderboard", "runs_dir=/dev/null/x"], ["runs_dir=/dev/null/x", "not a directory"]),
    (["leaderboard", "predictor=our"], ["unknown predictor 'our'", "Did you mean 'ours'?"]),
    (["leaderboard", "gpu=h100_sxm"], ["unknown key 'gpu'"]),
    (["leaderboard.calibrate", "predictor=our"], ["Did you mean 'ours'?"]),
    (["leaderboard.calibrate", "predictor=genz"], ["no frozen constants"]),
    (["leaderboard.report", "report.partial=maybe"], ["report.partial='maybe'", "keep, replace"]),
    (["leaderboard.report", "report.jobs=0"], ["report.jobs=0"]),
    (["leaderboard.report", "--bogus"], ["unknown flag --bogus"]),
    (["leaderboard.explain", "explain.worst=0"], ["explain.worst=0", "at least 1"]),
    (["leaderboard.explain", "predictor=genz"], ["offers no explain"]),
    (["leaderboard.explain", "explain.cel=x"], ["unknown key 'explain.cel'", "Did you mean 'cell'?"]),
    (["leaderboard.hub"], ["hub.export=PATH"]),
    (["leaderboard.rerun", "report.jobs=two"], ["report.jobs='two'"]),
    (["leaderboard.data", "card"], ["card takes a dataset name"]),
    (["leaderboard.data", "lits"], ["invalid choice: 'lits'"]),
]


@pytest.mark.long
def test_every_bad_input_is_one_line_and_status_2():
    outcomes = _many([argv for argv, _ in NO_STORE])
    problems = {" ".join(argv): problem for (argv, fragments), done in zip(NO_STORE, outcomes, strict=True)
                if (problem := _refusal_problem(done, *fragments))}
    assert not problems, json.dumps(problems, indent=1)


COMMANDS = ("leaderboard", "leaderboard.calibrate", "leaderboard.report", "leaderboard.explain",
            "leaderboard.hub", "leaderboard.rerun", "leaderboard.data")


@pytest.mark.long
def test_help_of_every_command_exits_0_without_a_traceback():
    argvs = [[command, "--help"] for command in COMMANDS] + [["leaderboard.calibrate", "-h"]]
    for argv, done in zip(argvs, _many(argvs), strict=True):
        assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, argv
        assert "usage" in done.stdout.lower(), (argv, done.stdout[:300])
    groups = _run("leaderboard", "--help").stdout
    assert "predictor=NAME" in groups and "gpu:" not in groups  # no data folder shown as a group


def test_overwrite_of_a_folder_that_is_not_an_export_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    _one_line_refusal(_run("leaderboard.hub", f"hub.export={tmp_path}", "--overwrite"),
                      "not an earlier export")
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_an_external_predictor_value_is_checked_from_its_annotation(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "toy_typed.py").write_text(EXTERNAL)
    done = _run("leaderboard", f"predictors_path={folder}", "predictor=toy_typed",
                "predictor.alpha=big", f"runs_dir={tmp_path / 'runs'}")
    _one_line_refusal(done, "alpha='big' is not allowed", "of type float")


def test_a_bad_run_folder_is_skipped_with_its_name(tmp_path, capsys):
    runs = tmp_path / "runs"
    for name, seed in (("good", 0), ("bad", "abc")):
        (runs / name).mkdir(parents=True)
        (runs / name / "metrics.json").write_text(json.dumps({"run_id": name, "split_seed": seed}))
        (runs / name / "predictions.parquet").write_bytes(b"")
    (runs / "broken").mkdir()
    (runs / "broken" / "metrics.json").write_text("{not json")
    (runs / "broken" / "predictions.parquet").write_bytes(b"")
    assert [p.name for p in results.complete_run_folders(runs)] == ["good"]
    err = capsys.readouterr().err
    assert f"skipped run folder {runs / 'bad'}: split_seed='abc' is not bigint" in err
    assert f"skipped run folder {runs / 'broken'}: metrics.json does not parse" in err
    assert results.load_runs(runs).pl()["run_id"].to_list() == ["good"]


# ------------------------------------------------------------------ inputs that need the store


NEEDS_STORE = [
    (["leaderboard.explain", "dataset=h100_silicon"], ["h100_silicon holds serving, not cells"]),
    (["leaderboard.explain", "dataset=h200_sxm_ops"], ["h200_sxm_ops holds ops, not cells"]),
    (["leaderboard.explain", "dataset=h100_vidur", "explain.cell=nope"],
     ["no cell 'nope' in h100_vidur", "explain.worst=K"]),
    (["leaderboard.data", "card", "h200_vidru"], ["no dataset 'h200_vidru'",
                                                  "Did you mean 'h200_vidur'?"]),
    (["leaderboard", "dataset=vidur"], ["unknown dataset 'vidur'"]),  # a trace set, not a dataset
]


@pytest.mark.long  # one subprocess per bad input: about 18 s
def test_every_bad_input_that_needs_the_store_is_one_line(store_home):
    outcomes = _many([argv for argv, _ in NEEDS_STORE])
    problems = {" ".join(argv): problem for (argv, fragments), done in zip(NEEDS_STORE, outcomes, strict=True)
                if (problem := _refusal_problem(done, *fragments))}
    assert not problems, json.dumps(problems, indent=1)


@pytest.mark.long
def test_ctrl_c_is_one_line_and_status_130(store_home, tmp_path):
    # a seed of its own: the forests are not cached, so the fit is still running at the signal
    child = subprocess.Popen(
        [sys.executable, "-m", "leaderboard", "predictor=rf_scaled", "dataset=l40s_vidur",
         f"predictor.random_state={int(time.time()) % 100_000 + 100}", f"runs_dir={tmp_path}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=paths.REPO_ROOT)
    time.sleep(8)
    assert child.poll() is None, "the run ended before the signal"
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err[-2000:]
    assert "Traceback" not in out + err and err.strip().endswith("python -m leaderboard: interrupted")
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")]  # no run folder
