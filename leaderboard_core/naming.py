"""Named registries (predictors, dataset families, metrics): duplicates refused, typos answered.

One place for the rule every registry of the suite follows, as lm-eval's registries do: a second
entry under a taken name is an error, and an unknown name gets the valid names and the closest.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def closest(name: str, valid: list[str]) -> str:
    """`` Did you mean 'a'?`` when one valid name is close enough, else nothing; the names that
    extend ``name`` by a suffix come first (``h200_silicon``: its ``_fp8`` and ``_moe`` sets),
    since an edit-distance match would name another GPU's set."""
    extended = [v for v in valid if v.startswith(f"{name}_")]
    if extended:
        return f" Did you mean {' or '.join(repr(v) for v in extended)}?"
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def suggestion(name: str, valid: list[str]) -> str:
    """``valid names: a, b. Did you mean 'a'?``, the tail of every unknown-name error."""
    return f"valid names: {', '.join(valid)}.{closest(name, valid)}"


class Registry(Generic[T]):
    """Entries by name, in registration order. ``kind`` and ``what`` word the errors: "dataset
    family 'x' is already registered; pick another suffix (...)"."""

    def __init__(self, kind: str, what: str = "name", reserved: tuple[str, ...] = ()):
        self.kind, self.what, self.reserved = kind, what, reserved
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries or name in self.reserved:
            raise ValueError(f"{self.kind} '{name}' is already registered; pick another "
                             f"{self.what} ({suggestion(name, [*self.reserved, *self._entries])})")
        self._entries[name] = entry
        return entry

    def drop(self, name: str) -> None:
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} '{name}'; {suggestion(name, self.names())}")
        return self._entries[name]

    def find(self, name: str) -> T | None:
        return self._entries.get(name)

    def names(self) -> list[str]:
        return list(self._entries)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._entries.values()))
