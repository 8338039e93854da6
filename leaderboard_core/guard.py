"""The seal around ``fit`` and ``predict``: inside it, nothing may open the store.

A predictor gets its data from the harness only. If it reaches for the store (where every GPU's
ground truth lives), the call raises ``LeakageError`` and the run is marked INVALID. In a run,
fit and predict happen in a child process sealed for its whole life (``seal_process``, which new
threads cannot escape); ``sealed`` seals one block of the current context (``explain``, the
benchmarks).

A predictor could catch the refusal and go on. So every refusal is also recorded
(``attempts``), and in the child ``watch_opens`` records each file it opens, or tries to,
inside the folders where measurements lie: the harness marks a run that tried INVALID, whether
or not it caught the error. In a run's child each record is also sent to the parent as it
happens (``report_attempts``), so clearing the list afterwards erases nothing the parent has.
The hooks live in the predictor's own process, so they catch a predictor that tries and
swallows the refusal, not code written against the harness itself; what keeps the data out is
the refusal (namespaces, Landlock, and this guard).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from contextvars import ContextVar

_sealed: ContextVar[str | None] = ContextVar("sealed", default=None)
_process_stage: str | None = None
_attempts: list[str] = []
_reporters: list = []


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
        _record(f"{action} during {stage}")
        raise LeakageError(f"a predictor tried to {action} during {stage}; predictors get their "
                           "data from the harness only")


def _record(attempt: str) -> None:
    _attempts.append(attempt)
    for report in _reporters:
        report(attempt)


def report_attempts(report) -> None:
    """Call ``report(attempt)`` for every attempt from now on, as it happens."""
    _reporters.append(report)


def attempts() -> list[str]:
    """What this process tried and the seal refused or watched, each once, in order."""
    return list(dict.fromkeys(_attempts))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def watch_roots(watched: list[str], allowed: list[str], quiet: list[str] = ()
                ) -> list[tuple[str, bool]]:
    """(resolved folder, recorded?) innermost first: a ``watched`` folder records the files
    opened in it, an ``allowed`` one (what the process may read or write) or a ``quiet`` one
    (where libraries scan package metadata) does not."""
    roots = ([(os.path.realpath(p), True) for p in watched]
             + [(os.path.realpath(p), False) for p in [*allowed, *quiet]])
    # innermost first; a folder both watched and allowed (LEADERBOARD_HOME set to the
    # repository) is allowed: the child may use it, so using it is no attempt
    return sorted(roots, key=lambda root: (len(root[0]), not root[1]), reverse=True)


def recorded(path: str | bytes | os.PathLike, roots: list[tuple[str, bool]]) -> bool:
    """Whether the innermost of ``roots`` holding ``path`` (resolved, so a link into a watched
    folder counts) is a watched one."""
    path = os.path.realpath(os.fsdecode(path))
    return next((is_watched for root, is_watched in roots if _inside(path, root)), False)


def watch_opens(roots: list[tuple[str, bool]]) -> None:
    """Record, for good, every file this process opens or tries to open through Python's I/O
    (``open``, ``io.open_code``, ``os.open`` and what calls them) where ``roots``
    (``watch_roots``) say so. Files that native code opens (polars, pyarrow, DuckDB, another
    process) are not seen."""

    def hook(event: str, args: tuple) -> None:
        if (event == "open" and isinstance(args[0], (str, bytes, os.PathLike))
                and recorded(args[0], roots)):
            _record(f"open {os.path.realpath(os.fsdecode(args[0]))}")

    sys.addaudithook(hook)
