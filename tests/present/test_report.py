"""Results store, atlases, tie-aware ranking and the report, on synthetic run folders."""

from __future__ import annotations

import json
import os

import numpy as np
import polars as pl
import pytest

from leaderboard import report
from leaderboard.present import headline as report_headline
from leaderboard.present import leaderboard_table as report_leaderboard
from leaderboard.run import roster
from leaderboard.score import atlas, ranking, results
from leaderboard.seal import predictor_index
from leaderboard_core import paths
from leaderboard_core.contract import PredictorCard
from leaderboard_core.report_tables import PhaseMapes
from predictors import registry
from predictors.base import Predictor
from predictors.rf import VidurRandomForest

VERSIONS = {"a100_vidur": "va100", "h100_vidur": "vh100", "h200_vidur": "vh200"}
SKUS = {"a100_vidur": "a100_sxm", "h100_vidur": "h100_sxm", "h200_vidur": "h200_sxm"}


class TinyPredictor(Predictor):
    card = PredictorCard("analytical", "test", "throwaway", False)

    def __init__(self, scale: float = 1.0):
        self.scale = scale


def cells(n: int = 40, seed: int = 0, bias: float = 0.1) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    num_requests = rng.integers(1, 64, n)
    num_decode = np.where(np.arange(n) % 2 == 0, num_requests, 0)
    gt = rng.uniform(1, 10, n)
    pred = gt * (1 + bias + rng.normal(0, 0.05, n))
    return pl.DataFrame({
        "cell_id": [f"c{i}" for i in range(n)], "workload_id": [f"w{i}" for i in range(n)],
        "model": "m", "tp": 1, "phase": np.where(num_decode > 0, "decode", "prefill"),
        "num_requests": num_requests, "num_decode": num_decode,
        "total_tokens": np.where(num_decode > 0, num_requests, num_requests * 512),
        "decode_ctx_sum": num_decode * 300, "gt_kind": "gpu_block", "gt_ms": gt, "pred_ms": pred,
        "signed_pct": (pred - gt) / gt * 100})


def write_run(runs_dir, run_id: str, dataset: str = "h100_vidur", predictor: str = "tiny",
              created_at: str = "2026-01-01T00:00:00+00:00", folder_name: str | None = None,
              predictions: pl.DataFrame | None = None, **overrides):
    predictions = cells() if predictions is None else predictions
    home = "a100_vidur"
    metrics = {
        "run_id": run_id, "predictor": predictor, "params": {"scale": 1.0},
        "card": {"kind": "analytical", "reference": "test", "trained_on": "a100_sxm",
                 "needs_profiled_rows": False},
        "dataset": dataset, "sku": SKUS[dataset], "home_dataset": home, "home_sku": "a100_sxm",
        "split": "home_heldout" if dataset == home else "unseen", "split_seed": 0,
        "test_fraction": 0.3, "dataset_version": VERSIONS[dataset],
        "home_dataset_version": VERSIONS[home], "code_version": "abc",
        "code_hash": predictor_index.code_hash_of(predictor),
        "valid": True, "invalid_reasons": [], "fit_seconds": 0.01, "profiled_rows": 0,
        "deploy_rows": 0, "predict_cells_per_s": 1e5, "sandbox": "namespaces+landlock",
        "sealed": True,
        "spec_hash": results.spec_hashes()[SKUS[dataset]],
        "phases": {"all": {"n": len(predictions), "mape": 10.0}}, "created_at": created_at,
        "home_datasets": [home], "home_points": "full_grid", "home_points_used": "full_grid",
        **overrides}
    unsealed = [] if metrics["sealed"] else [f"unsealed: sandbox {metrics['sandbox']}"]
    metrics.setdefault("unrankable_because", unsealed)
    metrics.setdefault("rankable", not metrics["unrankable_because"])
    folder = runs_dir / (folder_name or run_id)
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1))
    predictions.with_columns(run_id=pl.lit(run_id)).write_parquet(folder / "predictions.parquet")
    return folder


def current_ids(runs_dir) -> set[str]:
    return set(results.current(results.load_runs(runs_dir), VERSIONS).pl()["run_id"])


def test_stale_runs_drop_out_and_the_latest_run_counts(tmp_path):
    write_run(tmp_path, "old", created_at="2026-01-01T00:00:00+00:00")
    write_run(tmp_path, "new", created_at="2026-01-02T00:00:00+00:00")
    write_run(tmp_path, "other-code", code_hash="0000000000000000",
              created_at="2026-01-03T00:00:00+00:00")
    write_run(tmp_path, "other-spec", spec_hash="0000000000000000",  # e.g. a GPU spec override
              created_at="2026-01-03T00:00:00+00:00")
    write_run(tmp_path, "other-target", dataset_version="stale",
              created_at="2026-01-03T00:00:00+00:00")
    write_run(tmp_path, "other-home", home_dataset_version="stale",
              created_at="2026-01-03T00:00:00+00:00")
    write_run(tmp_path, "other-params", params={"scale": 2.0})
    assert results.load_runs(tmp_path).shape[0] == 7
    assert current_ids(tmp_path) == {"new", "other-params"}


def test_partial_and_incomplete_folders_are_ignored(tmp_path):
    write_run(tmp_path, "done")
    write_run(tmp_path, "interrupted", folder_name=".interrupted.partial",
              created_at="2026-02-01T00:00:00+00:00")
    (write_run(tmp_path, "no-predictions", dataset="h200_vidur") / "predictions.parquet").unlink()
    assert [p.name for p in results.complete_run_folders(tmp_path)] == ["done"]
    assert current_ids(tmp_path) == {"done"}
    assert results.load_runs(tmp_path / "missing").shape[0] == 0


