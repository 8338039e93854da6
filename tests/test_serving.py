"""The serving replay: hand-computed TTFT/TPOT, token conservation, the silicon rows, scoring."""

from __future__ import annotations

import copy
import gc
import json
from pathlib import Path

import numpy as np
import polars as pl
import probe_predictors
import pytest
from conftest import SHARED, requires_shared
from hypothesis import given, settings
from hypothesis import strategies as st

from leaderboard.ingest.base import IngestContext
from leaderboard.ingest.silicon import MalformedRow, ingest, parse_row
from leaderboard.ingest.sources import SourceFile
from leaderboard.run.evaluate import RunSpec, run
from leaderboard.serving import simulate
from leaderboard.serving.replay import closed_loop, recorded_arrivals, step_cells, step_times
from leaderboard.serving.scheduler import Engine, Policy, StepLog
from leaderboard_core.specs import load_gpu_specs, load_models, model_by_alias
from predictors import registry

PREFILL_MS, DECODE_MS = 10.0, 1.0


def fixed_steps(cells: pl.DataFrame) -> np.ndarray:
    """A step with any prompt token takes 10 ms, a pure decode step 1 ms."""
    decode = (cells["num_decode"] == cells["num_requests"]).to_numpy()
    return np.where(decode, DECODE_MS, PREFILL_MS)


def test_two_request_toy_load_matches_the_hand_computation():
    # Budget 8: request A (10-token prompt, 3 outputs) arrives at 0, B (4, 2) at 5 ms.
    # step 0 [0,10): A 8 prompt tokens. B arrived during it, so joins step 1.
    # step 1 [10,20): A's last 2 prompt tokens + B's 4 -> both first tokens at 20.
    # step 2 [20,21): decode A and B; B has its 2 tokens, ends at 21.
    # step 3 [21,22): decode A; A has its 3 tokens, ends at 22.
    policy = Policy("chunked_mixed", token_budget=8, max_seqs=16, kv_tokens=1000)
    t = recorded_arrivals(policy, np.array([0.0, 5.0]), np.array([10, 4]), np.array([3, 2]),
                          "llama-3.1-8b", 1, fixed_steps)
    np.testing.assert_allclose(t.ttft, [20.0, 15.0])
    np.testing.assert_allclose(t.tpot, [(22 - 20) / 2, (21 - 20) / 1])
    # service time: first token minus the start of the first step with the request (0 and 10)
    np.testing.assert_allclose(t.service, [20.0, 10.0])
    # Closed loop, one client, two 10+3 requests: A runs steps 0-3 (10+10+1+1 ms), B is sent
    # when A ends at 22 and repeats it.
    c = closed_loop(policy, 10, 3, 1, 2, "llama-3.1-8b", 1, fixed_steps, idle_burst="first_alone")
    np.testing.assert_allclose(c.arrival, [0.0, 22.0])
    np.testing.assert_allclose(c.ttft, [20.0, 20.0])
    np.testing.assert_allclose(c.tpot, [1.0, 1.0])


def test_a_burst_to_a_busy_engine_is_not_split_and_resends_count_from_their_send():
    """first_alone, each step 10 ms with a prompt token and 1 ms without, 4 + 3 tokens.

    vLLM-like mixed steps, three clients: step 0 [0,10) A alone; [10,20) A decodes, B and C
    prefill; [20,21) all decode, A is done and D sent; [21,31) B and C end, D prefills, E and F
    are sent to a busy engine and so share [31,41) beside D's decode; [41,42) D ends;
    [42,43) E and F end. Only A parts from the others.

    SGLang-like prefill-first steps, two clients: [0,10) A alone, [10,20) B's prompt alone (A's
    decode waits), [20,21) and [21,22) both decode and end together, so C and D, sent at 22,
    reach an idle engine: [22,32) C alone, [32,42) D, which waited from 22. Every wave pays the
    lone step."""
    mixed = Policy("chunked_mixed", token_budget=64, max_seqs=16, kv_tokens=1000)
    t = closed_loop(mixed, 4, 3, 3, 6, "llama-3.1-8b", 1, fixed_steps, idle_burst="first_alone")
    np.testing.assert_allclose(t.arrival, [0.0, 0.0, 0.0, 21.0, 31.0, 31.0])
    np.testing.assert_allclose(t.ttft, [10.0, 20.0, 20.0, 10.0, 10.0, 10.0])
    np.testing.assert_allclose(t.tpot, [5.5, 5.5, 5.5, 5.5, 1.0, 1.0])
    prefill_first = Policy("prefill_first", token_budget=64, max_seqs=16, kv_tokens=1000)
    s = closed_loop(prefill_first, 4, 3, 2, 4, "llama-3.1-8b", 1, fixed_steps,
                    idle_burst="first_alone")
    np.testing.assert_allclose(s.arrival, [0.0, 0.0, 22.0, 22.0])
    np.testing.assert_allclose(s.ttft, [10.0, 20.0, 10.0, 20.0])
    np.testing.assert_allclose(s.tpot, [6.0, 1.0, 6.0, 1.0])


def test_clients_due_during_a_bursts_lone_step_join_the_next_step():
    """Staggered, four clients of 4 + 2 tokens: client i starts at step (2 i) // 4, so A and B
    at step 0, C and D at step 1. A runs [0,10) alone; B, C and D (C and D sent at 10, as the
    lone step ends) prefill in [10,20) beside A's last decode; [20,21) they end."""
    policy = Policy("chunked_mixed", token_budget=64, max_seqs=16, kv_tokens=1000)
    t = closed_loop(policy, 4, 2, 4, 4, "llama-3.1-8b", 1, fixed_steps, "staggered",
                    idle_burst="first_alone")
    np.testing.assert_allclose(t.arrival, [0.0, 0.0, 10.0, 10.0])
    np.testing.assert_allclose(t.ttft, [10.0, 20.0, 10.0, 10.0])
    np.testing.assert_allclose(t.tpot, [10.0, 1.0, 1.0, 1.0])


def test_a_step_shape_seen_before_is_priced_once_and_timed_the_same():
    """Steps with the same (new, cached) tokens request by request are one cell to the
    predictor; a step with the same tokens in another order, or another context, is not."""
    log = StepLog()
    for req, q, ctx in [([0, 1], [8, 1], [0, 5]), ([0, 1], [1, 1], [8, 6]),
                        ([2, 3], [8, 1], [0, 5]),  # step 0's shape, other requests
                        ([1, 0], [1, 8], [5, 0]),  # step 0's tokens in the other order
                        ([2, 3], [1, 1], [8, 6]),  # step 1's shape
                        ([2, 3], [1, 1], [9, 7]), ([2], [1], [9])]:  # step 1's tokens, later
        log.add(req, q, ctx)
    arrays = log.arrays()
    seen: list[int] = []

    def tokens_and_context(cells: pl.DataFrame) -> np.ndarray:
        seen.append(len(cells))
        q, ctx = cells["q_lens"].to_list(), cells["ctx_lens"].to_list()
        # a price that depends on the order, so a wrong match would show
        return np.array([sum((i + 1) * (a + 0.01 * b) for i, (a, b) in enumerate(zip(x, y, strict=True)))
                         for x, y in zip(q, ctx, strict=True)])

    every_step = tokens_and_context(step_cells(arrays, "llama-3.1-8b", 1))
    seen.clear()
    np.testing.assert_allclose(step_times(arrays, "llama-3.1-8b", 1, tokens_and_context),
                               every_step)
    assert seen == [5]  # seven steps, five shapes
    assert every_step[3] != every_step[0]
    gap = {k: v[arrays["step"] != 2] for k, v in arrays.items()}  # step 2 holds no request
    with pytest.raises(ValueError, match="step 2 of the log schedules no request"):
        step_times(gap, "llama-3.1-8b", 1, tokens_and_context)


def test_a_staggered_closed_loop_matches_the_hand_computation():
    # Two clients, 4+3 requests, staggered: client 1 starts 3 // 2 = 1 step after client 0.
    # step 0 [0,10): A's prompt (first token at 10). step 1 [10,20): A decodes, B's prompt
    # joins (B sent at 10, first token at 20). step 2 [20,21): A and B decode; A is done, C is
    # sent. step 3 [21,31): B decodes (done), C's prompt. step 4 [31,41): C decodes, D's
    # prompt. step 5 [41,42): C (done) and D decode. step 6 [42,43): D is done.
    policy = Policy("chunked_mixed", token_budget=64, max_seqs=16, kv_tokens=1000)
    t = closed_loop(policy, 4, 3, 2, 4, "llama-3.1-8b", 1, fixed_steps, "staggered",
                    idle_burst="first_alone")
    np.testing.assert_allclose(t.arrival, [0.0, 10.0, 21.0, 31.0])
    np.testing.assert_allclose(t.ttft, [10.0, 10.0, 10.0, 10.0])
    np.testing.assert_allclose(t.tpot, [(21 - 10) / 2, (31 - 20) / 2, (42 - 31) / 2, (43 - 41) / 2])
    lockstep = closed_loop(policy, 4, 3, 2, 4, "llama-3.1-8b", 1, fixed_steps,
                           idle_burst="together")
    np.testing.assert_allclose(lockstep.ttft, 10.0)  # both prompts share step 0, then C and D
    np.testing.assert_allclose(lockstep.arrival, [0.0, 0.0, 12.0, 12.0])
    with pytest.raises(ValueError, match="'drifting' is not one of"):
        closed_loop(policy, 4, 3, 2, 4, "llama-3.1-8b", 1, fixed_steps, "drifting",
                    idle_burst="together")
    with pytest.raises(ValueError, match="idle burst 'all' is not one of"):
        closed_loop(policy, 4, 3, 2, 4, "llama-3.1-8b", 1, fixed_steps, idle_burst="all")


def test_an_idle_engine_runs_the_first_request_of_a_burst_alone():
    """Two clients, 4+3 requests, lockstep, each step 10 ms with a prompt token and 1 ms without.
    first_alone: step 0 [0,10) A's prompt alone; B, sent at 0 too, joins step 1 [10,20) beside
    A's decode (B's first token at 20); step 2 [20,21) both decode, A is done and C is sent;
    step 3 [21,31) B's last decode and C's prompt, B is done and D is sent; step 4 [31,41) C
    decodes, D's prompt; step 5 [41,42) both decode; step 6 [42,43) D alone. The clients part
    after one burst. together: A and B share step 0 [0,10), decode in [10,11) and [11,12), and
    C and D are sent together at 12 to an idle engine, again in one step."""
    policy = Policy("chunked_mixed", token_budget=64, max_seqs=16, kv_tokens=1000)
    alone = closed_loop(policy, 4, 3, 2, 4, "llama-3.1-8b", 1, fixed_steps,
                        idle_burst="first_alone")
    np.testing.assert_allclose(alone.arrival, [0.0, 0.0, 21.0, 31.0])
    np.testing.assert_allclose(alone.ttft, [10.0, 20.0, 10.0, 10.0])
    np.testing.assert_allclose(alone.tpot, [(21 - 10) / 2, (31 - 20) / 2, (42 - 31) / 2,
                                            (43 - 41) / 2])
    together = closed_loop(policy, 4, 3, 2, 4, "llama-3.1-8b", 1, fixed_steps,
                           idle_burst="together")
    np.testing.assert_allclose(together.arrival, [0.0, 0.0, 12.0, 12.0])
    np.testing.assert_allclose(together.ttft, 10.0)
    np.testing.assert_allclose(together.tpot, 1.0)


