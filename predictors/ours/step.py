"""A step's GPU time T_blocks, per op family, for many cells at once.

Per layer (the ``_vidur`` ground truth's composition, leaderboard/cells/vidur_method.py): the
QKV, O, gate/up and down GEMMs at m = the step's tokens with Megatron-sharded n and k (of an
MoE layer, one fused-MoE kernel over the routed experts in place of gate/up and down); one
prefill-attention kernel over the step's prefills and one decode-attention kernel over its
decode requests, as the engine runs them; two TP all-reduces of the activations; all times
the layer count. The light kernels and the LM head are computed separately
(``wall_clock_extras``): the gpu_block ground truth has no time for them, so they are added for
wall-clock targets only.
"""

from __future__ import annotations

import numpy as np

from leaderboard_core.contract import NotSupported
from leaderboard_core.layer_work import light_kernel_elements
from predictors._roofline import ALLREDUCES_PER_LAYER, BF16_BYTES
from predictors.ours import factors, ops
from predictors.ours.config import Device
from predictors.ours.ops import Switches
from predictors.steps import Steps

# Requests per block of ``blocks``. Only prefill requests are read one by one where cells list
# them first (Steps skips the decode ones), so a block's temporaries are mostly per cell: about
# 5,000 cells of h200_vidur; Steps' fallback scan of every request takes 16 MB arrays.
# Measured on h200_vidur x 315, one core: 2^19 0.90M, 2^21 1.03-1.07M, 2^23 0.98-1.01M cells/s.
BLOCK_REQUESTS = 2**21


FFN_GEMMS = ("gemm_gate_up", "gemm_down")


def gemm_shapes(s: Steps) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-GPU (n, k) of the four GEMMs, vectorized (the same split as vidur_method.shapes)."""
    d, tp, h = s.head_dim, s.tp, s.hidden
    up = np.where(s.gated > 0, 2.0, 1.0) * s.ffn
    return {"gemm_qkv": ((s.heads + 2.0 * s.kv_heads) * d / tp, h),
            "gemm_o": (h, s.heads * d / tp), "gemm_gate_up": (up / tp, h),
            "gemm_down": (h, s.ffn / tp)}


def blocks(num_requests: np.ndarray, size: int = BLOCK_REQUESTS) -> list[tuple[int, int]]:
    """Cell ranges [lo, hi) of about ``size`` requests each, a cell never split. Every term is
    per cell, so timing a block at a time gives the same numbers; it bounds the temporaries
    (tens of MB at most, reused by the allocator), where whole-input arrays of hundreds of
    millions of requests would be fresh pages the kernel must fault in on every call."""
    ends = np.cumsum(num_requests)
    cuts = np.searchsorted(ends, np.arange(size, ends[-1], size), side="right") if len(ends) else []
    bounds = np.unique(np.concatenate([[0], cuts, [len(num_requests)]]).astype(np.int64))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)) or [(0, 0)]


def prefill_kernel(s: Steps) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(cells with prefill, requests, mean new tokens, mean context) of each step's one
    prefill-attention kernel. The engine runs all of a step's prefills as one varlen kernel; it
    is timed as a uniform batch at the mean lengths, which is exact for the _vidur cells (their
    prefills are a uniform measured batch)."""
    count = np.bincount(s.pf_cell, minlength=s.n).astype(np.float64)
    cells = np.flatnonzero(count)
    n = count[cells]
    return cells, n, s.sum(s.pf_q)[cells] / n, s.sum(s.pf_ctx)[cells] / n


