"""A step's GPU time T_blocks, per op family, for many cells at once.

Per layer (the ``_vidur`` ground truth's composition, leaderboard/cells/vidur_method.py): the
QKV, O, gate/up and down GEMMs at m = the step's tokens with Megatron-sharded n and k; one
prefill-attention kernel per prefill request; decode attention per group of requests with the
same context; two TP all-reduces of the activations; all times the layer count. The light
kernels and the LM head are computed separately (``wall_clock_extras``): the gpu_block ground
truth has no time for them, so they are added for wall-clock targets only.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from predictors._roofline import ALLREDUCES_PER_LAYER, BF16_BYTES
from predictors.ours import factors, ops
from predictors.ours.config import Device
from predictors.ours.ops import Switches
from predictors.steps import Steps

GEMMS = ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down")
# Decode requests are grouped by context octave: the ground truth's contexts are snapped to
# 2^k - 1, so an octave holds exactly one measured context; elsewhere it merges near contexts.
OCTAVES = 24


def gemm_shapes(s: Steps) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-GPU (n, k) of the four GEMMs, vectorized (the same split as vidur_method.shapes)."""
    d, tp, h = s.head_dim, s.tp, s.hidden
    up = np.where(s.gated > 0, 2.0, 1.0) * s.ffn
    return {"gemm_qkv": ((s.heads + 2.0 * s.kv_heads) * d / tp, h),
            "gemm_o": (h, s.heads * d / tp), "gemm_gate_up": (up / tp, h),
            "gemm_down": (h, s.ffn / tp)}


def decode_groups(cells: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cell index, request count, mean context) per group of a cell's decode requests that
    share a context octave. One pass of bincounts over the flat request lists, no sort, so a
    million steps of ~75 requests group in about a second."""
    q = cells["q_lens"].explode().to_numpy()
    ctx = cells["ctx_lens"].explode().to_numpy()
    decode = (q == 1) & (ctx > 0)
    # floor(log2(ctx + 1)) from the float32 exponent bits (exact below 2^24); octave 0 is the
    # bin of every non-decode request, dropped below.
    exponent = ((ctx + 1).astype(np.float32).view(np.int32) >> 23) - 127
    octave = np.minimum(exponent, OCTAVES - 1) * decode
    cell = np.repeat(np.arange(len(cells), dtype=np.int64), cells["num_requests"].to_numpy())
    key = cell * OCTAVES + octave
    count = np.bincount(key, minlength=len(cells) * OCTAVES)
    total = np.bincount(key, weights=ctx, minlength=len(cells) * OCTAVES)
    count.reshape(len(cells), OCTAVES)[:, 0] = 0
    used = np.flatnonzero(count)
    return used // OCTAVES, count[used].astype(np.float64), total[used] / count[used]


def block_times(cells: pl.DataFrame, s: Steps, dev: Device, c: dict,
                sw: Switches) -> dict[str, np.ndarray]:
    """Seconds per cell of each op family, summed over the layers."""
    out = {}
    for name, (n, k) in gemm_shapes(s).items():
        out[name] = ops.gemm(s.tokens, n, k, dev, c, sw)["seconds"] * s.layers
    sharded = s.sharded()
    pc = s.pf_cell
    pf = ops.prefill_attention(s.pf_q, s.pf_ctx, sharded["heads"][pc], sharded["kv_heads"][pc],
                               s.head_dim[pc], dev, c, sw)["seconds"]
    out["attn_prefill"] = s.sum(pf) * s.layers
    out["attn_decode"] = decode_attention_seconds(cells, s, dev, c, sw) * s.layers
    ar = ops.allreduce(s.tokens * s.hidden * BF16_BYTES, s.tp, dev, c, sw)["seconds"]
    out["allreduce"] = ALLREDUCES_PER_LAYER * ar * s.layers
    return out


def decode_attention_seconds(cells: pl.DataFrame, s: Steps, dev: Device, c: dict,
                             sw: Switches) -> np.ndarray:
    """Per cell and layer. With ``attention`` on, one kernel per power-of-two part of each
    same-context group, as the ground truth composes it; off, one kernel for the whole batch."""
    sharded = s.sharded()
    if not sw.attention:
        has = s.num_decode > 0
        mean_ctx = np.where(has, s.decode_ctx / np.maximum(s.num_decode, 1.0), 0.0)
        t = ops.decode_attention(s.num_decode, mean_ctx, sharded["heads"], sharded["kv_heads"],
                                 s.head_dim, dev, c, sw)["seconds"]
        return np.where(has, t, 0.0)
    cell, count, ctx = decode_groups(cells)
    heads, kv_heads, d = sharded["heads"][cell], sharded["kv_heads"][cell], s.head_dim[cell]
    per_group = np.zeros_like(ctx)
    for batch, kernels in ops.binary_parts(count, int(c["attention"]["decode_batch_max"])):
        if kernels.any():
            t = ops.decode_attention(float(batch), ctx, heads, kv_heads, d, dev, c, sw)["seconds"]
            per_group += kernels * t
    return np.bincount(cell, weights=per_group, minlength=s.n)


def wall_clock_extras(s: Steps, dev: Device, c: dict, sw: Switches) -> dict[str, np.ndarray]:
    """What a real step has beyond the gpu_block ops: the light kernels of every layer (norms,
    activation, rotary, residual adds, KV-cache write; memory-bound with a launch floor) and the
    LM head over each request's last token (T_samp without the sampler, which S(N) absorbs)."""
    lk = c["light_kernels"]
    t, h, kv = s.tokens, s.hidden, s.kv_heads * s.head_dim / s.tp
    elements = t * (2 * 2 * h + 3 * s.ffn / s.tp + 2 * (h / s.tp + kv) + 2 * 3 * h + 2 * kv)
    moved = BF16_BYTES * elements
    eta_mem = (factors.l2_memory_efficiency(moved / lk["kernels_per_layer"], dev.l2_bytes,
                                                c["memory_law"]) if sw.l2_memory else 1.0)
    floor = lk["kernels_per_layer"] * c["gemm"]["floor_s"] if sw.floors else 0.0
    light = (moved / (dev.mem_bw * eta_mem) + floor) * s.layers
    lm_head = ops.gemm(s.num_requests, s.vocab / s.tp, s.hidden, dev, c, sw)["seconds"]
    return {"light_kernels": light, "lm_head": lm_head}