def test_ranking_counts_ties_measured_ties_and_home_pairs():
    rows = [  # (workload, sku, split, measured, predicted)
        ("w1", "a", "home_heldout", 10.0, 1.0), ("w1", "b", "unseen", 20.0, 1.005),  # a~b tie
        ("w1", "c", "unseen", 30.0, 3.0),  # a<c and b<c correct
        ("w2", "a", "home_heldout", 10.0, 3.0), ("w2", "b", "unseen", 20.0, 2.0),  # a-b wrong
        ("w2", "c", "unseen", 20.1, 1.0),  # a-c wrong, b-c measured within 1%: left out
    ]
    frame = pl.DataFrame(rows, schema=["workload_id", "sku", "split", "gt_ms", "pred_ms"],
                         orient="row").with_columns(predictor=pl.lit("p"))
    row = ranking.ranking_table(ranking.sku_pairs(frame)).row(0, named=True)
    assert (row["correct"], row["wrong"], row["ties"], row["measured_ties"]) == (2, 2, 1, 1)
    assert row["pairs"] == 5 and row["home_pairs"] == 4
    assert row["decisive_accuracy"] == pytest.approx(0.5)
    assert row["tie_aware_accuracy"] == pytest.approx(0.4)
    assert row["most_tied_pair"] == "a/b: 1"
    # At 0.1% neither near-equality (0.5% apart) is equal any more.
    loose = ranking.ranking_table(ranking.sku_pairs(frame, tolerance=0.001)).row(0, named=True)
    assert loose["ties"] == 0 and loose["measured_ties"] == 0
    blind = frame.with_columns(pred_ms=pl.lit(1.0))  # the same time on every GPU: all ties
    row = ranking.ranking_table(ranking.sku_pairs(blind)).row(0, named=True)
    assert row["ties"] == 5 and row["decisive_accuracy"] is None and row["tie_aware_accuracy"] == 0


def test_bootstrap_places_share_a_rank_when_intervals_overlap():
    rng = np.random.default_rng(1)
    workloads = [f"w{i}" for i in range(200)]
    noise = rng.normal(0, 3, len(workloads))
    frames = [pl.DataFrame({"predictor": name, "workload_id": workloads,
                            "signed_pct": center + noise + rng.normal(0, 1, len(workloads))})
              for name, center in (("close_a", 10.0), ("close_b", 10.2), ("far", 40.0))]
    places = ranking.bootstrap_places(pl.concat(frames), samples=300)
    place = dict(places.select("predictor", "place").iter_rows())
    assert place == {"close_a": 1, "close_b": 1, "far": 3}
    far = places.filter(pl.col("predictor") == "far").row(0, named=True)
    assert far["ci_low"] < far["mape"] < far["ci_high"]
    again = ranking.bootstrap_places(pl.concat(frames), samples=300)
    assert again.equals(places)  # seeded


def test_atlas_buckets_cover_every_scored_cell():
    predictions = cells(200).with_columns(predictor=pl.lit("p"), dataset=pl.lit("h100_vidur"),
                                          sku=pl.lit("h100_sxm"), split=pl.lit("unseen"))
    predictions = predictions.with_columns(  # an INVALID run's missing predictions are not placed
        signed_pct=pl.when(pl.int_range(pl.len()) < 5).then(None).otherwise("signed_pct"))
    table = atlas.batch_context_table(predictions)
    assert table["n"].sum() == 195
    by_phase = dict(table.group_by("phase").agg(pl.col("n").sum()).iter_rows())
    assert by_phase == dict(predictions.drop_nulls("signed_pct").group_by("phase").len().iter_rows())
    one = predictions.filter(pl.col("num_requests").is_in([3, 4]) & (pl.col("num_decode") > 0))
    buckets = atlas.batch_context_table(one)["batch_bucket"].to_list()
    assert set(buckets) <= {1, 2} and atlas.bucket_label(1) == "2-3"
    assert atlas.op_family("gemm_qkv") == atlas.op_family("k_proj") == "gemm"
    assert atlas.op_family("input_layernorm") == "light kernels"


