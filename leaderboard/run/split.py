"""The seeded, disjoint home split: which home rows fit may read and which score the home."""

from __future__ import annotations

import hashlib
from functools import cache

import polars as pl

from leaderboard_core import paths, yaml_io


@cache
def default_split() -> dict:
    """``conf/split/heldout.yaml``: the split every run uses unless told otherwise."""
    return yaml_io.safe_load((paths.CONF_DIR / "split" / "heldout.yaml").read_text())


def is_heldout(keys: pl.Series, seed: int, test_fraction: float) -> pl.Series:
    """True for the held-out share. A key's side depends only on (seed, key), so a workload is
    on the same side on every GPU and in every run."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"split.test_fraction must be between 0 and 1, got {test_fraction}")

    def side(key: str) -> bool:
        digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < test_fraction

    return keys.map_elements(side, return_dtype=pl.Boolean).alias("heldout")


def split(frame: pl.DataFrame, key: str, seed: int, test_fraction: float
          ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(train, held-out) by ``key``; both sides are non-empty or this raises."""
    mask = is_heldout(frame[key], seed, test_fraction)
    train, test = frame.filter(~mask), frame.filter(mask)
    if len(train) == 0 or len(test) == 0:
        raise ValueError(f"the split of {frame[key].n_unique()} {key} values ({len(frame)} rows; "
                         f"seed {seed}, test_fraction {test_fraction}) leaves one side empty; "
                         "change split.seed or split.test_fraction")
    return train, test
