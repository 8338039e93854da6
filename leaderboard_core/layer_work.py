"""Counting rules of a transformer layer that the harness (its cards) and the predictors share,
so a rule is written once: the routing arithmetic of an MoE layer and the traffic of the light
per-layer kernels. Plain arithmetic, on numbers or numpy arrays alike.
"""

from __future__ import annotations

import numpy as np


def routed_experts(tokens, topk, experts):
    """One MoE layer's routing: ``rows``, the routed token copies (tokens x top-k), and
    ``touched``, the experts some token routes to (at most all of them: an expert no token picks
    is not read). Balanced routing spreads the rows evenly, so ``rows / touched`` per expert."""
    rows = tokens * topk
    return rows, np.minimum(experts, rows)


def light_kernel_elements(tokens, hidden, ffn, q_width, kv_width):
    """Elements the light kernels of one layer read and write for ``tokens`` tokens on one GPU,
    in vLLM's layer: two RMSNorms (read and write the hidden state), SiLU-and-multiply (read gate
    and up, write one: ``ffn`` is the per-GPU intermediate width, 0 where experts run it inside
    their fused kernel), rotary embedding (read and write Q and K), two residual adds (read two,
    write one) and the KV-cache write (K and V). Widths are per GPU."""
    return tokens * (2 * 2 * hidden + 3 * ffn + 2 * (q_width + kv_width) + 2 * 3 * hidden
                     + 2 * kv_width)