def test_report_renders_every_section(tmp_path, monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "tiny", TinyPredictor)
    monkeypatch.setitem(registry._REGISTRY, "rf_verbatim", VidurRandomForest)
    monkeypatch.setattr(registry, "discover", lambda: None)
    runs = tmp_path / "runs"
    for i, dataset in enumerate(VERSIONS):
        write_run(runs, f"r{i}", dataset=dataset, predictions=cells(seed=i))
    write_run(runs, "old", dataset="h100_vidur", code_hash="0000000000000000")
    two_homes = {"home_datasets": ["a100_vidur", "h100_vidur"]}
    for i, dataset in enumerate(VERSIONS):  # the two-home protocol: h100 is a home, never unseen
        write_run(runs, f"two{i}", dataset=dataset, predictions=cells(seed=i), **two_homes,
                  split="unseen" if dataset == "h200_vidur" else "home_heldout",
                  phases={"all": {"n": 40, "mape": 7.5 + i}})
    write_run(runs, "grid", dataset="a100_vidur", predictor="rf_verbatim",
              params=VidurRandomForest.default_params(),
              phases={"all": {"n": 40, "mape": 4.25}})
    write_run(runs, "cells", dataset="a100_vidur", predictor="rf_verbatim", home_points="behind_cells",
              params=VidurRandomForest.default_params(),
              phases={"all": {"n": 40, "mape": 9.75}})
    monkeypatch.setitem(registry._REGISTRY, "peeker", TinyPredictor)
    write_run(runs, "unsealed", dataset="h200_vidur", predictor="peeker", sandbox="process",
              sealed=False, predictions=cells(seed=9), phases={"all": {"n": 40, "mape": 0.0}})
    monkeypatch.setattr(atlas, "dominant_op_families", lambda datasets: pl.DataFrame(
        {"dataset": "h100_vidur", "cell_id": [f"c{i}" for i in range(40)], "op_family": "gemm"}))
    out = tmp_path / "RESULTS.md"
    block = report.render(runs, out, tmp_path / "atlas", versions=VERSIONS,
                          datasets=sorted(VERSIONS))  # no store needed
    for section in ("## Leaderboard", "### vidur: all", "## SKU ranking", "### Places",
                    "## Error atlases", "## Performance", "## Provenance"):
        assert section in block
    assert "![error atlas of tiny](atlas/tiny.png)" in block
    assert (tmp_path / "atlas" / "tiny.png").stat().st_size > 1000
    assert "1 dropped as stale" in block
    # an unsealed run is listed apart, and in no other table
    unsealed = block[block.index("## Runs not ranked"):block.index("## Provenance")]
    assert "| peeker | h200_vidur | VALID | 0.0 | unsealed: sandbox process |" in unsealed
    assert "peeker" not in block.replace(unsealed, "")
    assert "| tiny | 10.0 | 10.0 | 10.0 | 10.0 |" in block  # the one-home table: no two-home run
    two = block[block.index("## Two homes"):block.index("## Baselines at their published")]
    assert ("| predictor | a100_vidur (home, n=40) | h100_vidur (home, n=40) | h200_vidur (n=40) "
            "| GPU-mean MAPE % |") in two
    assert "| tiny | 7.5 | 8.5 | 9.5 | 9.5 |" in two
    strength = block[block.index("## Baselines at their published"):]
    # the default (full_grid) run stands for rf_verbatim; the behind_cells variant does not
    assert "| rf_verbatim | 4.25 | full_grid |" in strength and "9.75" not in block
    kept = "# Results\n\nintro\n\n" + "## Store build\n\nkept\n"
    first = report.splice(kept, block)
    assert first.index(report.BEGIN) < first.index("## Store build") and "kept" in first
    assert report.splice(first, f"{report.BEGIN}\nnew\n{report.END}").count(report.BEGIN) == 1


def test_leaderboard_shows_target_rows_and_sandbox(tmp_path, monkeypatch):
    """A reading predictor is never mixed up with a zero-reading one: each row carries the most
    target rows its runs read and the sandboxes they ran in."""
    monkeypatch.setitem(registry._REGISTRY, "tiny", TinyPredictor)
    monkeypatch.setitem(registry._REGISTRY, "reader", TinyPredictor)
    runs = tmp_path / "runs"
    for i, dataset in enumerate(VERSIONS):
        write_run(runs, f"t{i}", dataset=dataset, predictions=cells(seed=i))
        write_run(runs, f"r{i}", dataset=dataset, predictor="reader", predictions=cells(seed=i),
                  profiled_rows=[0, 16, 9][i], sandbox=["namespaces+landlock", "namespaces",
                                                        "namespaces+landlock"][i])
    current = results.current(results.load_runs(runs), VERSIONS).pl()
    board = report_leaderboard
    lines = board.main_leaderboard(board.leaderboard_runs(current, sorted(VERSIONS)))
    header = next(line for line in lines if line.startswith("| predictor"))
    assert header.endswith("| GPU-mean MAPE % | target rows | sandbox |")
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith(("| tiny", "| reader"))}
    assert rows["| tiny"].endswith("| 10.0 | 0 | namespaces+landlock |")
    assert rows["| reader"].endswith("| 10.0 | 16 | namespaces/namespaces+landlock |")


def test_rows_equal_to_the_printed_digit_keep_their_name_order(tmp_path, monkeypatch):
    """Two predictors whose unseen means differ in the fifteenth digit print the same mean and
    must come in name order, render after render, not in the order of that last bit."""
    for name in ("alpha", "zeta"):
        monkeypatch.setitem(registry._REGISTRY, name, TinyPredictor)
    runs = tmp_path / "runs"
    for i, dataset in enumerate(VERSIONS):
        for name, mape in (("alpha", 10.0), ("zeta", 10.0 - 1e-14)):
            write_run(runs, f"{name}{i}", dataset=dataset, predictor=name,
                      phases={"all": {"n": 40, "mape": mape}})
    current = results.current(results.load_runs(runs), VERSIONS).pl()
    board = report_leaderboard.leaderboard_runs(current, sorted(VERSIONS))
    mapes = PhaseMapes(board, ["h100_vidur", "h200_vidur"])
    assert mapes.unseen_mean("zeta", "all") < mapes.unseen_mean("alpha", "all")  # the last bit
    lines = report_leaderboard.main_leaderboard(board)
    order = [line.split(" | ")[0] for line in lines if line.startswith(("| alpha", "| zeta"))]
    assert order[:2] == ["| alpha", "| zeta"]


