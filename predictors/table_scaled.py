"""``table_scaled``: a profiled lookup. Each op a step runs (or each op-level point) is read from
the home GPU's measured table, then scaled to the target by the datasheet ratio of the op's
roofline bound, as ``rf_scaled`` scales its forests (baselines.md §2.6 (b)).

The lookup follows the interpolation rules aiconfigurator describes for its own tables
(``perf_interp_design.md``), re-implemented from the description:

- a shape measured on the home is its measured time (exact on the grid);
- between measured shapes, linear interpolation of log time in the log of the shape's varying
  dimensions (GEMM m, n, k; attention batch, new tokens, context; all-reduce bytes), inside the
  hull of the measured points of the same fixed key (dtype and head layout, or the TP degree);
- outside it, the nearest measured point, and the query counts as extrapolated (``lookup``
  returns the mask);
- a key the home never measured (a head layout or dtype of an op-level target) borrows the
  nearest measured key, rescaled by the home roofline time of the two shapes (extrapolated).

A step is composed as the ``_vidur`` cells are: per layer the four GEMMs at m = the step's
tokens, one prefill-attention kernel over its prefills (a uniform batch at their mean length)
and one decode-attention kernel over its decodes (at their mean context), two all-reduces of
the activations at TP > 1; times the layers. On the home every ``_vidur`` cell is a measured
grid point, so the home column is in-sample for this predictor. Attention is read at the KV
dtype a step names (an FP8 cache reads the FP8-KV tables, and a head layout they lack borrows
another FP8-KV layout, never a BF16 one), and from a 16-bit cache's points where it names
none. An MoE layer's routed experts are one fused-MoE kernel, read from the home's MoE points
of the same expert shape and TP, interpolated in the token count, at the dtype the step's GEMMs
read (block-scaled FP8 for a checkpoint that scales per block, ``_step_ops.table_dtype``).

A step whose ground truth is not the layers' GPU kernels alone (``gt_kind`` other than
``gpu_block``: measured serving, wall-clock steps) also runs the LM head, as aiconfigurator's own
step model does: one GEMM per step at m = the step's requests, n = vocabulary / TP, k = hidden.
The tables stop below the vocabulary sizes (n ≤ 65,536), so the LM head is read as the fewest
equal column slices inside the grid, each a measured-table lookup. ``lm_head=False`` leaves it
out. Light kernels (norms, rotary, activations, sampling) have no table and are never priced.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

from leaderboard_core.contract import Home, NotSupported, PredictorCard
from leaderboard_core.specs import SIXTEEN_BIT_KV, load_models
from predictors._roofline import in_first_home_units, peaks, point_seconds
from predictors._step_ops import TABLE_DTYPES, step_points
from predictors.base import Predictor
from predictors.registry import register

# Per op family: the columns that vary within a table, and those that pick the table.
AXES = {"gemm": ("m", "n", "k"), "attn_prefill": ("batch", "q_len", "kv_len"),
        "attn_decode": ("batch", "kv_len"), "allreduce": ("message_bytes",),
        "moe": ("num_tokens",)}
KEYS = {"gemm": ("dtype",), "attn_prefill": ("num_heads", "num_kv_heads", "head_dim", "dtype",
                                            "kv_dtype", "window_size"),
        "allreduce": ("num_gpus",),
        "moe": ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp", "moe_ep", "dtype")}
KEYS["attn_decode"] = KEYS["attn_prefill"]
# A step that names its KV cache's dtype (an FP8 cache) reads attention of that dtype only: the
# roofline ratio does not see the KV bytes, so a BF16 kernel borrowed for it would price it as
# BF16. Op-level points keep borrowing across KV dtypes, as they always have.
STEP_KV_KEY = ("kv_dtype",)


def family_of(op: str) -> str:
    return "gemm" if op.startswith("gemm") else op


def lookup(table: pl.DataFrame, family: str, query: pl.DataFrame, home_peaks: dict[str, float],
           prepared: dict | None = None, never_borrowed: tuple[str, ...] = ()
           ) -> tuple[np.ndarray, np.ndarray]:
    """Home latency (ms) of each query point, and whether it was extrapolated. The fixed key is
    every column of ``KEYS[family]`` the query carries; an attention query that names no KV
    dtype reads a 16-bit cache's points. A key the home never measured (a head
    layout, a dtype) borrows the nearest measured key's table, rescaled by the home roofline
    time of the query's shape over the borrowed shape's, and counts as extrapolated; a borrowed
    key matches the query on every column of ``never_borrowed`` it carries (NotSupported where
    no measured key does, or the table records no such column)."""
    if "kv_dtype" in KEYS[family] and "kv_dtype" in table.columns and "kv_dtype" not in query.columns:
        table = table.filter(pl.col("kv_dtype").is_in(list(SIXTEEN_BIT_KV)) | pl.col("kv_dtype").is_null())
    keys = [c for c in KEYS[family] if c in query.columns and c in table.columns]
    if unkeyed := [c for c in never_borrowed if c in query.columns and c not in table.columns]:
        raise NotSupported(f"the home's {family} points record no {'/'.join(unkeyed)}, which "
                           "the query names and never reads from another kernel")
    ms, outside = np.full(len(query), np.nan), np.zeros(len(query), bool)
    indexed = query.with_row_index("_q")
    for key, rows in indexed.group_by(keys, maintain_order=True) if keys else [((), indexed)]:
        wanted = dict(zip(keys, key, strict=True))
        known = table.filter(*[pl.col(c) == v for c, v in wanted.items()]) if keys else table
        i = rows["_q"].to_numpy()
        if known.is_empty():
            fixed = {c: v for c, v in wanted.items() if c in never_borrowed}
            candidates = table.filter(*[pl.col(c) == v for c, v in fixed.items()]) if fixed else table
            if candidates.is_empty():
                raise NotSupported(f"the home measured no {family} point at "
                                   + ", ".join(f"{c} {v}" for c, v in fixed.items())
                                   + "; a query at it never reads another one's kernels")
            nearest = _nearest_key(candidates, wanted)
            known = table.filter(*[pl.col(c) == v for c, v in nearest.items()])
            borrowed = rows.with_columns(**{c: pl.lit(v) for c, v in nearest.items()})
            ms[i], _ = _interpolate(known, AXES[family], rows, prepared, (family, *nearest.items()))
            ms[i] *= (point_seconds(family, rows, home_peaks)
                      / point_seconds(family, borrowed, home_peaks))
            outside[i] = True
        else:
            ms[i], outside[i] = _interpolate(known, AXES[family], rows, prepared,
                                             (family, *wanted.items()))
    return ms, outside


def _nearest_key(table: pl.DataFrame, wanted: dict) -> dict:
    """The measured key sharing most columns with ``wanted``, then the one whose named columns
    (dtype, KV dtype) match, since another dtype is another kernel while another shape is
    rescaled by the roofline, then nearest in log distance; ties go to the first in sorted
    order."""

    def distance(candidate: dict) -> tuple[int, int, float, str]:
        same = sum(candidate[c] == v for c, v in wanted.items())
        renamed = sum(candidate[c] != v for c, v in wanted.items() if isinstance(v, str))
        apart = sum(abs(np.log(max(float(candidate[c]), 1.0)) - np.log(max(float(v), 1.0)))
                    for c, v in wanted.items() if isinstance(v, (int, float))
                    and isinstance(candidate[c], (int, float)))
        return -same, renamed, apart, repr(sorted(candidate.items()))
    return min(table.select(list(wanted)).unique().to_dicts(), key=distance)


# Query points kept per triangulation: a long replay asks for many, and an unbounded memory of
# them grew without limit (about 100 bytes an entry).
MAX_ANSWERED = 500_000


def _interpolate(known: pl.DataFrame, axes: tuple[str, ...], rows: pl.DataFrame,
                 prepared: dict | None = None, key=None):
    """Log-log interpolation in the axes that vary among ``known``; nearest point outside.
    ``prepared`` caches, per ``key``, the triangulation and every query point already answered:
    a replay asks for many small batches that repeat shapes, and a point on the hull of a lattice
    costs SciPy a brute-force simplex search."""
    if prepared is not None and key in prepared:
        varying, x, values, linear, answered = prepared[key]
    else:
        points = known.group_by(axes).agg(pl.col("latency_ms").median()).sort(axes)  # order fixes the hull
        varying = [a for a in axes if points[a].n_unique() > 1]
        x = _log(points, varying)
        values = np.log(points["latency_ms"].to_numpy())
        linear, answered = None, {}
        if len(varying) > 1:
            try:
                linear = LinearNDInterpolator(x, values)
            except Exception:  # noqa: BLE001 - a degenerate hull (points on one plane): nearest only
                linear = None
        if prepared is not None:
            prepared[key] = varying, x, values, linear, answered
    q = _log(rows, varying)
    if not varying:
        return np.full(len(rows), np.exp(values[0])), np.zeros(len(rows), bool)
    if len(varying) == 1:
        order = np.argsort(x[:, 0])
        grid, at = x[order, 0], q[:, 0]
        outside = (at < grid[0]) | (at > grid[-1])
        return np.exp(np.interp(at, grid, values[order])), outside
    unique, back = _unique_rows(q)
    if len(answered) + len(unique) > MAX_ANSWERED:
        answered.clear()  # answers are recomputed alike: the bound changes no prediction
    new = np.array([tuple(point) not in answered for point in unique], bool)
    if new.any():
        fresh = unique[new]
        inside = linear(fresh) if linear is not None else np.full(len(fresh), np.nan)
        outside = np.isnan(inside)
        if outside.any():
            inside[outside] = NearestNDInterpolator(x, values)(fresh[outside])
        answered.update(zip(map(tuple, fresh), zip(inside, outside, strict=True), strict=True))
    kept = [answered[tuple(point)] for point in unique]
    log_ms, outside = np.array([v for v, _ in kept]), np.array([o for _, o in kept], bool)
    return np.exp(log_ms[back.ravel()]), outside[back.ravel()]


def _unique_rows(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(q, axis=0, return_inverse=True)``: the distinct rows in lexicographic order
    and each row's index among them, by Polars' dense rank of the rows (NumPy sorts rows as
    opaque records, 1.7 s for a million rows against 0.2 s)."""
    frame = pl.DataFrame(q, schema=[f"c{j}" for j in range(q.shape[1])], orient="row")
    back = frame.select(pl.struct(pl.all()).rank("dense").cast(pl.Int64) - 1).to_series().to_numpy()
    unique = np.empty((int(back.max()) + 1 if len(back) else 0, q.shape[1]), q.dtype)
    unique[back] = q
    return unique, back


