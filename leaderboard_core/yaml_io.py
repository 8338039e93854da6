"""YAML read with libyaml where PyYAML was built with it: a run reads about 90 config files
(GPU datasheets, model shapes), which took 0.46 s of its 0.75 s of inputs in pure Python."""

from __future__ import annotations

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str):
    """``yaml.safe_load``, on the C loader when there is one (the same safe subset)."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader either way