@pytest.fixture
def two_specs(tmp_path, monkeypatch):
    """Two leaderboard runs expected (tiny on h100 and h200); only the h100 one is written."""
    from leaderboard.run import roster
    from leaderboard.run.evaluate import RunSpec

    monkeypatch.setattr(results, "store_versions", lambda: VERSIONS)
    monkeypatch.setattr(roster, "run_specs", lambda runs_dir: [
        RunSpec(predictor="tiny", dataset=d, params={}, runs_dir=runs_dir)
        for d in ("h100_vidur", "h200_vidur")])
    monkeypatch.setattr(report, "render", lambda runs_dir, out, atlas_dir, merged=None,
                        published_dir=None: (
        f"{report.BEGIN}\n## Headline\nblock {atlas_dir}\n{report.END}"))
    runs = tmp_path / "runs"
    write_run(runs, "h100")
    (tmp_path / "RESULTS.md").write_text("# Results\n\nthe full tables\n")
    return runs


def test_a_partial_report_names_the_missing_runs_and_keeps_results(two_specs, tmp_path, capsys):
    report.main([f"runs_dir={two_specs}", f"report.out={tmp_path / 'RESULTS.md'}"])
    err = capsys.readouterr().err
    assert "1 leaderboard runs missing: tiny on h200_vidur" in err
    assert (tmp_path / "RESULTS.md").read_text() == "# Results\n\nthe full tables\n"
    assert "partial-atlas" in (two_specs / "partial-report.md").read_text()


def test_replace_and_the_old_flags_still_write_results(two_specs, tmp_path, capsys):
    report.main(["--runs-dir", str(two_specs), f"--out={tmp_path / 'RESULTS.md'}",
                 "report.partial=replace"])
    assert "--runs-dir is deprecated" in capsys.readouterr().err
    assert "block" in (tmp_path / "RESULTS.md").read_text()


def test_results_md_states_the_last_full_rerun_in_one_line(two_specs, tmp_path):
    out = tmp_path / "RESULTS.md"
    (two_specs / roster.TIMING_FILE).write_text(json.dumps({"outcomes": [], "full_rerun": {
        "runs": 1624, "seconds": 917, "jobs": 2, "cores": 2}}))
    report.main([f"runs_dir={two_specs}", f"report.out={out}", "report.partial=replace"])
    lines = out.read_text().splitlines()
    assert "Last full rerun: 1624 runs in 917 s on 2 workers (2 cores)." in lines


def test_report_help_lists_its_overrides(capsys):
    with pytest.raises(SystemExit):
        report.main(["--help"])
    out = capsys.readouterr().out
    assert "report.rerun=true" in out and "partial: keep" in out and "jobs: 2" in out


def test_composed_cells_are_left_out_of_the_ranking_and_the_places():
    """Four workloads on two unseen GPUs; the composed one is predicted in the wrong order and
    10x off, so counting it would show as a wrong pair and two more cells."""
    rows = []
    for w in range(4):
        composed = w == 3
        for dataset, sku, gt in (("h100_vidur", "h100_sxm", 2.0), ("h200_vidur", "h200_sxm", 1.0)):
            pred = (3.0 - gt) * 10 if composed else gt * 1.05
            rows.append({"predictor": "p", "dataset": dataset, "sku": sku, "split": "unseen",
                         "workload_id": f"w{w}", "gt_ms": gt, "pred_ms": pred,
                         "signed_pct": (pred - gt) / gt * 100, "composed": composed})
    runs = pl.DataFrame({"predictor": ["p", "p"], "dataset": ["h100_vidur", "h200_vidur"],
                         "split": ["unseen", "unseen"], "valid": [True, True],
                         "family": ["vidur", "vidur"]})
    text = "\n".join(report.rankings(pl.DataFrame(rows), runs))
    assert "| p | 3 | 3 | 3 | 0 | 0 |" in text  # workloads, pairs, correct, wrong, ties
    (place,) = [line for line in text.splitlines() if line.startswith("| 1 | p |")]
    assert place.endswith("| 6 |") and "| 5.00 |" in place
    # a predictor without a VALID run on every unseen GPU is never placed
    one_invalid = runs.with_columns(valid=pl.Series([True, False]))
    text = "\n".join(report.rankings(pl.DataFrame(rows), one_invalid))
    assert "| 1 | p |" not in text and "sealed VALID run on every unseen GPU): p." in text


def test_the_seal_cost_section_shows_each_run_and_the_target(tmp_path):
    from leaderboard.present import sections

    bench = {"repeats": 3, "target_ratio": 1.3, "code_version": "abc", "date": "2026-12-01",
             "results": [{"predictor": "ours", "dataset": "h100_vidur", "walled_s": 2.6,
                          "walled_sandbox": "namespaces+landlock", "bare_s": 1.9,
                          "bare_sandbox": "landlock", "ratio": 2.6 / 1.9, "met": False}]}
    path = tmp_path / "seal.json"
    path.write_text(json.dumps(bench))
    text = "\n".join(sections.seal_overhead(path))
    assert "| ours | h100_vidur | 2.60 | namespaces+landlock | 1.90 | landlock | 1.37 | **NO** |" in text
    assert "target walled / bare ≤ 1.3" in text
    assert "No benchmark result" in "\n".join(sections.seal_overhead(tmp_path / "none"))


