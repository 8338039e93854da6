"""Fitted models on disk, keyed by what they were fitted from, loaded only from one directory.

A pickle runs code when it is loaded, so this module loads one only from
``<LEADERBOARD_HOME>/models`` (after resolving links) and only under a name it derived itself
from a content hash: a path anywhere else is refused, not opened.
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from leaderboard_core import paths
from leaderboard_core.versioning import content_hash

# Bump when what is stored changes shape, so old files are never read as new ones (2: a
# forest kept as its trees' node arrays).
FORMAT = 2


class UntrustedModelPath(PermissionError):
    """A model file outside the cache directory: never unpickled."""


def cache_dir() -> Path:
    return paths.home() / "models"


def key_of(*parts: Any) -> str:
    """The cache key: the fitted-from data and config, the format and the sklearn version
    (a forest pickled by one sklearn is not guaranteed to load in another)."""
    # the installed version, read without importing scikit-learn (1.5 s), which a model
    # loaded from here may never need
    return content_hash(FORMAT, metadata.version("scikit-learn"), *parts, length=32)


def trusted(path: Path) -> Path:
    """``path`` resolved, if it lies inside the cache directory; else ``UntrustedModelPath``."""
    root = cache_dir().resolve()
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(root):
        raise UntrustedModelPath(f"refusing to load model file {path} (resolves to {resolved}): "
                                 f"fitted models are only loaded from {root}")
    return resolved


def load(path: Path) -> Any:
    # The C unpickler: joblib's reads through Python's pure-Python one, which took 7.7 of a
    # forest run's 14 s to load its 61 forests (pickle: about a seventh of that).
    with trusted(path).open("rb") as f:
        return pickle.load(f)


def load_or_fit(kind: str, key: str, fit: Callable[[], Any]) -> tuple[Any, bool]:
    """The object stored under (kind, key), or ``fit()`` stored there; and whether it was loaded.

    Written to a unique temporary name and renamed, so a concurrent run never reads half a file.
    """
    path = cache_dir() / f"{kind}-{key}.pickle"
    if path.is_file():
        return load(path), True
    obj = fit()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        with partial.open("wb") as f:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return obj, False
