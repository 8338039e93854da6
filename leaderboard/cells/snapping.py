"""Snapping a replayed step onto the grid every GPU of the family measured.

The rule, applied in this order (a cell's composition is the snapped step, so its ground truth
is exactly the measured points it names):

1. A decode request's context moves to the nearest measured KV length (in log2).
2. A prefill chunk moves to the nearest measured prompt length (in log2, at least 16 tokens) and
   starts from an empty cache: aiconfigurator measured prefill attention with no prefix only.
3. The step's token count must be a measured GEMM m and, under TP, give a measured all-reduce
   message: while it does not, drop the newest decode request; with none left, drop the shortest
   prefill chunk; a single chunk left moves down the prompt-length grid.
4. A step with nothing left is skipped.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable

from leaderboard.cells.scheduler import Slot

MIN_PREFILL = 16


def nearest_log(value: int, grid: list[int]) -> int:
    """The grid value nearest on a log2 scale; ties go to the larger one."""
    i = bisect_right(grid, value)
    near = grid[max(i - 1, 0): i + 1]
    return min(near, key=lambda g: (abs(math.log2(g) - math.log2(max(value, 1))), -g))


def presnap(slots: list[Slot], axes: dict[str, list[int]]) -> tuple[tuple, tuple]:
    """Rules 1 and 2: (prefill lengths, longest first; decode KV lengths, oldest first)."""
    isl_grid = [q for q in axes["isl"] if q >= MIN_PREFILL]
    prefills = sorted((nearest_log(s.q, isl_grid) for s in slots if not s.decode), reverse=True)
    return tuple(prefills), tuple(nearest_log(s.ctx, axes["kv"]) for s in slots if s.decode)


def fit(prefills: tuple, decodes: tuple, axes: dict[str, list[int]],
        tokens_ok: Callable[[int], bool]) -> tuple[list[int], list[int]] | None:
    """Rules 3 and 4: the snapped step as (q_lens, ctx_lens), or None."""
    isl_grid = [q for q in axes["isl"] if q >= MIN_PREFILL]
    prefills, decodes = list(prefills), list(decodes)
    while decodes or prefills:
        if tokens_ok(len(decodes) + sum(prefills)):
            return [*prefills, *[1] * len(decodes)], [*[0] * len(prefills), *decodes]
        if decodes:
            decodes.pop()
        elif len(prefills) > 1:
            prefills.pop()
        else:
            lower = bisect_right(isl_grid, prefills[0]) - 2
            if lower < 0:
                return None
            prefills[0] = isl_grid[lower]
    return None


def binary_batches(count: int, batches: list[int]) -> list[int]:
    """Split ``count`` identical requests into measured batch sizes, largest first."""
    parts, left = [], count
    for b in sorted(batches, reverse=True):
        while left >= b:
            parts.append(b)
            left -= b
    return parts if left == 0 else []
