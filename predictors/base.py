"""The predictor contract: scikit-learn style, vectorized, blind to the target's ground truth.

A predictor's hyper-parameters are its constructor fields; what it learns ends in ``_``.
``fit(home)`` sees only the home GPU's training rows and returns ``self``. ``predict(cells, gpu)``
sees the target's cells without their ground-truth columns and the target's datasheet, and
returns one step time in milliseconds per cell.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import polars as pl

from leaderboard_core.contract import Home, NotSupported, PredictorCard, Reading, ReadingRequest
from leaderboard_core.specs import GpuSpec


class Predictor:
    """Base class. Subclasses set ``card`` and implement ``fit`` and ``predict``."""

    card: ClassVar[PredictorCard]
    name: ClassVar[str]  # set by ``register``
    # The allowed values of a parameter that takes one of a few (checked before a run starts).
    param_choices: ClassVar[dict[str, tuple]] = {}
    # The closed range [low, high] of a numeric parameter (None: unbounded on that side),
    # checked before a run starts as the choices are; every float must also be finite.
    param_bounds: ClassVar[dict[str, tuple[float | None, float | None]]] = {}

    @classmethod
    def _parameters(cls) -> list[inspect.Parameter]:
        return [p for p in inspect.signature(cls.__init__).parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    @classmethod
    def param_names(cls) -> list[str]:
        return [p.name for p in cls._parameters()]

    @classmethod
    def default_params(cls) -> dict[str, Any]:
        return {p.name: p.default for p in cls._parameters() if p.default is not p.empty}

    def get_params(self) -> dict[str, Any]:
        return {p: getattr(self, p) for p in self.param_names()}

    def fit(self, home: Home) -> Predictor:
        self.trained_on_ = home.sku
        self.profiled_rows_ = 0
        return self

    def predict(self, cells: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        raise NotImplementedError

    def request_reading(self, cells: pl.DataFrame, gpu: GpuSpec, budget: int
                        ) -> ReadingRequest | None:
        """The one deploy-time reading a predictor may take on the target (ours.md): up to
        ``budget`` target rows, named as cells or op points, or None for none. The harness
        measures nothing new: it hands the named rows' ground truth to ``take_reading``, counts
        them in the run's ``profiled_rows`` and leaves every cell they touch out of the score.
        A request over ``budget`` makes the run INVALID."""
        return None

    def take_reading(self, reading: Reading, gpu: GpuSpec) -> None:
        """Take the deploy reading asked for by ``request_reading``."""

    # Optional hooks the harness calls for any predictor, as it calls ``predict_ops``.

    def explain(self, cell: pl.DataFrame, gpu: GpuSpec) -> list[dict] | None:
        """One blind cell's prediction term by term (``python -m leaderboard.explain``), as
        tables: dicts of ``title``, ``rows`` (each a dict of column to printed value) and an
        optional ``note`` printed above; None (the default) when the predictor offers none."""
        return None

    def predict_by_op(self, cells: pl.DataFrame, gpu: GpuSpec) -> dict[str, np.ndarray] | None:
        """Each step prediction split into the parts it sums, in ms, keyed by the ground truth's
        lineage op names where they match one (``gemm_qkv`` ... ``attn_decode``, ``allreduce``
        of the composed ``_vidur`` cells): the harness files them beside the step prediction and
        the report sets each against its measured op time (the per-op atlas). Called after
        ``predict`` on step targets; None (the default) when the prediction is not split."""
        return None

    @classmethod
    def report_sections(cls, runs: pl.DataFrame) -> list[str]:
        """Markdown sections of its own for RESULTS.md, from the current leaderboard ``runs``
        (one row per run, with its dataset ``family``); the report calls each distinct
        implementation once. None by default."""
        return []

    @classmethod
    def calibration_homes(cls) -> dict[str, dict[str, str]] | None:
        """The homes ``calibrate_constants`` fits on, by role, each as run fields (``dataset``,
        ``home_points``); None (the default) for a predictor without frozen constants."""
        return None

    @classmethod
    def calibrate_constants(cls, homes: dict[str, Home]) -> dict[str, Any]:
        """Refit the predictor's frozen constants on ``homes`` (by the roles
        ``calibration_homes`` names) and write them where ``fit`` reads them (``python -m
        leaderboard.calibrate predictor=<name>``); returns the fitted values."""
        raise NotSupported(f"predictor '{cls.name}' has no constants to calibrate")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"
