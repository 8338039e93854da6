"""The contract between the harness and every predictor: what ``fit`` gets, what a card says,
what a deploy reading is, and the columns a predictor never sees.

Both sides import these types from here, so neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from leaderboard_core.specs import GpuSpec

# Columns a predictor never receives at predict time.
GROUND_TRUTH_COLUMNS = ("gt_ms", "gt_spread_ms", "composed", "warm_share")
KINDS = ("analytical", "learned", "profiled")
PRECISIONS = ("bf16", "fp8")  # GEMM precisions a cell can have (its ``gemm_dtype``)
# Layer kinds a cell's model can have: every FFN dense, or mixture-of-experts layers
# (conf/model's MoE fields; ``leaderboard_core.specs.is_moe``) with each expert split over the TP
# group, or ``moe_ep``: spread whole over it (expert parallelism, a cell's ``moe_ep`` column).
LAYER_KINDS = ("dense", "moe", "moe_ep")
# Which of the home's measured op points fit gets (``split.home_points``, leaderboard/run/home_grid.py).
# Under held_out_shapes they lack every shape a scored cell reads, so constants frozen from the
# default home must be refitted to stay out of sample.
HELD_OUT_SHAPES = "held_out_shapes"
HOME_POINTS = ("full_grid", "behind_cells", "every_shape", HELD_OUT_SHAPES)


@dataclass(frozen=True)
class PredictorCard:
    """What a predictor is, for the leaderboard's tables and the run's metrics.json."""

    kind: str  # analytical | learned | profiled
    reference: str  # paper or repository it re-implements
    description: str
    needs_profiled_rows: bool  # does fit read measured rows at all
    # The GEMM precisions (a cell's ``gemm_dtype``) it prices; the harness answers NotSupported
    # for a home or target holding any other, so no step is silently scored as bf16.
    precisions: tuple[str, ...] = ("bf16",)
    # The layer kinds it prices; the harness answers NotSupported for a home or target holding
    # a model of any other (an MoE model is never priced as a dense one by default).
    layers: tuple[str, ...] = ("dense",)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"card kind '{self.kind}' is not one of {KINDS}")
        if unknown_layers := set(self.layers) - set(LAYER_KINDS):
            raise ValueError(f"card layers {sorted(unknown_layers)} are not among {LAYER_KINDS}")
        unknown = set(self.precisions) - set(PRECISIONS)
        if unknown:
            raise ValueError(f"card precisions {sorted(unknown)} are not among {PRECISIONS}")


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
    that row's GPU (``gpu_of``). ``points`` names which op points ``ops`` holds (one of
    ``HOME_POINTS``).
    """

    sku: str
    gpu: GpuSpec
    dataset: str
    cells: pl.DataFrame
    ops: dict[str, pl.DataFrame] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    published: pl.DataFrame = field(default_factory=pl.DataFrame)
    gpus: dict[str, GpuSpec] = field(default_factory=dict)
    points: str = "behind_cells"

    def __post_init__(self):
        if self.points not in HOME_POINTS:
            raise ValueError(f"home points '{self.points}' are not one of {HOME_POINTS}")
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


class ReadingRefused(ValueError):
    """A reading request the harness does not answer; the run is INVALID with this reason."""


class NotSupported(ValueError):
    """The predictor cannot score this input (say which, and what it does support)."""


def expert_parallel(frame: pl.DataFrame) -> np.ndarray:
    """Per row of ``frame`` (cells, or MoE op points), the GPUs its experts are spread over
    whole (``moe_ep``); 1 where every expert is split over the TP group, vLLM's default (a null
    ``moe_ep``, a frame without the column, a dense model)."""
    if "moe_ep" not in frame.columns:
        return np.ones(len(frame), np.int64)
    return frame["moe_ep"].fill_null(1).to_numpy().astype(np.int64)


def expert_groups(cells: pl.DataFrame) -> dict[tuple[str, int], int]:
    """Per (model, TP) of ``cells``, its ``expert_parallel`` placement. A configuration the cells
    hold under two placements raises: score one placement at a time."""
    placed = cells.select("model", "tp", ep=pl.Series(expert_parallel(cells))).unique()
    if (twice := placed.filter(pl.len().over("model", "tp") > 1)).height:
        raise ValueError(f"cells hold {sorted(set(twice.select('model', 'tp').iter_rows()))} with "
                         "experts both split over the TP group and spread whole over it; score "
                         "one placement at a time")
    return {(name, tp): ep for name, tp, ep in placed.iter_rows()}


# One layer's token-level ops in Vidur's profile (mlp.csv), the op names its cells and a home's
# ops carry; the embedding is outside the layers and phi-2's parallel block has no
# post_attention_layernorm.
VIDUR_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
# Cell sources whose ground truth sums only these per-layer token-level ops: the GEMMs and the
# light kernels (norms, rotary, activation, residual add), with no attention kernel and no
# all-reduce (leaderboard/cells/profiles.py, the vidurprof card). A predictor pricing a whole
# step prices only these on such cells, from the blind ``source`` column.
LAYER_OP_SOURCES = {"vidur": VIDUR_OPS}
# Cell sources composed from op points named gemm_*, attn_prefill, attn_decode and allreduce
# (leaderboard/cells/vidur_method.py): the points a deploy reading can name on such cells.
COMPOSED_SOURCES = ("aiconfigurator",)
# A run's predictions file carries a predictor's per-op split (Predictor.predict_by_op) as one
# ``op_ms_<op>`` column per part.
BY_OP_PREFIX = "op_ms_"
