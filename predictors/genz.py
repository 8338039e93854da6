"""GenZ-style roofline (GenZ-LLM-Analyzer), re-implemented from baselines.md §3.

Every step uses GenZ's chunked formulation (§3.2, ``chunked_moddeling``), which covers pure
prefill with uneven prompts, pure decode with uneven contexts and mixed steps alike:

* QKV and out-projection GEMMs over all T tokens of the step, counting weight bytes only
  (the chunked form keeps their activations on-chip);
* the up/gate and down GEMMs with input, weight and output all off-chip;
* per prefill request a Logit and an Attend over ``q`` queries and ``c + q`` keys, with no
  causal halving (faithful; §8.6);
* per decode request a Logit and an Attend over its ``c`` cached tokens, K (resp. V) bytes only;
* two ring all-reduces of T·h elements per layer when TP > 1 (§3.3), over the GPU's own
  interconnect at one direction's bandwidth (``_roofline.link_gbs_per_direction``), with GenZ's
  default 1 µs link latency.

Each operator costs ``max(2·MAC/(F·ceff), bytes/(BW·meff))`` (an operator without MACs costs
nothing), the layer sum is multiplied by L, and GenZ's embedding and classifier GEMMs are left
out (§0.2). GenZ has no norm, activation, rope or softmax operators. Decode runs with beam width
1: GenZ's ``decode_moddeling`` default of 4 would multiply the batch (§3.2 pitfall).

An MoE layer (the ``_vidur_moe`` cells) runs its routed experts in place of the up/gate and
down GEMMs: ``tokens x top-k`` routed rows through each expert's gate/up and down, all off-chip,
with the weights of every expert some token touches (``_roofline.expert_work``); the dense FFN
runs in the dense layers only. GenZ models MoE FFNs too, but its own expert accounting was not
checked against this: the touched-expert rule is the suite's, shared by every roofline here.

GenZ's quirk kept behind ``binary_bw=True``: it reads every "GB/s" (memory and link) as
2^30 B/s, so its memory-bound times are 1e9/2^30 = 0.931 of a decimal reading.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import polars as pl

from leaderboard_core.contract import Home, PredictorCard
from leaderboard_core.specs import GpuSpec
from predictors._roofline import (
    ALLREDUCES_PER_LAYER,
    BF16_BYTES,
    GENZ_COLLECTIVE_FIXED_S,
    expert_work,
    link_gbs_per_direction,
    peak_flops,
    ring_allreduce_s,
)
from predictors.base import Predictor
from predictors.registry import register
from predictors.steps import Steps

GENZ_REFERENCE = ("Bambhaniya et al., 'Demystifying Platform Requirements for Diverse LLM "
                  "Inference Use Cases', arXiv 2406.01698; github.com/abhibambhaniya/GenZ-LLM-Analyzer")
GIB = float(2**30)


@dataclass
class OperatorTable:
    """Every GenZ operator of every cell at efficiency 1, already multiplied by the layers.

    Kept apart from the efficiencies so that calibration can re-time it cheaply."""

    cell: np.ndarray  # the cell each operator belongs to
    compute_s: np.ndarray
    memory_s: np.ndarray
    collective_s: np.ndarray  # one per cell

    def step_ms(self, compute_efficiency: float, memory_efficiency: float) -> np.ndarray:
        per_op = np.where(self.compute_s > 0,
                          np.maximum(self.compute_s / compute_efficiency,
                                     self.memory_s / memory_efficiency), 0.0)
        blocks = np.bincount(self.cell, weights=per_op, minlength=len(self.collective_s))
        return (blocks + self.collective_s) * 1e3


def operator_table(steps: Steps, gpu: GpuSpec, binary_bw: bool = True,
                   link_latency_us: float = 1.0) -> OperatorTable:
    giga = GIB if binary_bw else 1e9
    mem_bytes_per_s = float(gpu["mem_bw_gbs"]) * giga
    link_bytes_per_s = link_gbs_per_direction(gpu) * giga
    # GenZ shards with ceil (H' = ceil(n_q/P) and so on).
    heads, kv_heads, ffn = (np.ceil(w / steps.tp) for w in (steps.heads, steps.kv_heads, steps.ffn))
    d, h, tokens = steps.head_dim, steps.hidden, steps.tokens
    qkv_width, up_width = (heads + 2 * kv_heads) * d, (1 + steps.gated) * ffn
    # (MACs, off-chip elements) per cell and layer. A decode request's Logit and Attend have
    # equal MACs and bytes, both proportional to its context, so summing max(compute, memory)
    # over the decode requests equals one operator over their summed context (exact).
    # (MACs, off-chip elements, layers it runs in) per cell.
    experts = expert_work(steps)  # an MoE layer: the routed experts in place of the dense FFN
    rows, touched, width = experts["rows"], experts["touched"], experts["width"]
    per_cell = [
        (tokens * qkv_width * h, qkv_width * h, steps.layers),
        (tokens * h * heads * d, h * heads * d, steps.layers),
        (tokens * up_width * h, tokens * h + up_width * h + tokens * up_width, steps.dense_layers),
        (tokens * h * ffn, tokens * ffn + h * ffn + tokens * h, steps.dense_layers),
        (rows * 2 * width * h, rows * h + touched * 2 * width * h + rows * 2 * width,
         steps.moe_layers),
        (rows * width * h, rows * width + touched * width * h + rows * h, steps.moe_layers),
        (2 * heads * d * steps.decode_ctx, 2 * kv_heads * d * steps.decode_ctx, steps.layers),
    ]
    # A prefill request's Logit (Q+K off-chip) and Attend (V+out off-chip) are equal too.
    pf, q, keys = steps.pf_cell, steps.pf_q, steps.pf_ctx + steps.pf_q
    per_prefill_request = (2 * heads[pf] * d[pf] * q * keys,
                           2 * d[pf] * (heads[pf] * q + kv_heads[pf] * keys))
    cell = np.concatenate([np.tile(np.arange(steps.n), len(per_cell)), pf])
    macs = np.concatenate([m for m, _, _ in per_cell] + [per_prefill_request[0]])
    elements = np.concatenate([e for _, e, _ in per_cell] + [per_prefill_request[1]])
    layers = np.concatenate([n for _, _, n in per_cell] + [steps.layers[pf]])
    allreduce_s = ring_allreduce_s(BF16_BYTES * tokens * h, steps.tp, link_bytes_per_s,
                                   link_latency_us * 1e-6, GENZ_COLLECTIVE_FIXED_S)
    return OperatorTable(cell=cell, compute_s=2 * macs / peak_flops(gpu) * layers,
                         memory_s=BF16_BYTES * elements / mem_bytes_per_s * layers,
                         collective_s=ALLREDUCES_PER_LAYER * steps.layers * allreduce_s)


@register("genz")
class GenZ(Predictor):
    card = PredictorCard(
        kind="analytical", reference=GENZ_REFERENCE, needs_profiled_rows=False,
        description="GenZ's chunked roofline for every step: per-operator max(compute, memory) "
                    "at datasheet peaks, ring all-reduces over the GPU's link, binary GB/s; MoE "
                    "layers at their active experts", layers=("dense", "moe", "moe_ep"))
    # an efficiency is a share of the peak; a latency is not negative
    param_bounds = {"compute_efficiency": (1e-3, 1.0), "memory_efficiency": (1e-3, 1.0),
                    "link_latency_us": (0.0, None)}

    def __init__(self, compute_efficiency: float = 1.0, memory_efficiency: float = 1.0,
                 binary_bw: bool = True, link_latency_us: float = 1.0):
        self.compute_efficiency = compute_efficiency
        self.memory_efficiency = memory_efficiency
        self.binary_bw = binary_bw
        self.link_latency_us = link_latency_us

    def efficiencies(self) -> tuple[float, float]:
        return self.compute_efficiency, self.memory_efficiency

    def predict(self, cells: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        table = operator_table(Steps.from_cells(cells), gpu, self.binary_bw, self.link_latency_us)
        return table.step_ms(*self.efficiencies())


@register("genz_calibrated")
class GenZCalibrated(GenZ):
    """GenZ with its efficiencies grid-searched on the home's training cells (§3.4).

    The fit minimises MAPE over the home cells that carry ground truth; prediction applies the
    learned efficiencies to the target's datasheet peaks. ``shared_efficiency=True`` searches one
    ``system_eff`` for both, as GenZ's own entry points pass it; the default searches compute and
    memory efficiency separately, which is what a calibration of two ceilings needs."""

    card = PredictorCard(
        kind="analytical", reference=GENZ_REFERENCE, needs_profiled_rows=True,
        description="GenZ's chunked roofline with compute/memory efficiencies grid-searched for "
                    "MAPE on the home GPU's training cells, applied to the target's peaks; MoE "
                    "layers at their active experts", layers=("dense", "moe", "moe_ep"))
    param_bounds = {"efficiency_min": (1e-3, 1.0), "efficiency_max": (1e-3, 1.0),
                    "efficiency_step": (1e-4, 1.0), "link_latency_us": (0.0, None)}

    def __init__(self, shared_efficiency: bool = False, efficiency_min: float = 0.30,
                 efficiency_max: float = 1.00, efficiency_step: float = 0.01,
                 binary_bw: bool = True, link_latency_us: float = 1.0):
        self.shared_efficiency = shared_efficiency
        self.efficiency_min = efficiency_min
        self.efficiency_max = efficiency_max
        self.efficiency_step = efficiency_step
        self.binary_bw = binary_bw
        self.link_latency_us = link_latency_us

    def fit(self, home: Home) -> GenZCalibrated:
        super().fit(home)
        measured = home.cells.filter(pl.col("gt_ms").is_not_null() & (pl.col("gt_ms") > 0))
        if measured.is_empty():
            raise ValueError(f"home {home.dataset} has no cells with ground truth to calibrate on")
        # Each home GPU's cells against its own datasheet; the efficiencies are shared.
        tables = [(operator_table(Steps.from_cells(rows), gpu, self.binary_bw,
                                  self.link_latency_us), rows["gt_ms"].to_numpy())
                  for gpu, rows in home.by_gpu(measured)]
        count = int(round((self.efficiency_max - self.efficiency_min) / self.efficiency_step)) + 1
        grid = np.round(self.efficiency_min + self.efficiency_step * np.arange(count), 6)
        candidates = ([(e, e) for e in grid] if self.shared_efficiency
                      else list(itertools.product(grid, grid)))
        mape = [float(np.mean(np.concatenate([np.abs(table.step_ms(c, m) / truth - 1.0)
                                              for table, truth in tables]))) * 100.0
                for c, m in candidates]
        best = int(np.argmin(mape))
        self.compute_efficiency_, self.memory_efficiency_ = (float(e) for e in candidates[best])
        self.home_mape_ = mape[best]
        self.profiled_rows_ = len(measured)
        return self

    def efficiencies(self) -> tuple[float, float]:
        if not hasattr(self, "compute_efficiency_"):
            raise RuntimeError("genz_calibrated must be fitted on a home before predict")
        return self.compute_efficiency_, self.memory_efficiency_