def test_headline_is_the_gpu_mean_of_each_kind_recomputed_by_hand(tmp_path, monkeypatch):
    """The headline's number is the mean over the unseen GPUs of each GPU's MAPE (recomputed
    here from the predictions written), its CI brackets it, and each kind gets its own best."""
    for name in ("tiny", "reader", "profiled"):
        monkeypatch.setitem(registry._REGISTRY, name, TinyPredictor)
    runs = tmp_path / "runs"
    frames = {}
    for i, dataset in enumerate(VERSIONS):
        frames[dataset] = cells(seed=i, bias=0.1 + 0.05 * i)
        write_run(runs, f"t{i}", dataset=dataset, predictions=frames[dataset])
        write_run(runs, f"r{i}", dataset=dataset, predictor="reader", profiled_rows=3,
                  predictions=cells(seed=i, bias=0.02))
        write_run(runs, f"p{i}", dataset=dataset, predictor="profiled",
                  card={"kind": "profiled", "reference": "t", "needs_profiled_rows": True},
                  predictions=cells(seed=i, bias=0.3))
    current = report_leaderboard.leaderboard_runs(results.current(results.load_runs(runs), VERSIONS).pl(),
                                      sorted(VERSIONS))
    lines = report_headline.headline(current, results.load_predictions(current))
    unseen = [d for d in VERSIONS if d != "a100_vidur"]
    by_hand = np.mean([frames[d]["signed_pct"].abs().mean() for d in unseen])
    row = next(line for line in lines if "| datasheet only |" in line)
    cols = [c.strip() for c in row.strip("|").split("|")]
    assert cols[:4] == ["vidur", "datasheet only", "tiny", f"{by_hand:.1f}"]
    low, high = map(float, cols[4].split(" – "))
    assert low <= by_hand <= high and cols[5] == str(len(unseen))
    assert "| vidur | with a deploy reading | reader |" in "\n".join(lines)
    assert "| vidur | profiled on the home | profiled |" in "\n".join(lines)


def test_a_not_supported_run_shows_as_such(tmp_path, monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "tiny", TinyPredictor)
    monkeypatch.setitem(registry._REGISTRY, "bf16_only", TinyPredictor)
    runs = tmp_path / "runs"
    for i, dataset in enumerate(VERSIONS):
        write_run(runs, f"t{i}", dataset=dataset, predictions=cells(seed=i))
    current = results.current(results.load_runs(runs), VERSIONS).pl()
    outcomes = {("bf16_only", d): "not supported: prices bf16 GEMMs only" for d in VERSIONS}
    board = report_leaderboard
    text = "\n".join(board.main_leaderboard(board.leaderboard_runs(current, sorted(VERSIONS)),
                                            outcomes))
    assert "| bf16_only | n/s | n/s | n/s | — |" in text
    assert "- bf16_only on h200_vidur: prices bf16 GEMMs only" in text


def test_the_serving_oracle_is_kept_out_of_the_leaderboard_and_found_by_the_report(tmp_path,
                                                                                   monkeypatch):
    """A serving run fitted on its own GPU is the oracle: never a leaderboard row, always the
    report's oracle row; the rerun's oracle spec (a home named as one string) counts as present."""
    from leaderboard.run import roster
    from leaderboard.run.evaluate import RunSpec

    monkeypatch.setitem(registry._REGISTRY, "tiny", TinyPredictor)
    monkeypatch.setitem(VERSIONS, "h100_silicon", "vsil")
    monkeypatch.setitem(SKUS, "h100_silicon", "h100_sxm")
    versions = dict(VERSIONS)
    serving = cells().with_columns(phase=pl.lit("ttft"))
    write_run(tmp_path, "ranked", dataset="h100_silicon", predictions=serving)
    write_run(tmp_path, "oracle", dataset="h100_silicon", predictions=serving,
              predictor="table_scaled", params={"lm_head": True}, home_points="every_shape",
              home_dataset="h100_vidur", home_sku="h100_sxm",
              home_dataset_version="vh100", home_datasets=["h100_vidur"], split="home_gpu",
              unrankable_because=["home: h100_vidur (default a100_vidur)",
                                  "home_points: every_shape (default full_grid)"])
    current = results.current(results.load_runs(tmp_path), versions).pl()
    assert set(current["run_id"]) == {"ranked", "oracle"}
    from leaderboard.present import leaderboard_table as board

    ranked = board.leaderboard_runs(current, ["h100_silicon"])
    assert ranked["run_id"].to_list() == ["ranked"]
    # the same predictor fitted on the target's GPU on the default points (as an FP8 serving set
    # is, on the FP8 family's H100 home) is a ranked run, not the oracle
    write_run(tmp_path, "same-gpu", dataset="h100_silicon", predictions=serving,
              predictor="table_scaled", params={"lm_head": True}, home_dataset="h100_vidur",
              home_sku="h100_sxm", home_dataset_version="vh100", home_datasets=["h100_vidur"],
              split="home_gpu")
    current = results.current(results.load_runs(tmp_path), versions).pl()
    assert set(board.leaderboard_runs(current, ["h100_silicon"])["run_id"]) == {"ranked", "same-gpu"}
    assert board.oracle_runs(current, ["h100_silicon"])["run_id"].to_list() == ["oracle"]
    specs = [RunSpec("tiny", "h100_silicon", {}, runs_dir=tmp_path),
             RunSpec("table_scaled", "h100_silicon", {}, runs_dir=tmp_path, home="h100_vidur",
                     home_points="every_shape"),
             RunSpec("tiny", "h100_silicon", {}, runs_dir=tmp_path, home="h200_vidur")]
    monkeypatch.setattr(roster, "run_specs", lambda runs_dir: specs)
    assert report.missing_runs(tmp_path, versions) == ["tiny on h100_silicon (home h200_vidur)"]


