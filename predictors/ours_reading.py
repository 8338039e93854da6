"""``ours_reading``: ``ours`` plus a capped deploy reading of a few of the target's op points.

Three things the model needs are not on a datasheet: how long an almost empty kernel takes on
the target (its launch and latency floor follows architecture and software, not the clock
alone), what fraction of the DRAM peak its GEMM kernels stream at, and how long a collective of
a tiny message takes. ``ours_reading`` asks the harness, through the capped reading interface,
for a few points of each, in this order (the cap may cut the later ones):

- ``decode_points`` decode-attention points with the least KV to stream (floor-dominated): the
  attention floors and both attention kernels' per-CTA costs scale by one factor,
  ``fixed_costs``;
- ``gemm_points`` GEMMs of the smallest step with the most weight bytes (memory-bound): the
  memory law's efficiencies scale by one factor, ``memory``;
- ``allreduce_points`` all-reduces of each TP degree's smallest message (latency-dominated):
  the custom all-reduce floor and NCCL's latencies (Simple's step, LL's base and hops) scale
  by ``collective_latency``.

Each factor is the median over its points of what the point needs of the part being scaled (the
measured time less the rest of the modelled time, over the modelled part), clipped to a range a
real GPU stays in. Memory is read first, as the attention kernels stream through the same law.
All other constants stay frozen from the home. The points read, and every cell containing one,
leave the score and count in the run's ``profiled_rows``.

A fourth reading, prefill efficiency from the largest or the median prefill kernels, was tried on
the development GPUs and left out: it moved their mean by under 0.1 point, as the kernels it can
read (compute-bound ones) are not the mid-sized ones the model misses.
"""

from __future__ import annotations

import copy

import numpy as np
import polars as pl

from leaderboard_core.contract import COMPOSED_SOURCES, PredictorCard, Reading, ReadingRequest
from leaderboard_core.specs import GpuSpec
from predictors.ours import Ours, factors, ops
from predictors.ours.step import allreduce_bytes, gemm_shapes
from predictors.registry import register
from predictors.steps import Steps

COLLECTIVE_LATENCIES = ("custom_floor_s", "nccl_step_s", "nccl_ll_base_s", "nccl_ll_hop_s_nvlink",
                        "nccl_ll_hop_s_pcie")
FIXED_COSTS = ("decode_floor_s", "decode_split_floor_s", "decode_cta_s", "prefill_floor_s",
               "prefill_cta_s")
# A reading that puts a part 4x (a bandwidth or efficiency 2x) off is a broken reading, not a GPU.
RANGES = {"fixed_costs": (0.25, 4.0), "memory": (0.5, 2.0), "collective_latency": (0.25, 4.0)}


