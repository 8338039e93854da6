"""The random forest on Vidur's own profiles (``<gpu>_vidurprof``): its home ground.

Those cells are one prefill request of q tokens, timed as ``num_layers`` x the sum of one
layer's token-level ops from Vidur's ``mlp.csv`` (norms, QKV, rope, output projection, MLP
projections and activation, residual add; no attention file is pinned). Vidur fits one forest
per such op on ``[num_tokens]`` and evaluates it at the step's token count rounded up to 8
(§2.2, §2.4); ``rf_verbatim`` and ``rf_scaled`` do the same here. ``rf_scaled`` moves each
linear op by the roofline-time ratio of its GEMM and each light op by the memory-bandwidth
ratio (light ops stream activations: §2.6 (a)'s memory class).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard_core.contract import VIDUR_OPS, Home, NotSupported

AS_GEMM = {"attn_pre_proj": "gemm_qkv", "attn_post_proj": "gemm_o", "mlp_up_proj": "gemm_gate_up",
           "mlp_down_proj": "gemm_down"}


def is_token_profile(home: Home) -> bool:
    return any(op in home.ops for op in VIDUR_OPS)


def token_rows(home: Home, name: str, tp: int) -> dict[str, pl.DataFrame]:
    """Per token-level op, the home's profiled points of this (model, TP): x, y and row id.
    An op the model does not run (phi-2's parallel block has no post-attention norm) has no
    points and no forest."""
    if len(home.gpus) > 1:
        raise NotSupported("rf on Vidur's profiles takes one home; its light ops have no "
                           "roofline shape to scale a second home's points by")
    out = {}
    for op in VIDUR_OPS:
        points = home.ops.get(op, pl.DataFrame()).with_row_index("row")
        mine = points.filter(model=name, tp=tp) if not points.is_empty() else points
        if not mine.is_empty():
            out[op] = mine.select("row", x=pl.concat_list("num_tokens"), y="latency_ms")
    return out


def scaled_ratios(gemm_ratios: dict[str, np.ndarray], home_peaks: dict[str, float],
                  target_peaks: dict[str, float]) -> dict[str, np.ndarray | float]:
    """Per Vidur op, the home-to-target multiplier ``rf_scaled`` applies."""
    memory = home_peaks["mem_bw"] / target_peaks["mem_bw"]
    return {op: gemm_ratios[AS_GEMM[op]] if op in AS_GEMM else memory for op in VIDUR_OPS}