def test_ttft_within_the_oracles_error_of_the_best_is_a_tie():
    from leaderboard.present.serving_section import ttft_ties

    def runs(rows):
        return pl.DataFrame([{"predictor": p, "dataset": d, "valid": True,
                              "phases": json.dumps({"ttft": {"mape": m}})} for p, d, m in rows])

    scored = runs([("a", "h100_silicon", 30.0), ("b", "h100_silicon", 39.9),
                   ("c", "h100_silicon", 41.0), ("a", "rtx4090_serving", 50.0)])
    oracle = runs([("table_scaled", "h100_silicon", 10.0)])
    ties = ttft_ties(scored, oracle)
    # best 30; the oracle misses by 10 points, so 39.9 is inside it and 41.0 is 11 points behind
    assert ties == {("a", "h100_silicon"): "tie", ("b", "h100_silicon"): "tie",
                    ("c", "h100_silicon"): "+11.0"}  # no RTX4090 oracle run here: no verdict


def test_leave_one_gpu_out_runs_are_found_and_tabled(tmp_path, monkeypatch):
    from leaderboard.present import protocols
    from leaderboard.run.homes import leave_one_gpu_out

    rows = {n: {"name": n, "kind": "cells", "sku": SKUS[n]} for n in VERSIONS}
    rows["h100_sxm_ops"] = {"name": "h100_sxm_ops", "kind": "ops", "sku": "h100_sxm"}
    assert leave_one_gpu_out("a100_vidur", rows) == ["h100_vidur", "h200_vidur"]
    from leaderboard.run.homes import homes_of

    assert homes_of("h200_vidur", "logo", rows) == ["a100_vidur", "h100_vidur"]
    monkeypatch.setitem(registry._REGISTRY, "tiny", TinyPredictor)
    for dataset in VERSIONS:
        write_run(tmp_path, f"one-{dataset}", dataset=dataset)
    write_run(tmp_path, "logo-a100", dataset="a100_vidur", home_dataset="h100_vidur",
              home_sku="h100_sxm", home_dataset_version="vh100", split="unseen",
              home_datasets=["h200_vidur", "h100_vidur"],
              phases={"all": {"n": 40, "mape": 12.5}})
    current = results.current(results.load_runs(tmp_path), VERSIONS).pl()
    one_home = report_leaderboard.leaderboard_runs(current, sorted(VERSIONS))
    assert "logo-a100" not in set(one_home["run_id"])  # five (here two) homes: not the one-home table
    left_out = protocols.leave_one_out_runs(current, one_home)
    assert left_out["run_id"].to_list() == ["logo-a100"]
    lines = protocols.leave_one_out_leaderboard(left_out)
    assert any(line.startswith("| tiny | 12.5 |") for line in lines), lines


def test_the_home_out_of_sample_sits_beside_the_default_home_and_off_the_leaderboard(
        tmp_path, monkeypatch):
    """The table sets the held-out-shapes run beside the default run, over all its cells and
    over the held-out configurations' cells only (recomputed here: 30 % on qwen3-8b TP2); a
    run of another seed is not a second row, and a failed run shows its reason."""
    from leaderboard.present import leaderboard_table as report_leaderboard
    from leaderboard.present import protocols

    def predictions(rows):
        return pl.DataFrame([{"cell_id": f"c{i}", "model": m, "tp": tp, "composed": composed,
                              "phase": "decode", "gt_ms": 1.0, "pred_ms": 1 + e / 100,
                              "signed_pct": e} for i, (m, tp, e, composed) in enumerate(rows)])

    monkeypatch.setitem(registry._REGISTRY, "tiny", TinyPredictor)
    monkeypatch.setitem(registry._REGISTRY, "other", TinyPredictor)
    write_run(tmp_path, "default", dataset="a100_vidur", phases={"all": {"n": 3, "mape": 3.0}},
              predictions=predictions([("llama-3-8b", 4, 10.0, False), ("qwen3-8b", 2, 30.0, False),
                                       ("qwen3-8b", 2, 90.0, True)]))
    write_run(tmp_path, "shapes", dataset="a100_vidur", home_points="held_out_shapes",
              home_points_used="held_out_shapes", predictions=predictions([("qwen3-8b", 2, 40, 0)]),
              phases={"all": {"n": 40, "mape": 21.5}, "decode": {"n": 30, "mape": 25.0}})
    write_run(tmp_path, "other-seed", dataset="a100_vidur", home_points="held_out_shapes",
              split_seed=3, predictions=predictions([("qwen3-8b", 2, 40, 0)]))
    write_run(tmp_path, "failed", predictor="other", dataset="a100_vidur",
              home_points="held_out_shapes", valid=False,
              invalid_reasons=["NotSupported: fitted per configuration"])
    write_run(tmp_path, "other-default", predictor="other", dataset="a100_vidur")
    current = results.current(results.load_runs(tmp_path), VERSIONS).pl()
    one_home = report_leaderboard.leaderboard_runs(current, sorted(VERSIONS))
    assert sorted(one_home["run_id"]) == ["default", "other-default"]
    lines = protocols.home_out_of_sample(current, one_home)
    assert "| tiny | 3.0 | 30.0 | 21.5 | — | 25.0 | 40 |" in lines, lines
    assert sum(line.startswith("| tiny |") for line in lines) == 1
    assert any(line.startswith("| other |") and "INVALID: NotSupported: fitted per configuration"
               in line for line in lines), lines
    assert "(here: qwen3-8b TP2)" in " ".join(lines)
    assert protocols.home_out_of_sample(current.filter(pl.col("run_id") == "default"),
                                               one_home) == []


