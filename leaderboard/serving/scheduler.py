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

The KV cache follows one of three rules (``kv_rule``):

- ``reserve`` (TRT-LLM's GUARANTEED_NO_EVICT): admission reserves a request's prompt and output,
  and a request waits while the reservation would exceed ``kv_tokens``; nothing is ever evicted;
- ``on_demand`` (vLLM V1): a request holds the KV of the tokens it has computed, and is
  admitted when its next chunk fits what is free. When a running request's next tokens do not
  fit, the most recently admitted running request is preempted (its KV freed, moved to the
  front of the queue, recomputed: prompt and the outputs so far), as vLLM's recompute
  preemption does; no request is admitted in a step that preempted. KV is counted in tokens.
  With ``prefix_cache_block`` (vLLM's prefix caching, on by default in V1) the freed KV stays
  cached in whole blocks until other requests need the space, and the re-admitted request
  recomputes only what was evicted. With ``whole_sequence_admission`` (vLLM's
  ``scheduler_reserve_full_isl``) a waiting request joins only when the KV of every token it
  must hold to decode (its prompt, or what a preempted request had computed) fits, not just its
  first chunk's;
- ``estimated`` (SGLang, with ``prefill_first``): admission on an estimated output and
  retraction when a decode step runs out of KV (``leaderboard.serving.sglang_kv``).

``replay.new_engine`` gives the engine of a policy's rule.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

POLICIES = ("chunked_mixed", "prefill_first", "whole_mixed")
KV_RULES = ("reserve", "on_demand", "estimated")


@dataclass(frozen=True)
class Policy:
    kind: str
    token_budget: int
    max_seqs: int
    kv_tokens: int
    kv_rule: str = "reserve"
    prefix_cache_block: int = 0  # tokens per cached KV block; 0: no prefix cache
    whole_sequence_admission: bool = False  # admit only when the request's whole KV fits

    def __post_init__(self):
        if self.kind not in POLICIES:
            raise ValueError(f"scheduler policy '{self.kind}' is not one of {POLICIES}")
        if self.kv_rule not in KV_RULES:
            raise ValueError(f"KV rule '{self.kv_rule}' is not one of {KV_RULES}")
        if self.kv_rule == "on_demand" and self.kind != "chunked_mixed":
            raise ValueError("the on_demand KV rule is vLLM's and runs with chunked_mixed only")
        if self.kv_rule == "estimated" and self.kind != "prefill_first":
            raise ValueError("the estimated KV rule is SGLang's and runs with prefill_first only")
        vllm_only = self.prefix_cache_block or self.whole_sequence_admission
        if vllm_only and self.kv_rule != "on_demand":
            raise ValueError("prefix_cache_block and whole_sequence_admission are vLLM's, "
                             "modelled with the on_demand KV rule only")


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
        # Tokens to compute before decoding: the prompt, or after a preemption every token the
        # request had computed (recompute).
        self.prefill = self.prompt.copy()
        self.preemptions = 0
        self.cached: dict[int, int] = {}  # preempted request -> its tokens still cached
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
        """Tokens left to compute: the prompt's (or recompute's) rest, or a decode of one token."""
        return int(self.prefill[r] - self.done[r]) if self.done[r] < self.prefill[r] else 1

    def _admissible(self, budget_left: int, used: int = 0) -> bool:
        """Whether the first waiting request joins this step; ``used``: the KV tokens the
        running requests hold after this step's chunks so far (``on_demand`` only)."""
        if not self.waiting or len(self.running) >= self.policy.max_seqs or budget_left <= 0:
            return False
        r = self.waiting[0]
        if self.policy.kv_rule == "on_demand":  # a cache hit (done[r] > 0) holds KV too
            held = (self.prefill[r] if self.policy.whole_sequence_admission
                    else self.done[r] + min(self._need(r), budget_left))
            fits = used + held <= self.policy.kv_tokens
        else:
            fits = self.reserved + self.prompt[r] + self.output[r] <= self.policy.kv_tokens
        return bool(fits or not self.running)  # an empty engine takes any request

    def _preempt_last(self) -> int:
        """Free the most recently admitted running request's KV and queue it first again."""
        r = self.running.pop()
        self.reserved -= int(self.prompt[r] + self.output[r])
        # A request preempted mid-prompt, or mid-recompute, still owes the rest of what it had
        # to compute as a prefill (``prefill`` starts at the prompt and never falls).
        self.prefill[r] = max(self.done[r], self.prefill[r])
        if block := self.policy.prefix_cache_block:
            self.cached[r] = int(self.done[r]) // block * block
        self.done[r] = 0
        self.waiting.appendleft(r)
        self.preemptions += 1
        return r

    def _plan_on_demand(self) -> list[tuple[int, int]]:
        """vLLM V1: running requests in admission order, preempting from the back when the next
        tokens do not fit; then waiting requests, unless this step preempted."""
        budget, plan, preempted = self.policy.token_budget, [], False
        used = int(self.done[self.running].sum()) if self.running else 0
        i = 0
        while i < len(self.running):
            r = self.running[i]
            take = min(self._need(r), budget)
            if take <= 0:
                break
            while used + take > self.policy.kv_tokens and len(self.running) > i + 1:
                used -= int(self.done[self.running[-1]])
                self._preempt_last()
                preempted = True
            if used + take > self.policy.kv_tokens and plan:  # r alone does not fit either
                used -= int(self.done[r])
                self._preempt_last()
                preempted = True
                break
            plan.append((r, take))
            used += take
            budget -= take
            i += 1
        if self.cached:
            self._evict_cached(used)
        while not preempted:
            if self.waiting and self.waiting[0] in self.cached:  # resume from the cache
                front = self.waiting[0]
                self.done[front] = min(self.cached[front], self._cacheable(used))
            if not self._admissible(budget, used):
                break
            r = self._admit()
            plan.append((r, min(self._need(r), budget)))
            used += int(self.done[r]) + plan[-1][1]
            budget -= plan[-1][1]
        return plan

    def _cacheable(self, used: int) -> int:
        """Whole cache blocks free beside ``used`` KV tokens."""
        block = self.policy.prefix_cache_block
        return max(self.policy.kv_tokens - used, 0) // block * block

    def _evict_cached(self, used: int) -> None:
        """Keep of each preempted request's cached tokens what still fits beside the ``used``
        KV of the running requests. An approximation of vLLM, which evicts the least recently
        freed blocks first: here a cache survives while the free KV covers it, whatever else
        was freed after it, and each cache is clipped alone (their sum may exceed the free KV).
        A waiting request holds no KV until re-admitted.
        A hit never covers a token still to be computed: it is whole blocks of what the
        request had computed."""
        for r, tokens in self.cached.items():
            self.cached[r] = min(tokens, self._cacheable(used))
            self.done[r] = 0

    def _admit(self) -> int:
        r = self.waiting.popleft()
        self.cached.pop(r, None)
        self.running.append(r)
        self.reserved += int(self.prompt[r] + self.output[r])
        return r

    def _plan(self) -> list[tuple[int, int]]:
        """(request, new tokens) for the next step, per the policy."""
        if self.policy.kv_rule == "on_demand":
            return self._plan_on_demand()
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
        used = int(self.done[self.running].sum()) if self.running else 0
        if not self.running or self._admissible(self.policy.token_budget, used):
            return 0
        if len(self.running) > self.policy.token_budget:
            return 0
        run = np.asarray(self.running)
        if (self.done[run] < self.prefill[run]).any():
            return 0
        left = int((self.prompt[run] + self.output[run] - 1 - self.done[run]).min())
        if self.policy.kv_rule == "on_demand":  # each decode step adds a token per request
            left = min(left, (self.policy.kv_tokens - int(self.done[run].sum())) // len(run))
        return left

    def step(self, log: StepLog, max_steps: int) -> int:
        """Schedule up to ``max_steps`` steps (one, or a run of identical-shape decodes) into
        ``log``; return how many. Requests that finish move to ``finished``."""
        k = min(self._decode_run(), max_steps)
        if k > 1:
            run = np.asarray(self.running)
            log.add_decodes(run, self.done[run].copy(), k)
            self.done[run] += k
            if self.cached:  # the run's last step holds the most KV: clip the caches to it
                self._evict_cached(int(self.done[run].sum()))
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