def test_a_closed_loop_frees_its_engine_and_step_log_when_it_returns():
    """Nothing of a replay waits for the cyclic collector: a burst's lone step (the path that
    once called itself) leaves no reference cycle, so its engine and step log, gigabytes at 512
    clients, go as soon as the replay returns."""
    policy = Policy("chunked_mixed", token_budget=64, max_seqs=16, kv_tokens=1000)
    gc.collect()
    gc.disable()
    try:
        for burst in ("first_alone", "together"):
            for start in ("lockstep", "staggered"):
                closed_loop(policy, 4, 3, 3, 9, "llama-3.1-8b", 1, fixed_steps, start,
                            idle_burst=burst)
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert unreachable == 0


def two_clients_of_vllm(version: str) -> pl.DataFrame:
    """One closed-loop vLLM target of ``version``: two clients of 4 prompt + 3 output tokens."""
    return pl.DataFrame({"run": ["r"], "load": ["closed"], "model": ["llama-3.1-8b"], "tp": [1],
                         "backend": ["vllm"], "backend_version": [version], "gemm_dtype": ["bf16"],
                         "concurrency": [2], "isl": [4], "osl": [3]})


def test_the_steady_state_ttft_is_the_staggered_loop_after_its_first_wave():
    """Two clients, 4+3 requests, 4 waves (A to H), a step taking as many ms as it has tokens,
    and vLLM 0.12.0's host time h(n) = base + per request x n (before async scheduling) added to
    every step of n requests. Lockstep, the idle engine taking A alone: step 0 A's prompt
    (4 + h(1)); step 1 A's decode and B's prompt (5 + h(2)); step 2 both decode (2 + h(2)), A
    done and C sent; from there each prompt shares a step with one decode (5 + h(2)) and each
    second step is two decodes (2 + h(2)), until H's last decode runs alone (1 + h(1)). TTFT:
    A 4 + h(1), B 9 + h(1) + h(2), the other six 5 + h(2). TPOT: 7 + 2 h(2) over two tokens for
    all but H, whose last two steps give 3 + h(2) + h(1). Staggered (client 1 one step later):
    A's prompt alone (4 ms, TTFT 4); then each prompt shares its step with one decode (5 ms)
    and is sent at the start of that step: TTFT 5 for the other seven. The steady state drops
    the first wave (2 requests): 5 + h(2), not the mean of all eight."""
    from leaderboard.serving.simulate import load_conf, predict_targets

    target = two_clients_of_vllm("0.12.0")
    ttft, tpot, service, steady = predict_targets(
        target, load_models(), load_gpu_specs()["h100_sxm"],
        lambda cells: cells["total_tokens"].to_numpy().astype(np.float64))
    host = load_conf()["backends"]["vllm"]["host_time"]
    h1, h2 = (host["base_ms"] + n * host["per_request_ms"] for n in (1, 2))
    np.testing.assert_allclose(
        [ttft[0], tpot[0], steady[0]],
        [(4 + h1 + 9 + h1 + h2 + 6 * (5 + h2)) / 8, (7 * (7 + 2 * h2) + 3 + h2 + h1) / 16,
         5.0 + h2])
    assert np.isnan(service[0])  # closed loops have no recorded arrivals


def test_a_vllm_run_from_0_14_is_replayed_with_its_host_time_overlapped():
    """The run's version reaches the host time: the same two clients of 4 + 3 tokens under vLLM
    0.19.0, a step taking 0.25 ms a token, so every step (at most 5 tokens, 1.25 ms) is shorter
    than its host time h(n) (h(1) = 1.46 ms) and takes h(n). The steps as in the 0.12.0 test:
    h(1), then h(2) until H's last decode, h(1). TTFT: A h(1), B h(1) + h(2), six more h(2);
    TPOT h(2) for seven, (h(2) + h(1)) / 2 for H. Added in full, as for 0.12.0, each step would
    be its GPU time plus h(n)."""
    from leaderboard.serving.simulate import load_conf, predict_targets

    target = two_clients_of_vllm("0.19.0")
    ttft, tpot, _, _ = predict_targets(
        target, load_models(), load_gpu_specs()["h100_sxm"],
        lambda cells: 0.25 * cells["total_tokens"].to_numpy().astype(np.float64))
    host = load_conf()["backends"]["vllm"]["host_time"]
    h1, h2 = (host["base_ms"] + n * host["per_request_ms"] for n in (1, 2))
    np.testing.assert_allclose([ttft[0], tpot[0]],
                               [(2 * h1 + 7 * h2) / 8, (15 * h2 + h1) / 16])


def test_sglang_pauses_decodes_while_a_prompt_is_prefilled():
    # prefill_first: B's prompt (arriving during A's decode) gets a step of its own, so A's
    # decode stalls one 10 ms step: A = [prefill 0-10][decode 10-11][B prefill 11-21][decode 21-22].
    policy = Policy("prefill_first", token_budget=64, max_seqs=16, kv_tokens=1000)
    t = recorded_arrivals(policy, np.array([0.0, 10.5]), np.array([8, 8]), np.array([3, 2]),
                          "llama-3.1-8b", 1, fixed_steps)
    np.testing.assert_allclose(t.ttft, [10.0, 21.0 - 10.5])
    np.testing.assert_allclose(t.tpot, [(22 - 10) / 2, (22 - 21) / 1])


def _schedule_all(policy: Policy, lengths: list[tuple[int, int]]):
    """(prompts, outputs, the step log's arrays) of requests all arriving at once, run to the end."""
    prompt = np.array([p for p, _ in lengths])
    output = np.array([o for _, o in lengths])
    engine, log = Engine(policy, prompt, output), StepLog()
    for r in range(len(prompt)):
        engine.arrive(r)
    while engine.busy:
        engine.step(log, 5)
    return prompt, output, log.arrays()


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["chunked_mixed", "prefill_first", "whole_mixed"]),
       budget=st.integers(16, 96), max_seqs=st.integers(1, 6), kv=st.integers(40, 400),
       lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 12)), min_size=1, max_size=9))
def test_every_prompt_and_decode_token_is_scheduled_exactly_once(kind, budget, max_seqs, kv,
                                                                 lengths):
    prompt, output, a = _schedule_all(Policy(kind, budget, max_seqs, kv), lengths)
    for r in range(len(prompt)):
        mine = np.flatnonzero(a["req"] == r)
        q, ctx = a["q"][mine], a["ctx"][mine]
        # Positions 0 .. prompt+output-2 each computed once, in order, no gap or overlap.
        assert ctx[0] == 0 and (ctx[1:] == ctx[:-1] + q[:-1]).all()
        assert q.sum() == prompt[r] + output[r] - 1
        assert (q[ctx >= prompt[r]] == 1).all()  # after the prompt, one token per step
    per_step = np.bincount(a["step"], weights=a["q"])
    one_request = np.bincount(a["step"]) == 1  # whole_mixed lets a lone long prompt through
    assert ((per_step <= budget) | one_request).all()
    assert np.bincount(a["step"]).max() <= max_seqs


def _steps(policy: Policy, prompt: list[int], output: list[int]) -> tuple[list, int]:
    """Every step's (request, new tokens, cached tokens), requests all arriving at step 0, and
    the engine's preemptions."""
    engine, log = Engine(policy, np.array(prompt), np.array(output)), StepLog()
    for r in range(len(prompt)):
        engine.arrive(r)
    while engine.busy:
        engine.step(log, 1)
    a = log.arrays()
    return [list(zip(a["req"][a["step"] == k].tolist(), a["q"][a["step"] == k].tolist(),
                     a["ctx"][a["step"] == k].tolist(), strict=True))
            for k in range(log.steps)], engine.preemptions


def test_vllm_kv_on_demand_preempts_the_last_admitted_and_recomputes_it():
    # 12 KV tokens; A and B have 4-token prompts and 6 outputs. Step 0 prefills both (8 held),
    # steps 1-2 decode both (12 held). At step 3 A's next token does not fit: B, admitted last,
    # is preempted (6 tokens freed) and nothing is admitted that step. A finishes at step 5;
    # step 6 recomputes B's 6 tokens as one prefill, then B decodes to its end at step 9.
    steps, preemptions = _steps(Policy("chunked_mixed", 64, 16, 12, "on_demand"), [4, 4], [6, 6])
    assert [sorted(step) for step in steps] == [
        [(0, 4, 0), (1, 4, 0)], [(0, 1, 4), (1, 1, 4)], [(0, 1, 5), (1, 1, 5)], [(0, 1, 6)],
        [(0, 1, 7)], [(0, 1, 8)], [(1, 6, 0)], [(1, 1, 6)], [(1, 1, 7)], [(1, 1, 8)]]
    assert preemptions == 1
    t = recorded_arrivals(Policy("chunked_mixed", 64, 16, 12, "on_demand"), np.array([0.0, 0.0]),
                          np.array([4, 4]), np.array([6, 6]), "llama-3.1-8b", 1, fixed_steps)
    # Steps 0 and 6 hold prompt tokens (10 ms), the others are decodes (1 ms): A ends at 15,
    # B at 28. B's first token came with step 0 (10 ms), not with its recompute.
    np.testing.assert_allclose(t.ttft, [10.0, 10.0])
    np.testing.assert_allclose(t.tpot, [(15 - 10) / 5, (28 - 10) / 5])


def test_a_request_preempted_mid_prompt_recomputes_its_whole_prompt_in_chunks():
    # 20 KV tokens, an 8-token budget. A (4-token prompt, 12 outputs) decodes while B's
    # 30-token prompt is chunked; at step 2 A's next token does not fit beside B's 11 tokens, so
    # B is preempted mid-prompt. Until A ends, B is re-admitted with a 7-token chunk and
    # preempted again. Then its pass computes all 30 prompt tokens in budget-sized chunks and
    # decodes its other 2 outputs: never the prompt's rest one token per step.
    steps, preemptions = _steps(Policy("chunked_mixed", 8, 16, 20, "on_demand"), [4, 30], [12, 3])
    b_entries = [(q, ctx) for step in steps for r, q, ctx in step if r == 1]
    last_pass = max(i for i, (_, ctx) in enumerate(b_entries) if ctx == 0)
    assert b_entries[last_pass:] == [(8, 0), (8, 8), (8, 16), (6, 24), (1, 30), (1, 31)]
    assert preemptions == 5


def test_a_preempted_request_resumes_from_what_the_prefix_cache_kept():
    # As above, with 4-token cache blocks: B is preempted at step 2 with 11 tokens computed, 8
    # of them in whole blocks. While it waits A's decodes take the free KV: at A's 15th token
    # only 5 tokens are free beside it, so one block (4 tokens) of B's cache is left. When A
    # ends B is re-admitted at context 4 and computes the other 26 prompt tokens.
    steps, preemptions = _steps(Policy("chunked_mixed", 8, 16, 20, "on_demand",
                                       prefix_cache_block=4), [4, 30], [12, 3])
    assert steps[:2] == [[(0, 4, 0), (1, 4, 0)], [(0, 1, 4), (1, 7, 4)]]
    assert steps[2:12] == [[(0, 1, ctx)] for ctx in range(5, 15)]
    assert steps[12:] == [[(1, 8, 4)], [(1, 8, 12)], [(1, 8, 20)], [(1, 2, 28)], [(1, 1, 30)],
                          [(1, 1, 31)]]
    assert preemptions == 1