def test_a_run_on_another_home_is_not_a_second_leaderboard_row():
    from leaderboard.run.split import default_split
    from leaderboard.seal import predictor_index

    split, defaults = default_split(), predictor_index.index()["ours"]["defaults"]

    def run(home):
        return {"predictor": "ours", "params": json.dumps(defaults), "split_seed": split["seed"],
                "test_fraction": split["test_fraction"], "dataset": "h200_vidur",
                "home_points": split["home_points"], "home_datasets": [home],
                "home_dataset": home, "sku": "h200_sxm", "home_sku": home.split("_")[0]}

    current = pl.DataFrame([run("a100_vidur"), run("h100_vidur")])
    kept = report_leaderboard.leaderboard_runs(current, ["a100_vidur", "h100_vidur", "h200_vidur"])
    assert kept["home_dataset"].to_list() == ["a100_vidur"]


def test_the_rerun_replaces_a_worker_after_its_runs(tmp_path):
    """The rerun starts a fresh worker after RUNS_PER_WORKER runs, each with Polars on one
    thread (its thread pool kept the memory of every serving run): 12 calls at 2 per worker in 2
    workers are six processes, and each sees one Polars thread. Run in a child with a time
    limit: handing a pool with max_tasks_per_child all its work at once hangs it on Python
    before 3.13 (CPython gh-115634), as the first version of this did."""
    import subprocess
    import sys

    script = tmp_path / "pids.py"
    script.write_text("import os\n"
                      "from leaderboard import rerun\n"
                      "import polars\n"
                      "def pid(_):\n"
                      "    return os.getpid(), (polars.thread_pool_size(),\n"
                      "                         os.environ.get('OPENBLAS_NUM_THREADS'))\n"
                      "if __name__ == '__main__':\n"
                      "    rerun.RUNS_PER_WORKER = 2\n"
                      "    seen = list(rerun.in_workers(pid, list(range(12)), 2))\n"
                      "    print(len(seen), len({p for p, _ in seen}), *{t for _, t in seen},\n"
                      "          os.environ.get('POLARS_MAX_THREADS'),\n"
                      "          os.environ.get('OPENBLAS_NUM_THREADS'))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**{k: v for k, v in os.environ.items()
                                               if k not in ("POLARS_MAX_THREADS",
                                                            "OPENBLAS_NUM_THREADS")},
                                            "PYTHONPATH": str(paths.REPO_ROOT)})
    # six workers, each with one Polars and one BLAS thread; this process's own environment
    # left as it was
    assert done.stdout.split() == ["12", "6", "(1,", "'1')", "None", "None"], done.stderr


