"""What a step holds in GPU memory, from the model's shapes: weights and KV cache per GPU.

A cell whose weights plus KV cache exceed ``UTILIZATION`` of the GPU's memory is a state no
server can be in (vLLM reserves ``gpu_memory_utilization`` = 0.9 of it by default), so the
builder drops it and the card counts it. Weights are Megatron-sharded over TP (the vocabulary
too); KV heads are split over TP, one per GPU at least (replicated when there are fewer).
Memory sizes in the specs are binary gigabytes (an "80 GB" HBM3 stack holds 80 GiB).
"""

from __future__ import annotations

from leaderboard_core.specs import SpecError, is_moe, kv_elements_per_token, moe_shapes, tp_shapes

UTILIZATION = 0.9
BF16_BYTES = 2
GEMM_BYTES = {"bf16": 2, "fp8": 1}  # linear-layer weight bytes per element


def projection_elements(model: dict, tp: int) -> tuple[int, int]:
    """One layer's weight elements on one GPU: its attention projections (QKV and O) and its
    dense FFN (gate/up and down; an MoE model's dense layers)."""
    s = tp_shapes(model, tp)
    return (sum(n * k for n, k in (s["qkv"], s["o"])),
            sum(n * k for n, k in (s["gate_up"], s["down"])))


def layer_weight_bytes(model: dict, tp: int, gemm_dtype: str = "bf16") -> float:
    """One layer's linear weights on one GPU; of an MoE model, the mean over its layers, every
    expert (routed and shared) and the router counted: all of them sit in memory."""
    attention, ffn = projection_elements(model, tp)
    if is_moe(model):
        e = moe_shapes(model, tp)
        moe = (e["experts"] + e["shared"]) * 3 * e["hidden"] * e["inter"] + e["hidden"] * e["experts"]
        ffn = (e["dense_layers"] * ffn + e["moe_layers"] * moe) / model["num_layers"]
    return (attention + ffn) * GEMM_BYTES[gemm_dtype]


def lm_head_bytes(model: dict, tp: int) -> float:
    """The LM head's weights on one GPU (vocabulary-parallel, bf16)."""
    return model["vocab_size"] * model["hidden_size"] * BF16_BYTES / tp


def weight_bytes(model: dict, tp: int, gemm_dtype: str = "bf16") -> float:
    """Every weight on one GPU: the layers, the LM head and, unless tied to it, the embedding."""
    embeddings = 1 if model.get("tied_embeddings") else 2
    return (model["num_layers"] * layer_weight_bytes(model, tp, gemm_dtype)
            + embeddings * lm_head_bytes(model, tp))


def weight_misfit(model: dict, tp: int, gemm_dtype: str, mem_gb: float) -> str | None:
    """Why a run of ``model`` over TP ``tp`` GPUs of ``mem_gb`` GiB cannot be what it states: a
    TP that does not shard the model's heads, or weights alone above ``UTILIZATION`` of each
    GPU's memory; None when the weights fit."""
    try:
        weights = weight_bytes(model, tp, gemm_dtype)
    except SpecError as exc:
        return str(exc)
    if weights > UTILIZATION * mem_gb * 2**30:
        return (f"weights alone above {UTILIZATION:.0%} of TP{tp} x {mem_gb} GiB (the run's "
                "parallelism is not what it states)")
    return None


def kv_bytes(model: dict, tp: int, q_lens: list[int], ctx_lens: list[int]) -> float:
    """The bf16 KV cache of the step's requests (cached context plus new tokens) on one GPU."""
    if len(q_lens) != len(ctx_lens):
        raise ValueError(f"{len(q_lens)} q_lens against {len(ctx_lens)} ctx_lens")
    tokens = sum(q_lens) + sum(ctx_lens)
    return tokens * model["num_layers"] * kv_elements_per_token(model, tp) * BF16_BYTES


def room_bytes(model: dict, tp: int, q_lens: list[int], ctx_lens: list[int], mem_gb: float,
               gemm_dtype: str = "bf16") -> float:
    """What one GPU has left, of ``UTILIZATION`` of its memory, beside the weights and the bf16
    KV cache of the step's requests; negative where they do not fit."""
    return (UTILIZATION * mem_gb * 2**30 - weight_bytes(model, tp, gemm_dtype)
            - kv_bytes(model, tp, q_lens, ctx_lens))


def fits(model: dict, tp: int, q_lens: list[int], ctx_lens: list[int], mem_gb: float,
         gemm_dtype: str = "bf16") -> bool:
    return room_bytes(model, tp, q_lens, ctx_lens, mem_gb, gemm_dtype) >= 0
