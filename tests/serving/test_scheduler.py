"""The replay's scheduler, worked by hand: toy loads, bursts, closed loops, preemption and
admission, and every token scheduled once."""

from __future__ import annotations

import gc

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leaderboard.serving.replay import closed_loop, recorded_arrivals, step_cells, step_times
from leaderboard.serving.scheduler import Engine, Policy, StepLog
from leaderboard_core.specs import load_gpu_specs, load_models

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
    from leaderboard.cells.common import schedulers_conf
    from leaderboard.serving.simulate import predict_targets

    target = two_clients_of_vllm("0.12.0")
    ttft, tpot, service, steady, _ = predict_targets(
        target, load_models(), load_gpu_specs()["h100_sxm"],
        lambda cells: cells["total_tokens"].to_numpy().astype(np.float64))
    host = schedulers_conf()["backends"]["vllm"]["host_time"]
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
    from leaderboard.cells.common import schedulers_conf
    from leaderboard.serving.simulate import predict_targets

    target = two_clients_of_vllm("0.19.0")
    ttft, tpot, *_ = predict_targets(
        target, load_models(), load_gpu_specs()["h100_sxm"],
        lambda cells: 0.25 * cells["total_tokens"].to_numpy().astype(np.float64))
    host = schedulers_conf()["backends"]["vllm"]["host_time"]
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
