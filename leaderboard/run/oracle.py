"""The replay's own error: an oracle step timer, run beside the predictors on every serving set.

The oracle prices each replayed step from the target GPU's own measured kernels: the
``table_scaled`` lookup fitted on the target's ``<short>_vidur`` set instead of the A100 home, so
every GEMM, attention kernel and all-reduce is read from the target's tables (exact on their grid,
log-log interpolated between grid points) and no cross-GPU scaling is left. The RTX4090, which
no aiconfigurator table holds, is read from LLMServingSim's vLLM profile of it, of the serving
run's model and vLLM version (``rtx4090_llmservingsim``: its projections, LM head, and prefill
and decode attention). An MoE run's experts are read from the GPU's fused-MoE tables, at the
block-scaled FP8 its checkpoints load. A step that names an FP8 KV cache (the replay's
``fp8_kv`` engine choice, never the headline) reads the GPU's FP8-KV attention tables.
Whatever error it still has belongs to the replay and to what the tables do not hold (light
kernels, host time, the frontend, another backend's kernels), not to a predictor. It is a
self-check, never ranked: the report gives its TTFT and TPOT error beside the predictors' and
calls predictors tied when their TTFT errors differ by less than the oracle's.

An oracle run is an ordinary sealed run (``predictor=table_scaled dataset=<set>
dataset.home=<short>_vidur split.home_points=every_shape``: every measured shape of the target,
since the serving models are not the step sets' models); what marks it is a serving-level run
whose home GPU is the target.
"""

from __future__ import annotations

from leaderboard.cells import families
from leaderboard.run import homes

ORACLE = "table_scaled"
# Every measured shape of the target GPU: the serving models are not the step sets' models, so
# their projections and head layouts are not in those sets' grid (``leaderboard.run.home_grid``).
ORACLE_POINTS = "every_shape"
# Per serving family, the step families whose op points are the target's own kernels at its
# precision, the first that holds the GPU taken (FP8 GEMM tables only in the FP8 family's, at
# the versions that pass its check; LLMServingSim's vLLM profile where no aiconfigurator table
# holds the GPU). An MoE run reads the GPU's block-scaled FP8 GEMM and fused-MoE tables
# (``every_shape`` reads every precision): at the FP8 family's version where the GPU has one
# (vLLM 0.19.0, nearer the H100's and H200's runs, mostly of 0.16.0 and 0.18.0, than the MoE
# family's 0.14.0 there), else at the MoE family's (the B200's, 0.19.0).
STEP_FAMILY = {"silicon": ("vidur",), "silicon_fp8": ("vidur_fp8",),
               "silicon_moe": ("vidur_fp8", "vidur_moe"),
               "serving": ("vidur", "llmservingsim"), "e2e": ("vidur",)}


def oracle_home(dataset: str, rows: dict[str, dict]) -> str | None:
    """The oracle's home for a serving ``dataset``: the GPU's step set of the first family of
    ``STEP_FAMILY`` that has one (its tables read at the set's own version; for the RTX4090,
    which no aiconfigurator table holds, LLMServingSim's vLLM profile of it), or None: no step
    set of that precision was built for the GPU (the B200 has no FP8 set: its per-tensor FP8 GEMM
    tables fail the build's FP8 check), or the serving family has no oracle."""
    sku = rows[dataset]["sku"]
    for step in STEP_FAMILY.get(families.suffix_of(dataset), ()):
        same_gpu = sorted(n for n, r in rows.items() if r["sku"] == sku and r["kind"] == "cells"
                          and families.suffix_of(n) == step
                          and homes.points_of(ORACLE_POINTS, [r], rows) == ORACLE_POINTS)
        if same_gpu:
            return same_gpu[0]
    return None


def is_oracle(predictor: str, home_points: str, dataset: str, sku: str,
              home_sku: str | None) -> bool:
    """The oracle run: the oracle predictor on every measured shape of the serving target's own
    GPU. All three matter: an H100 FP8 serving run of any predictor has its family's H100 home."""
    fam = families.of(dataset)
    return (predictor == ORACLE and home_points == ORACLE_POINTS and fam is not None
            and fam.level == "serving" and home_sku == sku)
