"""Work a rerun does once and reuses: a closed loop's plan (parent side) and a predictor's fit
(inside its sealed child). Reuse must never change a number."""

from __future__ import annotations

import json
import os
import pickle
import struct
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from leaderboard.run.evaluate import RunSpec, run
from leaderboard.seal import job
from leaderboard.serving import plan_store
from leaderboard.serving.replay import closed_loop
from leaderboard.serving.scheduler import Policy
from leaderboard_core import paths
from leaderboard_core.versioning import harness_hash


def _steps(prefill_ms: float):
    def timer(cells: pl.DataFrame) -> np.ndarray:
        decode = (cells["num_decode"] == cells["num_requests"]).to_numpy()
        return np.where(decode, 1.0, prefill_ms)
    return timer


def test_a_kept_closed_loop_plan_prices_each_predictor_as_a_fresh_schedule_would():
    policy = Policy("chunked_mixed", token_budget=8, max_seqs=16, kv_tokens=1000)
    loop = lambda timer: closed_loop(policy, 10, 3, 2, 6, "llama-3.1-8b", 1, timer,  # noqa: E731
                                     idle_burst="first_alone")
    first = loop(_steps(10.0))
    kept = [p for p in (paths.home() / "replay-plans" / harness_hash()).iterdir()
            if not p.name.startswith(".")]
    assert len(kept) == 1 and kept[0].suffix == ".plan"
    assert {"inverse", "arrival_step"} <= set(plan_store._read(kept[0]))
    again, slower = loop(_steps(10.0)), loop(_steps(20.0))  # both read the kept plan
    assert [p for p in (paths.home() / "replay-plans" / harness_hash()).iterdir()
            if not p.name.startswith(".")] == kept
    for a, b in ((first.ttft, again.ttft), (first.tpot, again.tpot),
                 (first.arrival, again.arrival)):
        np.testing.assert_array_equal(a, b)
    # Two clients, 10-token prompts, budget 8: by hand, request 0 takes its first 8 prompt
    # tokens alone (first_alone), then its last 2 with request 1's first 6 (first token at
    # 20 ms), then request 1's last 4 with request 0's first decode (30 ms): TTFT 20 and 30.
    np.testing.assert_allclose(first.ttft[:2], [20.0, 30.0])
    # the plan holds steps, not times: a predictor twice as slow on prompts waits twice as long
    np.testing.assert_allclose(slower.ttft[:2], [40.0, 60.0])


class _Counted:
    fits = 0

    def __init__(self, payload: int = 8):
        self.payload = payload

    def fit(self, home):
        type(self).fits += 1
        self.weights_ = np.arange(self.payload, dtype=np.float64)
        return self


def test_a_damaged_kept_plan_is_scheduled_again_and_replaced():
    """A kept plan cut short (a disk fault, a writer killed outside the rename) or grown is
    not read: the plan is made again, and the whole one takes the damaged one's place."""
    made = []

    def make():
        made.append(1)
        return {"a": np.arange(3), "b": np.ones(2)}

    _, first = plan_store.kept(["k"], make)
    (kept,) = [p for p in plan_store._folder().iterdir() if not p.name.startswith(".")]
    whole = kept.read_bytes()
    hostile = [[["a", "<i8", [-1]], ["b", "<f8", [2]]], [["a", "|O", [3]], ["b", "<f8", [2]]],
               [["a", "<i8", [2**70]], ["b", "<f8", [2]]], [["a", "<i8", []], ["b", "<f8", [2]]],
               "[" * 100_000]
    headers = [json.dumps(h).encode() if not isinstance(h, str) else h.encode() for h in hostile]
    for damaged in (whole[:-8], whole + b"\0" * 64, b"{not a header",
                    *(struct.pack("<Q", len(h)) + h + whole[8 + len(h):] for h in headers)):
        kept.write_bytes(damaged)
        _, again = plan_store.kept(["k"], make)
        assert set(again) == {"a", "b"} and kept.read_bytes() == whole
    assert len(made) == 4 + len(hostile)
    _, read_back = plan_store.kept(["k"], make)
    assert len(made) == 4 + len(hostile)  # the replaced plan is whole: read, not made
    for name in first:
        np.testing.assert_array_equal(read_back[name], first[name])
        assert read_back[name].dtype == first[name].dtype


def test_a_kept_plan_reads_back_every_dtype_and_shape_and_empty_arrays():
    arrays = {"ints": np.arange(7, dtype=np.int64), "floats": np.linspace(0, 1, 5),
              "small": np.arange(6, dtype=np.int32).reshape(2, 3), "none": np.zeros(0, np.int64)}
    plan_store.kept(["shapes"], lambda: arrays)
    _, read = plan_store.kept(["shapes"], lambda: pytest.fail("a kept plan was made again"))
    for name, array in arrays.items():
        assert read[name].dtype == array.dtype and read[name].shape == array.shape
        np.testing.assert_array_equal(read[name], array)
    made = []
    for odd in ({"o": np.array([object()])}, {"scalar": np.array(3)}):  # not kept, still given
        assert plan_store.kept(["odd", str(odd)], lambda odd=odd: made.append(1) or odd)[1] is odd
        plan_store.kept(["odd", str(odd)], lambda odd=odd: made.append(1) or odd)
    assert len(made) == 4 and not [p for p in plan_store._folder().iterdir()
                                   if p.name.startswith(".")]


