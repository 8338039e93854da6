"""BLIS's roofline v2 step model (``inference-sim/inference-sim``), re-implemented from its
public documentation (docs/baselines.md §10), not from its code.

BLIS v2 prices each op of a step as max(FLOP / (peak x MFU), bytes / bandwidth), the MFU looked
up per op from benchmark tables (GEMMs by shape, attention by batch and sequence length, the
nearest measured point where a shape was not benchmarked), sums a phase's ops, and combines a
mixed batch's prefill and decode phases by the max; TP adds all-reduce time. What is kept and
what changed:

* kept: the per-op max(FLOP / (peak x MFU), bytes / peak bandwidth), MFU by nearest neighbour
  (in the log of the shape, within the same dtype, head layout or expert shape, borrowing the
  whole family where the home measured none of that key), phases combined by the max;
* changed: BLIS's MFU tables are its own kernel benchmarks, which hold other GPUs'
  measurements and are never read here. The MFU of every home op point is rebuilt from the home
  GPU's measured points only: MFU = FLOP / (home peak x measured time). A step's ops are those
  the step sets compose (``_step_ops.step_points``: four GEMMs, a prefill- and a
  decode-attention kernel, the fused MoE kernel); the all-reduce is the message over the
  target's link (its datasheet), for the whole step, added after the phase max;
* left out: BLIS's static overheads (a fixed per-step and per-layer time), host time outside
  the GPU block the step sets measure (the serving replay adds measured host time for every
  predictor), and the LM head, which BLIS's op list does not name.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy.spatial import cKDTree

from leaderboard_core.contract import Home, NotSupported, PredictorCard
from leaderboard_core.specs import load_models
from predictors._roofline import in_first_home_units, peaks, point_seconds, point_work
from predictors._step_ops import step_points
from predictors.base import Predictor
from predictors.registry import register

# Per op family: the shape axes the MFU is looked up along, and the columns that must match.
AXES = {"gemm": ("m", "n", "k"), "attn_prefill": ("batch", "q_len"),
        "attn_decode": ("batch", "kv_len"), "moe": ("num_tokens",)}
MATCH = {"gemm": ("dtype",), "attn_prefill": ("num_heads", "num_kv_heads", "head_dim"),
         "attn_decode": ("num_heads", "num_kv_heads", "head_dim"),
         "moe": ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp", "moe_ep", "dtype")}
NEVER_BORROWED = {"gemm": ("dtype",), "moe": ("dtype",)}  # an FP8 kernel is not a BF16 one


def _family(op: str) -> str:
    return "gemm" if op.startswith("gemm") else op


def _peak_flops(frame: pl.DataFrame, peak: dict[str, float]) -> np.ndarray:
    """Per point, the tensor-core peak its dtype runs at (FP8 tables at the FP8 peak)."""
    if "dtype" not in frame.columns:
        return np.full(len(frame), peak["flops"])
    fp8 = frame["dtype"].cast(pl.String).str.starts_with("fp8").fill_null(False).to_numpy()
    return np.where(fp8, peak["fp8_flops"], peak["flops"])


def _log_axes(frame: pl.DataFrame, family: str) -> np.ndarray:
    return np.log2(np.column_stack([frame[c].to_numpy().astype(np.float64)
                                    for c in AXES[family]]) + 1.0)


def _phase_cells(cells: pl.DataFrame, phase: str) -> pl.DataFrame:
    """The prefill or the decode requests of each cell, as a step of their own."""
    zero = pl.lit(0, pl.Int64)
    if phase == "prefill":
        return cells.with_columns(total_tokens=pl.col("prefill_tokens"), num_decode=zero,
                                  decode_ctx_sum=zero)
    return cells.with_columns(total_tokens=pl.col("num_decode"), num_prefill=zero,
                              prefill_tokens=zero)


@register("blis_roofline")
class BlisRoofline(Predictor):
    """BLIS's roofline v2, its MFU tables rebuilt from the home GPU's measured op points."""

    card = PredictorCard(
        kind="profiled",
        reference="BLIS (inference-sim/inference-sim), roofline v2 latency model; "
                  "docs/concepts/roofline.md",
        description="per op max(FLOP / (peak x MFU), bytes / bandwidth), MFU by nearest home "
                    "op point; prefill and decode phases combined by the max; all-reduce over "
                    "the link",
        needs_profiled_rows=True, precisions=("bf16", "fp8"), layers=("dense", "moe", "moe_ep"))

    def fit(self, home: Home) -> BlisRoofline:
        ops = in_first_home_units(home)
        if not any(name.startswith("gemm") for name in ops):
            raise NotSupported(f"blis_roofline rebuilds its MFU tables from the home's measured "
                               f"op points; dataset {home.dataset} has none")
        home_peak = peaks(home.gpu)
        by_family: dict[str, list[pl.DataFrame]] = {}
        for name, frame in ops.items():
            family = _family(name)
            if family not in AXES or frame.is_empty():
                continue
            frame = frame.fill_null(0)
            flop, _ = point_work(family, frame)
            mfu = flop / (_peak_flops(frame, home_peak) * frame["latency_ms"].to_numpy() * 1e-3)
            keep = [c for c in (*AXES[family], *MATCH[family]) if c in frame.columns]
            by_family.setdefault(family, []).append(
                frame.select(keep).with_columns(mfu=pl.Series(mfu)))
        self.tables_ = {f: pl.concat(parts, how="diagonal_relaxed").filter(
            pl.col("mfu").is_finite() & (pl.col("mfu") > 0)) for f, parts in by_family.items()}
        self.profiled_rows_ = sum(len(t) for t in self.tables_.values())
        return super().fit(home)

    def _mfu(self, family: str, query: pl.DataFrame) -> np.ndarray:
        """The MFU of each query point: its nearest home point's, within the same key."""
        if family not in self.tables_:
            raise NotSupported(f"the home measured no {family} points")
        table = self.tables_[family]
        keys = [c for c in MATCH[family] if c in table.columns and c in query.columns]
        out = np.empty(len(query))
        indexed = query.with_row_index("_q")
        for key, rows in (indexed.group_by(keys, maintain_order=True) if keys else [((), indexed)]):
            known = table.filter(pl.all_horizontal(pl.col(c) == v for c, v in zip(keys, key,
                                                                                  strict=True)))
            if known.is_empty():
                fixed = [c for c in NEVER_BORROWED.get(family, ()) if c in keys]
                known = table.filter(pl.all_horizontal(
                    pl.col(c) == v for c, v in zip(keys, key, strict=True) if c in fixed)) \
                    if fixed else table
                if known.is_empty():
                    raise NotSupported(f"the home measured no {family} points of "
                                       f"{dict(zip(keys, key, strict=True))}")
            _, nearest = cKDTree(_log_axes(known, family)).query(_log_axes(rows, family))
            out[rows["_q"].to_numpy()] = known["mfu"].to_numpy()[nearest]
        return out

    def _phase_seconds(self, cells: pl.DataFrame, gpu) -> np.ndarray:
        total, target = np.zeros(len(cells)), peaks(gpu)
        for op, index, calls, query in step_points(cells, load_models()):
            family = _family(op)
            if family not in AXES or not len(index):
                continue
            flop, byte = point_work(family, query)
            seconds = np.maximum(flop / (_peak_flops(query, target) * self._mfu(family, query)),
                                 byte / target["mem_bw"])
            np.add.at(total, index, seconds * calls)
        return total

    def predict(self, cells: pl.DataFrame, gpu) -> np.ndarray:
        # a phase with no requests runs no kernels (its GEMMs would still read the weights)
        prefill = np.where(cells["num_prefill"].to_numpy() > 0,
                           self._phase_seconds(_phase_cells(cells, "prefill"), gpu), 0.0)
        decode = np.where(cells["num_decode"].to_numpy() > 0,
                          self._phase_seconds(_phase_cells(cells, "decode"), gpu), 0.0)
        allreduce = np.zeros(len(cells))
        for op, index, calls, query in step_points(cells, load_models()):
            if op == "allreduce" and len(index):
                np.add.at(allreduce, index, point_seconds(op, query, peaks(gpu)) * calls)
        return (np.maximum(prefill, decode) + allreduce) * 1e3