@register("ours_reading")
class OursReading(Ours):
    card = PredictorCard(
        kind="analytical", reference="docs/ours.md (deploy reading)",
        description="ours with three factors read from a capped deploy reading of the target's "
                    "op points: kernel fixed costs (smallest decode kernels), GEMM memory "
                    "efficiency (largest weights at the smallest step), collective latency "
                    "(smallest all-reduce per TP); "
                    "every other constant frozen from the home",
        needs_profiled_rows=False)
    # 0 reads none of that group; registry.build refuses a negative count
    param_bounds = {"decode_points": (0, None), "gemm_points": (0, None),
                    "allreduce_points": (0, None)}

    def __init__(self, decode_points: int = 4, gemm_points: int = 3, allreduce_points: int = 3):
        super().__init__()
        self.decode_points, self.gemm_points = decode_points, gemm_points
        self.allreduce_points = allreduce_points

    def fit(self, home) -> OursReading:
        super().fit(home)
        self.constants_ = copy.deepcopy(self.constants_)  # the reading rescales this copy only
        self.reading_scales_ = {name: 1.0 for name in RANGES}  # until the reading: as ``ours``
        return self

    def request_reading(self, cells: pl.DataFrame, gpu: GpuSpec, budget: int
                        ) -> ReadingRequest | None:
        """The wall-clock sweep of ``ours`` where the targets are wall-clock steps; on cells
        composed of named op points, the three groups of points above, cut to ``budget``."""
        if "gt_kind" in cells.columns and (cells["gt_kind"] == "wall_clock").any():
            return super().request_reading(cells, gpu, budget)
        if budget < 1 or "source" not in cells.columns or \
                not cells["source"].is_in(COMPOSED_SOURCES).all():
            return None
        s = Steps.from_cells(cells)
        points = (_decode_points(s, self.decode_points) + _gemm_points(s, self.gemm_points)
                  + _allreduce_points(s, self.allreduce_points))
        return ReadingRequest(op_points=tuple(points[:budget])) if points else None

    def take_reading(self, reading: Reading, gpu: GpuSpec) -> None:
        if not reading.cells.is_empty():
            super().take_reading(reading, gpu)
            return
        gemms = [points for op, points in reading.ops.items() if op.startswith("gemm_")]
        if gemms:
            self._scale("memory", self._memory_need(pl.concat(gemms, how="diagonal"), gpu),
                        [("memory_law", "dram"), ("memory_law", "l2")])
        if "attn_decode" in reading.ops:
            self._scale("fixed_costs", self._fixed_need(reading.ops["attn_decode"], gpu),
                        [("attention", k) for k in FIXED_COSTS])
        if "allreduce" in reading.ops:
            self._scale("collective_latency", self._latency_need(reading.ops["allreduce"], gpu),
                        [("collectives", k) for k in COLLECTIVE_LATENCIES])

    def _scale(self, name: str, need: np.ndarray, leaves: list[tuple[str, str]]) -> None:
        """Multiply ``leaves`` by the median of ``need``, clipped to the factor's range."""
        need = need[np.isfinite(need)]
        if need.size == 0:
            return
        factor = float(np.clip(np.median(need), *RANGES[name]))
        self.reading_scales_[name] = factor
        for section, key in leaves:
            self.constants_[section][key] *= factor

    def _memory_need(self, points: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        """Memory-bound GEMMs: modelled streaming time over the measured time less the floor."""
        m, n, k = (points[x].to_numpy().astype(np.float64) for x in ("m", "n", "k"))
        g = ops.gemm(m, n, k, self.device(gpu), self.constants_, self.switches)
        rest = _measured(points) - g["floor_s"]
        return np.where((g["memory_s"] >= g["compute_s"]) & (rest > 0),
                        g["memory_s"] / rest, np.nan)

    def _fixed_need(self, points: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        """Decode kernels: (measured - modelled streaming) over the modelled fixed costs."""
        shape = (points[x].to_numpy().astype(np.float64) for x in (
            "batch", "kv_len", "num_heads", "num_kv_heads", "head_dim"))
        a = ops.decode_attention(*shape, self.device(gpu), self.constants_, self.switches)
        fixed = a["floor_s"] + a["cta_s"]
        return (_measured(points) - (a["seconds"] - fixed)) / fixed

    def _latency_need(self, points: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        """Small all-reduces: the latency scale at which the modelled time meets the measured
        one. Per message the model is the faster of lines in that scale (NCCL's Simple and LL;
        the custom path is one line, the same in both), so the scale is the larger of the two
        lines' own solutions: (measured - the line's volume time) / its latency."""
        size, tp = (points[x].to_numpy().astype(np.float64) for x in ("message_bytes", "num_gpus"))
        dev = self.device(gpu)

        def seconds(collectives: dict) -> np.ndarray:
            c = {**self.constants_, "collectives": {**self.constants_["collectives"],
                                                    **collectives}}
            return ops.allreduce(size, tp, dev, c, self.switches)["seconds"]

        quiet = dict.fromkeys(COLLECTIVE_LATENCIES, 0.0)
        needs = []
        for only in (factors.NCCL_SIMPLE_ONLY, factors.NCCL_LL_ONLY):
            full, volume = seconds(only), seconds({**quiet, **only})
            needs.append((_measured(points) - volume) / (full - volume))
        return np.fmax(*needs)


def _measured(points: pl.DataFrame) -> np.ndarray:
    return points["latency_ms"].to_numpy() * 1e-3


def _ints(**columns) -> dict:
    return {k: int(v) for k, v in columns.items()}


def _decode_points(s: Steps, count: int) -> list[dict]:
    """The decode kernels of pure decode steps with the least KV to stream."""
    sharded = s.sharded()
    cells = np.flatnonzero((s.num_decode > 0) & (s.num_decode == s.num_requests))
    rows = {}
    for i in ([] if count < 1 else cells[np.lexsort((s.num_decode[cells],
                                                  s.decode_ctx[cells] * sharded["kv_heads"][cells]))]):
        point = _ints(batch=s.num_decode[i], kv_len=s.decode_ctx[i] // s.num_decode[i],
                      num_heads=sharded["heads"][i], num_kv_heads=sharded["kv_heads"][i],
                      head_dim=s.head_dim[i])
        rows.setdefault(tuple(point.values()), {"op": "attn_decode", **point})
        if len(rows) == count:
            break
    return list(rows.values())


def _gemm_points(s: Steps, count: int) -> list[dict]:
    """The GEMMs with the most weight bytes at the smallest step (the most memory-bound)."""
    smallest = np.flatnonzero((s.tokens == s.tokens.min()) & ~s.fp8)
    rows = {}
    for op, (n, k) in gemm_shapes(s).items():
        for i in smallest:
            rows.setdefault((s.tokens[i], n[i], k[i]), {"op": op, **_ints(
                m=s.tokens[i], n=n[i], k=k[i])})
    return sorted(rows.values(), key=lambda p: (-p["n"] * p["k"], p["n"], p["op"]))[:count]


def _allreduce_points(s: Steps, count: int) -> list[dict]:
    """Each TP degree's smallest all-reduce message, the lowest degrees first."""
    message = allreduce_bytes(s)
    return [{"op": "allreduce", **_ints(num_gpus=tp, message_bytes=message[s.tp == tp].min())}
            for tp in sorted(set(s.tp[s.tp > 1]))][:count]
