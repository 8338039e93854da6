"""The op points of a step, composed as the ``_vidur`` cells compose them, for the predictors
that price each op from measured points (``table_scaled``, ``neusight_tiles``).

Per layer: the four GEMMs at m = the step's tokens (an MoE layer: QKV and O, and one fused-MoE
kernel over the routed experts, at the cell's expert placement, in place of gate/up and down),
one prefill-attention kernel over its prefills (a uniform batch at their mean length) and one
decode-attention kernel over its decodes (at their mean context), two all-reduces of the
activations at TP > 1; times the layers. A step whose ground truth is not the layers' GPU
kernels alone (``gt_kind`` other than ``gpu_block``) also runs the LM head: one GEMM at m = the
step's requests, n = vocabulary / TP, k = hidden, in the fewest equal column slices no wider
than ``lm_head_max_n`` (a measured table stops short of the vocabulary sizes), at BF16 (vLLM
never quantizes it). Each point carries the table dtype it is read at: an FP8 step of a model
whose checkpoint scales per block (``fp8_scaling: block``) runs vLLM's block-scaled kernels,
the ``fp8_block`` tables, its projections and experts alike. A cell that names its KV cache's
dtype (``kv_dtype``: an FP8 cache) has its attention points carry it; a cell that names none
holds a 16-bit cache.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard_core.contract import expert_parallel
from leaderboard_core.specs import FP8_BLOCK_TABLES, fp8_scaling, is_moe, moe_shapes, tp_shapes
from predictors._roofline import ALLREDUCES_PER_LAYER, BF16_BYTES

TABLE_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}  # a cell's gemm_dtype -> the tables' dtype


def table_dtype(gemm_dtype: str, model: dict) -> str:
    """The measured tables' dtype a step of ``gemm_dtype`` reads for ``model``'s projections
    and experts."""
    if gemm_dtype == "fp8" and fp8_scaling(model) == "block":
        return FP8_BLOCK_TABLES
    return TABLE_DTYPES[gemm_dtype]


def step_points(cells: pl.DataFrame, models: dict, lm_head_max_n: float | None = None
                ) -> list[tuple[str, np.ndarray, np.ndarray, pl.DataFrame]]:
    """The op points of each cell: (op family, cell index, calls per step, the points' shape
    columns); with ``lm_head_max_n``, the LM head of every cell whose ground truth is not
    ``gpu_block``, in slices of at most that many columns."""
    out = []
    c = cells.with_row_index("_cell")
    for (name, tp), group in c.group_by("model", "tp", maintain_order=True):
        model, s = models[name], tp_shapes(models[name], tp)
        i, layers = group["_cell"].to_numpy(), float(model["num_layers"])
        tokens = group["total_tokens"].to_numpy()
        heads = {"num_heads": s["heads"], "num_kv_heads": s["kv_heads"],
                 "head_dim": model["head_dim"]}
        kv = {"kv_dtype": group["kv_dtype"]} if "kv_dtype" in group.columns else {}
        if kv and kv["kv_dtype"].null_count():
            raise ValueError(f"{kv['kv_dtype'].null_count()} {name} cells name no kv_dtype; name "
                             "every cell's KV cache dtype, or drop the column for a 16-bit cache")
        dtypes = [table_dtype(d, model) for d in (group["gemm_dtype"].fill_null("bf16")
                                                  if "gemm_dtype" in group.columns
                                                  else ["bf16"] * len(i))]
        ffn_layers = layers
        if is_moe(model):  # one fused-MoE kernel per MoE layer, dense FFN GEMMs in the others
            e = moe_shapes(model, tp)
            ffn_layers = float(e["dense_layers"])
            ep = expert_parallel(group)  # experts spread whole over ep GPUs
            out.append(("moe", i, np.full(len(i), float(e["moe_layers"])), pl.DataFrame({
                "num_tokens": tokens, "hidden_size": np.full(len(i), e["hidden"]),
                "inter_size": np.full(len(i), model["moe_intermediate_size"]),
                "topk": np.full(len(i), e["topk"]), "num_experts": np.full(len(i), e["experts"]),
                "moe_tp": tp // ep, "moe_ep": ep, "dtype": dtypes})))
        for op in ("qkv", "o", "gate_up", "down"):
            n, k = s[op]
            count = layers if op in ("qkv", "o") else ffn_layers
            if not count:
                continue
            out.append(("gemm", i, np.full(len(i), count),
                        pl.DataFrame({"m": tokens, "n": np.full(len(i), n), "k": np.full(len(i), k),
                                      "dtype": dtypes})))
        n_dec, n_pf = group["num_decode"].to_numpy(), group["num_prefill"].to_numpy()
        dec, pf = n_dec > 0, n_pf > 0
        out.append(("attn_decode", i[dec], np.full(dec.sum(), layers), pl.DataFrame({
            "batch": n_dec[dec], "kv_len": group["decode_ctx_sum"].to_numpy()[dec] / n_dec[dec],
            "q_len": np.ones(dec.sum()), **{k: np.full(dec.sum(), v) for k, v in heads.items()},
            **{k: v.filter(dec) for k, v in kv.items()}})))
        out.append(("attn_prefill", i[pf], np.full(pf.sum(), layers), pl.DataFrame({
            "batch": n_pf[pf], "q_len": group["prefill_tokens"].to_numpy()[pf] / n_pf[pf],
            "kv_len": np.zeros(pf.sum()), **{k: np.full(pf.sum(), v) for k, v in heads.items()},
            **{k: v.filter(pf) for k, v in kv.items()}})))
        if tp > 1:
            out.append(("allreduce", i, np.full(len(i), ALLREDUCES_PER_LAYER * layers), pl.DataFrame(
                {"message_bytes": tokens * s["hidden"] * BF16_BYTES, "num_gpus": np.full(len(i), tp)})))
        if lm_head_max_n is not None and (head := _lm_head(group, model, tp, s["hidden"],
                                                           lm_head_max_n)):
            out.append(head)
    return out


def _lm_head(group: pl.DataFrame, model: dict, tp: int, hidden: int, max_n: int):
    """The LM head GEMM of each cell of ``group`` that is not ``gpu_block`` ground truth (None
    where there is none)."""
    wanted = (group["gt_kind"] != "gpu_block").fill_null(True).to_numpy() \
        if "gt_kind" in group.columns else np.ones(len(group), bool)
    if not wanted.any():
        return None
    columns = model["vocab_size"] / tp
    slices = max(1, int(np.ceil(columns / max_n)))
    rows = group.filter(pl.Series(wanted))
    return ("gemm", rows["_cell"].to_numpy(), np.full(len(rows), float(slices)), pl.DataFrame({
        "m": rows["num_requests"].to_numpy(), "n": np.full(len(rows), columns / slices),
        "k": np.full(len(rows), hidden), "dtype": TABLE_DTYPES["bf16"]}))  # never quantized
