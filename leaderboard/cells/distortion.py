"""What snapping did to the replayed steps: the figures a ``_vidur`` card reports.

Every (configuration, replayed step) counts once per time it was replayed. A step is *kept* when
it snapped onto a workload; its distortion compares the snapped workload with the replayed one.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from leaderboard.cells.common import PHASES
from leaderboard.cells.snapping import Snapped, StepShape


class Tally:
    def __init__(self):
        self.steps = Counter()  # phase of the replayed step -> count
        self.kept = Counter()  # phase -> count of steps that snapped onto a workload
        self.prefix = 0  # steps dropped: a chunk with prior context, never measured
        self.tokens, self.ctx, self.dropped, self.weights = [], [], [], []

    def add(self, shape: StepShape, snapped: Snapped | None, count: int) -> None:
        self.steps[shape.phase] += count
        self.prefix += count * shape.prefix
        if snapped is None:
            return
        self.kept[shape.phase] += count
        self.weights.append(count)
        self.tokens.append(abs(snapped.tokens - shape.tokens) / shape.tokens)
        self.ctx.append(abs(snapped.ctx - shape.mean_ctx) / shape.mean_ctx
                        if shape.n_decode else np.nan)
        before = shape.n_decode + shape.n_prefill
        self.dropped.append(max(before - snapped.n_decode - snapped.n_prefill, 0))

    def _stats(self, values) -> str:
        v, w = np.asarray(values, float), np.asarray(self.weights, float)
        ok = ~np.isnan(v)
        v, w = v[ok], w[ok]
        if not len(v):
            return "- | - | -"
        order = np.argsort(v)
        cum = np.cumsum(w[order]) / w.sum()
        med, p90 = (v[order][np.searchsorted(cum, q)] for q in (0.5, 0.9))
        return " | ".join(f"{x:.3g}" for x in (med, p90, v.max()))

    def table(self) -> str:
        """Markdown: distortion (median, P90, max) and the phase mix, replayed against kept."""
        total, kept = sum(self.steps.values()), sum(self.kept.values())
        rows = ["| distortion of a kept step | median | P90 | max |", "|---|---|---|---|",
                f"| token count, relative | {self._stats(self.tokens)} |",
                f"| mean decode context, relative | {self._stats(self.ctx)} |",
                f"| requests dropped | {self._stats(self.dropped)} |", "",
                "| phase | replayed steps | snapped onto a workload |", "|---|---|---|"]
        rows += [f"| {p} | {self.steps[p] / max(total, 1):.1%} | "
                 f"{self.kept[p] / max(kept, 1):.1%} |" for p in PHASES]
        rows += ["", f"{kept / max(total, 1):.1%} of {total:,} replayed (configuration, step) "
                 f"pairs snapped onto a workload; {self.prefix / max(total, 1):.1%} were dropped "
                 "as chunks with prior context, the rest had no measured neighbour."]
        return "\n".join(rows)