def test_a_fit_is_kept_once_and_read_back_and_a_large_one_is_not_kept(tmp_path, monkeypatch):
    kept, facts = tmp_path / "fitted-abc.pickle", {"invalid_reasons": []}
    first = job._fitted(_Counted(), None, kept, facts)
    assert _Counted.fits == 1 and kept.is_file() and "fit_reused" not in facts
    again = job._fitted(_Counted(), None, kept, facts := {"invalid_reasons": []})
    assert _Counted.fits == 1 and facts["fit_reused"] is True
    np.testing.assert_array_equal(first.weights_, again.weights_)
    with kept.open("rb") as f:
        assert pickle.load(f)["fit_seconds"] == facts["fit_seconds"]
    monkeypatch.setattr(job, "MAX_KEPT_FIT", 1 << 10)
    big = tmp_path / "fitted-big.pickle"
    job._fitted(_Counted(payload=4096), None, big, {"invalid_reasons": []})
    assert not big.exists() and big.with_suffix(".too-large").exists()
    assert not list(tmp_path.glob(".*partial"))
    assert not kept.exists()  # a new fit's keep replaces the older code's


@pytest.mark.slow
def test_a_fit_reused_on_another_target_of_the_home_scores_as_a_cold_fit(store_home, tmp_path):
    def one(dataset: str) -> dict:
        return run(RunSpec("genz_calibrated", dataset, {}, runs_dir=tmp_path / "runs")).metrics

    assert one("l40s_vidur")["fit_reused"] is False
    warm = one("h100_vidur")
    assert warm["fit_reused"] is True
    for cache in (Path(store_home.home) / "predictor-cache").glob("genz_calibrated-*"):
        for kept in cache.glob("fitted-*"):
            kept.unlink()
    cold = one("h100_vidur")
    assert cold["fit_reused"] is False and cold["phases"] == warm["phases"]


def test_a_predictor_cache_unused_for_two_weeks_goes_and_one_in_use_stays(tmp_path, monkeypatch):
    from leaderboard.seal import sandbox

    monkeypatch.setenv("LEADERBOARD_HOME", str(tmp_path / "home"))
    root = paths.home() / "predictor-cache"
    old, recent = root / "rf-old", root / "rf-recent"
    for folder, days in ((old, sandbox.UNUSED_CACHE_DAYS + 1), (recent, 1)):
        (folder / "forest").mkdir(parents=True)
        when = time.time() - days * 86400
        os.utime(folder, (when, when))
    home = tmp_path / "bundle"
    home.mkdir()
    (home / "cells.arrow").write_bytes(b"rows")
    in_use = sandbox.predictor_cache("rf", {}, home)
    assert not old.exists() and recent.is_dir() and in_use.is_dir()
    assert time.time() - in_use.stat().st_mtime < 60


def test_kept_cells_are_those_of_a_fresh_schedule_per_deployment_and_the_oldest_go():
    from leaderboard.serving import replay

    policy = Policy("chunked_mixed", token_budget=8, max_seqs=16, kv_tokens=1000)
    loads = [(isl, 3, 2, 6, "lockstep", "first_alone") for isl in (10, 12, 14)]
    kept = [replay.closed_loop_plan(policy, *load[:4], load[4], idle_burst=load[5])[0]
            for load in loads]
    kept = [replay.closed_loop_plan(policy, *load[:4], load[4], idle_burst=load[5])[0]
            for load in loads]  # now read back from their files
    fresh = [replay.Plan.from_arrays(replay._closed_loop_plan(policy, *load)) for load in loads]
    assert all(p.key for p in kept) and not any(p.key for p in fresh)
    for plan, scheduled in zip(kept, fresh, strict=True):
        for deployment in (("llama-3.1-8b", 1, "bf16"), ("qwen3-8b", 2, "bf16"),
                           ("llama-3.1-8b", 1, "fp8")):
            assert plan.cells(*deployment).equals(scheduled.cells(*deployment))
    assert len(replay._kept_cells.frames) == 9  # one per plan and deployment
    # a kept frame holds copies, never the plan file's mapping
    frame = kept[0].cells("llama-3.1-8b", 1, "bf16")
    assert not np.shares_memory(frame["q_lens"].explode().to_numpy(), kept[0].shapes["q"])

    deployment = ("llama-3.1-8b", 1, "bf16")
    sizes = [int(p.cells(*deployment).estimated_size()) for p in kept]
    bounded = replay._KeptCells(limit=sum(sizes[1:]))
    for plan in kept:
        bounded.get((plan.key, *deployment), lambda plan=plan: plan.cells(*deployment))
    assert [k[0] for k in bounded.frames] == [p.key for p in kept[1:]]  # the oldest went
    again = bounded.get((kept[2].key, *deployment), lambda: pytest.fail("laid out again"))
    assert again.equals(fresh[2].cells(*deployment))


def test_plans_of_older_harness_code_and_stray_files_are_removed(monkeypatch):
    """Making a plan removes every folder of other harness code and any stray file beside them
    (renamed out of reach first, then deleted), and keeps its own."""
    plan_store.kept(["first"], lambda: {"a": np.arange(2)})
    root = plan_store._folder().parent
    (root / "0123456789abcdef").mkdir()
    (root / "0123456789abcdef" / "x.plan").write_bytes(b"old")
    (root / "stray.txt").write_text("left by hand")
    plan_store.kept(["second"], lambda: {"a": np.arange(3)})
    assert [p.name for p in root.iterdir()] == [plan_store._folder().name]
    assert len(list(plan_store._folder().glob("*.plan"))) == 2
