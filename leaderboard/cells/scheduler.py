"""Continuous-batching replay of real request traces, to get realistic step compositions.

Two policies, both step-driven (a step is one forward pass):

- ``vllm``: prefill first. When prompts are waiting and fit, a step prefills whole prompts up to
  the token budget; otherwise it decodes every running request. No mixed steps.
- ``sarathi``: chunked prefill under a token budget. Every running decode goes first, then the
  remaining budget takes prefill chunks, oldest request first. Steps may be mixed.

Arrivals are mapped to steps with a nominal step time (``STEP_SECONDS``): the replay only needs
the order and the crowding of requests, not their timing, and no latency model enters here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

STEP_SECONDS = 0.025


@dataclass
class Request:
    prompt: int
    output: int
    arrival_step: int
    prefilled: int = 0
    generated: int = 0

    @property
    def context(self) -> int:
        return self.prefilled + self.generated


@dataclass(frozen=True)
class Slot:
    """One request's share of a step: ``q`` new tokens on top of ``ctx`` cached ones."""

    q: int
    ctx: int
    decode: bool


@dataclass
class Replay:
    policy: str  # vllm | sarathi
    token_budget: int
    max_seqs: int = 256
    max_steps: int = 4000
    waiting: list[Request] = field(default_factory=list)
    running: list[Request] = field(default_factory=list)

    def steps(self, requests: list[Request]) -> Iterator[list[Slot]]:
        pending = sorted(requests, key=lambda r: r.arrival_step)
        step = 0
        while (pending or self.waiting or self.running) and step < self.max_steps:
            while pending and pending[0].arrival_step <= step:
                self.waiting.append(pending.pop(0))
            slots = self._vllm() if self.policy == "vllm" else self._sarathi()
            if slots:
                yield slots
            step += 1

    def _admit(self, budget: int, chunked: bool) -> list[Slot]:
        """Prefill slots for partially prefilled then waiting requests, within ``budget``."""
        slots = []
        for req in [r for r in self.running if r.prefilled < r.prompt] + list(self.waiting):
            if budget <= 0 or (req in self.waiting and len(self.running) >= self.max_seqs):
                break
            left = req.prompt - req.prefilled
            take = min(left, budget) if chunked else left
            if take > budget:
                break
            slots.append(Slot(take, req.prefilled, False))
            req.prefilled += take
            budget -= take
            if req in self.waiting:
                self.waiting.remove(req)
                self.running.append(req)
        return slots

    def _decode(self, limit: int) -> list[Slot]:
        slots = []
        for req in [r for r in self.running if r.prefilled >= r.prompt][:limit]:
            slots.append(Slot(1, req.context, True))
            req.generated += 1
        self.running = [r for r in self.running if r.generated < r.output]
        return slots

    def _vllm(self) -> list[Slot]:
        fits = self.waiting and self.waiting[0].prompt <= self.token_budget
        if fits and len(self.running) < self.max_seqs:
            return self._admit(self.token_budget, chunked=False)
        return self._decode(self.max_seqs)

    def _sarathi(self) -> list[Slot]:
        decodes = self._decode(self.token_budget)
        return decodes + self._admit(self.token_budget - len(decodes), chunked=True)


def requests_from_trace(prompts, outputs, arrivals_s, max_prompt: int | None) -> list[Request]:
    """Trace rows to requests, outputs at least one token. Prompts are never clipped: with
    ``max_prompt`` (whole-prompt prefill) a longer prompt is left out, as vLLM rejects it;
    chunked prefill (``None``) carries any prompt across steps."""
    return [
        Request(int(p), max(int(o), 1), int(a / STEP_SECONDS))
        for p, o, a in zip(prompts, outputs, arrivals_s, strict=True)
        if max_prompt is None or p <= max_prompt
    ]
