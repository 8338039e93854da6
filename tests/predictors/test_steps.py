"""``Steps.from_cells``: the per-request rows of prefill requests, wherever a cell lists them."""

from __future__ import annotations

import numpy as np
import polars as pl

from predictors.steps import Steps


def _cells(rows: list[tuple[list[int], list[int]]]) -> pl.DataFrame:
    """Cells of qwen3-8b TP1 with ``num_decode`` derived by the cells' rule (q 1, ctx > 0)."""
    return pl.DataFrame([{
        "model": "qwen3-8b", "tp": 1, "q_lens": q, "ctx_lens": c, "num_requests": len(q),
        "num_decode": sum(1 for x, y in zip(q, c, strict=True) if x == 1 and y > 0),
        "total_tokens": sum(q),
        "decode_ctx_sum": sum(y for x, y in zip(q, c, strict=True) if x == 1 and y > 0)}
        for q, c in rows])


def test_prefills_listed_first_are_found_without_reading_the_decodes():
    frame = _cells([([512, 1, 1], [0, 40, 50]), ([1, 1], [7, 9]), ([64, 32], [0, 100])])
    s = Steps.from_cells(frame)
    assert s.pf_cell.tolist() == [0, 2, 2]
    assert s.pf_q.tolist() == [512, 64, 32] and s.pf_ctx.tolist() == [0, 0, 100]
    # The requests after a cell's first num_prefill are taken as decode unread: poisoning one
    # (a 7-token prompt the columns still count as decode) changes nothing. A full scan would
    # have found it.
    poisoned = frame.with_columns(q_lens=pl.Series([[512, 7, 1], [1, 1], [64, 32]]))
    assert Steps.from_cells(poisoned).pf_q.tolist() == [512, 64, 32]


def test_prefills_anywhere_in_a_cell_are_still_all_found():
    """A prefill after a decode (and a one-token prompt on an empty cache, which is a prefill)
    breaks the prefills-first layout: every request is scanned instead, same answer."""
    s = Steps.from_cells(_cells([([1, 512, 1], [40, 0, 50]), ([1], [0]), ([1, 1], [7, 9])]))
    assert s.pf_cell.tolist() == [0, 1]
    assert s.pf_q.tolist() == [512, 1] and s.pf_ctx.tolist() == [0, 0]
    assert np.array_equal(s.num_decode, [2, 0, 2])
