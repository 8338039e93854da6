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

from predictors._roofline import ALLREDUCES_PER_LAYER, BF16_BYTES
from predictors.ours import factors, ops
from predictors.ours.config import Device
from predictors.ours.ops import Switches
from predictors.steps import Steps

# Decode requests are grouped by context octave: the ground truth's contexts are snapped to
# 2^k - 1, so an octave holds exactly one measured context; elsewhere it merges near contexts.
OCTAVES = 24
# Requests per block of ``blocks``: per-request temporaries under 4 MB (measured fastest on
# h200_vidur x 405: larger blocks pay for fresh pages), per-cell arrays of thousands of cells.
BLOCK_REQUESTS = 2**19


def gemm_shapes(s: Steps) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-GPU (n, k) of the four GEMMs, vectorized (the same split as vidur_method.shapes)."""
    d, tp, h = s.head_dim, s.tp, s.hidden
    up = np.where(s.gated > 0, 2.0, 1.0) * s.ffn
    return {"gemm_qkv": ((s.heads + 2.0 * s.kv_heads) * d / tp, h),
            "gemm_o": (h, s.heads * d / tp), "gemm_gate_up": (up / tp, h),
            "gemm_down": (h, s.ffn / tp)}


def blocks(num_requests: np.ndarray, size: int = BLOCK_REQUESTS) -> list[tuple[int, int]]:
    """Cell ranges [lo, hi) of about ``size`` requests each, a cell never split. Every term is
    per cell, so timing a block at a time gives the same numbers; it keeps the per-request
    temporaries a few MB, which the allocator reuses, where whole-input arrays of tens of
    millions of requests are fresh pages the kernel must fault in on every call."""
    ends = np.cumsum(num_requests)
    cuts = np.searchsorted(ends, np.arange(size, ends[-1], size), side="right") if len(ends) else []
    bounds = np.unique(np.concatenate([[0], cuts, [len(num_requests)]]).astype(np.int64))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)) or [(0, 0)]


def context_octave(ctx: np.ndarray) -> np.ndarray:
    """min(floor(log2(ctx + 1)), OCTAVES - 1) from the float32 exponent bits: exact below 2^24,
    and every larger context is in the last octave anyway. ctx <= 0 gives octave 0."""
    exponent = np.add(ctx, 1, dtype=np.float32).view(np.int32)
    exponent >>= 23
    np.clip(exponent, 127, 126 + OCTAVES, out=exponent)
    exponent -= 127
    return exponent


def decode_groups(s: Steps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cell index, request count, mean context) per group of a cell's decode requests that
    share a context octave, by cell then octave. A cell's requests of one context mostly come
    in runs, so the requests are first cut into runs (within a cell) and the runs (a quarter
    as many on the _vidur sets) binned by (cell, octave): no sort, and no pass over q. The few
    non-decode requests (``Steps``' prefill rows) are then taken out of their bins, and
    octave 0 (empty contexts) is dropped. Counts and context sums are integers, exact in
    float64, so what is left is exactly the decode requests' sums."""
    ctx, bins = s.req_ctx, s.n * OCTAVES
    starts = s.req_end - np.diff(s.req_end, prepend=0)
    new_run = np.empty(len(ctx), dtype=bool)
    np.not_equal(ctx[1:], ctx[:-1], out=new_run[1:])
    new_run[starts[starts < len(ctx)]] = True  # a cell starts a run, so none spans two cells
    run = np.flatnonzero(new_run)
    runs_per_cell = np.diff(np.searchsorted(run, starts), append=len(run))
    value = ctx[run]
    key = np.repeat(np.arange(0, bins, OCTAVES), runs_per_cell) + context_octave(value)
    length = np.diff(run, append=len(ctx))
    count = np.bincount(key, weights=length, minlength=bins)
    total = np.bincount(key, weights=length * value, minlength=bins)
    prefill = s.pf_cell * OCTAVES + context_octave(s.pf_ctx)
    np.subtract.at(count, prefill, 1.0)
    np.subtract.at(total, prefill, s.pf_ctx)
    count.reshape(s.n, OCTAVES)[:, 0] = 0.0
    used = np.flatnonzero(count != 0.0)
    return used // OCTAVES, count[used], total[used] / count[used]


def block_times(s: Steps, dev: Device, c: dict, sw: Switches) -> dict[str, np.ndarray]:
    """Seconds per cell of each op family, summed over the layers."""
    out = {}
    for name, (n, k) in gemm_shapes(s).items():
        out[name] = ops.gemm(s.tokens, n, k, dev, c, sw)["seconds"] * s.layers
    sharded = s.sharded()
    pc = s.pf_cell
    pf = ops.prefill_attention(s.pf_q, s.pf_ctx, sharded["heads"][pc], sharded["kv_heads"][pc],
                               s.head_dim[pc], dev, c, sw)["seconds"]
    out["attn_prefill"] = s.sum(pf) * s.layers
    out["attn_decode"] = decode_attention_seconds(s, dev, c, sw) * s.layers
    ar = ops.allreduce(s.tokens * s.hidden * BF16_BYTES, s.tp, dev, c, sw)["seconds"]
    out["allreduce"] = ALLREDUCES_PER_LAYER * ar * s.layers
    return out


def decode_attention_seconds(s: Steps, dev: Device, c: dict, sw: Switches) -> np.ndarray:
    """Per cell and layer. With ``attention`` on, one kernel per power-of-two part of each
    same-context group, as the ground truth composes it; off, one kernel for the whole batch."""
    sharded = s.sharded()
    if not sw.attention:
        has = s.num_decode > 0
        mean_ctx = np.where(has, s.decode_ctx / np.maximum(s.num_decode, 1.0), 0.0)
        t = ops.decode_attention(s.num_decode, mean_ctx, sharded["heads"], sharded["kv_heads"],
                                 s.head_dim, dev, c, sw)["seconds"]
        return np.where(has, t, 0.0)
    cell, count, ctx = decode_groups(s)
    batches, kernels = ops.binary_parts(count, int(c["attention"]["decode_batch_max"]))
    # Only the (batch, group) pairs with a kernel are timed: a group has a few of the ~12
    # batch sizes.
    pair = np.flatnonzero(kernels != 0)
    part, group = np.divmod(pair, len(count))
    on = cell[group]
    t = ops.decode_attention(batches[part], ctx[group], sharded["heads"][on],
                             sharded["kv_heads"][on], s.head_dim[on], dev, c, sw)["seconds"]
    # The pairs run batch by batch, so bincount adds each group's kernels in batch order and
    # then each cell's groups in group order: the additions, in the same order, of timing one
    # batch size for every group at a time.
    per_group = np.bincount(group, weights=kernels.ravel()[pair] * t, minlength=len(count))
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
    floor = lk["kernels_per_layer"] * c["gemm"]["floor_s"] * dev.floor_scale if sw.floors else 0.0
    light = (moved / (dev.mem_bw * eta_mem) + floor) * s.layers
    lm_head = ops.gemm(s.num_requests, s.vocab / s.tp, s.hidden, dev, c, sw)["seconds"]
    return {"light_kernels": light, "lm_head": lm_head}
