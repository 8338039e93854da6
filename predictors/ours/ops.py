"""Per-op times of one forward step: FLOPs and bytes of each op, timed through the factors.

Each op function returns a dict of arrays: ``seconds`` and the factor values behind it (so
``explain`` prints exactly what ``predict`` summed). ``Switches`` turns factors off for the
ablation ladder; a switched-off factor is 1 (or 0 for an additive floor).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leaderboard_core.layer_work import routed_experts
from predictors._roofline import BF16_BYTES, FP8_BYTES, ring_allreduce_s
from predictors.ours import factors
from predictors.ours.config import Device


@dataclass(frozen=True)
class Switches:
    clock: bool = True  # f_clk
    waves: bool = True  # eta_cl: tile padding, waves, cluster cap
    delivery: bool = True  # eta_act * eta_duty
    l2_memory: bool = True  # eta_mem(x), the L2-reuse law
    floors: bool = True  # per-kernel floors, clock-scaled from the home
    attention: bool = True  # attention's own efficiencies, GT-style kernel split
    collectives: bool = True  # all-reduce floors, link efficiency, regimes by topology
    routing: bool = True  # MoE experts' loads under the cell's stated power-law routing
    fp8: bool = True  # FP8 GEMMs at the FP8 home's kernel efficiency, plus its quantization floor


def gemm(m, n, k, dev: Device, c: dict, sw: Switches, fp8=False) -> dict[str, np.ndarray]:
    """One GEMM (m x k) @ (k x n): max(compute, memory) + floor. Where ``fp8`` (per GEMM): FP8
    inputs (1 byte each) at the FP8 dense peak, the output written in bf16; else all bf16. With
    the ``fp8`` switch on, an FP8 GEMM's tensor cores run at ``fp8.gemm_eta`` of a BF16 GEMM's
    efficiency and it pays ``fp8.quant_floor_s`` more floor (the activation's quantization
    before it), both fitted on the FP8 family's home."""
    g = c["gemm"]
    flops = 2.0 * m * n * k
    in_bytes = np.where(fp8, FP8_BYTES, BF16_BYTES)
    moved = in_bytes * (m * k + n * k) + BF16_BYTES * m * n
    peak = np.where(fp8, dev.fp8_peak_flops or np.nan, dev.peak_flops)
    one = np.ones_like(flops)
    f_clk = dev.f_clk * one if sw.clock else one
    eta_cl = (factors.wave_efficiency(m, n, k, dev.sms, dev.cta_cap, g["tile_m"],
                                            g["tile_n"], g["tile_k"])
              if sw.waves else one)
    eta_act = dev.eta_act * one if sw.delivery else one
    eta_duty = factors.duty_cycle(k, g["duty_c"], g["tile_k"]) if sw.delivery else one
    eta_mem = (factors.l2_memory_efficiency(moved, dev.l2_bytes, c["memory_law"])
               if sw.l2_memory else one)
    eta_fp8 = np.where(fp8, c["fp8"]["gemm_eta"], 1.0) * one if sw.fp8 else one
    eta_c = f_clk * eta_cl * eta_act * eta_duty * eta_fp8
    compute_s = flops / (peak * eta_c)
    memory_s = moved / (dev.mem_bw * eta_mem)
    quant_s = np.where(fp8, c["fp8"]["quant_floor_s"], 0.0) if sw.fp8 else 0.0
    floor_s = (g["floor_s"] + quant_s) * dev.floor_scale * one if sw.floors else 0.0 * one
    return {"seconds": np.maximum(compute_s, memory_s) + floor_s, "compute_s": compute_s,
            "memory_s": memory_s, "floor_s": floor_s, "f_clk": f_clk, "eta_cl": eta_cl,
            "eta_act": eta_act, "eta_duty": eta_duty, "eta_fp8": eta_fp8, "eta_mem": eta_mem,
            "flops": flops, "bytes": moved}


