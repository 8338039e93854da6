"""The replay's own error: an oracle step timer, run beside the predictors on every serving set.

The oracle prices each replayed step from the target GPU's own measured kernels: the
``table_scaled`` lookup fitted on the target's ``<short>_vidur`` set instead of the A100 home, so
every GEMM, attention kernel and all-reduce is read from the target's tables (exact on their grid,
log-log interpolated between grid points) and no cross-GPU scaling is left. Whatever error it
still has belongs to the replay and to what the tables do not hold (light kernels, host time,
the frontend, another backend's kernels), not to a predictor. It is a self-check, never ranked:
the report gives its TTFT and TPOT error beside the predictors' and calls predictors tied when
their TTFT errors differ by less than the oracle's.

An oracle run is an ordinary sealed run (``predictor=table_scaled dataset=<set>
dataset.home=<short>_vidur``); what marks it is a serving-level run whose home GPU is the target.
"""

from __future__ import annotations

ORACLE = "table_scaled"
STEP_SUFFIX = "vidur"  # the step-level family whose op points are the target's own kernels


def oracle_home(dataset: str, rows: dict[str, dict]) -> str | None:
    """The oracle's home for a serving ``dataset``: the step set of the same GPU, or None when
    the GPU has no kernel tables (the RTX4090)."""
    sku = rows[dataset]["sku"]
    same_gpu = sorted(n for n, r in rows.items()
                      if r["sku"] == sku and n.endswith(f"_{STEP_SUFFIX}") and r["kind"] == "cells")
    return same_gpu[0] if same_gpu else None


def is_oracle(level: str, sku: str, home_sku: str | None) -> bool:
    """A serving run fitted on its own GPU is the oracle (predictors fit on the A100 home)."""
    return level == "serving" and home_sku == sku
