"""Snapping a replayed step onto the grid every GPU of the family measured.

A serving engine runs one attention kernel per kind and layer: one decode kernel over every
decode request, one prefill kernel over every new prompt. A cell therefore keeps exactly one
measured point of each kind, and its workload becomes the measured one:

1. Decode: the decode count moves to a neighbouring measured batch and the mean context to the
   nearest measured KV length (log2); every decode request of the cell then sits at that length.
2. Prefill: the prompts become a uniform batch, the count a neighbouring measured batch and the
   mean length a neighbouring measured prompt length (at least 16 tokens). A chunk with prior
   context was never measured (aiconfigurator times prefill with an empty cache): its step is
   dropped, not faked.
3. Among the neighbours, the candidate whose token count is a measured GEMM m (and, under TP, a
   measured all-reduce size) with the least distortion wins; one that more than halves or
   doubles the token count is no candidate, and a step with none is dropped. The step's phase
   never changes: a mixed step stays mixed or is dropped.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product

from leaderboard.cells.scheduler import Slot

MIN_PREFILL = 16


@dataclass(frozen=True)
class StepShape:
    """A replayed step reduced to what snapping reads; ``prefix`` marks a chunk with context."""

    n_decode: int
    mean_ctx: int
    n_prefill: int
    mean_len: int
    prefix: bool

    @property
    def tokens(self) -> int:
        return self.n_decode + self.n_prefill * self.mean_len

    @property
    def phase(self) -> str:
        return phase_of_step(self)


@dataclass(frozen=True)
class Snapped:
    n_decode: int
    ctx: int
    n_prefill: int
    length: int

    @property
    def tokens(self) -> int:
        return self.n_decode + self.n_prefill * self.length

    def workload(self) -> tuple[list[int], list[int]]:
        """(q_lens, ctx_lens): the uniform prefill batch first, then the decodes."""
        return ([self.length] * self.n_prefill + [1] * self.n_decode,
                [0] * self.n_prefill + [self.ctx] * self.n_decode)


def phase_of_step(step: Snapped) -> str:
    return "mixed" if step.n_decode and step.n_prefill else (
        "decode" if step.n_decode else "prefill")


def shape_of(slots: list[Slot]) -> StepShape:
    decodes = [s.ctx for s in slots if s.decode]
    prefills = [s for s in slots if not s.decode]
    return StepShape(
        len(decodes), round(sum(decodes) / len(decodes)) if decodes else 0, len(prefills),
        round(sum(s.q for s in prefills) / len(prefills)) if prefills else 0,
        any(s.ctx > 0 for s in prefills))


def nearest_log(value: int, grid: list[int]) -> int:
    """The grid value nearest on a log2 scale; ties go to the larger one."""
    i = bisect_right(grid, value)
    near = grid[max(i - 1, 0): i + 1]
    return min(near, key=lambda g: (abs(math.log2(g) - math.log2(max(value, 1))), -g))


def neighbours(value: int, grid: list[int]) -> list[int]:
    """The measured values just below and just above ``value`` (itself when measured)."""
    i = bisect_left(grid, value)
    if i < len(grid) and grid[i] == value:
        return [value]
    return grid[max(i - 1, 0): i + 1]


def uniform_steps(axes: dict[str, list[int]], tokens_ok: Callable[[int], bool]):
    """Every step of measured uniform batches: a prompt batch, a decode batch at one context,
    or one of each, whose token count passes ``tokens_ok``."""
    isl = [q for q in axes["isl"] if q >= MIN_PREFILL]
    prompts = [(0, 0), *product(axes["prefill_batch"], isl)]
    decodes = [(0, 0), *product(axes["decode_batch"], axes["kv"])]
    for (p, q), (d, c) in product(prompts, decodes):
        if (p or d) and tokens_ok(d + p * q):
            yield Snapped(d, c, p, q)


def _log_gap(new: float, old: float) -> float:
    return abs(math.log2(new / old)) if old else 0.0


def snap(shape: StepShape, axes: dict[str, list[int]],
         tokens_ok: Callable[[int], bool]) -> Snapped | None:
    """The snapped step, or None when it cannot be one measured point per attention kind."""
    if shape.prefix:
        return None
    isl = axes["isl"][bisect_left(axes["isl"], MIN_PREFILL):]  # the axes are sorted
    decodes = neighbours(shape.n_decode, axes["decode_batch"]) if shape.n_decode else [0]
    ctx = nearest_log(shape.mean_ctx, axes["kv"]) if shape.n_decode else 0
    prefills = neighbours(shape.n_prefill, axes["prefill_batch"]) if shape.n_prefill else [0]
    lengths = neighbours(max(shape.mean_len, MIN_PREFILL), isl) if shape.n_prefill else [0]
    fits = [s for d, p, q in product(decodes, prefills, lengths)
            if tokens_ok((s := Snapped(d, ctx, p, q)).tokens) and _log_gap(s.tokens, shape.tokens) <= 1]
    if not fits:
        return None
    return min(fits, key=lambda s: (_log_gap(s.tokens, shape.tokens)
                                    + _log_gap(s.n_decode, shape.n_decode)
                                    + _log_gap(s.n_prefill, shape.n_prefill), -s.tokens))
