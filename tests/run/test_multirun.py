"""Multirun: Hydra's joblib launcher in parallel, and the SLURM path through submitit's local
executor. Every run of the sweep lands in its own complete folder."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from leaderboard_core import paths


def _sweep(tmp_path, *overrides) -> tuple[list[dict], str]:
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "leaderboard", "-m", "predictor=genz,llm_viewer",
         "dataset=h100_vidur,l40s_vidur", f"runs_dir={runs}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
         *overrides], capture_output=True, text=True, timeout=300, cwd=paths.REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list(runs.glob(".*")), "no partial run folder may remain"
    metrics = [json.loads((d / "metrics.json").read_text()) for d in sorted(runs.iterdir())]
    return metrics, done.stdout + done.stderr


def _check(metrics: list[dict]) -> None:
    assert sorted((m["predictor"], m["dataset"]) for m in metrics) == [
        ("genz", "h100_vidur"), ("genz", "l40s_vidur"),
        ("llm_viewer", "h100_vidur"), ("llm_viewer", "l40s_vidur")]
    assert all(m["valid"] and m["phases"]["mixed"]["n"] >= 300 for m in metrics)
    # "all" is every prefill and decode cell; the composed mixed ones are scored apart
    assert all(m["phases"]["all"]["n"] == m["phases"]["prefill"]["n"] + m["phases"]["decode"]["n"]
               >= 1500 for m in metrics)
    counts = {(m["dataset"], m["phases"]["all"]["n"] + m["phases"]["mixed"]["n"]) for m in metrics}
    assert len(counts) == 2, counts  # both predictors scored every cell of each dataset


@pytest.mark.long  # four sealed runs in two processes: about 16 s
@pytest.mark.usefixtures("store_home")
def test_joblib_multirun_runs_in_parallel_and_loses_nothing(tmp_path):
    metrics, output = _sweep(tmp_path)
    _check(metrics)
    assert "Joblib.Parallel(n_jobs=2" in output and "launching 4 jobs" in output


@pytest.mark.usefixtures("store_home")
@pytest.mark.long
def test_submitit_launcher_runs_the_sweep(tmp_path):
    _check(_sweep(tmp_path, "hydra/launcher=submitit_local_test")[0])
    assert list((tmp_path / "sweep" / ".submitit").iterdir()), "submitit wrote no job folders"


def test_a_sweep_counts_not_supported_answers_and_fails_only_on_invalid_ones(tmp_path, capsys):
    from leaderboard import cli

    log = tmp_path / "sweep.jsonl"
    rows = [("a", "VALID", 5.0), ("b", "NOT SUPPORTED", None)]
    log.write_text("".join(json.dumps({"predictor": p, "dataset": "d", "status": s, "mape": m,
                                       "where": "x"}) + "\n" for p, s, m in rows))
    assert cli.print_sweep(str(log)) == 0
    assert "1 VALID, 1 not supported, 0 INVALID or failed" in capsys.readouterr().err
    with open(log, "a") as more:
        more.write(json.dumps({"predictor": "c", "dataset": "d", "status": "INVALID",
                               "mape": None, "where": "y"}) + "\n")
    assert cli.print_sweep(str(log)) == 1
    stated = {"valid": False, "invalid_reasons": ["NotSupported: prices bf16 GEMMs only"]}
    assert cli.verdict(stated) == "NOT SUPPORTED"
    assert cli.verdict({**stated, "invalid_reasons": ["NotSupported: x", "boom"]}) == "INVALID"


@pytest.mark.usefixtures("store_home")
@pytest.mark.slow
def test_the_rerun_through_submitits_local_executor_scores_as_the_pool_does(tmp_path):
    """rerun.launcher=local sends each run as a submitit array task (the path launcher=slurm
    takes to a cluster); its numbers are those of the same runs made here."""
    from leaderboard import rerun
    from leaderboard.run.evaluate import RunSpec, run

    specs = [RunSpec("llm_viewer", d, {}, runs_dir=tmp_path / "jobs") for d in
             ("h100_vidur", "l40s_vidur")]
    outcomes = list(rerun.in_jobs(specs, "local", tmp_path / "submitit"))
    assert [(o.predictor, o.dataset, o.status) for o in outcomes] == [
        ("llm_viewer", "h100_vidur", "valid"), ("llm_viewer", "l40s_vidur", "valid")]
    assert list((tmp_path / "submitit").iterdir()), "submitit wrote no job folders"
    by_jobs = {json.loads((d / "metrics.json").read_text())["dataset"]:
               json.loads((d / "metrics.json").read_text())["phases"]
               for d in (tmp_path / "jobs").iterdir()}
    for spec in specs:
        here = run(RunSpec(spec.predictor, spec.dataset, {}, runs_dir=tmp_path / "here"))
        assert by_jobs[spec.dataset] == here.metrics["phases"]
