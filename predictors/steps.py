"""A vectorized view of cells for predictors: per-cell model shapes and per-request arrays.

Decode requests enter most formulas only through per-cell sums (their count and total context),
so those come from the cell's derived columns. Prefill and chunked-prefill requests are few per
step and are kept one row each (``pf_cell``, ``pf_q``, ``pf_ctx``), so a predictor can apply any
per-request formula and sum it back with ``Steps.sum``. A predictor that needs the decode requests
one by one reads every request's context (``req_ctx``, the flat list values, no copy) with each
cell's end in it (``req_end``).

The derived columns are trusted as the cells' schema defines them (leaderboard/cells/schema.py,
``derive``): ``num_decode`` and ``decode_ctx_sum`` count the requests with one new token on a
non-empty cache. The decode terms come from them, and so does finding the prefill requests
without reading the decode ones; cells built by hand must derive them by the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl

from leaderboard_core.contract import expert_parallel
from leaderboard_core.specs import load_models

MODEL_FIELDS = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads",
                "kv_heads": "num_kv_heads", "head_dim": "head_dim", "ffn": "intermediate_size",
                "gated": "gated_mlp", "vocab": "vocab_size"}


# A mixture-of-experts model's routed layers (conf/model's MoE fields); a dense model has
# none: no experts, and every layer is a dense-FFN layer.
MOE_FIELDS = {"experts": "num_experts", "topk": "experts_per_token",
              "moe_ffn": "moe_intermediate_size"}


def _layer_counts(m: dict) -> dict[str, float]:
    dense = m.get("dense_layers", m["num_layers"])
    return {"dense_layers": float(dense), "moe_layers": float(m["num_layers"] - dense),
            **{k: float(m.get(v, 0)) for k, v in MOE_FIELDS.items()}}


@lru_cache(maxsize=1)
def _model_table() -> pl.DataFrame:
    models = load_models()
    return pl.DataFrame([{"model": name, **{k: float(m[v]) for k, v in MODEL_FIELDS.items()},
                          **_layer_counts(m)} for name, m in models.items()])


@dataclass
class Steps:
    n: int
    tp: np.ndarray
    layers: np.ndarray
    hidden: np.ndarray
    heads: np.ndarray
    kv_heads: np.ndarray
    head_dim: np.ndarray
    ffn: np.ndarray
    gated: np.ndarray  # 1.0 for a gated (SwiGLU) MLP
    vocab: np.ndarray
    dense_layers: np.ndarray  # layers with a dense FFN (all of a dense model's)
    moe_layers: np.ndarray  # layers whose FFN is routed experts (none of a dense model's)
    experts: np.ndarray  # routed experts per MoE layer (0 for a dense model)
    topk: np.ndarray  # experts each token is routed to
    moe_ffn: np.ndarray  # one expert's intermediate width, before TP
    tokens: np.ndarray  # T: new tokens this step
    num_requests: np.ndarray
    num_decode: np.ndarray
    decode_ctx: np.ndarray  # sum of decode requests' contexts
    pf_cell: np.ndarray  # per prefill request: its cell
    pf_q: np.ndarray
    pf_ctx: np.ndarray
    req_ctx: np.ndarray  # every request's context (int64), cell after cell
    req_end: np.ndarray  # per cell: one past its last request in req_ctx
    fp8: np.ndarray  # per cell: True where its GEMMs run in FP8 (``gemm_dtype``), else bf16
    # per cell: the GPUs its experts are spread over whole (``moe_ep``); 1 where every expert is
    # split over the TP group (vLLM's default) and for a dense model
    moe_ep: np.ndarray
    # per cell: the exponent of the power-law routing its MoE kernels were timed under
    # (``moe_routing`` "power_law_<alpha>"); 0 for balanced routing and for a dense model
    routing_alpha: np.ndarray

    @classmethod
    def from_cells(cls, cells: pl.DataFrame) -> Steps:
        table = _model_table()
        unknown = set(cells["model"].unique()) - set(table["model"])
        if unknown:
            raise ValueError(f"no conf/model/<name>.yaml for model(s) {sorted(unknown)}")
        shaped = cells.select("model", "tp", "total_tokens", "num_requests", "num_decode",
                              "decode_ctx_sum").join(table, on="model", how="left",
                                                     maintain_order="left")
        # The flat list values are zero-copy; only prefill requests get a row of their own.
        q = cells["q_lens"].explode().to_numpy()
        ctx = cells["ctx_lens"].explode().to_numpy()
        counts = cells["num_requests"].to_numpy()
        ends = np.cumsum(counts)
        prefill = _prefill_requests(q, ctx, ends, counts, cells["num_decode"].to_numpy())
        col = lambda frame, c: frame[c].to_numpy().astype(np.float64)  # noqa: E731
        return cls(
            n=len(cells), tp=col(shaped, "tp"),
            **{k: col(shaped, k) for k in (*MODEL_FIELDS, "dense_layers", "moe_layers",
                                           *MOE_FIELDS)},
            tokens=col(shaped, "total_tokens"), num_requests=col(shaped, "num_requests"),
            num_decode=col(shaped, "num_decode"), decode_ctx=col(shaped, "decode_ctx_sum"),
            pf_cell=np.searchsorted(ends, prefill, side="right"),
            pf_q=q[prefill].astype(np.float64), pf_ctx=ctx[prefill].astype(np.float64),
            req_ctx=ctx, req_end=ends,
            fp8=(cells["gemm_dtype"] == "fp8").fill_null(False).to_numpy()
            if "gemm_dtype" in cells.columns else np.zeros(len(cells), bool),
            moe_ep=expert_parallel(cells).astype(np.float64),
            routing_alpha=_routing_alpha(cells),
        )

    def sum(self, per_prefill_request: np.ndarray) -> np.ndarray:
        """Per-cell sums of a value given per prefill request."""
        return np.bincount(self.pf_cell, weights=per_prefill_request, minlength=self.n)

    @property
    def num_prefill(self) -> np.ndarray:
        return self.num_requests - self.num_decode

    def experts_per_gpu(self) -> dict[str, np.ndarray]:
        """One GPU's share of an MoE layer's expert GEMMs: the rows of ``tokens`` tokens routed
        top-k over ``experts`` experts of intermediate ``width``. Split over the TP group
        (``moe_ep`` 1), a GPU computes every routed row over every expert at width / TP. Spread
        whole over ``moe_ep`` GPUs (vLLM's expert parallelism without data-parallel attention),
        every GPU still receives all the step's tokens and routes them, but holds experts / EP
        whole experts and, routing balanced, computes 1 / EP of the rows: the rows of
        tokens / EP tokens over experts / EP experts at full width. The routing and the top-k
        sum over all the tokens are not in this share."""
        return {"tokens": self.tokens / self.moe_ep, "experts": self.experts / self.moe_ep,
                "width": self.moe_ffn * self.moe_ep / self.tp}

    def sharded(self) -> dict[str, np.ndarray]:
        """Per-GPU widths under Megatron TP: heads, KV heads (at least one) and FFN."""
        return {"heads": self.heads / self.tp, "kv_heads": np.maximum(self.kv_heads / self.tp, 1.0),
                "ffn": self.ffn / self.tp}


def _routing_alpha(cells: pl.DataFrame) -> np.ndarray:
    """Per cell, the exponent of its ``moe_routing`` (``power_law_1.01`` -> 1.01); 0 where
    balanced, unstated or dense."""
    if "moe_routing" not in cells.columns:
        return np.zeros(len(cells))
    stated = cells["moe_routing"].cast(pl.String)
    alpha = stated.str.extract(r"^power_law_(\d+(?:\.\d+)?)$").cast(pl.Float64)
    unknown = stated.is_not_null() & (stated != "balanced") & alpha.is_null()
    if unknown.any():
        raise ValueError(f"moe_routing {stated.filter(unknown)[0]!r} is neither 'balanced' nor "
                         "'power_law_<alpha>'")
    return alpha.fill_null(0.0).to_numpy()


def _prefill_requests(q: np.ndarray, ctx: np.ndarray, ends: np.ndarray, counts: np.ndarray,
                      num_decode: np.ndarray) -> np.ndarray:
    """Flat indices of the prefill requests: not ``q == 1`` on a non-empty cache, the rule the
    cells' ``num_decode`` column is derived by (leaderboard/cells/schema.py). Cells list their
    prefills first; where the first ``num_prefill`` requests of every cell are prefills, those
    are all of them (the column counts the rest as decode), so the decode requests, most of
    the data, are never read. Otherwise every request is scanned (the fallback reads 2^21
    requests a block in ``ours``, arrays of 16 MB)."""
    def is_prefill(i):
        return (q[i] != 1) | (ctx[i] == 0)

    prefills = counts - num_decode
    firsts = np.cumsum(prefills) - prefills
    guess = np.arange(prefills.sum()) + np.repeat(ends - counts - firsts, prefills)
    return guess if is_prefill(guess).all() else np.flatnonzero(is_prefill(slice(None)))
