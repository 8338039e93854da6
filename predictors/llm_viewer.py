"""LLM-Viewer-style roofline (hahnyuan/LLM-Viewer), re-implemented from baselines.md §4.

Each operator of a Llama layer costs ``max(OPs / peak, bytes / BW)`` at the datasheet's dense
bf16 peak and decimal memory bandwidth, with no efficiency factor; the layer sum is multiplied
by L. The operators are the seven linear layers (q, k, v, o, gate, up, down), the non-fused
attention (qk, softmax, sv; the default ``use_flashattention=False``; the fused variant is not
implemented), two norms, two residual adds and the MLP activation.

LLM-Viewer's quirks are kept, because they are what it predicts:

* prefill qk loads its queries with the KV head count (``q·d·n_kv``, not ``n_q``);
* ``mlp_act`` is sized with the hidden width h, not the FFN width;
* the full ``s·s`` score matrix is computed and stored: no causal halving (§8.6);
* norms, adds and the activation are priced although the ``_vidur`` ground truth has none.

The ``lm_head`` it adds once per stage is removed (§0.2). §4.3's adaptation to the benchmark:
TP divides n_q, n_kv and f by P; linear and element-wise ops run over all T tokens of the
step; attention is priced per prefill request (b = 1; a chunk of q new tokens on c cached ones
scores q·(c+q) pairs against c+q keys) and over the decode requests of the step as one batched
op. LLM-Viewer adds no collectives; ``ring_allreduce=True`` adds GenZ's two ring all-reduces
per layer over the GPU's link at decimal GB/s (§4.3's "+ring-AR" variant).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard_core.contract import PredictorCard
from leaderboard_core.specs import GpuSpec
from predictors._roofline import (
    ALLREDUCES_PER_LAYER,
    BF16_BYTES,
    GENZ_COLLECTIVE_FIXED_S,
    link_gbs_per_direction,
    peak_flops,
    ring_allreduce_s,
)
from predictors.base import Predictor
from predictors.registry import register
from predictors.steps import Steps

OpCounts = dict[str, tuple[np.ndarray, np.ndarray]]  # op name -> (OPs, bytes), one layer


def cell_ops(steps: Steps) -> OpCounts:
    """Per cell: the linear, element-wise and batched decode-attention ops of one layer."""
    widths = steps.sharded()
    heads, kv_heads, ffn = widths["heads"], widths["kv_heads"], widths["ffn"]
    d, h, n = steps.head_dim, steps.hidden, steps.tokens
    e = BF16_BYTES
    linear = {"q": (h, heads * d), "k": (h, kv_heads * d), "v": (h, kv_heads * d),
              "o": (heads * d, h), "gate": (h, ffn), "up": (h, ffn), "down": (ffn, h)}
    # k and v write their output to the KV cache instead of as an activation: same byte count.
    ops = {name: (2 * ic * oc * n, e * (ic * oc + ic * n + oc * n))
           for name, (ic, oc) in linear.items()}
    ops["gate"] = tuple(count * steps.gated for count in ops["gate"])  # only a gated MLP has it
    ops.update({
        "attn_norm": (7 * n * h, 2 * e * n * h), "mlp_norm": (7 * n * h, 2 * e * n * h),
        "attn_add": (n * h, 2 * e * n * h), "mlp_add": (n * h, 2 * e * n * h),
        "mlp_act": (2 * n * h, 3 * e * n * h),  # sic: h, not the FFN width
    })
    # Decode attention: LLM-Viewer's batched formulas with b·s replaced by the summed context.
    # Summing per request would give the same unless requests straddle the ridge, which needs
    # an arithmetic intensity above n_q/n_kv FLOP/B: far below every datasheet's ridge.
    b, s = steps.num_decode, steps.decode_ctx
    ops.update({
        "decode_qk": (2 * s * d * heads, e * (d * b * heads + s * heads + s * d * kv_heads)),
        "decode_softmax": (5 * heads * s, 2 * e * heads * s),
        "decode_sv": (2 * s * d * heads, e * (s * heads + d * b * heads + s * d * kv_heads)),
    })
    return ops


def prefill_request_ops(steps: Steps) -> OpCounts:
    """Per prefill request (b = 1): non-fused attention of ``q`` queries over ``c + q`` keys."""
    widths = steps.sharded()
    cell = steps.pf_cell
    heads, kv_heads, d = widths["heads"][cell], widths["kv_heads"][cell], steps.head_dim[cell]
    q, keys = steps.pf_q, steps.pf_ctx + steps.pf_q
    scores, e = q * keys, BF16_BYTES
    return {
        "prefill_qk": (2 * scores * d * heads,
                       e * (q * d * kv_heads + scores * heads + keys * d * kv_heads)),  # sic n_kv
        "prefill_softmax": (5 * heads * scores, 2 * e * heads * scores),
        "prefill_sv": (2 * scores * d * heads,
                       e * (scores * heads + q * d * heads + keys * d * kv_heads)),
    }


def point_ops(points: pl.DataFrame) -> OpCounts:
    """Per measured kernel of an op-level dataset: its LLM-Viewer ops. A GEMM point is one
    linear layer (N = m tokens, ic = k, oc = n); an attention point is b requests of the same
    shape (prefill: s = q_len new tokens, no cache; decode: s = kv_len cached tokens)."""
    col = lambda c: points[c].fill_null(0).to_numpy().astype(np.float64)  # noqa: E731
    gemm = (points["op_family"] == "gemm").to_numpy()
    prefill = (points["phase"] == "attn_prefill").to_numpy() & ~gemm
    m, n, k = col("m"), col("n"), col("k")
    b, heads, kv_heads, d = col("batch"), col("num_heads"), col("num_kv_heads"), col("head_dim")
    s = np.where(prefill, col("q_len"), col("kv_len"))
    e = BF16_BYTES
    only = lambda mask, c: (c[0] * mask, c[1] * mask)  # noqa: E731
    attention = ~gemm
    sq = np.where(prefill, s * s, s)  # scores per request and head: s² (prefill) or s (decode)
    q_rows = np.where(prefill, s, 1.0)
    return {
        "gemm": only(gemm, (2 * m * n * k, e * (m * k + k * n + m * n))),
        "qk": only(attention, (2 * b * sq * d * heads, e * b * (
            q_rows * d * np.where(prefill, kv_heads, heads) + sq * heads + s * d * kv_heads))),
        "softmax": only(attention, (5 * b * heads * sq, 2 * e * b * heads * sq)),
        "sv": only(attention, (2 * b * sq * d * heads,
                               e * b * (sq * heads + q_rows * d * heads + s * d * kv_heads))),
    }


@register("llm_viewer")
class LLMViewer(Predictor):
    card = PredictorCard(
        kind="analytical", needs_profiled_rows=False,
        reference="Yuan et al., 'LLM Inference Unveiled: Survey and Roofline Model Insights', "
                  "arXiv 2402.16363; github.com/hahnyuan/LLM-Viewer",
        description="LLM-Viewer's per-op roofline max(OPs/peak, bytes/BW) at datasheet peaks, "
                    "non-fused attention, no efficiencies, no collectives by default")
    param_bounds = {"link_latency_us": (0.0, None)}

    def __init__(self, ring_allreduce: bool = False, link_latency_us: float = 1.0):
        self.ring_allreduce = ring_allreduce
        self.link_latency_us = link_latency_us

    def predict_ops(self, points: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        flops, mem_bytes_per_s = peak_flops(gpu), gpu.mem_bw_bytes_per_s
        return sum(np.maximum(ops / flops, moved / mem_bytes_per_s)
                   for ops, moved in point_ops(points).values()) * 1e3

    def predict(self, cells: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        steps = Steps.from_cells(cells)
        flops, mem_bytes_per_s = peak_flops(gpu), gpu.mem_bw_bytes_per_s

        def roofline(ops: np.ndarray, moved: np.ndarray) -> np.ndarray:
            return np.maximum(ops / flops, moved / mem_bytes_per_s)

        layer_s = sum(roofline(*c) for c in cell_ops(steps).values())
        layer_s = layer_s + steps.sum(sum(roofline(*c) for c in prefill_request_ops(steps).values()))
        if self.ring_allreduce:
            layer_s = layer_s + ALLREDUCES_PER_LAYER * ring_allreduce_s(
                BF16_BYTES * steps.tokens * steps.hidden, steps.tp,
                link_gbs_per_direction(gpu) * 1e9, self.link_latency_us * 1e-6,
                GENZ_COLLECTIVE_FIXED_S)
        return steps.layers * layer_s * 1e3