def _log(frame: pl.DataFrame, columns: list[str]) -> np.ndarray:
    return np.log(np.maximum(frame.select(columns).to_numpy().astype(np.float64), 1.0))


@register("table_scaled")
class TableScaled(Predictor):
    card = PredictorCard(
        kind="profiled",
        reference="aiconfigurator (ai-dynamo/aiconfigurator): interpolation in measured kernel "
                  "tables, perf_interp_design.md, re-implemented; cross-GPU scaling as rf_scaled "
                  "(baselines.md §2.6 (b))",
        description="each op read from the home GPU's measured table (log-log interpolation off "
                    "the grid, nearest point outside it), scaled by the roofline-time ratio, "
                    "target over home; the LM head on steps that are not GPU-block ground truth",
        needs_profiled_rows=True, precisions=("bf16", "fp8"), layers=("dense", "moe", "moe_ep"))

    def __init__(self, lm_head: bool = True):
        self.lm_head = lm_head

    def fit(self, home: Home) -> TableScaled:
        ops = in_first_home_units(home)
        if not any(name.startswith("gemm") for name in ops):
            raise NotSupported(f"table_scaled reads the home's measured op points; dataset "
                               f"{home.dataset} has none (the _vidur and _ops families have them)")
        by_family: dict[str, list[pl.DataFrame]] = {}
        for name, frame in ops.items():
            if family_of(name) in AXES:
                columns = [c for c in (*AXES[family_of(name)], *KEYS[family_of(name)],
                                       "latency_ms") if c in frame.columns]
                by_family.setdefault(family_of(name), []).append(frame.select(columns))
        self.tables_ = {f: pl.concat(frames, how="diagonal_relaxed")
                        for f, frames in by_family.items()}
        self.home_peaks_ = peaks(home.gpu)
        self.prepared_: dict = {}  # triangulations, built on first use
        self.profiled_rows_ = sum(len(t) for t in self.tables_.values())
        return super().fit(home)

    def _priced(self, family: str, query: pl.DataFrame, gpu,
                never_borrowed: tuple[str, ...] = ()) -> np.ndarray:
        if family not in self.tables_:
            raise NotSupported(f"the home measured no {family} points")
        ms, _ = lookup(self.tables_[family], family, query, self.home_peaks_, self.prepared_,
                       never_borrowed)
        return ms * (point_seconds(family, query, peaks(gpu))
                     / point_seconds(family, query, self.home_peaks_))

    def predict(self, cells: pl.DataFrame, gpu) -> np.ndarray:
        max_n = int(self.tables_["gemm"]["n"].max()) if self.lm_head else None
        total, parts = np.zeros(len(cells)), step_points(cells, load_models(), max_n)
        wanted = {d for f, i, _, query in parts if f == "gemm" and len(i) for d in query["dtype"]}
        measured = set(self.tables_["gemm"]["dtype"]) if "dtype" in self.tables_["gemm"].columns else set()
        missing = wanted - measured - {TABLE_DTYPES["bf16"]}
        if missing:
            raise NotSupported(f"the home measured no {'/'.join(sorted(missing))} GEMMs to look up "
                               "(a home of the FP8 family has fp8; the oracle's every_shape home "
                               "every dtype its GPU's tables hold)")
        for family in AXES:  # one lookup per family: its interpolants are built once
            mine = [(i, calls, query) for f, i, calls, query in parts if f == family and len(i)]
            if mine:
                ms = self._priced(family, pl.concat([q for *_, q in mine], how="diagonal_relaxed"),
                                  gpu, STEP_KV_KEY)
                np.add.at(total, np.concatenate([i for i, *_ in mine]),
                          ms * np.concatenate([calls for _, calls, _ in mine]))
        return total

    def predict_ops(self, points: pl.DataFrame, gpu) -> np.ndarray:
        out = np.zeros(len(points))
        indexed = points.with_row_index("_p")
        for (phase,), rows in indexed.group_by("phase"):
            family = family_of(phase)
            out[rows["_p"].to_numpy()] = self._priced(family, rows.fill_null(0), gpu)
        return out