def prefill_attention(q, ctx, heads, kv_heads, head_dim, dev: Device, c: dict,
                      sw: Switches) -> dict[str, np.ndarray]:
    """Causal FlashAttention of one request: q new tokens over ctx cached plus themselves.
    With ``attention`` on, its compute efficiency is FlashAttention's own (fitted on home) and
    its CTAs (one per head per query tile) are wave-quantized like a GEMM's tiles."""
    a = c["attention"]
    flops = 4.0 * q * (ctx + q / 2.0) * heads * head_dim
    moved = BF16_BYTES * head_dim * (2.0 * q * heads + 2.0 * (q + ctx) * kv_heads)
    one = np.ones_like(flops)
    f_clk = dev.f_clk * one if sw.clock else one
    if sw.attention:
        # One CTA per (head, query tile), no split along the keys: FlashAttention-2's grid.
        eta_cl = (factors.wave_efficiency(q, heads * a["tile_q"], 0.0 * q, dev.sms, dev.sms,
                                          a["tile_q"], a["tile_q"], 1) if sw.waves else one)
        eta_kernel = a["prefill_eta"] * one
    else:
        eta_cl = one
        eta_kernel = dev.eta_act * one if sw.delivery else one
    eta_mem = (factors.l2_memory_efficiency(moved, dev.l2_bytes, c["memory_law"])
               if sw.l2_memory else one)
    eta_c = f_clk * eta_cl * eta_kernel
    compute_s = flops / (dev.peak_flops * eta_c)
    memory_s = moved / (dev.mem_bw * eta_mem)
    floor = a["prefill_floor_s"] if sw.attention else c["gemm"]["floor_s"]
    floor_s = floor * dev.floor_scale * one if sw.floors else 0.0 * one
    # Each (head, query tile) CTA's fixed work, as in decode.
    cta_s = (factors.per_cta_seconds(heads * np.ceil(q / a["tile_q"]), dev.sms, a["prefill_cta_s"])
             * dev.floor_scale if sw.attention and sw.floors else 0.0 * one)
    return {"seconds": np.maximum(compute_s, memory_s) + floor_s + cta_s, "compute_s": compute_s,
            "memory_s": memory_s, "floor_s": floor_s, "cta_s": cta_s, "f_clk": f_clk,
            "eta_cl": eta_cl, "eta_kernel": eta_kernel, "eta_mem": eta_mem, "flops": flops,
            "bytes": moved}


def decode_attention(batch, kv, heads, kv_heads, head_dim, dev: Device, c: dict,
                     sw: Switches) -> dict[str, np.ndarray]:
    """One decode-attention kernel over ``batch`` requests of ``kv`` cached tokens: it streams
    their K and V once. With ``attention`` on, a kernel with few (request x KV head) CTAs keeps
    only part of the memory system busy, at FlashInfer's own efficiency (fitted on home)."""
    a = c["attention"]
    flops = 4.0 * batch * kv * heads * head_dim
    moved = BF16_BYTES * head_dim * batch * (2.0 * kv * kv_heads + 2.0 * heads)
    one = np.ones_like(flops)
    eta_mem = (factors.l2_memory_efficiency(moved, dev.l2_bytes, c["memory_law"])
               if sw.l2_memory else one)
    if sw.attention:
        parallel = factors.decode_parallelism(batch * kv_heads, dev.sms, a["decode_knee"])
        eta_kernel = a["decode_eta"] * parallel
    else:
        eta_kernel = one
    memory_s = moved / (dev.mem_bw * eta_mem * eta_kernel)
    compute_s = flops / dev.peak_flops
    if sw.attention:
        floor = a["decode_floor_s"] + factors.split_kv_floor(batch, dev.split_kv,
                                                             a["decode_split_floor_s"])
        cta_s = factors.per_cta_seconds(batch * kv_heads, dev.sms, a["decode_cta_s"])
    else:
        floor, cta_s = c["gemm"]["floor_s"], 0.0 * one
    floor_s = floor * dev.floor_scale * one if sw.floors else 0.0 * one
    cta_s = cta_s * dev.floor_scale if sw.floors else 0.0 * one
    return {"seconds": np.maximum(compute_s, memory_s) + floor_s + cta_s, "compute_s": compute_s,
            "memory_s": memory_s, "floor_s": floor_s, "cta_s": cta_s, "eta_kernel": eta_kernel,
            "eta_mem": eta_mem, "flops": flops, "bytes": moved}


