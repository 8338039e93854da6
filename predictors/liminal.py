"""LIMINAL-style decode model (Davies et al., arXiv 2507.14397): baselines.md §5's template.

LIMINAL's equations are not public in a form read here, so this is §5's [RECON] template that
keeps the abstract's ingredients: a coarse per-layer roofline plus an exposed synchronization
latency per collective. Per GPU and layer, with W the layer's weight elements after TP
sharding, T the step's tokens and the requests' KV heads and contexts:

* memory:  ``(e·W + e·Σ 2·kv_len·n_kv·d) / (BW·η_m)``
* compute: ``(2·T·W + Σ attention FLOPs) / (F·η_c)``
* sync:    ``2 · (τ_sync + 2(P-1)/P · e·T·h / link)`` when P > 1 (two all-reduces per layer)
* step:    ``L · (max(memory, compute) + sync)``

A decode request reads its ``c`` cached tokens and costs ``4·c·n_q·d`` attention FLOPs; T is
then the decode batch B, which is the template exactly. **Prefill and mixed steps are outside
LIMINAL's scope.** With ``extend_to_prefill=True`` (the default, so that runs on mixed datasets
stay VALID) they use the extension §5 names: T counts every new token, and a prefill request
of ``q`` tokens on ``c`` cached ones reads ``c + q`` keys and costs ``4·q·(c + q/2)·n_q·d``
causal FLOPs. These predictions are an extension, not LIMINAL. With ``False``, any non-decode
cell raises ``NotSupported``.

An MoE layer (the ``_vidur_moe`` cells) reads the weights of the experts its tokens touch and
computes each token's top-k experts (``_roofline.expert_work``); the dense FFN terms stay on
the dense layers. LIMINAL's paper discusses MoE decode by active parameters; the exact form here
is the suite's, shared by every roofline.

τ_sync is fitted on the home's measured all-reduce points when there are any: the intercept of
a straight line of latency against the ring transfer term at the home's datasheet link (its
slope, the home's achieved link bandwidth, is not carried to the target, which keeps its
datasheet link). Without points it is ``default_tau_sync_us`` = 5 µs, GenZ's fixed
per-collective cost; LIMINAL's own value is not known here. Links are taken one direction,
half the quoted bidirectional figure (``_roofline.link_gbs_per_direction``), in decimal GB/s.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard_core.contract import Home, NotSupported, PredictorCard
from leaderboard_core.specs import GpuSpec
from predictors._roofline import (
    ALLREDUCES_PER_LAYER,
    BF16_BYTES,
    expert_work,
    link_gbs_per_direction,
    peak_flops,
    ring_allreduce_s,
)
from predictors.base import Predictor
from predictors.registry import register
from predictors.steps import Steps


@register("liminal")
class Liminal(Predictor):
    card = PredictorCard(
        kind="analytical", needs_profiled_rows=True,
        reference="Davies, Crago, Sankaralingam, Kozyrakis, 'LIMINAL: Exploring the Frontiers of "
                  "LLM Decode Performance', arXiv 2507.14397 (no code released; baselines.md §5 "
                  "template)",
        description="LIMINAL-style decode roofline per layer, max(memory, compute) plus exposed "
                    "all-reduce sync (tau fitted on the home's all-reduce points); prefill and "
                    "mixed steps are a flagged extension, not LIMINAL; MoE layers at their "
                    "active parameters",
        layers=("dense", "moe", "moe_ep"))
    param_bounds = {"compute_efficiency": (1e-3, 1.0), "memory_efficiency": (1e-3, 1.0),
                    "default_tau_sync_us": (0.0, None)}

    def __init__(self, extend_to_prefill: bool = True, compute_efficiency: float = 1.0,
                 memory_efficiency: float = 1.0, default_tau_sync_us: float = 5.0):
        self.extend_to_prefill = extend_to_prefill
        self.compute_efficiency = compute_efficiency
        self.memory_efficiency = memory_efficiency
        self.default_tau_sync_us = default_tau_sync_us

    def fit(self, home: Home) -> Liminal:
        super().fit(home)
        points = home.ops.get("allreduce", pl.DataFrame())
        self.tau_sync_s_ = self.default_tau_sync_us * 1e-6
        if not points.is_empty():
            # each home GPU's points over its own link (several homes share one tau)
            parts = home.by_gpu(points)
            transfer_s = np.concatenate([ring_allreduce_s(
                rows["message_bytes"].to_numpy().astype(np.float64),
                rows["num_gpus"].to_numpy().astype(np.float64),
                link_gbs_per_direction(gpu) * 1e9, 0.0, 0.0) for gpu, rows in parts])
            measured_s = np.concatenate([rows["latency_ms"].to_numpy() for _, rows in parts]) * 1e-3
            if np.unique(transfer_s).size >= 2:
                _, intercept = np.polyfit(transfer_s, measured_s, 1)
                self.tau_sync_s_ = max(float(intercept), 0.0)
                self.profiled_rows_ = len(points)
        return self

    def predict(self, cells: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        if not hasattr(self, "tau_sync_s_"):
            raise RuntimeError("liminal must be fitted on a home before predict")
        steps = Steps.from_cells(cells)
        if not self.extend_to_prefill and (steps.num_prefill > 0).any():
            raise NotSupported("liminal models decode steps only; these cells hold prefill "
                               "requests (pass extend_to_prefill=True for the flagged extension)")
        widths = steps.sharded()
        heads, kv_heads, ffn = widths["heads"], widths["kv_heads"], widths["ffn"]
        d, h = steps.head_dim, steps.hidden
        attention_w = h * (heads + 2 * kv_heads) * d + heads * d * h
        dense_w = h * (1 + steps.gated) * ffn + ffn * h
        experts = expert_work(steps)  # an MoE layer: the touched experts read, top-k computed
        keys_read = steps.decode_ctx + steps.sum(steps.pf_ctx + steps.pf_q)
        scored_pairs = steps.decode_ctx + steps.sum(steps.pf_q * (steps.pf_ctx + steps.pf_q / 2))
        bandwidth = gpu.mem_bw_bytes_per_s * self.memory_efficiency
        flops = peak_flops(gpu) * self.compute_efficiency
        sync_s = ALLREDUCES_PER_LAYER * ring_allreduce_s(
            BF16_BYTES * steps.tokens * h, steps.tp, link_gbs_per_direction(gpu) * 1e9, 0.0,
            self.tau_sync_s_)

        def layer_s(read_w, computed_w):
            memory_s = BF16_BYTES * (read_w + 2 * keys_read * kv_heads * d) / bandwidth
            compute_s = (2 * computed_w + 4 * scored_pairs * heads * d) / flops
            return np.maximum(memory_s, compute_s) + sync_s

        dense = layer_s(attention_w + dense_w, steps.tokens * (attention_w + dense_w))
        per_expert = 3 * h * experts["width"]
        routed = layer_s(attention_w + experts["touched"] * per_expert,
                         steps.tokens * attention_w + experts["rows"] * per_expert)
        return (steps.dense_layers * dense + steps.moe_layers * routed) * 1e3
