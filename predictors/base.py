"""The predictor contract: scikit-learn style, vectorized, blind to the target's ground truth.

A predictor's hyper-parameters are its constructor fields; what it learns ends in ``_``.
``fit(home)`` sees only the home GPU's training rows and returns ``self``. ``predict(cells, gpu)``
sees the target's cells without their ground-truth columns and the target's datasheet, and
returns one step time in milliseconds per cell.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import polars as pl

from leaderboard.specs import GpuSpec

# Columns a predictor never receives at predict time.
GROUND_TRUTH_COLUMNS = ("gt_ms", "gt_spread_ms", "composed", "warm_share")
KINDS = ("analytical", "learned", "profiled")


@dataclass(frozen=True)
class PredictorCard:
    """What a predictor is, for the leaderboard's tables and the run's metrics.json."""

    kind: str  # analytical | learned | profiled
    reference: str  # paper or repository it re-implements
    description: str
    needs_profiled_rows: bool  # does fit read measured rows at all

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"card kind '{self.kind}' is not one of {KINDS}")


@dataclass(frozen=True)
class Home:
    """Everything ``fit`` may read: the home GPU's training rows, never a held-out or unseen row.

    ``ops`` holds, per lineage op (``gemm_qkv``, ``attn_prefill``, ``attn_decode``,
    ``allreduce``...), the measured points the training cells were composed from. ``published``
    is the store's table of coefficients that upstream tools released (DistServe's fits): an
    artifact of those tools, not any GPU's ground truth here.

    A home of several GPUs (``dataset.home=[a,b]``) has every row tagged with its ``sku`` (a
    column of the cells and of each op frame) and each GPU's datasheet in ``gpus``; ``sku``,
    ``gpu`` and ``dataset`` name the first. A predictor normalises what it fits from each row by
    that row's GPU (``gpu_of``).
    """

    sku: str
    gpu: GpuSpec
    dataset: str
    cells: pl.DataFrame
    ops: dict[str, pl.DataFrame] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    published: pl.DataFrame = field(default_factory=pl.DataFrame)
    gpus: dict[str, GpuSpec] = field(default_factory=dict)

    def __post_init__(self):
        if not self.gpus:
            object.__setattr__(self, "gpus", {self.sku: self.gpu})

    def by_gpu(self, frame: pl.DataFrame):
        """(GPU spec, its rows) per home GPU of ``frame``, in ``gpus`` order. With several homes
        the rows are told apart by their ``sku`` column; one home takes them all."""
        if len(self.gpus) == 1:
            return [(self.gpu, frame)]
        return [(gpu, rows) for sku, gpu in self.gpus.items()
                if not (rows := frame.filter(pl.col("sku") == sku)).is_empty()]


@dataclass(frozen=True)
class ReadingRequest:
    """Target rows a predictor asks to read: cells by ``cell_id``, and op points, each a dict of
    the lineage op and its shape (``{"op": "attn_decode", "batch": 8, "kv_len": 512, ...}``;
    every key but ``op`` must match the point's field)."""

    cells: tuple[str, ...] = ()
    op_points: tuple[dict[str, Any], ...] = ()

    @property
    def size(self) -> int:
        return len(self.cells) + len(self.op_points)


@dataclass(frozen=True)
class Reading:
    """The rows of a ``ReadingRequest`` with their ground truth: the cells (``gt_ms``
    included) and, per op, the points (``latency_ms`` included)."""

    cells: pl.DataFrame
    ops: dict[str, pl.DataFrame] = field(default_factory=dict)


class NotSupported(ValueError):
    """The predictor cannot score this input (say which, and what it does support)."""


class Predictor:
    """Base class. Subclasses set ``card`` and implement ``fit`` and ``predict``."""

    card: ClassVar[PredictorCard]
    name: ClassVar[str]  # set by ``register``
    # The allowed values of a parameter that takes one of a few (checked before a run starts).
    param_choices: ClassVar[dict[str, tuple]] = {}

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

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"