@settings(max_examples=80, deadline=None)
@given(budget=st.integers(32, 96), kv=st.integers(60, 400), block=st.sampled_from([1, 16]),
       whole=st.booleans(),
       lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=2, max_size=8))
def test_a_run_of_decode_steps_schedules_as_its_steps_one_by_one(budget, kv, block, whole,
                                                                 lengths):
    # step() may schedule many identical decode steps at once; the caches it clips and the
    # requests it admits must be those of scheduling them one at a time.
    policy = Policy("chunked_mixed", budget, 6, kv, "on_demand", block, whole)
    prompt = np.array([p for p, _ in lengths])
    output = np.array([o for _, o in lengths])

    def schedule(max_steps):
        engine, log = Engine(policy, prompt, output), StepLog()
        for r in range(len(prompt)):
            engine.arrive(r)
        while engine.busy:
            engine.step(log, max_steps)
        return {k: v.tolist() for k, v in log.arrays().items()}

    assert schedule(1) == schedule(10**6)


def test_a_request_preempted_again_mid_recompute_keeps_its_outputs():
    # Request 5 (27-token prompt) is preempted after computing 33 tokens and preempted again
    # while recomputing them: each later pass still owes all 33 as a prefill, never decoding
    # its outputs 28-33 again one token a step (the case of every request here).
    policy = Policy("chunked_mixed", 28, 6, 167, "on_demand", 16, True)
    prompt, output, a = _schedule_all(policy, list(zip([11, 40, 27, 10, 20, 27, 14, 26],
                                                       [5, 25, 38, 15, 18, 27, 37, 8],
                                                       strict=True)))
    per_step = np.bincount(a["step"], weights=a["q"])
    for r in range(len(prompt)):
        mine = np.flatnonzero(a["req"] == r)
        q, ctx = a["q"][mine], a["ctx"][mine]
        owed = np.maximum.accumulate(np.r_[prompt[r], (ctx + q)[:-1]])
        ones = np.flatnonzero((q == 1) & (ctx + 1 < owed))
        assert (per_step[a["step"][mine[ones]]] == policy.token_budget).all(), r


def test_whole_sequence_admission_waits_for_the_whole_prompt_to_fit():
    # vLLM's scheduler_reserve_full_isl: B's 30-token prompt never fits beside A's 4 to 15
    # tokens in 20, so B waits for A to end instead of being admitted a chunk and preempted.
    steps, preemptions = _steps(Policy("chunked_mixed", 8, 16, 20, "on_demand",
                                       whole_sequence_admission=True), [4, 30], [12, 3])
    assert steps[:12] == [[(0, 4, 0)]] + [[(0, 1, ctx)] for ctx in range(4, 15)]
    assert steps[12:] == [[(1, 8, 0)], [(1, 8, 8)], [(1, 8, 16)], [(1, 6, 24)], [(1, 1, 30)],
                          [(1, 1, 31)]]
    assert preemptions == 0


@pytest.mark.parametrize("fields", [{"prefix_cache_block": 16},
                                    {"whole_sequence_admission": True}])
def test_vllm_admission_rules_need_the_on_demand_kv_rule(fields):
    with pytest.raises(ValueError, match="on_demand KV rule only"):
        Policy("chunked_mixed", 64, 16, 100, "reserve", **fields)


@settings(max_examples=60, deadline=None)
@given(budget=st.integers(16, 96), max_seqs=st.integers(1, 6), kv=st.integers(40, 400),
       lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 12)), min_size=1, max_size=9),
       block=st.sampled_from([0, 1, 16]), whole=st.booleans())
def test_on_demand_kv_recomputes_whole_passes_and_never_overfills(budget, max_seqs, kv, lengths,
                                                                  block, whole):
    prompt, output, a = _schedule_all(Policy("chunked_mixed", budget, max_seqs, kv, "on_demand",
                                             block, whole), lengths)
    for r in range(len(prompt)):
        mine = np.flatnonzero(a["req"] == r)
        q, ctx = a["q"][mine], a["ctx"][mine]
        assert ctx[0] == 0
        # A pass starts where the last one's context does not continue: at 0, or with a
        # prefix-cache hit of whole blocks no further than the tokens computed before.
        starts = np.flatnonzero(np.r_[True, ctx[1:] != ctx[:-1] + q[:-1]])
        reached = ctx[starts[1:] - 1] + q[starts[1:] - 1]
        assert (ctx[starts[1:]] <= reached).all()
        assert (ctx[starts] % max(block, 1) == 0).all() and (block or (ctx[starts] == 0).all())
        per_step = np.bincount(a["step"], weights=a["q"])
        for lo, hi in zip(starts, [*starts[1:], len(q)], strict=True):
            # a pass computes in chunks the prompt and whatever earlier passes had reached:
            # one token at a time only past that, or where the step's budget ran out
            owed = max(prompt[r], int((ctx[:lo] + q[:lo]).max(initial=0)))
            ones = np.flatnonzero((q[lo:hi] == 1) & (ctx[lo:hi] + 1 < owed)) + lo
            assert (per_step[a["step"][mine[ones]]] == budget).all()
        assert ctx[-1] + q[-1] == prompt[r] + output[r] - 1  # the last pass reaches the end
    held = np.bincount(a["step"], weights=a["ctx"] + a["q"])  # KV of the requests a step runs
    alone = np.bincount(a["step"]) == 1  # an empty engine takes any request
    assert ((held <= kv) | alone).all()


GOOD = {"id": "run-a", "silicon_data_source": "x; silicon_concurrency=8", "backend": "vllm",
        "backend_version": "0.12.0", "model_path": "Qwen/Qwen3-32B", "system": "h100_sxm",
        "precision": "", "mode": "agg", "gemm_quant_mode": "", "isl": "1024", "osl": "128",
        "batch_size": "8", "tp_size": "2", "pp_size": "1", "attention_dp_size": "",
        "moe_ep_size": "1", "moe_tp_size": "2", "silicon_ttft_ms": "300.5",
        "silicon_tpot_ms": "12.5"}


def test_a_good_silicon_row_is_read_as_bf16_with_its_load():
    rec = parse_row(GOOD, 7, "silicon.csv", model_by_alias(load_models()))
    assert (rec["model"], rec["precision"], rec["concurrency"], rec["tp"]) == ("qwen3-32b", "bf16", 8, 2)
    assert (rec["ttft_ms"], rec["tpot_ms"], rec["row"]) == (300.5, 12.5, 7)


@pytest.mark.parametrize("field, value, says", [
    ("silicon_tpot_ms", "abc", "'silicon_tpot_ms' is 'abc', not a number"),
    ("silicon_ttft_ms", "-3", "must be finite and > 0"),
    ("isl", "10.5", "not a whole number"),
    ("batch_size", "", "'batch_size' is empty"),
    ("mode", "split", "expected 'agg' or 'disagg'"),
])
def test_a_malformed_silicon_row_names_the_row(tmp_path, field, value, says):
    header = list(GOOD)
    rows = [GOOD, {**GOOD, "id": "run-bad", field: value}]
    path = tmp_path / "silicon_sample.csv"
    path.write_text("\n".join([",".join(header)] + [",".join(r[h] for h in header) for r in rows]) + "\n")
    file = SourceFile("x/silicon_sample.csv", path, "0" * 64, False, "x", None, None)
    with pytest.raises(MalformedRow, match=rf"line 3 \(id run-bad\).*{says}"):
        ingest([file], IngestContext(load_gpu_specs(), load_models()))


def test_every_silicon_row_is_accounted_for(real_store):
    (total,) = real_store.sql("SELECT count(*) FROM serving_runs")[0]
    (card,) = real_store.sql("SELECT card FROM datasets WHERE name = 'h100_silicon'")[0]
    coverage = card[card.index("## Coverage"):card.index("**Rows no replay")]
    table = [line.split("|") for line in coverage.splitlines() if line.startswith("| ")][1:]
    assert sum(int(cells[5]) for cells in table) == total == 5221
    usable = sum(int(c[5]) for c in table if c[6].strip() == "usable")
    (targets,) = real_store.sql("SELECT count(*) FROM serving_targets WHERE load = 'closed'")[0]
    assert usable == targets > 0


@pytest.fixture
def constant(monkeypatch, store_home):
    registry.discover()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    # a module-level class: the sandboxed child imports it by module, as any predictor
    registry.register("two_ms_steps")(probe_predictors.TwoMsSteps)


@pytest.mark.long  # replays all 288 loads of h100_silicon's three backends (about 20 s)
def test_a_serving_run_scores_ttft_and_tpot(constant, tmp_path):
    result = run(RunSpec("two_ms_steps", "h100_silicon", {}, runs_dir=tmp_path / "runs"))
    assert result.metrics["level"] == "serving" and result.metrics["valid"]
    assert set(result.metrics["phases"]) == {"ttft", "tpot", "ttft_steady"}
    ttft = result.predictions.filter(pl.col("phase") == "ttft").sort("workload_id")
    steady = result.predictions.filter(pl.col("phase") == "ttft_steady").sort("workload_id")
    # the steady-state bound is scored against the same measured TTFT
    assert steady["gt_ms"].to_list() == ttft["gt_ms"].to_list()
    tpot = result.predictions.filter(pl.col("phase") == "tpot")
    # Every step is 2 ms; TRT-LLM decodes every running request each step, so its TPOT is
    # exactly 2 ms; SGLang's prefill-only steps stall the decodes they interrupt, and vLLM
    # recomputes what it preempts when the KV cache fills, so theirs are never less.
    trtllm = tpot.filter(pl.col("backend") == "trtllm")["pred_ms"].to_numpy()
    np.testing.assert_allclose(trtllm, 2.0)
    for backend in ("sglang", "vllm"):
        stalled = tpot.filter(pl.col("backend") == backend)["pred_ms"].to_numpy()
        assert (stalled >= 2.0 - 1e-9).all(), backend
    assert (tpot.filter(pl.col("backend") == "sglang")["pred_ms"] > 2.01).any()
    gt = tpot["gt_ms"].to_numpy()
    assert result.metrics["phases"]["tpot"]["median_ape"] == pytest.approx(
        np.median(np.abs(tpot["pred_ms"].to_numpy() - gt) / gt * 100))


