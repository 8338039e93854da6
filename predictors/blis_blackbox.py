"""BLIS's blackbox step model (the ``inference-sim/inference-sim`` simulator), re-implemented
from its public documentation (docs/baselines.md §9), not from its code.

BLIS prices a scheduler iteration with three trained coefficients per (model, GPU, TP, vLLM
version): GPU time = β0 + β1·X + β2·Y, X the iteration's uncached prefill tokens and Y its decode
tokens; a separate CPU term α0 + α1·(input length) + α2·(output length) is per request, not per
step. What is kept and what changed:

* kept: the linear form, one coefficient set per (GPU, model, TP), fitted on the home GPUs
  only (each home GPU its own set; a serving set on a home GPU uses that GPU's);
* changed: BLIS trains its β by Bayesian optimisation against request-level TTFT, ITL and E2E;
  the home here offers measured steps, so β are fitted to them directly, by non-negative least
  squares on relative error (BLIS's coefficients are non-negative rates), skipping composed
  cells (a sum of parts, not a step BLIS would have timed);
* left out: the α (CPU) term, a per-request overhead outside the GPU step the step sets
  measure (the serving replay adds each backend's measured host time for every predictor).

BLIS's docs give no rule to carry β to another GPU ("requires hours of profiling per (model,
GPU, TP, vLLM version)"), so a target GPU other than a home's is NotSupported, with that reason:
the model scores its home's held-out cells and nothing it never saw.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy.optimize import nnls

from leaderboard_core.contract import Home, NotSupported, PredictorCard
from leaderboard_core.specs import GpuSpec
from predictors.base import Predictor
from predictors.registry import register
from predictors.steps import Steps

TERMS = ("beta0", "beta1", "beta2")


def iteration_features(cells: pl.DataFrame) -> np.ndarray:
    """Per cell, BLIS's regressors: 1, uncached prefill tokens, decode tokens."""
    steps = Steps.from_cells(cells)
    return np.column_stack([np.ones(len(cells)), steps.sum(steps.pf_q),
                            steps.num_decode.astype(np.float64)])


def fit_betas(features: np.ndarray, measured_ms: np.ndarray) -> np.ndarray | None:
    """β ≥ 0 minimising Σ((Xβ − y)/y)²; None when the rows cannot pin down all three (fewer
    rows than terms, or a regressor that never varies from zero)."""
    if len(measured_ms) < len(TERMS) or not np.all(np.abs(features).max(axis=0) > 0):
        return None
    scaled = features / measured_ms[:, None]
    norms = scaled.max(axis=0)
    betas, _ = nnls(scaled / norms, np.ones_like(measured_ms))
    return betas / norms


@register("blis_blackbox")
class BlisBlackbox(Predictor):
    """BLIS's blackbox GPU-time line, β fitted per (GPU, model, TP) on the home's measured
    steps."""

    card = PredictorCard(
        kind="profiled",
        reference="BLIS (inference-sim/inference-sim), blackbox latency model; docs/approach.md",
        description="β0 + β1·prefill tokens + β2·decode tokens per (GPU, model, TP), fitted on "
                    "the home; no rule to carry it to another GPU (NotSupported there)",
        needs_profiled_rows=True, layers=("dense", "moe", "moe_ep"))

    def fit(self, home: Home) -> BlisBlackbox:
        super().fit(home)
        cells = home.cells
        if "composed" in cells.columns:
            cells = cells.filter(~pl.col("composed"))
        cells = cells.filter(pl.col("gt_ms").is_finite() & (pl.col("gt_ms") > 0))
        self.betas_, self.fit_notes_ = {}, {}
        if "sku" not in cells.columns:  # one home: its cells are the home GPU's
            cells = cells.with_columns(sku=pl.lit(home.sku))
        for (sku, model, tp), group in cells.group_by("sku", "model", "tp", maintain_order=True):
            betas = fit_betas(iteration_features(group), group["gt_ms"].to_numpy())
            if betas is None:
                self.fit_notes_[f"{sku} {model} TP{tp}"] = f"{len(group)} rows cannot fit"
            else:
                self.betas_[(sku, model, int(tp))] = betas
        self.home_skus_ = sorted(home.gpus or {home.sku: home.gpu})
        self.profiled_rows_ = len(cells)
        return self

    def predict(self, cells: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        if gpu.sku not in self.home_skus_:
            raise NotSupported(
                f"{self.name}'s coefficients are trained per (model, GPU, TP, vLLM version) on "
                f"{'/'.join(self.home_skus_)}; BLIS documents no rule to carry them to {gpu.sku}")
        keys = [(gpu.sku, m, t) for m, t in zip(cells["model"], cells["tp"].cast(pl.Int64),
                                                  strict=True)]
        if missing := sorted({f"{m} TP{t}" for _, m, t in keys if (gpu.sku, m, t) not in
                              self.betas_}):
            raise NotSupported(f"{self.name} has no coefficients for {', '.join(missing)} "
                               f"(fitted: {len(self.betas_)} (model, TP) pairs; notes: "
                               f"{self.fit_notes_})")
        betas = np.array([self.betas_[k] for k in keys])
        return (iteration_features(cells) * betas).sum(axis=1)