def test_a_rerun_redoes_only_stale_or_missing_runs_and_lists_them_dry(two_specs, monkeypatch,
                                                                        capsys):
    """tiny on h100 has a current run, tiny on h200 none: a dry run lists the h200 run only;
    ``rerun.all=true`` lists both; ``predictor=`` filters, an unknown one names the fix."""
    from leaderboard import rerun
    from leaderboard.run.inputs import InputError
    from leaderboard.store import database

    monkeypatch.setattr(database, "ensure", lambda: None)
    monkeypatch.setitem(registry._REGISTRY, "tiny", TinyPredictor)
    assert rerun.main([f"runs_dir={two_specs}", "rerun.dry_run=true"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["tiny on h200_vidur: would run (0.0 s)"]
    assert "1 of 2 runs are stale or missing" in out.err
    # A refusal leaves no run folder: the last rerun's record of it, made with today's code,
    # datasets and specs, keeps it from running again; made when another dataset (here the
    # home) had another version, it runs again.
    from dataclasses import asdict

    from leaderboard.run import roster

    rerun_h200 = ["tiny on h200_vidur: would run (0.0 s)"]

    spec = next(s for s in roster.run_specs(two_specs) if s.dataset == "h200_vidur")
    refusal = rerun.Outcome.of(spec, "not supported: no h200 here", 1.0)
    versions = results.store_versions()
    now = rerun._made_with({"tiny"}, versions)["tiny"]
    for made_with, listed in ((now, []), (rerun._made_with({"tiny"}, {**versions, "a100_vidur":
                                                                       "rebuilt"})["tiny"], rerun_h200)):
        refusal.made_with = made_with
        (two_specs / roster.TIMING_FILE).write_text(json.dumps({"outcomes": [asdict(refusal)]}))
        rerun.main([f"runs_dir={two_specs}", "rerun.dry_run=true"])
        assert capsys.readouterr().out.splitlines() == listed, made_with
    # a refusal of a spec with other homes stands for that spec only
    refusal.made_with, refusal.homes = now, ["h100_vidur"]
    (two_specs / roster.TIMING_FILE).write_text(json.dumps({"outcomes": [asdict(refusal)]}))
    rerun.main([f"runs_dir={two_specs}", "rerun.dry_run=true"])
    assert capsys.readouterr().out.splitlines() == rerun_h200
    (two_specs / roster.TIMING_FILE).unlink()
    rerun.main([f"runs_dir={two_specs}", "rerun.dry_run=true", "rerun.all=true"])
    assert len(capsys.readouterr().out.splitlines()) == 2
    rerun.main([f"runs_dir={two_specs}", "rerun.dry_run=true", "predictor=ours"])
    assert capsys.readouterr().out == ""
    with pytest.raises(InputError, match="unknown predictor 'tinyy'.*pass predictors_path=DIR"):
        rerun.main([f"runs_dir={two_specs}", "rerun.dry_run=true", "predictor=tinyy"])


def test_a_bundle_merges_only_current_rankable_runs_of_its_own_predictors(tmp_path, monkeypatch):
    """Issue 62's journey: an outside predictor's bundle joins the report's tables; a run at
    another dataset version, an unrankable run, a run whose id names another, and a bundle of
    another harness or claiming a predictor of the suite's own are refused, with the reason
    (the second hostile review forged such a bundle and hid an honest llm_viewer run)."""
    from leaderboard.present import bundles
    from leaderboard_core.versioning import harness_hash

    sent = tmp_path / "sent"
    common = {"predictor": "outsider", "code_hash": "c0ffee", "harness_hash": harness_hash()}
    fine = write_run(sent, "fine", dataset="h200_vidur", **common)
    stale = write_run(sent, "stale", dataset="h100_vidur", dataset_version="old", **common)
    raised = write_run(sent, "raised", dataset="a100_vidur", rankable=False,
                       unrankable_because=["reading: caps max_points=99"], **common)
    renamed = write_run(sent, "fine", dataset="h200_vidur", folder_name="renamed", **common)
    claimed = {"outsider": {"card": {}, "code_hash": "c0ffee", "folder": "mine"}}
    bundle = bundles.write([fine, stale, raised, renamed], tmp_path / "b.tar.gz", claimed)
    merged = bundles.merge([bundle], tmp_path / "merged", VERSIONS, {"ours": "real"})
    assert sorted(p.name for p in (tmp_path / "merged").iterdir()) == ["fine"]
    note = merged.notes[0]
    assert note.startswith("merged 1 run(s) of outsider") and "refused 3" in note
    assert "at another dataset version" in note and "not a rankable VALID run (reading" in note
    assert "its metrics.json names run 'fine'" in note
    assert merged.code == {"outsider": "c0ffee"}
    current = results.current(results.load_runs([tmp_path / "none", merged.folder]), VERSIONS,
                              bundled=merged.code).pl()
    assert current["run_id"].to_list() == ["fine"]
    ours = bundles.write([write_run(tmp_path / "o", "o1", dataset="h200_vidur", predictor="ours",
                                    harness_hash=harness_hash())], tmp_path / "o.tar.gz",
                         {"ours": {"code_hash": "x"}})
    assert "claims the suite's own predictor(s) ['ours']" in bundles.merge(
        [ours], tmp_path / "m3", VERSIONS, {"ours": "real"}).notes[0]
    refused = bundles.merge([bundle], tmp_path / "merged2", VERSIONS, {},
                            verify=lambda files, runs: "all-phase MAPE 57 on rerun, 0.5 here")
    assert refused.notes[0].endswith("do not reproduce (all-phase MAPE 57 on rerun, 0.5 here)")
    monkeypatch.setattr(bundles, "harness_hash", lambda: "another")
    refused = bundles.merge([bundle], tmp_path / "merged4", VERSIONS, {})
    assert refused.notes[0].startswith(f"refused {bundle}: made by harness")


def test_a_bundle_carries_its_predictors_code_for_the_maintainer_to_rerun(tmp_path):
    import tarfile

    from leaderboard.present import bundles

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "mine.py").write_text("import helper\n")
    (folder / "helper.py").write_text("X = 1\n")
    run = write_run(tmp_path / "runs", "r1", predictor="mine")
    out = bundles.write([run], tmp_path / "b.tar.gz", {"mine": {"code_hash": "x"}},
                        [folder / "mine.py", folder / "helper.py"], folder)
    with tarfile.open(out) as tar:
        names = sorted(tar.getnames())
    assert names == ["bundle.json", "code/helper.py", "code/mine.py",
                     "runs/r1/metrics.json", "runs/r1/predictions.parquet"]


def test_only_the_suites_own_predictors_add_sections(monkeypatch):
    """A predictors_path module's report_sections hook could print a table that reads as the
    leaderboard's: only sections headed with a built-in predictor's name are kept."""
    from leaderboard.present import sections
    from leaderboard.seal import predictor_index

    monkeypatch.setattr(predictor_index, "report_sections", lambda runs: [
        "## ours: the ladder", "| ours | 1 |", "## Leaderboard: MAPE % per phase (vidur)",
        "| hooky | 0.4 |", "## hooky: mine", "x", "## ours", "y"])
    monkeypatch.setattr(predictor_index, "index", lambda: {
        "ours": {"module": "predictors.ours"}, "hooky": {"module": "hooky"}})
    monkeypatch.setattr(predictor_index, "folder_of", lambda module: "/x" if module == "hooky"
                        else None)
    assert sections.predictor_sections(pl.DataFrame()) == [
        "## ours: the ladder", "| ours | 1 |", "## ours", "y"]


def test_the_rerun_record_keeps_the_specs_not_redone_and_replaces_the_rest(tmp_path):
    """One entry per spec (homes and home points part of it): a redone spec's entry is
    replaced, another home's entry of the same predictor and dataset kept, an entry of a record
    older than homes (which names no spec) dropped."""
    from dataclasses import asdict

    from leaderboard import rerun
    from leaderboard.run import roster

    mine = rerun.Outcome("p", "d", "valid", 1.0, None, "full_grid")
    other_home = rerun.Outcome("p", "d", "valid", 2.0, ["h"], "full_grid")
    legacy = {"predictor": "p", "dataset": "d", "status": "valid", "seconds": 3.0}
    (tmp_path / roster.TIMING_FILE).write_text(json.dumps(
        {"outcomes": [asdict(mine), asdict(other_home), legacy]}))
    rerun._record(tmp_path, [rerun.Outcome("p", "d", "invalid", 4.0, None, "full_grid")], 4.0,
                  2, False)
    kept = json.loads((tmp_path / roster.TIMING_FILE).read_text())["outcomes"]
    assert sorted((o["seconds"], o["homes"], o["status"]) for o in kept) == [
        (2.0, ["h"], "valid"), (4.0, None, "invalid")]
