"""SGLang's estimated-output admission and retraction (kv_rule ``estimated``), against schedules
recomputed by hand on tiny engines (prompts 30, outputs 40, token budget 30: one prompt a step)."""

from __future__ import annotations

import numpy as np
import pytest

from leaderboard.serving.replay import new_engine
from leaderboard.serving.scheduler import Policy, StepLog


def _run(policy, prompt, output, arrivals=None, max_steps=None):
    """Schedule to the end; ``arrivals``: {step: [requests]} (default: all at step 0)."""
    arrivals = arrivals or {0: list(range(len(prompt)))}
    engine, log = new_engine(policy, np.array(prompt), np.array(output)), StepLog()
    pending = sorted(arrivals)
    while pending or engine.busy:
        while pending and pending[0] <= log.steps:
            for r in arrivals[pending.pop(0)]:
                engine.arrive(r)
        if not engine.busy:
            continue
        until = pending[0] - log.steps if pending else 10**9
        engine.step(log, until if max_steps is None else min(until, max_steps))
    return engine, log.arrays()


def _entries(a, req):
    """(step, q, ctx) of every entry of ``req``."""
    m = a["req"] == req
    return list(zip(a["step"][m].tolist(), a["q"][m].tolist(), a["ctx"][m].tolist(), strict=True))


def _decodes(first_step, ctx0, n):
    return [(first_step + i, 1, ctx0 + i) for i in range(n)]


def test_estimated_admits_what_reserve_refuses():
    """kv 130. Reserve: 70 + 70 > 130, so request 1 waits until request 0 ends (its 39 decodes
    are steps 1-39) and is prefilled at step 40. Estimated: at step 1 request 0 holds 30 KV
    tokens and reserves (40 - 1 outputs) x 0.7 = 27.3, leaving 72.7 > 30 + 40: request 1 is
    prefilled at step 1, then both decode from step 2 (request 0 from ctx 30) until the KV runs
    out at step 37 and request 1 is retracted."""
    est, a = _run(Policy("prefill_first", 30, 16, 130, "estimated"), [30, 30], [40, 40])
    assert _entries(a, 1)[0] == (1, 30, 0)
    assert _entries(a, 0) == [(0, 30, 0)] + _decodes(2, 30, 39)
    res, b = _run(Policy("prefill_first", 30, 16, 130, "reserve"), [30, 30], [40, 40])
    assert _entries(b, 1)[0] == (40, 30, 0)
    # one token less of KV and the estimate refuses too: 129 - 30 - 27.3 = 71.7 > 70 still
    # admits; 127 - 57.3 = 69.7 < 70 refuses until request 0 ends
    _, c = _run(Policy("prefill_first", 30, 16, 127, "estimated"), [30, 30], [40, 40])
    assert _entries(c, 1)[0] == (40, 30, 0)
    # the optimism costs a retraction at step 37 (see test_retraction_when_kv_runs_out)
    assert (est.preemptions, res.preemptions) == (1, 0)


@pytest.mark.parametrize("max_steps", [None, 1])
def test_retraction_when_kv_runs_out(max_steps):
    """kv 130, three requests. Step 0 prefills 0; step 1 admits 1 (72.7 > 70) after which the
    estimate is spent (130 - 30 - 27.3 - 70 < 0: admission stops, request 2 waits). Both decode
    from step 2 at 2 tokens a step from 60 held: at step 2 + 35 = 37 the 130 tokens are full, so
    step 37 retracts. Equal outputs (36) and prompts: the later admitted (1) goes, freeing 65 >=
    20 tokens for the one left; SGLang appends it to the waiting queue: [2, 1]. Ratio after:
    min(1, (36 + 20) / 40) = 1. Step 37 decodes 0 alone (ctx 65); step 38 tries 2: 130 - 66 -
    (40 - 37) x 1 = 61 <= 70, refused; 0 ends after step 40 (ctx 68). Step 41 prefills 2 (the
    engine empty), which decodes steps 42-80 while 1 (105 > 130 - 30 - 27.3) waits. Step 81
    recomputes 1's 65 tokens from scratch in chunks 30, 30, 5 (steps 81-83), then it decodes
    ctx 65-68 (steps 84-87). Decode runs or single steps give the same schedule."""
    e, a = _run(Policy("prefill_first", 30, 16, 130, "estimated"), [30] * 3, [40] * 3,
                max_steps=max_steps)
    assert e.preemptions == 1
    assert _entries(a, 0) == [(0, 30, 0)] + _decodes(2, 30, 39)
    assert _entries(a, 1) == ([(1, 30, 0)] + _decodes(2, 30, 35)
                              + [(81, 30, 0), (82, 30, 30), (83, 5, 60)] + _decodes(84, 65, 4))
    assert _entries(a, 2) == [(41, 30, 0)] + _decodes(42, 30, 39)
    assert int(a["step"].max()) == 87
    # KV never exceeds the capacity: tokens held after each step
    held = np.zeros(3, np.int64)
    for s in range(88):
        m = a["step"] == s
        for r, q, c in zip(a["req"][m], a["q"][m], a["ctx"][m], strict=True):
            held[r] = c + q
        held[0] = 0 if s > 40 else held[0]  # finished
        held[1] = 0 if 37 <= s < 81 else held[1]  # retracted
        held[2] = 0 if s > 80 else held[2]  # finished
        assert held.sum() <= 130


