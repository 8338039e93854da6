"""The seal around ``fit`` and ``predict``: inside it, nothing may open the store.

A predictor gets its data from the harness only. If it reaches for the store (where every GPU's
ground truth lives), the call raises ``LeakageError`` and the run is marked INVALID. In a run,
fit and predict happen in a child process sealed for its whole life (``seal_process``, which new
threads cannot escape); ``sealed`` seals one block of the current context (``explain``, the
benchmarks).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

_sealed: ContextVar[str | None] = ContextVar("sealed", default=None)
_process_stage: str | None = None


class LeakageError(RuntimeError):
    pass


@contextmanager
def sealed(stage: str):
    token = _sealed.set(stage)
    try:
        yield
    finally:
        _sealed.reset(token)


def seal_process(stage: str) -> None:
    """Seal this process, every thread included, for good."""
    global _process_stage
    _process_stage = stage


def check(action: str) -> None:
    stage = _sealed.get() or _process_stage
    if stage is not None:
        raise LeakageError(f"a predictor tried to {action} during {stage}; predictors get their "
                           "data from the harness only")
