"""The seal around ``fit`` and ``predict``: inside it, nothing may open the store.

A predictor gets its data from the harness only. If it reaches for the store (where every GPU's
ground truth lives), the call raises ``LeakageError`` and the run is marked INVALID. In a run,
fit and predict happen in a child process sealed for its whole life (``seal_process``, which new
threads cannot escape); ``sealed`` seals one block of the current context (``explain``, the
benchmarks).

A predictor could catch the refusal and go on. So every refusal is also recorded
(``attempts``), and in the child ``watch_opens`` records each file it opens, or tries to,
inside the watched folders (the suite's home, the sources, the runs) and outside those
it may read: the harness marks a run that tried INVALID, whether or not it caught the error,
and whether the kernel or this guard refused it.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from contextvars import ContextVar

_sealed: ContextVar[str | None] = ContextVar("sealed", default=None)
_process_stage: str | None = None
_attempts: list[str] = []


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
        _attempts.append(f"{action} during {stage}")
        raise LeakageError(f"a predictor tried to {action} during {stage}; predictors get their "
                           "data from the harness only")


def attempts() -> list[str]:
    """What this process tried and the seal refused or watched, in order."""
    return list(_attempts)


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def watch_opens(watched: list[str], allowed: list[str]) -> None:
    """Record, for good, every file this process opens or tries to open inside ``watched`` and
    outside ``allowed`` (an audit hook: Python code cannot remove it). Paths are compared
    resolved, so a link elsewhere that points into a watched folder counts."""
    watched_roots = tuple(os.path.realpath(p) for p in watched)
    allowed_roots = tuple(os.path.realpath(p) for p in allowed)

    def hook(event: str, args: tuple) -> None:
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.path.realpath(os.fsdecode(args[0]))
        if _inside(path, watched_roots) and not _inside(path, allowed_roots):
            _attempts.append(f"open {path}")

    sys.addaudithook(hook)