def test_ratio_decay_moves_admission():
    """Request 0 alone, request 1 arrives at step 10 (request 0: 30 + 9 KV tokens, 10 outputs,
    9 decode steps so far). With a decay of 0.01 a step the ratio is 0.7 - 0.09 = 0.61: 129 -
    39 - 30 x 0.61 = 71.7 > 70, admitted at step 10. Without decay (0.7): 129 - 39 - 21 = 69
    <= 70, refused, and not tried again until request 0 ends after step 39: prefilled at step
    40. The floor: a decay of 0.1 reaches 0.7 x 0.14 = 0.098 after 7 steps; at step 10 then
    129 - 39 - 30 x 0.098 = 87.06 > 70; with 108 KV tokens 108 - 39 - 2.94 = 66.06 refuses
    (the floor holds the ratio up: at 0.7 - 0.9 < 0 it would admit)."""
    def join(kv, decay):
        engine = new_engine(Policy("prefill_first", 30, 16, kv, "estimated"), np.array([30, 30]),
                        np.array([40, 40]))
        engine.ratio_decay = decay
        log = StepLog()
        engine.arrive(0)
        while engine.busy or log.steps < 10:
            if log.steps == 10:
                engine.arrive(1)
            engine.step(log, 10 - log.steps if log.steps < 10 else 10**9)
        a = log.arrays()
        return _entries(a, 1)[0][0], engine

    assert join(129, 0.01)[0] == 10
    assert join(129, 0.0)[0] == 40
    assert join(129, 0.1)[0] == 10
    step, engine = join(108, 0.1)
    assert step == 40 and engine.min_ratio == pytest.approx(0.098)
    # SGLang's own constants: 0.7, floor 0.7 x 0.14 = 0.098, (0.7 - 0.098) / 600 a step
    assert engine.init_ratio == 0.7
    assert new_engine(Policy("prefill_first", 30, 16, 108, "estimated"), np.array([1]),
                  np.array([1])).ratio_decay == pytest.approx(0.602 / 600)


def test_reserve_and_on_demand_unchanged():
    """Reserve, prefill_first, kv 130, budget 30: request 0 at step 0, its decodes steps 1-39;
    request 1 (70 + 70 > 130) at step 40, decodes 41-79. On-demand, chunked_mixed, kv 70,
    budget 64: both prompts at step 0 (60 tokens), decodes steps 1-5 reach 70; at step 6
    request 0's token does not fit, so request 1 (35 tokens) is preempted and step 6 decodes 0
    alone; 1 (35 to recompute) never fits beside 0 (37 + 35 > 70) until 0 ends after step 39;
    step 40 recomputes 35 tokens, decodes steps 41-74."""
    _, a = _run(Policy("prefill_first", 30, 16, 130, "reserve"), [30, 30], [40, 40])
    assert _entries(a, 0) == [(0, 30, 0)] + _decodes(1, 30, 39)
    assert _entries(a, 1) == [(40, 30, 0)] + _decodes(41, 30, 39)
    e, b = _run(Policy("chunked_mixed", 64, 16, 70, "on_demand"), [30, 30], [40, 40])
    assert e.preemptions == 1
    assert _entries(b, 0) == [(0, 30, 0)] + _decodes(1, 30, 39)
    assert _entries(b, 1) == [(0, 30, 0)] + _decodes(1, 30, 5) + [(40, 35, 0)] + _decodes(41, 35, 34)


def test_estimated_needs_prefill_first():
    with pytest.raises(ValueError, match="prefill_first"):
        Policy("chunked_mixed", 30, 16, 100, "estimated")
