"""Closed loops priced together: the same step times as each loop priced alone, in a few calls
of the predictor's timer instead of one per loop."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from leaderboard.serving import batched
from leaderboard.serving.batched import SwitchedTimer, price_together
from leaderboard.serving.replay import closed_loop, closed_loop_plan, closed_loop_timeline, step_cells
from leaderboard.serving.scheduler import Policy
from leaderboard.serving.simulate import with_expert_placement, with_kv_cache


def _row_timer(calls: list[pl.DataFrame]):
    """A row-wise step time (tokens and cached context, and the columns a wrapper adds),
    remembering every frame it is asked for."""
    def timer(cells: pl.DataFrame) -> np.ndarray:
        calls.append(cells)
        ep = cells["moe_ep"].fill_null(1).to_numpy() if "moe_ep" in cells.columns else 1
        kv = (cells["kv_dtype"] == "fp8").to_numpy() if "kv_dtype" in cells.columns else 0
        return (1.0 + 0.01 * cells["total_tokens"].to_numpy() + 1e-4 * cells[
            "decode_ctx_sum"].to_numpy()) / ep + 0.5 * kv
    return timer


def _loops():
    policy = Policy("chunked_mixed", token_budget=16, max_seqs=8, kv_tokens=4000)
    return [closed_loop_plan(policy, isl, 4, c, 3 * c, start, idle_burst="first_alone")
            for isl, c in ((10, 2), (30, 4)) for start in ("lockstep", "staggered")]


def test_loops_priced_together_time_every_step_as_alone_in_one_call():
    alone_calls, together_calls = [], []
    alone, switched = _row_timer(alone_calls), SwitchedTimer(_row_timer(together_calls))
    # each loop its own wrapper, as each target's engine has: a placement, a KV dtype, host
    # time added to the step (older engines) and host time overlapped with it
    def host_added(timer):
        return lambda cells: timer(cells) + 0.25 * cells["num_requests"].to_numpy()

    def host_overlapped(timer):
        return lambda cells: np.maximum(timer(cells), 0.25 * cells["num_requests"].to_numpy())

    wrappers = [host_added(switched), with_expert_placement(switched, 2),
                with_kv_cache(switched, "fp8"), host_overlapped(switched)]
    wrapped_alone = [host_added(alone), with_expert_placement(alone, 2),
                     with_kv_cache(alone, "fp8"), host_overlapped(alone)]
    jobs = [(w, step_cells(plan.shapes, "llama-3.1-8b", 1)) for w, (plan, _) in
            zip(wrappers, _loops(), strict=True)]
    together = price_together(switched, jobs)
    expected = [w(cells) for w, (_, cells) in zip(wrapped_alone, jobs, strict=True)]
    for got, want in zip(together, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    # one call per schema of the wrapped steps, fewer than one per loop; cell ids unique
    schemas = {tuple(c.schema.items()) for c in together_calls}
    assert len(together_calls) == len(schemas) < len(alone_calls) == 4
    assert all(c["cell_id"].n_unique() == len(c) for c in together_calls)
    asked = len(together_calls)
    switched(jobs[0][1])  # the raw timer again afterwards
    assert len(together_calls) == asked + 1


def test_the_entry_bound_splits_a_batch_and_keeps_the_order(monkeypatch):
    calls = []
    switched = SwitchedTimer(_row_timer(calls))
    jobs = [(switched, step_cells(plan.shapes, "llama-3.1-8b", 1)) for plan, _ in _loops()]
    largest = max(int(cells["num_requests"].sum()) for _, cells in jobs)
    monkeypatch.setattr(batched, "MAX_ENTRIES_PER_CALL", largest)
    together = price_together(switched, jobs)
    assert 1 < len(calls) <= len(jobs)
    for got, (_, cells) in zip(together, jobs, strict=True):
        np.testing.assert_array_equal(got, _row_timer([])(cells))


def test_a_timeline_from_batched_times_equals_the_closed_loop_alone():
    timer = _row_timer([])
    policy = Policy("chunked_mixed", token_budget=16, max_seqs=8, kv_tokens=4000)
    for start in ("lockstep", "staggered"):
        plan, arrival = closed_loop_plan(policy, 30, 4, 4, 12, start, idle_burst="first_alone")
        (ms,) = price_together(SwitchedTimer(timer), [(timer, step_cells(plan.shapes,
                                                                         "llama-3.1-8b", 1))])
        together = closed_loop_timeline(plan, arrival, ms[plan.inverse], 4)
        alone = closed_loop(policy, 30, 4, 4, 12, "llama-3.1-8b", 1, timer, start,
                            idle_burst="first_alone")
        for a, b in ((together.ttft, alone.ttft), (together.tpot, alone.tpot),
                     (together.arrival, alone.arrival)):
            np.testing.assert_array_equal(a, b)


def test_a_failing_timer_leaves_the_switch_on_the_raw_timer():
    def refuses(cells: pl.DataFrame) -> np.ndarray:
        raise ValueError("no")

    switched = SwitchedTimer(refuses)
    plan, _ = _loops()[0]
    with pytest.raises(ValueError, match="no"):
        price_together(switched, [(switched, step_cells(plan.shapes, "llama-3.1-8b", 1))])
    with pytest.raises(ValueError, match="no"):
        switched(step_cells(plan.shapes, "llama-3.1-8b", 1))


def test_a_wrapper_that_asks_for_other_steps_the_second_time_is_refused():
    switched = SwitchedTimer(_row_timer([]))
    plan, _ = _loops()[0]
    cells = step_cells(plan.shapes, "llama-3.1-8b", 1)
    passes = []

    def fickle(steps: pl.DataFrame) -> np.ndarray:  # the second pass asks for half the steps
        passes.append(len(steps))
        return switched(steps if len(passes) == 1 else steps.head(len(steps) // 2))

    with pytest.raises(ValueError, match="asked for other steps"):
        price_together(switched, [(fickle, cells)])
    np.testing.assert_array_equal(switched(cells), _row_timer([])(cells))  # raw again
