"""Progress for long work: a rich bar on a terminal, a plain line every few seconds elsewhere.

Used by the store build (its files, tables and cell families), the forest fits of ``rf``,
``report --rerun`` and the wait on another process's store build. Off a terminal (a log file,
CI, a pipe) a bar draws nothing, so a background thread prints what is happening every
``EVERY_SECONDS`` instead; work shorter than that prints nothing. Processes that share a
terminal with a bar of their own (the workers of a rerun, and the sandboxed fits they start)
are silenced with ``show(False)``.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress

EVERY_SECONDS = 5.0
_shown = True


def show(flag: bool) -> None:
    """Turn this process's progress output on or off."""
    global _shown
    _shown = bool(flag)


def shown() -> bool:
    return _shown


class Tracker:
    """What a piece of work has done so far: a count out of ``total`` and a note."""

    def __init__(self, what: str, total: int | None):
        self.what, self.total, self.done, self.text = what, total, 0, ""
        self.started = time.monotonic()
        self._bar: tuple[Progress, int] | None = None

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._refresh()

    def note(self, text: str) -> None:
        self.text = text
        self._refresh()

    def line(self) -> str:
        count = f" {self.done}/{self.total}" if self.total is not None else ""
        note = f", {self.text}" if self.text else ""
        return f"{self.what}:{count}{note} ({time.monotonic() - self.started:.0f} s)"

    def _refresh(self) -> None:
        if self._bar is not None:
            bar, task = self._bar
            bar.update(task, completed=self.done, note=self.text)


def _print_lines(tracker: Tracker, stop: threading.Event) -> None:
    while not stop.wait(EVERY_SECONDS):
        print(tracker.line(), file=sys.stderr, flush=True)


@contextmanager
def track(what: str, total: int | None = None, enabled: bool = True):
    """A ``Tracker`` for the block, shown as a bar on a terminal, as lines elsewhere (neither
    when ``enabled`` is false or the process is silenced)."""
    tracker = Tracker(what, total)
    if not (_shown and enabled):
        yield tracker
        return
    # rich imported only here: a run's sealed child, silenced, never pays for it (about 30 ms
    # a run); a rerun's worker has it already, from the rerun's own bar
    from rich.console import Console  # noqa: PLC0415

    console = Console(stderr=True)
    if console.is_terminal:
        from rich.progress import (  # noqa: PLC0415
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[note]}"))
        with Progress(*columns, console=console, transient=True) as bar:
            tracker._bar = bar, bar.add_task(what, total=total, note="")
            yield tracker
    else:
        stop = threading.Event()
        ticker = threading.Thread(target=_print_lines, args=(tracker, stop), daemon=True)
        ticker.start()
        try:
            yield tracker
        finally:
            stop.set()
            ticker.join()
