"""One serving engine's iteration-level scheduler: which tokens each forward step runs.

The scheduler knows token counts only, never time: given the requests that have arrived, the
sequence of steps is fixed. ``leaderboard.serving.replay`` turns steps into time with a
predictor. Three policies cover the backends in ``conf/serving/schedulers.yaml``:

- ``chunked_mixed`` (vLLM V1): running requests first, in admission order (a decode takes one
  token, an unfinished prompt a chunk of what is left), then waiting ones, until the token
  budget or ``max_seqs`` is spent;
- ``prefill_first`` (SGLang): while a prompt waits or is half done, a step prefills only (chunks
  up to the budget); otherwise it decodes every running request;
- ``whole_mixed`` (TRT-LLM, chunking off): decodes plus whole prompts that fit the budget.

Admission reserves a request's prompt and output in the KV cache (no preemption): a request
waits while the reservation would exceed ``kv_tokens``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

POLICIES = ("chunked_mixed", "prefill_first", "whole_mixed")


@dataclass(frozen=True)
class Policy:
    kind: str
    token_budget: int
    max_seqs: int
    kv_tokens: int

    def __post_init__(self):
        if self.kind not in POLICIES:
            raise ValueError(f"scheduler policy '{self.kind}' is not one of {POLICIES}")


@dataclass
class StepLog:
    """Every scheduled (request, new tokens, cached tokens) entry, step after step."""

    step: list[np.ndarray] = field(default_factory=list)
    req: list[np.ndarray] = field(default_factory=list)
    q: list[np.ndarray] = field(default_factory=list)
    ctx: list[np.ndarray] = field(default_factory=list)
    steps: int = 0

    def add(self, req, q, ctx) -> None:
        self.step.append(np.full(len(req), self.steps, dtype=np.int64))
        self.req.append(np.asarray(req, np.int64))
        self.q.append(np.asarray(q, np.int64))
        self.ctx.append(np.asarray(ctx, np.int64))
        self.steps += 1

    def add_decodes(self, req: np.ndarray, ctx0: np.ndarray, k: int) -> None:
        """``k`` pure-decode steps of the same requests, contexts growing by one each step."""
        n = len(req)
        self.step.append(np.repeat(np.arange(self.steps, self.steps + k), n))
        self.req.append(np.tile(req, k))
        self.q.append(np.ones(n * k, np.int64))
        self.ctx.append((ctx0[None, :] + np.arange(k)[:, None]).ravel())
        self.steps += k

    def arrays(self) -> dict[str, np.ndarray]:
        cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
        return {"step": cat(self.step), "req": cat(self.req), "q": cat(self.q), "ctx": cat(self.ctx)}


class Engine:
    """The scheduler state of one engine over requests ``0..n-1`` (prompt and output lengths)."""

    def __init__(self, policy: Policy, prompt: np.ndarray, output: np.ndarray):
        self.policy = policy
        self.prompt, self.output = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
        if (self.prompt < 1).any() or (self.output < 1).any():
            raise ValueError("every request needs at least one prompt and one output token")
        self.done = np.zeros(len(prompt), np.int64)  # tokens computed: prompt, then decodes
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.reserved = 0
        self.finished: list[int] = []  # in finishing order, for a closed loop to refill

    def arrive(self, req: int) -> None:
        self.waiting.append(req)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def _need(self, r: int) -> int:
        """Tokens left to compute: the prompt's rest, or a decode of one token."""
        return int(self.prompt[r] - self.done[r]) if self.done[r] < self.prompt[r] else 1

    def _admissible(self, budget_left: int) -> bool:
        if not self.waiting or len(self.running) >= self.policy.max_seqs or budget_left <= 0:
            return False
        r = self.waiting[0]
        fits = self.reserved + self.prompt[r] + self.output[r] <= self.policy.kv_tokens
        return bool(fits or not self.running)  # an empty engine takes any request

    def _admit(self) -> int:
        r = self.waiting.popleft()
        self.running.append(r)
        self.reserved += int(self.prompt[r] + self.output[r])
        return r

    def _plan(self) -> list[tuple[int, int]]:
        """(request, new tokens) for the next step, per the policy."""
        p, budget, plan = self.policy, self.policy.token_budget, []
        prefilling = [r for r in self.running if self.done[r] < self.prompt[r]]
        if p.kind == "prefill_first" and (prefilling or self._admissible(budget)):
            for r in prefilling:
                take = min(self._need(r), budget)
                if take > 0:
                    plan.append((r, take))
                    budget -= take
            while self._admissible(budget):
                r = self._admit()
                plan.append((r, min(self._need(r), budget)))
                budget -= plan[-1][1]
            return plan
        for r in self.running:  # chunked_mixed, whole_mixed, and prefill_first's decode steps
            take = min(self._need(r), budget)
            if take <= 0 or (p.kind == "whole_mixed" and take < self._need(r)):
                break
            plan.append((r, take))
            budget -= take
        while self._admissible(budget):
            need = int(self.prompt[self.waiting[0]])
            if p.kind == "whole_mixed" and need > budget and plan:
                break
            r = self._admit()
            plan.append((r, need if p.kind == "whole_mixed" else min(need, budget)))
            budget -= plan[-1][1]
        return plan

    def _decode_run(self) -> int:
        """How many next steps are pure decodes of the same running set (0: plan step by step)."""
        if not self.running or self._admissible(self.policy.token_budget):
            return 0
        if len(self.running) > self.policy.token_budget:
            return 0
        run = np.asarray(self.running)
        if (self.done[run] < self.prompt[run]).any():
            return 0
        left = self.prompt[run] + self.output[run] - 1 - self.done[run]
        return int(left.min())

    def step(self, log: StepLog, max_steps: int) -> int:
        """Schedule up to ``max_steps`` steps (one, or a run of identical-shape decodes) into
        ``log``; return how many. Requests that finish move to ``finished``."""
        k = min(self._decode_run(), max_steps)
        if k > 1:
            run = np.asarray(self.running)
            log.add_decodes(run, self.done[run].copy(), k)
            self.done[run] += k
        else:
            k = 1
            plan = self._plan()
            if not plan:
                raise RuntimeError("scheduler made no progress: a request can never fit the "
                                   "token budget; raise token_budget in conf/serving/schedulers.yaml")
            req = np.array([r for r, _ in plan])
            q = np.array([t for _, t in plan])
            log.add(req, q, self.done[req].copy())
            self.done[req] += q
        # A request has its last token once prompt + output - 1 tokens are computed: the first
        # output token comes with the prompt's last chunk.
        for r in [r for r in self.running if self.done[r] >= self.prompt[r] + self.output[r] - 1]:
            self.running.remove(r)
            self.reserved -= int(self.prompt[r] + self.output[r])
            self.finished.append(r)
        return k
