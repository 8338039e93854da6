"""One static batch run offline, end to end: the e2e family's replay.

``batch`` prompts of ``isl`` tokens all arrive at once and each generates exactly ``osl``
tokens. Nothing arrives later, so the steps do not depend on their times: the batch is
scheduled to the end first (``plan``) and priced with every other target of the run
(``leaderboard.serving.batched``). With the cache large enough, a step either prefills whole
prompts (as many as the token budget holds) or decodes the whole batch, its context growing by
one: ceil(batch x isl / budget) prefill steps, then ``osl - 1`` decode steps. The run's time to
first token is the end of the step that gives the batch's last first token; its end-to-end
latency is the end of the last step (``times``).
"""

from __future__ import annotations

import numpy as np

from leaderboard.serving import plan_store
from leaderboard.serving.replay import Plan, new_engine
from leaderboard.serving.scheduler import Policy, StepLog


def plan(policy: Policy, isl: int, osl: int, batch: int) -> Plan:
    """The steps of one static batch under ``policy``: the same for every predictor, so
    scheduled once and kept (``plan_store``), as a closed loop's are (scheduling them was 3.9 of
    an e2e run's 10 s)."""
    key = [policy.__dict__, isl, osl, batch, "static"]
    name, arrays = plan_store.kept(key, lambda: _scheduled(policy, isl, osl, batch))
    return Plan.from_arrays(arrays, name)


def _scheduled(policy: Policy, isl: int, osl: int, batch: int) -> dict[str, np.ndarray]:
    prompt, output = np.full(batch, isl, np.int64), np.full(batch, osl, np.int64)
    engine = new_engine(policy, prompt, output)
    for request in range(batch):
        engine.arrive(request)
    log = StepLog()
    while engine.busy:
        engine.step(log, osl)
    return Plan.of(log.arrays(), prompt).arrays()


def times(batch_plan: Plan, step_ms: np.ndarray) -> tuple[float, float]:
    """The batch's time to first token and end-to-end latency (ms) from its steps' times."""
    step_end = np.cumsum(step_ms)
    first, last, _ = batch_plan.times(step_end, np.concatenate([[0.0], step_end[:-1]]))
    return float(np.max(first)), float(np.max(last))