def fused_moe(tokens, topk, experts, hidden, inter, dev: Device, c: dict,
              sw: Switches, fp8=False, skew=0.0) -> dict[str, np.ndarray]:
    """One MoE layer's routed experts as vLLM's fused-MoE path runs them: the ``tokens x topk``
    routed rows, spread evenly over the experts (balanced routing) or, where ``skew`` (a power-law
    exponent) is above 0, as ``factors.power_law_loads`` spreads them, go
    through two grouped GEMMs (gate/up to ``2 inter``, then down to ``hidden``; ``inter`` is one
    expert's width on this GPU) with the activation between them. Each expert's rows are padded
    to the kernel's row block, so the padded rows are the work the tensor cores do; the weights
    of every expert touched are read once; the activations of every routed row are read and
    written by each kernel. The layer launches ``kernels`` kernels (alignment, two GEMMs,
    activation, the top-k sum), each with the GEMM's floor. Where ``fp8``: 1-byte expert weights
    and the FP8 dense peak, activations in bf16 (as ``gemm`` prices an FP8 GEMM)."""
    m = c["moe"]
    rows, touched = routed_experts(tokens, topk, experts)
    per_expert = rows / np.maximum(touched, 1.0)  # a step of no tokens routes none
    block = np.where(tokens <= experts, m["block_m_small"], m["block_m"])
    padded = touched * np.ceil(per_expert / block) * block
    skew = np.broadcast_to(skew, np.shape(tokens))
    touched, padded = np.array(touched, np.float64), np.array(padded, np.float64)
    for i in np.flatnonzero(skew > 0) if sw.routing else ():  # fewer touched, more padded
        loads = factors.power_law_loads(tokens[i], topk[i], int(experts[i]), skew[i],
                                        m["power_law_span"])
        touched[i] = np.count_nonzero(loads)
        padded[i] = (np.ceil(loads / block[i]) * block[i]).sum()
    flops = 2.0 * padded * hidden * 3.0 * inter
    weights = np.where(fp8, FP8_BYTES, BF16_BYTES) * touched * 3.0 * hidden * inter
    activations = BF16_BYTES * rows * (2.0 * hidden + 6.0 * inter)
    peak = np.where(fp8, dev.fp8_peak_flops or np.nan, dev.peak_flops)
    moved = weights + activations
    one = np.ones_like(flops)
    f_clk = dev.f_clk * one if sw.clock else one
    eta_act = dev.eta_act * one if sw.delivery else one
    eta_mem = (factors.l2_memory_efficiency(moved, dev.l2_bytes, c["memory_law"])
               if sw.l2_memory else one)
    compute_s = flops / (peak * f_clk * eta_act)
    memory_s = moved / (dev.mem_bw * eta_mem)
    floor_s = (m["kernels"] * c["gemm"]["floor_s"] * dev.floor_scale * one if sw.floors
               else 0.0 * one)
    return {"seconds": np.maximum(compute_s, memory_s) + floor_s, "compute_s": compute_s,
            "memory_s": memory_s, "floor_s": floor_s, "f_clk": f_clk, "eta_act": eta_act,
            "eta_mem": eta_mem, "flops": flops, "bytes": moved, "padded_rows": padded}


def allreduce(message_bytes, tp, dev: Device, c: dict, sw: Switches) -> dict[str, np.ndarray]:
    """One TP all-reduce of the step's activations, with the path and variant that priced it
    (1.0 where taken: ``custom``, ``symm``, ``one_shot``, ``nccl_ll``). Off: the bare ring over
    the link."""
    if not sw.collectives:
        return {"seconds": ring_allreduce_s(message_bytes, tp, dev.link_bytes_per_s, 0.0, 0.0),
                "bytes": message_bytes}
    terms = factors.allreduce_terms(message_bytes, tp, dev.link_bytes_per_s, dev.topology,
                                    c["collectives"], dev.allreduce_tables)
    return {"bytes": message_bytes, **{k: v.astype(np.float64) for k, v in terms.items()}}
