"""The seal around ``fit`` and ``predict``: inside it, nothing may open the store.

A predictor gets its data from the harness only. If it reaches for the store (where every GPU's
ground truth lives), the call raises ``LeakageError`` and the run is marked INVALID.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

_sealed: ContextVar[str | None] = ContextVar("sealed", default=None)


class LeakageError(RuntimeError):
    pass


@contextmanager
def sealed(stage: str):
    token = _sealed.set(stage)
    try:
        yield
    finally:
        _sealed.reset(token)


def check(action: str) -> None:
    stage = _sealed.get()
    if stage is not None:
        raise LeakageError(f"a predictor tried to {action} during {stage}; predictors get their "
                           "data from the harness only")
