"""Price many closed loops' steps in a few calls instead of one call per loop.

A serving run replays about two hundred closed loops, two per target; each used to send its
steps to the predictor's sealed child alone: a file written, a round trip and the child's own
overhead per loop, most of a serving run. A closed loop's steps do not depend on their times
(``replay.closed_loop_plan``), so every loop of a run can be scheduled first and all its steps
priced together. A step is priced as it would be alone: the per-target wrappers
(``simulate.run_engine``: host time, expert placement, KV dtype) still see each loop's own
steps, in two passes of the same wrapper around a raw timer that first records and then answers.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard.serving.replay import StepTimer

# The most list entries (requests across steps) sent in one call: a silicon set's loops hold
# about 23 million; a call of this size is about 64 MB of Arrow for the child to read.
MAX_ENTRIES_PER_CALL = 4_000_000


class SwitchedTimer:
    """A step timer whose work can be swapped: ``raw`` (the predictor's) by default, or a
    recorder or an answerer for ``price_together``'s two passes."""

    def __init__(self, raw: StepTimer):
        self.raw, self._now = raw, raw

    def __call__(self, cells: pl.DataFrame) -> np.ndarray:
        return self._now(cells)

    def use(self, timer: StepTimer) -> None:
        self._now = timer


def price_together(switched: SwitchedTimer, jobs: list[tuple[StepTimer, pl.DataFrame]]
                   ) -> list[np.ndarray]:
    """``timed(cells)`` for each (timed, cells) of ``jobs``, where every ``timed`` wraps
    ``switched``: the raw timer is asked once per ``MAX_ENTRIES_PER_CALL`` entries of steps of
    one schema (a wrapper may add a column some loops' steps lack), never once per job."""
    asked: list[pl.DataFrame] = []

    def record(cells: pl.DataFrame) -> np.ndarray:
        asked.append(cells)
        return np.ones(len(cells))

    try:
        switched.use(record)
        for timed, cells in jobs:
            timed(cells)
        replies = iter(zip(asked, _asked_in_batches(switched.raw, asked), strict=True))

        def answer(cells: pl.DataFrame) -> np.ndarray:
            # the second pass must ask exactly what the first recorded, in the same order
            recorded, ms = next(replies, (None, None))
            if recorded is None or recorded.schema != cells.schema or len(recorded) != len(cells):
                raise ValueError("a step-time wrapper asked for other steps when its answers "
                                 "came back than when they were recorded; the harness cannot "
                                 "price its closed loops together")
            return ms

        switched.use(answer)
        priced = [timed(cells) for timed, cells in jobs]
        if next(replies, None) is not None:
            raise ValueError("a step-time wrapper asked for fewer steps when its answers came "
                             "back than when they were recorded")
        return priced
    finally:
        switched.use(switched.raw)


def _asked_in_batches(raw: StepTimer, asked: list[pl.DataFrame]) -> list[np.ndarray]:
    """The raw timer's answer for each frame of ``asked``, frames of one schema concatenated
    (each cell named by its frame, so no two share a ``cell_id``) up to the entry bound."""
    answers: list[np.ndarray | None] = [None] * len(asked)
    by_schema: dict[tuple, list[int]] = {}
    for i, frame in enumerate(asked):
        by_schema.setdefault(tuple(frame.schema.items()), []).append(i)
    for members in by_schema.values():
        batch: list[int] = []
        entries = 0
        for i in [*members, None]:
            size = 0 if i is None else int(asked[i]["num_requests"].sum())
            if batch and (i is None or entries + size > MAX_ENTRIES_PER_CALL):
                frames = [asked[j].with_columns(cell_id=pl.format("{}:{}", pl.lit(j),
                                                                  pl.col("cell_id")))
                          for j in batch]
                ms = raw(pl.concat(frames))
                for j, part in zip(batch, np.split(ms, np.cumsum([len(asked[k]) for k in batch])[:-1]),
                                   strict=True):
                    answers[j] = part
                batch, entries = [], 0
            if i is not None:
                batch.append(i)
                entries += size
    return answers