def decode_kernel(s: Steps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cells with decode, requests, mean context) of each step's one decode-attention kernel:
    the engine runs every decode request of a step in one kernel, as Vidur prices it too."""
    cells = np.flatnonzero(s.num_decode > 0)
    n = s.num_decode[cells]
    return cells, n, s.decode_ctx[cells] / n


def block_times(s: Steps, dev: Device, c: dict, sw: Switches) -> dict[str, np.ndarray]:
    """Seconds per cell of each op family, summed over the layers."""
    out = {}
    for name, (n, k) in gemm_shapes(s).items():
        ffn = name in FFN_GEMMS  # a dense-FFN GEMM runs in the dense layers only
        out[name] = ops.gemm(s.tokens, n, k, dev, c, sw, s.fp8)["seconds"] * (
            s.dense_layers if ffn else s.layers)
    out["moe"] = np.zeros(s.n)  # every block has the same terms, zero for a dense model
    if (routed := s.moe_layers > 0).any():
        if sw.routing and ((s.routing_alpha > 0) & (s.moe_ep > 1)).any():
            raise NotSupported("ours prices power-law routing with the experts split over the "
                               "TP group only; spread over GPUs, the collector times the heaviest "
                               "GPU's experts, which ours does not model")
        share = {k: v[routed] for k, v in s.experts_per_gpu().items()}
        out["moe"][routed] = ops.fused_moe(
            share["tokens"], s.topk[routed], share["experts"], s.hidden[routed], share["width"],
            dev, c, sw, s.fp8[routed], s.routing_alpha[routed])["seconds"] * s.moe_layers[routed]
    out["attn_prefill"] = prefill_attention_seconds(s, dev, c, sw) * s.layers
    out["attn_decode"] = decode_attention_seconds(s, dev, c, sw) * s.layers
    ar = ops.allreduce(allreduce_bytes(s), s.tp, dev, c, sw)["seconds"]
    out["allreduce"] = ALLREDUCES_PER_LAYER * ar * s.layers
    return out


def allreduce_bytes(s: Steps) -> np.ndarray:
    """Bytes of each TP all-reduce of a step: its tokens' bf16 activations."""
    return s.tokens * s.hidden * BF16_BYTES


def prefill_attention_seconds(s: Steps, dev: Device, c: dict, sw: Switches) -> np.ndarray:
    """Per cell and layer: one prefill kernel whose CTAs are every request's (``heads`` times
    the request count, as a measured point of ``batch`` requests is timed on the home)."""
    sharded, out = s.sharded(), np.zeros(s.n)
    cells, n, q, ctx = prefill_kernel(s)
    out[cells] = ops.prefill_attention(q, ctx, sharded["heads"][cells] * n,
                                       sharded["kv_heads"][cells] * n, s.head_dim[cells], dev, c,
                                       sw)["seconds"]
    return out


def decode_attention_seconds(s: Steps, dev: Device, c: dict, sw: Switches) -> np.ndarray:
    """Per cell and layer: one decode kernel over all the step's decode requests."""
    sharded, out = s.sharded(), np.zeros(s.n)
    cells, n, ctx = decode_kernel(s)
    out[cells] = ops.decode_attention(n, ctx, sharded["heads"][cells], sharded["kv_heads"][cells],
                                      s.head_dim[cells], dev, c, sw)["seconds"]
    return out


def wall_clock_extras(s: Steps, dev: Device, c: dict, sw: Switches) -> dict[str, np.ndarray]:
    """What a real step has beyond the gpu_block ops: the light kernels of every layer (norms,
    activation, rotary, residual adds, KV-cache write; memory-bound with a launch floor) and the
    LM head over each request's last token (T_samp without the sampler, which S(N) absorbs)."""
    lk = c["light_kernels"]
    t, h, kv = s.tokens, s.hidden, s.kv_heads * s.head_dim / s.tp
    # An MoE layer's activation runs inside its fused kernel: only dense layers have their own.
    act = s.ffn / s.tp * s.dense_layers / s.layers
    moved = BF16_BYTES * light_kernel_elements(t, h, act, s.heads * s.head_dim / s.tp, kv)
    eta_mem = (factors.l2_memory_efficiency(moved / lk["kernels_per_layer"], dev.l2_bytes,
                                                c["memory_law"]) if sw.l2_memory else 1.0)
    floor = lk["kernels_per_layer"] * c["gemm"]["floor_s"] * dev.floor_scale if sw.floors else 0.0
    light = (moved / (dev.mem_bw * eta_mem) + floor) * s.layers
    lm_head = ops.gemm(s.num_requests, s.vocab / s.tp, s.hidden, dev, c, sw)["seconds"]
    return {"light_kernels": light, "lm_head": lm_head}