def test_the_oracle_fits_on_the_same_gpus_kernels_of_the_sets_precision():
    """The oracle's home is the same GPU's step set of the serving set's precision, read at that
    set's own version (not only the ``_ops`` set's): a GPU with no op grid, or no step set of
    that precision, has none."""
    from leaderboard.run.oracle import oracle_home

    def row(kind, sku, version):
        return {"kind": kind, "sku": sku, "backend_versions": [version]}

    rows = {"h100_silicon": row("serving", "h100_sxm", "0.12.0"),
            "h100_silicon_fp8": row("serving", "h100_sxm", "0.12.0"),
            "rtx4090_serving": row("serving", "rtx4090", "0.10.0"),
            "h100_vidur": row("cells", "h100_sxm", "0.14.0"),
            "h200_vidur": row("cells", "h200_sxm", "0.14.0"),
            "h100_vidur_fp8": row("cells", "h100_sxm", "0.19.0"),
            "h100_sxm_ops": row("ops", "h100_sxm", "0.14.0")}
    rows = {name: {"name": name, **r} for name, r in rows.items()}
    assert oracle_home("h100_silicon", rows) == "h100_vidur"
    assert oracle_home("h100_silicon_fp8", rows) == "h100_vidur_fp8"  # 0.19.0, not the grid's
    assert oracle_home("rtx4090_serving", rows) is None  # no kernel table of the GPU
    # LLMServingSim's profile of the GPU: a vLLM profiler's (a release) serves; v0's does not
    rows["rtx4090_llmservingsim"] = {"name": "rtx4090_llmservingsim",
                                     **row("cells", "rtx4090", "unknown")}
    assert oracle_home("rtx4090_serving", rows) is None
    rows["rtx4090_llmservingsim"]["backend_versions"] = ["0.19.0"]
    assert oracle_home("rtx4090_serving", rows) == "rtx4090_llmservingsim"
    rows["b200_silicon_fp8"] = {**rows["h100_silicon_fp8"], "name": "b200_silicon_fp8",
                                "sku": "b200_sxm"}
    rows["b200_vidur"] = {**rows["h100_vidur"], "name": "b200_vidur", "sku": "b200_sxm"}
    rows["b200_sxm_ops"] = {**rows["h100_sxm_ops"], "name": "b200_sxm_ops", "sku": "b200_sxm"}
    assert oracle_home("b200_silicon_fp8", rows) is None  # no FP8 step set of the B200
    # MoE runs: the FP8 family's version where the GPU has one, else the MoE family's set
    rows["h100_silicon_moe"] = {**rows["h100_silicon_fp8"], "name": "h100_silicon_moe"}
    rows["b200_silicon_moe"] = {**rows["b200_silicon_fp8"], "name": "b200_silicon_moe"}
    rows["h100_vidur_moe"] = {**rows["h100_vidur"], "name": "h100_vidur_moe"}
    assert oracle_home("h100_silicon_moe", rows) == "h100_vidur_fp8"
    assert oracle_home("b200_silicon_moe", rows) is None
    rows["b200_vidur_moe"] = {**rows["b200_vidur"], "name": "b200_vidur_moe",
                              "backend_versions": ["0.19.0"]}
    assert oracle_home("b200_silicon_moe", rows) == "b200_vidur_moe"
    del rows["h100_sxm_ops"]
    assert oracle_home("h100_silicon", rows) is None  # no measured op grid of the GPU
    assert oracle_home("h100_silicon_fp8", rows) is None
    assert oracle_home("h100_silicon_moe", rows) is None


def test_every_shape_reads_the_homes_own_version_and_full_grid_the_grids():
    """``full_grid`` reads the points of the ``_ops`` set's version only; ``every_shape`` (the
    oracle's) those of the home's own version, as the store holds them, at every precision and
    with the fused-MoE points, an MoE family's home included."""
    from leaderboard.run import home_grid, homes

    calls = []

    class Store:
        def op_points_at(self, sku, version):
            calls.append((sku, version))
            return pl.DataFrame({
                "op_family": ["gemm", "gemm", "attention", "attention"],
                "phase": [None, None, "decode", "decode"],
                "dtype": ["fp8", "fp8_block", "bfloat16", "bfloat16"],
                "kv_dtype": [None, None, "bfloat16", "fp8"],
                "m": [8, 8, None, None], "n": [1024, 1024, None, None],
                "k": [8192, 8192, None, None], "batch": [1, 1, 4, 4], "q_len": [None, None, 1, 1],
                "kv_len": [None, None, 512, 512], "num_heads": [None, None, 64, 64],
                "num_kv_heads": [None, None, 8, 8], "head_dim": [None, None, 128, 128],
                "window_size": [None, None, 0, 0], "latency_ms": [0.01, 0.015, 0.02, 0.012],
                "flags": [None] * 4, "sku": [sku] * 4, "backend_version": [version] * 4})

        def moe_points_at(self, sku, version):
            return pl.DataFrame({"dtype": ["fp8_block"], "num_tokens": [64], "hidden_size": [3072],
                                 "inter_size": [1536], "topk": [8], "num_experts": [256],
                                 "moe_tp": [1], "moe_ep": [4], "sku": [sku], "version": [version],
                                 "latency_ms": [0.3]})

        def collective_points(self, sku, version):
            return pl.DataFrame({"backend": ["vllm_graph"], "message_bytes": [4096],
                                 "num_gpus": [2], "sku": [sku], "version": [version],
                                 "latency_ms": [0.005]})

    row = {"name": "h100_vidur_fp8", "sku": "h100_sxm", "backend_versions": ["0.19.0"]}
    ops = {"name": "h100_sxm_ops", "sku": "h100_sxm", "backend_versions": ["0.14.0"]}
    rows = {"h100_vidur_fp8": row, "h100_sxm_ops": ops}
    assert homes.points_of("full_grid", [row], rows) == "behind_cells"
    assert homes.points_of("every_shape", [row], rows) == "every_shape"
    grid = home_grid.full_grid(Store(), row, None, {}, "fp8")
    assert calls == [("h100_sxm", "0.19.0")]
    assert grid["gemm_qkv"]["version"].to_list() == ["0.19.0"] * 2
    assert grid["gemm_qkv"]["dtype"].to_list() == ["fp8", "fp8_block"]  # every precision
    # every KV dtype the oracle keys on (the fp8_kv engine choice reads the FP8-KV points)
    assert grid["attn_decode"].select("kv_dtype", "latency_ms").rows() == [("bfloat16", 0.02),
                                                                          ("fp8", 0.012)]
    assert grid["allreduce"]["num_gpus"].to_list() == [2]
    assert grid["moe"].select("dtype", "moe_ep", "latency_ms").row(0) == ("fp8_block", 4, 0.3)
    configs = home_grid.full_grid(Store(), {**row, "backend_versions": ["0.14.0"]},
                                  [("llama-3.1-70b", 1)], load_models(), "fp8")
    assert "moe" not in configs  # the grid of a home's configurations has no experts
    # its cells hold a BF16 cache, and predictors other than the oracle do not key on it
    assert configs["attn_decode"]["kv_dtype"].to_list() == ["bfloat16"]
    moe_home = {"name": "h100_vidur_moe", "sku": "h100_sxm", "backend_versions": ["0.14.0"]}
    rows["h100_vidur_moe"] = moe_home
    assert homes.points_of("every_shape", [moe_home], rows) == "every_shape"
    assert homes.points_of("full_grid", [moe_home], rows) == "behind_cells"  # experts off the grid
    del rows["h100_sxm_ops"]
    assert homes.points_of("every_shape", [moe_home], rows) == "behind_cells"  # no tables
    empty = type("Empty", (Store,), {"op_points_at": lambda self, sku, version:
                                     Store.op_points_at(self, sku, version).clear()})
    with pytest.raises(ValueError, match="has no h100_sxm GEMM and attention points at version 0.19.0"):
        home_grid.full_grid(empty(), row, None, {}, "fp8")


def test_a_vllm_closed_loop_takes_its_launchers_budget_where_its_template_passes_it():
    """aiconfigurator's generator launches an aggregated vLLM worker with
    --max-num-batched-tokens = concurrency + isl + 1500, a flag its launch template passes from
    vLLM 0.14.1; 0.12.0, an unknown version, a recorded-arrival run and the other backends
    keep the defaults (8192 tokens on an 80 GB H100)."""
    from leaderboard.serving.simulate import policy_for

    m, gpu = load_models()["qwen3-32b"], load_gpu_specs()["h100_sxm"]
    for version, budget in (("0.19.0", 8 + 1024 + 1500), ("0.14.1", 2532), ("0.14.0", 8192),
                            ("0.12.0", 8192), ("unknown", 8192)):
        assert policy_for("vllm", "any", m, 2, gpu, version=version, closed_loop=(8, 1024)
                          ).token_budget == budget, version
    assert policy_for("vllm", "any", m, 2, gpu, version="0.19.0").token_budget == 8192
    for backend in ("sglang", "trtllm"):
        assert policy_for(backend, "any", m, 2, gpu, version="9.9", closed_loop=(8, 1024)
                          ).token_budget == 8192
    # a run whose metadata states its limits keeps them
    stated = policy_for("vllm", "RTX4090/Llama-3.1-8B", load_models()["llama-3.1-8b"], 1,
                        load_gpu_specs()["rtx4090"], version="0.19.0", closed_loop=(8, 1024))
    assert (stated.token_budget, stated.max_seqs) == (2048, 256)


def test_a_rule_marked_unrecorded_holds_for_an_unknown_version_only(monkeypatch):
    """``unrecorded: true`` (benchmarks/engine_choices.py's launch_rule) gives the launcher's
    budget to a run whose version is not recorded; a recorded older release stays out."""
    from leaderboard.serving.simulate import load_conf, policy_for

    monkeypatch.setitem(load_conf()["backends"]["vllm"]["closed_loop_launch"], "unrecorded", True)
    m, gpu = load_models()["qwen3-32b"], load_gpu_specs()["h100_sxm"]
    for version, budget in (("unknown", 8 + 1024 + 1500), (None, 2532), ("0.12.0", 8192),
                            ("0.14.1", 2532)):
        assert policy_for("vllm", "any", m, 2, gpu, version=version, closed_loop=(8, 1024)
                          ).token_budget == budget, version


def test_vllm_prefix_caching_everywhere_and_whole_sequence_admission_from_0_19():
    from leaderboard.serving.simulate import policy_for

    m, gpu = load_models()["qwen3-32b"], load_gpu_specs()["h100_sxm"]
    for version, whole in (("0.19.0", True), ("0.20.1", True), ("0.18.0", False),
                           ("0.12.0", False), ("unknown", False), (None, False)):
        policy = policy_for("vllm", "any", m, 2, gpu, version=version)
        assert (policy.prefix_cache_block, policy.whole_sequence_admission) == (16, whole), version
    for backend in ("sglang", "trtllm"):
        policy = policy_for(backend, "any", m, 2, gpu, version="9.9")
        assert (policy.prefix_cache_block, policy.whole_sequence_admission) == (0, False)


@requires_shared
def test_the_rtx4090_runs_recorded_engine_is_the_one_replayed():
    """The LLMServingSim run's meta.json (pinned) states vLLM 0.19.0's resolved scheduler and
    cache: the replay's policy for that run must match it field by field."""
    from leaderboard.serving.simulate import policy_for

    meta = json.loads((SHARED / "casys-kaist__LLMServingSim/bench/examples/RTX4090/"
                       "Llama-3.1-8B/vllm/meta.json").read_text())
    sched, cache = meta["resolved_config"]["scheduler_config"], meta["kv_cache"]
    policy = policy_for("vllm", "RTX4090/Llama-3.1-8B", load_models()["llama-3.1-8b"], 1,
                        load_gpu_specs()["rtx4090"], version=meta["vllm_version"])
    assert (policy.token_budget, policy.max_seqs, policy.kv_tokens) == (
        sched["max_num_batched_tokens"], sched["max_num_seqs"], cache["num_kv_tokens"])
    assert policy.whole_sequence_admission == sched["scheduler_reserve_full_isl"]
    assert cache["enable_prefix_caching"] and policy.prefix_cache_block == cache["block_size"]
    assert sched["policy"] == "fcfs" and policy.kv_rule == "on_demand"


def test_kv_capacity_counts_gib_and_fp8_layers_at_one_byte():
    from leaderboard.serving.simulate import kv_capacity, load_conf

    m, gpu = load_models()["llama-3.1-70b"], load_gpu_specs()["h100_sxm"]
    # Llama-3.1-70B: 80 layers, hidden 8192, 64 query / 8 KV heads of 128, MLP 28672, vocab 128256
    layer = 8192 * (64 + 2 * 8) * 128 + 64 * 128 * 8192 + 3 * 8192 * 28672
    embeddings = 2 * 128256 * 8192 * 2  # embedding and LM head, BF16
    per_token = 2 * 80 * 8 * 128 * 2  # K and V, BF16
    memory = 0.9 * 80 * 2**30 * 2  # TP 2, GiB
    for dtype, layer_bytes in (("bf16", 2), ("fp8", 1)):
        expected = int((memory - 80 * layer * layer_bytes - embeddings) // per_token)
        assert kv_capacity(m, 2, gpu, 0.9, load_conf(), dtype) == expected, dtype

    # TensorRT-LLM's fraction is of the memory the weights leave free
    for dtype, layer_bytes in (("bf16", 2), ("fp8", 1)):
        free = 2 * (80 * 2**30 - (80 * layer * layer_bytes + embeddings) / 2)
        expected = int(0.9 * free // per_token)
        assert kv_capacity(m, 2, gpu, 0.9, load_conf(), dtype, of_free=True) == expected, dtype


def test_kv_capacity_counts_a_replicated_kv_head_on_every_gpu():
    """Qwen3-235B-A22B has 4 KV heads: at TP 8 each GPU holds one whole head (a replica), so a
    token takes 8 heads' room in all, twice what 4 heads shared would: half the tokens fit. At
    TP 4 the heads are shared and nothing is replicated."""
    from leaderboard.cells.memory import weight_bytes
    from leaderboard.serving.simulate import kv_cache_dtype, kv_capacity, load_conf
    from leaderboard_core.specs import KV_CACHE_BYTES

    m, gpu = load_models()["qwen3-235b-a22b"], load_gpu_specs()["b200_sxm"]
    assert m["num_kv_heads"] == 4
    for tp, heads_in_all in ((4, 4), (8, 8)):
        free = tp * (0.9 * float(gpu["mem_gb"]) * 2**30 - weight_bytes(m, tp, "fp8"))
        per_token = (2 * m["num_layers"] * heads_in_all * m["head_dim"]
                     * KV_CACHE_BYTES[kv_cache_dtype(load_conf())])
        assert kv_capacity(m, tp, gpu, 0.9, load_conf(), "fp8") == int(free // per_token), tp


def test_an_mla_model_caches_one_latent_a_token_and_layer_on_every_gpu():
    """DeepSeek-V3 caches kv_lora_rank 512 + qk_rope_head_dim 64 = 576 elements a token and
    layer, the same on every GPU of the group, not keys and values per head: at TP 8, 61 layers
    x 576 x 2 bytes = 70,272 bytes a GPU (per-head counting, 2 x 128 / 8 heads x 192, would give
    10.7 times that). The engine's capacity counts it on each of the 8 GPUs."""
    from leaderboard.cells.memory import kv_bytes, weight_bytes
    from leaderboard.serving.simulate import kv_capacity, load_conf

    m, gpu = load_models()["deepseek-v3"], load_gpu_specs()["b200_sxm"]
    assert (m["attention"], m["kv_lora_rank"], m["qk_rope_head_dim"]) == ("mla", 512, 64)
    assert kv_bytes(m, 8, [1], [0]) == 61 * 576 * 2
    free = 8 * (0.9 * float(gpu["mem_gb"]) * 2**30 - weight_bytes(m, 8, "fp8"))
    assert kv_capacity(m, 8, gpu, 0.9, load_conf(), "fp8") == int(free // (8 * 61 * 576 * 2))


def test_sglang_memory_fraction_follows_its_version_rule_and_trtllm_takes_the_free_memory():
    from leaderboard.serving.sglang_kv import static_memory_fraction
    from leaderboard.serving.simulate import kv_capacity, load_conf, policy_for

    gib = 1024  # MiB
    # up to 0.5.1.post1: an 80 GB GPU reserves (9.5 + TP / 2) GiB, a 141 GB one (12 + TP / 2)
    assert static_memory_fraction(80, 1, general=False) == round((80 - 10) / 80, 3) == 0.875
    assert static_memory_fraction(80, 8, general=False) == round((80 - 13.5) / 80, 3)
    assert static_memory_fraction(141, 2, general=False) == round((141 - 13) / 141, 3)
    # general rule: 512 MiB + 1.5 x chunk + 2 x CUDA-graph ceiling + TP / 8 GiB
    assert static_memory_fraction(80, 1, general=True) == round(
        (80 * gib - (512 + 8192 * 1.5 + 256 * 2 + gib / 8)) / (80 * gib), 3)
    assert static_memory_fraction(80, 4, general=True) == round(
        (80 * gib - (512 + 8192 * 1.5 + 512 * 2 + gib / 2)) / (80 * gib), 3)
    assert static_memory_fraction(180, 2, general=True) == round(
        (180 * gib - (512 + 16384 * 1.5 + 512 * 2 + gib / 4)) / (180 * gib), 3)
    # under 60 GB a 4096-token chunk and a CUDA-graph ceiling of 32
    assert static_memory_fraction(40, 1, general=True) == round(
        (40 * gib - (512 + 4096 * 1.5 + 32 * 2 + gib / 8)) / (40 * gib), 3)
    with pytest.raises(ValueError, match="35 GiB"):
        static_memory_fraction(24, 1, general=True)

    m, gpu = load_models()["qwen3-32b"], load_gpu_specs()["h100_sxm"]
    for version, fraction in (("0.5.1.post1", 0.875), ("0.5.8.post1", 0.836), (None, 0.836),
                              ("unknown", 0.836)):
        policy = policy_for("sglang", "any", m, 1, gpu, version=version)
        assert policy.kv_tokens == kv_capacity(m, 1, gpu, fraction, load_conf()), version
    trtllm = policy_for("trtllm", "any", m, 2, gpu)
    assert trtllm.kv_tokens == kv_capacity(m, 2, gpu, 0.9, load_conf(), of_free=True)


def test_an_fp8_serving_set_replays_fp8_steps_and_a_bf16_only_predictor_declines(store_home,
                                                                                  tmp_path):
    from leaderboard_core.contract import NotSupported

    seen = []

    class Spy:
        def __call__(self, cells):
            seen.append(set(cells["gemm_dtype"]))
            return np.full(len(cells), 2.0)

    policy = Policy("chunked_mixed", 64, 16, 1000, "on_demand")
    closed_loop(policy, 8, 3, 2, 4, "llama-3.1-70b", 2, Spy(), gemm_dtype="fp8",
                idle_burst="first_alone")
    assert seen == [{"fp8"}]
    with pytest.raises(NotSupported, match="prices bf16 GEMMs only; dataset h200_silicon_fp8"):
        run(RunSpec("genz", "h200_silicon_fp8", {}, runs_dir=tmp_path / "runs"))


def test_the_slope_artefact_is_a_ttft_that_falls_with_load_and_a_growing_one_is_not():
    import polars as pl

    from leaderboard.cells import serving_artefacts

    def group(tp: int, b: float, growth: float = 0.0, osls=(128, 256, 512)) -> list[dict]:
        return [{"row": 100 * tp + i, "sku": "h100_sxm", "model_path": "m", "backend": "trtllm",
                 "backend_version": "1", "precision": "bf16", "tp": tp, "isl": 1024, "osl": osl,
                 "concurrency": c, "batch_size": c, "tpot_ms": 8.0 + c / 8,
                 "ttft_ms": 60 + growth * c + (b * (osl - 1) * (8.0 + c / 8) / (c - 1)
                                               if c > 1 else 0.0),
                 "why": None}
                for i, (osl, c) in enumerate((o, c) for o in osls for c in (1, 8, 16, 32, 64))]

    runs = pl.DataFrame(group(1, 0.85)  # falls with load: the artefact
                        + group(2, 0.02, growth=4.0)  # TTFT grows with load: replayable
                        + group(3, 0.85, osls=(512,))  # one output length: no evidence
                        + group(5, 0.3, growth=-0.5)  # falls, but b too small to be a wait
                        + [{**r, "why": "left out already"} for r in group(4, 0.85)])
    found = serving_artefacts.slope_artefacts(runs)
    # the TP1 group's rows at 1 < c <= 32 only: i = osl index * 5 + c index
    assert sorted(found) == [100 + 5 * o + k for o in range(3) for k in (1, 2, 3)]
    a, b, r2 = found[101]
    assert b == pytest.approx(0.85, abs=0.01) and a == pytest.approx(60, abs=1) and r2 > 0.99


def test_the_slope_rows_left_out_of_h100_silicon_are_the_llama_8b_trtllm_campaign(real_store):
    import numpy as np

    rows = real_store.sql("SELECT tp, isl, osl, coalesce(concurrency, batch_size), ttft_ms, "
                          "tpot_ms FROM serving_runs WHERE sku = 'h100_sxm' AND backend = "
                          "'trtllm' AND model_path LIKE '%Llama-3.1-8B%' AND mode = 'agg'")
    flagged = 0
    for tp, isl in {(r[0], r[1]) for r in rows}:
        g = np.array([r[2:] for r in rows if (r[0], r[1]) == (tp, isl) and 1 < r[3] <= 32], float)
        falls = all(g[(g[:, 0] == osl) & (g[:, 1] == g[g[:, 0] == osl, 1].max()), 2][0]
                    < g[(g[:, 0] == osl) & (g[:, 1] == g[g[:, 0] == osl, 1].min()), 2][0]
                    for osl in set(g[:, 0]))
        x = (g[:, 0] - 1) * g[:, 3] / (g[:, 1] - 1)
        slope, _ = np.polyfit(x, g[:, 2], 1)
        flagged += len(g) if falls and slope > 0.5 else 0
    card = real_store.sql("SELECT card FROM datasets WHERE name = 'h100_silicon'")[0][0]
    assert f"explain ({flagged}," in card and flagged == 63  # 7 of the campaign's 12 groups
    (total,) = real_store.sql("SELECT count(*) FROM serving_targets WHERE dataset = "
                              "'h100_silicon' AND backend = 'trtllm' AND model = 'llama-3.1-8b'")[0]
    assert total == 177 - flagged  # its other rows stay


TOY_MODEL = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
             "head_dim": 16, "intermediate_size": 128, "gated_mlp": True, "vocab_size": 1000,
             "tied_embeddings": False}


def test_a_decode_floor_is_the_bytes_a_step_reads_over_the_datasheet_bandwidth():
    """A small dense model, its floor recomputed from the shapes by hand, at TP 2 and at TP 4
    (fewer KV heads than GPUs: each GPU keeps one); the premise is the full length's KV."""
    from leaderboard.cells import serving_artefacts
    from leaderboard_core.specs import GpuSpec

    gpu = GpuSpec("toy", {"mem_bw_gbs": 1.0, "mem_gb": 1}, Path("toy.yaml"))
    # per GPU at TP 2, FP8 GEMM weights (1 byte): qkv (4 + 2 x 2) x 16 / 2 x 64, o 64 x 32,
    # gate_up 128 x 64, down 64 x 64; the LM head 1000 x 64 / 2 at 2 bytes
    weights = 2 * (64 * 64 + 64 * 32 + 128 * 64 + 64 * 64) + 1000 * 64 // 2 * 2
    # 3 requests at 100 + 40 / 2 tokens; per token 2 layers x K and V x 1 head x 16 x 2 bytes
    kv = 3 * (100 + 20) * 2 * 2 * 1 * 16 * 2
    floor = serving_artefacts.decode_floor_ms(TOY_MODEL, 2, "fp8", 3, 100, 40, gpu)
    assert floor == pytest.approx((weights + kv) / 1e9 * 1e3)
    # TP 4: qkv (4 / 4 + 2 x 1) x 16 x 64 (each GPU keeps one of the 2 KV heads whole, as
    # vLLM's QKV projection does), the others a quarter, LM head 1000 x 64 / 4 x 2; the KV the
    # same, one head per GPU
    quarter = 2 * (64 * 48 + 64 * 16 + 64 * 64 + 64 * 32) + 1000 * 64 // 4 * 2
    assert serving_artefacts.decode_floor_ms(TOY_MODEL, 4, "fp8", 3, 100, 40, gpu) == pytest.approx(
        (quarter + kv) / 1e6)
    # 0.9 GiB less weights (layers, LM head and embedding) holds N tokens of 128 bytes; the
    # premise counts isl + osl, so a load whose mean context fits and whose full one does not
    # gets no verdict
    tokens = (0.9 * 2**30 - (weights + 1000 * 64 // 2 * 2)) // 128
    assert serving_artefacts.decode_floor_ms(TOY_MODEL, 2, "fp8", 1, int(tokens) - 100, 99, gpu)
    assert serving_artefacts.decode_floor_ms(TOY_MODEL, 2, "fp8", 1, int(tokens) - 60, 99, gpu) is None


def test_runs_well_below_their_floor_take_their_campaign_out():
    """A TPOT under 95 % of its floor is found, one at 96 % is not, a load with no room gets
    no verdict, and a row left out already is not read; the campaign of a found row (its GPU,
    checkpoint, backend version and precision) goes with it, whatever its own TPOT."""
    from leaderboard.cells import serving_artefacts
    from leaderboard_core.specs import GpuSpec

    gpu = GpuSpec("toy", {"mem_bw_gbs": 1.0, "mem_gb": 1}, Path("toy.yaml"))
    floor = serving_artefacts.decode_floor_ms(TOY_MODEL, 2, "fp8", 3, 100, 40, gpu)

    def row(n: int, tpot: float, isl: int = 100, why: str | None = None,
            version: str = "1") -> dict:
        return {"row": n, "model": "toy", "model_path": "org/toy", "tp": 2, "precision": "fp8",
                "batch_size": 3, "isl": isl, "osl": 40, "sku": "toy", "backend": "vllm",
                "backend_version": version, "moe_ep": None, "tpot_ms": tpot, "why": why}

    runs = pl.DataFrame([row(1, 0.94 * floor), row(2, 0.96 * floor), row(3, 1e-6, isl=10**7),
                         row(4, 0.5 * floor, why="left out already"),
                         row(5, 2 * floor, version="2"), row(6, 0.0, version="3")])
    found = serving_artefacts.below_decode_floor(runs, {"toy": gpu}, {"toy": TOY_MODEL})
    assert list(found) == [1] and found[1] == pytest.approx(floor)  # a TPOT of 0 records none
    assert sorted(serving_artefacts.campaign_rows(runs, list(found))) == [1, 2, 3]


def test_an_moe_floor_counts_the_top_k_experts_only_where_every_gpu_holds_them():
    from leaderboard.cells import serving_artefacts

    models = load_models()
    dense, moe = models["qwen3-32b"], next(m for m in models.values() if "num_experts" in m)
    # Qwen3-32B at TP 1 in FP8: 64 x (10240 x 5120 + 5120 x 8192 + 51200 x 5120 + 5120 x 25600)
    # weight bytes and a BF16 LM head of 151936 x 5120
    expected = 64 * (10240 * 5120 + 5120 * 8192 + 51200 * 5120 + 5120 * 25600) \
        + 151936 * 5120 * 2
    assert serving_artefacts.streamed_weight_bytes(dense, 1, "fp8") == expected
    h, hd, tp = moe["hidden_size"], moe["head_dim"], 2
    two_dense = {**moe, "dense_layers": 2, "intermediate_size": 1024, "gated_mlp": True}
    attention = ((moe["num_heads"] + 2 * moe["num_kv_heads"]) * hd * h + h * moe["num_heads"] * hd) / tp
    ffn = (2 * 1024 * h + h * 1024) / tp
    experts = (moe["experts_per_token"] + moe["shared_experts"]) * 3 * h * (
        moe["moe_intermediate_size"] // tp)
    head = moe["vocab_size"] * h * 2 / tp
    layers = moe["num_layers"]
    assert serving_artefacts.streamed_weight_bytes(two_dense, tp, "bf16") == pytest.approx(
        2 * (layers * attention + 2 * ffn + (layers - 2) * experts) + head)
    # experts spread whole over the GPUs: none counted
    assert serving_artefacts.streamed_weight_bytes(two_dense, tp, "bf16", moe_ep=2) == pytest.approx(
        2 * (layers * attention + 2 * ffn) + head)


def test_the_campaign_below_the_decode_floor_is_left_out_of_its_set(real_store):
    """Every usable silicon run's floor, recomputed from its row and the model's shapes: the
    runs below it are the two Qwen3-32B FP8 runs of vLLM 0.12.0 on the H100 (TP1 c = 24, TP2
    c = 48), and no target holds any run of their campaign."""
    import duckdb

    from leaderboard.cells import serving_targets

    gpus, models = load_gpu_specs(), load_models()
    with duckdb.connect(str(real_store.path), read_only=True) as con:
        rows = con.sql("SELECT * FROM serving_runs").pl().to_dicts()
    targets = {r[0] for r in real_store.sql("SELECT target_id FROM serving_targets")}
    below = []
    for r in rows:
        if serving_targets.exclusion(r, gpus, models) is not None or not r["tpot_ms"] or r["osl"] < 2:
            continue
        m, gpu, c, tp = models[r["model"]], gpus[r["sku"]], r["batch_size"], r["tp"]
        if "num_experts" in m:
            continue  # MoE floors are further from every measured TPOT than any dense one
        width = 2 * m["intermediate_size"] if m["gated_mlp"] else m["intermediate_size"]
        per_layer = ((m["num_heads"] + 2 * m["num_kv_heads"]) * m["head_dim"] * m["hidden_size"]
                     + m["hidden_size"] * m["num_heads"] * m["head_dim"]
                     + (width + m["intermediate_size"]) * m["hidden_size"]) / tp
        gemm_bytes = {"bf16": 2, "fp8": 1}[r["precision"]]
        head = m["vocab_size"] * m["hidden_size"] * 2 / tp
        per_token = m["num_layers"] * 2 * max(m["num_kv_heads"] // tp, 1) * m["head_dim"] * 2
        held = (m["num_layers"] * per_layer * gemm_bytes
                + (1 if m.get("tied_embeddings") else 2) * head + c * (r["isl"] + r["osl"]) * per_token)
        if held > 0.9 * gpu["mem_gb"] * 2**30:
            continue
        floor = (m["num_layers"] * per_layer * gemm_bytes + head
                 + c * (r["isl"] + r["osl"] / 2) * per_token) / (gpu["mem_bw_gbs"] * 1e6)
        if r["tpot_ms"] < 0.95 * floor:
            below.append(r)
    assert sorted((r["sku"], r["model"], r["backend_version"], r["tp"], r["batch_size"])
                  for r in below) == [("h100_sxm", "qwen3-32b", "0.12.0", 1, 24),
                                      ("h100_sxm", "qwen3-32b", "0.12.0", 2, 48)]
    campaign = [r["run_id"] for r in rows if r["mode"] == "agg" and (
        r["sku"], r["model_path"], r["backend_version"], r["precision"]) == (
        "h100_sxm", "Qwen/Qwen3-32B", "0.12.0", "fp8")]
    assert len(campaign) == 3 and not set(campaign) & targets
    card = real_store.sql("SELECT card FROM datasets WHERE name = 'h100_silicon_fp8'")[0][0]
    assert "decode step (3 rows, in the coverage" in card


def test_the_bracket_split_adds_up_to_the_headline_ttft_mape():
    """Three closed loops, one inside the bracket, one above, one below: each side's points
    of MAPE and distance, by hand."""
    from leaderboard.present import serving_oracle as report_oracle

    ends = {"in": (100.0, 150.0, 80.0), "up": (200.0, 150.0, 100.0), "down": (50.0, 100.0, 80.0)}
    rows = pl.DataFrame([{"dataset": "d", "workload_id": w, "gt_ms": gt, "phase": phase,
                          "pred_ms": pred, "signed_pct": (pred - gt) / gt * 100}
                         for w, (gt, lock, steady) in ends.items()
                         for phase, pred in (("ttft", lock), ("ttft_steady", steady))])
    lines = report_oracle.bracket_split(rows)
    # errors 50, 25 and 100 % over 3 targets; above: 200 against 150, below: 50 against 80
    assert "| d | 3 | 58.3 | 1: 16.7 | 1: 8.3 (25.0 % off) | 1: 33.3 (60.0 % off) |" in lines
    assert report_oracle.inside_bracket(rows)["d"] == (3, pytest.approx(100 / 3),
                                                       pytest.approx((25 + 60) / 3))


def test_what_stops_the_oracle_reads_the_missing_tpot_per_client_and_the_misses(tmp_path):
    """Synthetic oracle rows: the engine's TPOT is the oracle's plus 0.1 ms per client (100 µs a
    client), its TTFT 20 % above: the table reads that back and names both goals missed."""
    from leaderboard.present import serving_oracle as report_oracle

    def what_stops_the_oracle(rows):  # without the benchmarks' files
        return report_oracle.what_stops_the_oracle(rows, tmp_path / "no", tmp_path / "no",
                                                   tmp_path / "no", tmp_path / "no")

    c = np.array([8, 16, 64, 128])
    tpot_pred, ttft_pred = 10.0 + 0 * c, 100.0 + 0 * c
    rows = pl.DataFrame({
        "dataset": "h100_silicon", "backend": "vllm", "model": "qwen3-32b", "tp": 2, "isl": 1024,
        "concurrency": np.tile(c, 2), "workload_id": np.tile(np.arange(4), 2),
        "phase": ["tpot"] * 4 + ["ttft"] * 4,
        "pred_ms": np.concatenate([tpot_pred, ttft_pred]),
        "gt_ms": np.concatenate([tpot_pred + 0.1 * c, ttft_pred * 1.25])})
    rows = rows.with_columns(signed_pct=(pl.col("pred_ms") / pl.col("gt_ms") - 1) * 100)
    text = "\n".join(what_stops_the_oracle(rows))
    row = next(line for line in text.splitlines() if line.startswith("| h100_silicon | vllm"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[2] == "4" and cells[4] == "-20.0"  # 100 / 125 - 1
    assert cells[7] == "0.80 / 12.80" and cells[8] == "100.0"
    assert cells[9:] == ["—", "—"]  # no steady-state rows
    assert "TTFT 20.0 % against 12 %" in text and "missed" in text
    # the measured TTFT 5 ms + 2 ms a client above the steady state's: 21 at c 8, 261 at 128
    steady = rows.filter(phase="ttft").with_columns(
        phase=pl.lit("ttft_steady"), pred_ms=pl.col("gt_ms") - 5.0 - 2.0 * pl.col("concurrency"))
    text = "\n".join(what_stops_the_oracle(pl.concat([rows, steady], how="vertical_relaxed")))
    row = next(line for line in text.splitlines() if line.startswith("| h100_silicon | vllm"))
    assert [x.strip() for x in row.strip("|").split("|")][9:] == ["21.00 / 261.00", "2.0"]
    # a second model at the high loads only, with a constant gap: pooled over both, the line
    # would tilt; per (model, TP, isl), the first model's 100 µs and the second's 0 give 50
    other = pl.DataFrame({
        "dataset": "h100_silicon", "backend": "vllm", "model": "llama-3.1-8b", "tp": 2,
        "isl": 1024, "concurrency": [64, 128, 64, 128], "workload_id": [4, 5, 4, 5],
        "phase": ["tpot"] * 2 + ["ttft"] * 2,
        "pred_ms": [10.0, 10.0, 100.0, 100.0], "gt_ms": [30.0, 30.0, 125.0, 125.0]}).with_columns(
        signed_pct=(pl.col("pred_ms") / pl.col("gt_ms") - 1) * 100)
    text = "\n".join(what_stops_the_oracle(pl.concat([rows, other], how="vertical_relaxed")))
    row = next(line for line in text.splitlines() if line.startswith("| h100_silicon | vllm"))
    assert [x.strip() for x in row.strip("|").split("|")][8] == "50.0"


def test_a_recorded_arrivals_oracle_is_read_without_loads_and_with_its_service_time(tmp_path):
    """Recorded arrivals (no concurrency, a prompt length per request): no gap by load, and the
    verdict gives the service time's error, here 20 % and 40 % short: mean 30, median -30; with
    the light-kernel benchmark's JSON, the line ends with what its own GPU's kernels give."""
    from leaderboard.present import serving_oracle as report_oracle

    rows = pl.DataFrame({
        "dataset": "rtx4090_serving", "backend": "vllm", "model": "llama-3.1-8b", "tp": 1,
        "isl": [100, 900] * 3, "concurrency": pl.Series([None] * 6, dtype=pl.Int64),
        "workload_id": [0, 1] * 3, "phase": ["ttft"] * 2 + ["tpot"] * 2 + ["service"] * 2,
        "pred_ms": [1000.0, 2000.0, 10.0, 10.0, 80.0, 60.0],
        "gt_ms": [1000.0, 2000.0, 10.0, 10.0, 100.0, 100.0]}).with_columns(
        signed_pct=(pl.col("pred_ms") / pl.col("gt_ms") - 1) * 100)
    text = "\n".join(report_oracle.what_stops_the_oracle(rows, tmp_path / "no", tmp_path / "no",
                                                         tmp_path / "no", tmp_path / "no"))
    row = next(line for line in text.splitlines() if line.startswith("| rtx4090_serving | vllm"))
    assert [x.strip() for x in row.strip("|").split("|")][7:] == ["—"] * 4
    assert "`rtx4090_serving` (recorded arrivals, not held to the `_silicon` goal): TTFT and " \
           "TPOT within its thresholds" in text and "met" not in text
    assert "service time (first token minus first scheduled, TTFT without the queue) is 30.0 % " \
           "MAPE, signed median -30.0 %" in text
    light = tmp_path / "light.json"
    light.write_text(json.dumps({"rows": [{
        "dataset": "rtx4090_serving", "backend": "all", "n": 300, "sampling_added": 300,
        "light_source": "llmservingsim rtx4090", "sampler_source": "rtx4090",
        **{f"{name}_{metric}": value for name, shift in (("headline", 0.0), ("light", -2.0),
                                                         ("sampled", -2.5))
           for metric, value in (("ttft_mape", 8.0 + shift), ("tpot_mape", 5.0 + shift),
                                 ("tpot_signed_median", -3.0 - shift))}}]}))
    text = "\n".join(report_oracle.what_stops_the_oracle(rows, tmp_path / "no", tmp_path / "no",
                                                         light, tmp_path / "no"))
    line = next(x for x in text.splitlines() if x.startswith("`rtx4090_serving`"))
    assert ("MAPE, signed median -30.0 %. Measured: the light kernels (llmservingsim rtx4090) "
            "added to every step (`benchmarks/light_kernels.py`) give 6.0 % TTFT and 3.0 % TPOT "
            "against 8.0 % and 5.0 %") in line
    assert line.endswith("the rtx4090 sampler on 300 of its 300 targets too 5.5 % and 2.5 %.")


def test_the_bracket_counts_measured_ttfts_between_lockstep_and_steady_state():
    """Three closed-loop targets with both bounds (lockstep 8, steady 5 ms): measured 6 lies
    between them, 9 above, 4 below: one in three, off the bracket by 0, 1/9 and 1/4 of the
    measured. A target without its steady row is not counted."""
    from leaderboard.present.serving_oracle import inside_bracket

    rows = pl.DataFrame({
        "dataset": "h200_silicon_fp8", "workload_id": ["a", "b", "c", "a", "b", "c", "d"],
        "phase": ["ttft"] * 3 + ["ttft_steady"] * 3 + ["ttft"],
        "gt_ms": [6.0, 9.0, 4.0, 6.0, 9.0, 4.0, 6.0],
        "pred_ms": [8.0, 8.0, 8.0, 5.0, 5.0, 5.0, 8.0]})
    n, share, off = inside_bracket(rows)["h200_silicon_fp8"]
    assert n == 3 and share == pytest.approx(100 / 3)
    assert off == pytest.approx(100 * (0 + 1 / 9 + 1 / 4) / 3)
    # the bracket is the interval either way round
    flipped = rows.with_columns(pred_ms=pl.when(pl.col("phase") == "ttft").then(5.0).otherwise(8.0))
    assert inside_bracket(flipped)["h200_silicon_fp8"] == (3, pytest.approx(100 / 3),
                                                           pytest.approx(off))
    assert inside_bracket(rows.filter(pl.col("phase") == "ttft")) == {}


def test_the_closed_loop_lengths_table_shows_each_length_and_the_best_per_set(tmp_path):
    """Two sets, lengths (4, 0) (4, 2) (10, 0) (10, 2): a length the benchmark did not replay
    shows as a dash; the best length per set is the lowest TTFT MAPE over every backend
    together, the shorter loop on a tie, and is within the goal only at 12 % or less."""
    from leaderboard.present.serving_unknowns import closed_loop_lengths

    def row(dataset, backend, waves, dropped, ttft, tpot=5.0, n=3):
        return {"dataset": dataset, "backend": backend, "waves": waves, "dropped": dropped,
                "n": n, "ttft_mape": ttft, "tpot_mape": tpot}

    bench = {"waves": [4, 10], "dropped": [0, 2], "seconds": 1.0, "code_version": "abc",
             "date": "2026-12-03", "rows": [
                 row("b_set", "all", 4, 0, 30.0), row("b_set", "all", 10, 0, 11.0),
                 row("b_set", "all", 10, 2, 11.0), row("b_set", "vllm", 10, 0, 11.0, n=2),
                 row("a_set", "all", 4, 0, 50.0), row("a_set", "all", 4, 2, 40.0, 9.0),
                 row("a_set", "all", 10, 0, 45.0), row("a_set", "all", 10, 2, 41.0)]}
    path = tmp_path / "waves.json"
    assert "No closed-loop length benchmark" in closed_loop_lengths(path)[0]
    path.write_text(json.dumps(bench))
    lines = closed_loop_lengths(path)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines
            if line.startswith("| ") and not line.startswith(("| dataset", "| ---"))]
    assert [r[:3] for r in rows] == [["a_set", "all", "3"], ["b_set", "all", "3"],
                                     ["b_set", "vllm", "2"]]
    assert rows[1][3:] == ["30.0 / 5.0", "—", "11.0 / 5.0", "11.0 / 5.0"]
    assert rows[2][3:] == ["—", "—", "11.0 / 5.0", "—"]
    best = [line for line in lines if line.startswith("- ")]
    assert best == ["- `a_set`: at best 40.0 % TTFT, 9.0 % TPOT (4 waves, first 2 dropped), "
                    "outside the 12 % TTFT goal.",
                    "- `b_set`: at best 11.0 % TTFT, 5.0 % TPOT (10 waves), within the 12 % "
                    "TTFT goal."]


@pytest.mark.slow
@pytest.mark.long
def test_a_serving_card_ends_with_its_current_oracle_runs_error(store_home, tmp_path):
    """``data card`` of a serving set: before an oracle run it names the command; after one,
    it states the oracle's TTFT MAPE, the mean over the run's own predictions recomputed here;
    a set with no step set of its GPU and precision says it has no oracle."""
    from leaderboard import data

    runs = tmp_path / "runs"
    where = {"sources_root": None, "gpu_specs": None}
    before = data.card("gb200_silicon", runs, **where)
    assert ("No current oracle run of gb200_silicon" in before
            and "dataset.home=gb200_vidur split.home_points=every_shape" in before)
    result = run(RunSpec("table_scaled", "gb200_silicon", {}, runs_dir=runs,
                         home="gb200_vidur", home_points="every_shape"))
    assert result.metrics["valid"]
    ttft = result.predictions.filter(pl.col("phase") == "ttft")
    mape = float((abs(ttft["pred_ms"] / ttft["gt_ms"] - 1)).mean() * 100)
    after = data.card("gb200_silicon", runs, **where)
    row = next(line for line in after.splitlines() if line.startswith("| gb200_silicon | 2 |"))
    assert [x.strip() for x in row.strip("|").split("|")][2] == f"{mape:.1f}"
    assert "has no oracle" in data.card("b200_silicon_fp8", runs, **where)


def test_vllms_host_time_is_vidurs_cpu_overhead_fitted_over_its_rows(real_store):
    """The yaml's vLLM host time per step: least squares of the sum of the four CPU parts
    Vidur's simulator adds to a step over every (model, TP, batch size) of its profile,
    recomputed from the store's cpu_overheads table; SGLang and TRT-LLM state none."""
    from leaderboard.serving.simulate import load_conf

    parts = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs")
    rows = real_store.sql(
        "SELECT batch_size, sum(latency_ms), count(*) FROM cpu_overheads WHERE source = 'vidur' "
        f"AND op IN {parts} GROUP BY model, tp, batch_size")
    assert len(rows) == 72 and {n for *_, n in rows} == {4}
    x = np.array([r[0] for r in rows], np.float64)
    y = np.array([r[1] for r in rows])
    design = np.stack([np.ones_like(x), x], axis=1)
    (base, per_request), *_ = np.linalg.lstsq(design, y, rcond=None)
    conf = load_conf()["backends"]
    assert conf["vllm"]["host_time"]["base_ms"] == pytest.approx(base, abs=5e-4)
    assert conf["vllm"]["host_time"]["per_request_ms"] == pytest.approx(per_request, abs=5e-5)
    assert "base_ms" not in conf["sglang"]["host_time"]
    assert "base_ms" not in conf["trtllm"]["host_time"]


def test_every_backend_states_its_host_time_and_when_its_engine_overlaps_it():
    """Each backend's yaml entry says what a step's host time is (measured, or none) and from
    which version its engine overlaps host work with the GPU, each with a source: a backend
    added without them would be replayed with a host time nobody chose."""
    from leaderboard.serving.simulate import load_conf
    from leaderboard_core.versioning import release

    for name, backend in load_conf()["backends"].items():
        host = backend["host_time"]
        assert ("base_ms" in host) == ("per_request_ms" in host) == ("source" in host), name
        assert release(host["overlapped"]["from_version"]) is not None, name
        assert len(host["overlapped"]["source"]) > 40, name


@pytest.mark.parametrize(("backend", "version", "host"), [
    ("vllm", "0.12.0", "added"), ("vllm", "0.13.1", "added"), ("vllm", "unknown", "added"),
    ("vllm", None, "added"), ("vllm", "0.14.0rc1", "overlapped"), ("vllm", "0.14.0", "overlapped"),
    ("vllm", "0.19.0", "overlapped"), ("sglang", "0.5.1.post1", "none"),
    ("trtllm", "1.0.0rc3", "none")])
def test_a_step_pays_host_time_unless_its_engine_overlaps_it(backend, version, host):
    """A vLLM step before 0.14.0, or of an unrecorded version, adds Vidur's 1.422 ms + 0.0416
    ms per request. From 0.14.0 vLLM schedules asynchronously by default (release notes, PR
    27614): a step takes the longer of its GPU time and that host time. SGLang and TRT-LLM
    have no measured host time (and run overlap schedulers): their steps add none. The
    predicate the light-kernel benchmark reads says the same."""
    from leaderboard.serving.simulate import host_time_added, with_host_time

    requests = np.array([1, 8, 64, 512])  # 512 requests: 22.7 ms of host time, over a 10 ms step
    timed = with_host_time(lambda c: np.full(len(c), 10.0), backend, version)
    measured = 1.422 + 0.0416 * requests
    expected = {"added": 10.0 + measured, "overlapped": np.maximum(10.0, measured),
                "none": np.full(4, 10.0)}[host]
    np.testing.assert_allclose(timed(pl.DataFrame({"num_requests": requests})), expected)
    assert host_time_added(backend, version) is (host == "added")



def test_a_home_of_wall_clock_steps_gets_no_host_time_from_the_replay(monkeypatch):
    """A predictor fitted on wall-clock steps predicts the host's time with the GPU's: the
    replay adds the engine's host time only to a home of GPU-block times, never twice."""
    from leaderboard.serving import simulate
    from leaderboard.serving.scoring import home_times_host

    assert home_times_host(pl.DataFrame({"gt_kind": ["wall_clock"] * 2}))
    assert not home_times_host(pl.DataFrame({"gt_kind": ["gpu_block", "wall_clock"]}))
    assert not home_times_host(pl.DataFrame())
    monkeypatch.setattr(simulate, "policy_for", lambda *args: None)
    first = {"load": "recorded", "backend": "vllm", "backend_version": "0.12.0", "run": "r",
             "model": "m", "tp": 1, "gemm_dtype": "bf16"}
    cells = pl.DataFrame({"num_requests": np.array([1, 64])})

    def gpu_ms(c):
        return np.full(len(c), 10.0)

    _, block_home = simulate.run_engine(first, {"m": {}}, None, gpu_ms)
    _, wall_home = simulate.run_engine(first, {"m": {}}, None, gpu_ms, host_in_steps=True)
    np.testing.assert_allclose(block_home(cells), 10.0 + 1.422 + 0.0416 * np.array([1, 64]))
    np.testing.assert_allclose(wall_home(cells), 10.0)

def test_the_serving_ranking_pairs_one_deployment_on_two_gpus_only():
    """A load measured with vLLM on H200 and B200 is one pair; TRT-LLM's run of the same model,
    precision, TP and load on B200 pairs with nothing (another engine), nor does an
    expert-parallel run beside a split one. Measured B200 faster; one predictor says so (correct),
    the other says H200 (wrong)."""
    from leaderboard.present.serving_section import sku_ranking

    load = {"model": "llama-3.1-70b", "precision": "fp8", "tp": 2, "isl": 1024, "osl": 1024,
            "concurrency": 8, "phase": "tpot", "valid": True, "split": "unseen"}
    rows = []
    for predictor, b200_pred in (("right", 8.0), ("wrong", 12.0)):
        rows += [{**load, "predictor": predictor, "sku": "h200_sxm", "backend": "vllm",
                  "moe_ep": None, "gt_ms": 10.0, "pred_ms": 10.0},
                 {**load, "predictor": predictor, "sku": "b200_sxm", "backend": "vllm",
                  "moe_ep": None, "gt_ms": 7.0, "pred_ms": b200_pred},
                 {**load, "predictor": predictor, "sku": "b200_sxm", "backend": "trtllm",
                  "moe_ep": None, "gt_ms": 20.0, "pred_ms": 5.0},
                 {**load, "predictor": predictor, "sku": "gb200", "backend": "vllm",
                  "moe_ep": 2, "gt_ms": 30.0, "pred_ms": 1.0}]
    text = "\n".join(sku_ranking(pl.DataFrame(rows)))
    assert "Loads measured on more than one GPU: 1." in text and ": 0 such." in text
    assert "| right | 1 | 1 | 1 | 0 | 0 |" in text and "| wrong | 1 | 1 | 0 | 1 | 0 |" in text
    # B200 ran the load again at another vLLM version (measured 9, predicted 8 by both): one
    # B200 result at the means (8 measured; 8 and 10 predicted), still one pair each
    again = [{**r, "gt_ms": 9.0, "pred_ms": 8.0} for r in rows
             if r["sku"] == "b200_sxm" and r["backend"] == "vllm"]
    text = "\n".join(sku_ranking(pl.DataFrame(rows + again)))
    assert "Loads measured on more than one GPU: 1." in text and ": 1 such." in text
    assert "| right | 1 | 1 | 1 | 0 | 0 |" in text and "| wrong | 1 | 1 | 0 | 0 | 1 |" in text


def test_every_shape_is_refused_to_any_predictor_but_the_oracles():
    """``every_shape`` pools every precision of a GPU's tables; a predictor that does not key
    them by dtype would fit bf16 and FP8 kernels as one, so the run is refused up front."""
    from leaderboard.run.run_inputs import load_inputs

    with pytest.raises(ValueError, match="every_shape is the serving oracle's .*run predictor=rf "
                                         "with split.home_points=full_grid"):
        load_inputs(RunSpec("rf", "h100_silicon", {}, home="h100_vidur", home_points="every_shape"))


def test_the_frontend_reading_adds_the_sourced_time_to_vllm_closed_loops_only():
    """vLLM closed loops: lockstep 100 and steady 80 ms against a measured 110; the reading adds
    8.4 and 12.2 ms to each. An SGLang load and a run of recorded arrivals stay out of it."""
    from leaderboard.present.serving_oracle import FRONTEND_MS, frontend_reading

    assert FRONTEND_MS == (8.4, 12.2)
    rows = pl.DataFrame({
        "dataset": "h100_silicon", "backend": ["vllm", "vllm", "sglang", "vllm"],
        "concurrency": pl.Series([8, 8, 8, None], dtype=pl.Int64),
        "phase": ["ttft", "ttft_steady", "ttft", "ttft"],
        "pred_ms": [100.0, 80.0, 10.0, 10.0], "gt_ms": [110.0, 110.0, 110.0, 110.0]})
    row = next(line for line in frontend_reading(rows) if line.startswith("| h100_silicon"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    lockstep = " / ".join(f"{abs(p / 110 - 1) * 100:.1f}" for p in (100.0, 108.4, 112.2))
    steady = " / ".join(f"{abs(p / 110 - 1) * 100:.1f}" for p in (80.0, 88.4, 92.2))
    assert cells == ["h100_silicon", "1", lockstep, steady] == [
        "h100_silicon", "1", "9.1 / 1.5 / 2.0", "27.3 / 19.6 / 16.2"]
    assert frontend_reading(rows.filter(pl.col("backend") == "sglang")) == []


def test_an_unknown_kv_cache_dtype_names_the_key_and_the_known_ones():
    conf = copy.deepcopy(simulate.load_conf())
    conf["simulation"]["kv_cache_dtype"] = "fp4"
    with pytest.raises(ValueError, match=r"simulation.kv_cache_dtype in .*schedulers.yaml: 'fp4' "
                                         r"is none of \['bfloat16', 'float16', 'fp8', 'int8'\]"):
        simulate.kv_capacity(load_models()["llama-3.1-8b"], 1, load_gpu_specs()["h100_sxm"], 0.9,
                             conf)
    with pytest.raises(ValueError, match=r"with_kv_cache: 'fp4' is none of"):
        simulate.with_kv_cache(lambda cells: np.ones(len(cells)), "fp4")


def test_the_headline_replays_the_cache_the_tables_read_when_a_step_names_none():
    """The yaml's cache is the default one (a 16-bit cache whose steps name no dtype), so the
    headline's steps read the very attention points the step sets' cells are built from."""
    from leaderboard_core.specs import DEFAULT_KV_DTYPE, SIXTEEN_BIT_KV

    assert simulate.kv_cache_dtype(simulate.load_conf()) == DEFAULT_KV_DTYPE
    assert DEFAULT_KV_DTYPE in SIXTEEN_BIT_KV


def test_a_sixteen_bit_kv_cache_leaves_the_step_timer_as_it_is():
    """The headline's BF16 cache (and a float16 one) hands the predictor the very timer, so its
    steps carry no ``kv_dtype``; an FP8 cache names it on every step."""
    seen = []

    def timer(cells):
        seen.append(cells.columns)
        return np.ones(len(cells))

    assert simulate.with_kv_cache(timer, "bfloat16") is timer
    assert simulate.with_kv_cache(timer, "float16") is timer
    simulate.with_kv_cache(timer, "fp8")(pl.DataFrame({"num_requests": [1, 2]}))
    assert seen == [["num_requests", "kv_dtype"]]
