"""Datasheet pieces shared by the roofline baselines (genz, llm_viewer, liminal) and by the
profiled ones that scale home measurements by roofline ratios (rf_scaled, table_scaled).

Only what two or more of them use lives here: the bf16 element size, the TP all-reduce count,
the routed experts' active work of an MoE layer, the per-op roofline-time ratio of a step
between two GPUs,
the per-direction link bandwidth read from a GPU's datasheet, GenZ's ring all-reduce formula
(baselines.md §3.3), which LLM-Viewer's optional collectives and LIMINAL's sync term reuse, and
the roofline time of one measured op point with the home-pooling it allows.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard_core.contract import Home, expert_parallel
from leaderboard_core.layer_work import routed_experts
from leaderboard_core.specs import GpuSpec
from predictors.steps import Steps

BF16_BYTES = 2.0
FP8_BYTES = 1.0
# Megatron TP: one all-reduce after the attention block, one after the MLP (baselines.md §8.5).
ALLREDUCES_PER_LAYER = 2.0
GENZ_COLLECTIVE_FIXED_S = 5e-6  # GenZ adds 5 µs to every collective


def peak_flops(gpu: GpuSpec) -> float:
    """Dense bf16 tensor-core peak in FLOP/s (decimal tera, as every datasheet means it)."""
    return float(gpu["bf16_dense_tflops"]) * 1e12


def fp8_peak_flops(gpu: GpuSpec) -> float | None:
    """Dense FP8 tensor-core peak in FLOP/s; None on a GPU without FP8 tensor cores."""
    return gpu.dense_tflops("fp8") * 1e12 if gpu.has_dense_peak("fp8") else None


def link_gbs_per_direction(gpu: GpuSpec) -> float:
    """The GPU's interconnect bandwidth in one direction, in GB/s.

    NVIDIA quotes NVLink and PCIe as the bidirectional total per GPU (A100 600, H100/H200 900,
    B200/GB200 1,800, L40S PCIe Gen4 x16 64). Each step of a ring all-reduce sends to one
    neighbour while it receives from the other, so the time a message takes is set by one
    direction: half the quoted figure. This reproduces GenZ's own H100 (450) and Blackwell (900)
    entries; GenZ's A100 entry (150, a quarter of 600) is the odd one out and is not followed.
    """
    return float(gpu["interconnect"]["bw_gbs"]) / 2.0


def ring_allreduce_s(message_bytes: np.ndarray, group: np.ndarray, link_bytes_per_s: float,
                     link_latency_s: float, fixed_s: float) -> np.ndarray:
    """Ring all-reduce time in seconds: ``fixed + 2(N-1)·latency + 2(N-1)/N · bytes / bw``.

    GenZ uses ``fixed = GENZ_COLLECTIVE_FIXED_S``; the value is 0 for a group of one or an empty message.
    """
    hops = 2.0 * (group - 1.0)
    seconds = (fixed_s + hops * link_latency_s
               + hops / np.maximum(group, 1.0) * message_bytes / link_bytes_per_s)
    return np.where((group > 1) & (message_bytes > 0), seconds, 0.0)


def expert_work(steps) -> dict[str, np.ndarray]:
    """Per cell and MoE layer, the routed experts at their active parameters, per GPU (experts
    split over the TP group, or spread whole over it: ``Steps.experts_per_gpu``): ``rows``
    (routed token copies, tokens x top-k), ``touched`` (experts some token routes to, at most
    all of them: an expert no token picks is not read), ``width`` (one expert's intermediate on
    this GPU). Each expert is gated: gate and up (h -> width), down (width -> h). Zero rows for
    a dense model. The extension every roofline here uses for MoE layers."""
    share = steps.experts_per_gpu()
    rows, touched = routed_experts(share["tokens"], steps.topk, share["experts"])
    return {"rows": rows, "touched": touched, "width": share["width"]}


def expert_flop_bytes(tokens, hidden, width, rows, touched) -> tuple[np.ndarray, np.ndarray]:
    """FLOP and bytes of one fused-MoE kernel: three projections (gate, up: h -> width; down)
    per routed row, the touched experts' weights read, the tokens' activations in and out."""
    return (2 * rows * hidden * 3 * width,
            BF16_BYTES * (touched * 3 * hidden * width + 2 * tokens * hidden))


def point_seconds(op: str, points: pl.DataFrame, peak: dict[str, float]) -> np.ndarray:
    """Roofline time of each measured op point on a GPU of these peaks: max(FLOP/F, BYTE/B),
    or the message over the link for the all-reduce; the point-level form of
    ``roofline_ratios``."""
    if op == "allreduce":
        return points["message_bytes"].to_numpy().astype(np.float64) / peak["link_bw"]
    flop, byte = point_work(op, points)
    return np.maximum(flop / peak["flops"], byte / peak["mem_bw"])


def point_work(op: str, points: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """FLOP and HBM bytes of each op point (a GEMM, attention or fused-MoE kernel; not the
    all-reduce, whose cost is the message over the link)."""
    col = lambda c: points[c].to_numpy().astype(np.float64)  # noqa: E731
    e = BF16_BYTES
    if op.startswith("gemm"):  # a step's gemm_qkv ... or an op-level point's gemm
        m, n, k = col("m"), col("n"), col("k")
        return 2 * m * n * k, e * (n * k + m * k + m * n)
    if op == "moe":  # one GPU's share: spread over moe_ep GPUs, 1 / moe_ep of the experts
        t = col("num_tokens")
        ep = expert_parallel(points)
        return expert_flop_bytes(t, col("hidden_size"), col("inter_size") / col("moe_tp"),
                                 *routed_experts(t / ep, col("topk"), col("num_experts") / ep))
    b, heads, kv_heads, d = col("batch"), col("num_heads"), col("num_kv_heads"), col("head_dim")
    kv = col("kv_len")  # cached context, as in the cells' lookups
    if op == "attn_prefill":
        q = col("q_len")
        return (4 * b * q * (kv + q / 2) * heads * d,
                e * b * (2 * q * heads * d + 2 * (kv + q) * kv_heads * d))
    return 4 * b * kv * heads * d, e * b * (2 * kv * kv_heads * d + 2 * heads * d)


def roofline_ratios(steps: Steps, home: dict[str, float], target: dict[str, float]
                    ) -> dict[str, np.ndarray]:
    """Per op and cell, max(FLOP/F, BYTE/B) on the target over the same on the home (§2.6 (b)),
    at the step's real (unrounded, TP-sharded) shapes; 1 where the op does no work."""
    e = BF16_BYTES
    s = steps.sharded()
    heads, kv_heads, d, h, t = s["heads"], s["kv_heads"], steps.head_dim, steps.hidden, steps.tokens

    def gemm(k: np.ndarray, n: np.ndarray):  # FP8 steps: 1-byte inputs, bf16 output
        return 2 * t * k * n, np.where(steps.fp8, FP8_BYTES, e) * (k * n + t * k) + e * t * n

    ffn_up = (1 + steps.gated) * s["ffn"]
    work = {"gemm_qkv": gemm(h, (heads + 2 * kv_heads) * d), "gemm_o": gemm(heads * d, h),
            "gemm_gate_up": gemm(h, ffn_up), "gemm_down": gemm(s["ffn"], h)}
    q, c, at = steps.pf_q, steps.pf_ctx, steps.pf_cell
    work["attn_prefill"] = (steps.sum(4 * q * (c + q / 2) * heads[at] * d[at]),
                            e * steps.sum(2 * q * heads[at] * d[at] + 2 * (c + q) * kv_heads[at] * d[at]))
    work["attn_decode"] = (4 * steps.decode_ctx * heads * d,
                           e * (2 * steps.decode_ctx * kv_heads * d + 2 * heads * d * steps.num_decode))
    experts = expert_work(steps)
    routed_tokens = np.where(experts["rows"] > 0, t, 0.0)  # a dense model's FFN routes none
    work["moe"] = expert_flop_bytes(routed_tokens, h, experts["width"], experts["rows"],
                                    experts["touched"])
    ratios = {}
    for op, (flop, byte) in work.items():
        fp8 = steps.fp8 if op.startswith("gemm") else False  # an FP8 GEMM runs at the FP8 dense peak
        on_home = np.maximum(flop / np.where(fp8, home["fp8_flops"], home["flops"]),
                             byte / home["mem_bw"])
        on_target = np.maximum(flop / np.where(fp8, target["fp8_flops"], target["flops"]),
                               byte / target["mem_bw"])
        ratios[op] = np.divide(on_target, on_home, out=np.ones(steps.n), where=on_home > 0)
    return ratios


def in_first_home_units(home: Home) -> dict[str, pl.DataFrame]:
    """The home's op points, each home GPU's latencies scaled to the first home's datasheet by
    the point's roofline-time ratio, so one forest per op learns one GPU's times (several homes);
    one home's points as they are."""
    if len(home.gpus) == 1:
        return home.ops
    first = peaks(home.gpu)
    out = {}
    for op, frame in home.ops.items():
        parts = [rows.with_columns(latency_ms=rows["latency_ms"].to_numpy()
                                   * point_seconds(op, rows, first) / point_seconds(op, rows, peaks(gpu)))
                 for gpu, rows in home.by_gpu(frame)]
        out[op] = pl.concat(parts)
    return out


def peaks(gpu) -> dict[str, float]:
    """Datasheet peaks; ``fp8_flops`` is NaN on a GPU without FP8 tensor cores."""
    fp8 = fp8_peak_flops(gpu)
    return {"flops": peak_flops(gpu), "fp8_flops": np.nan if fp8 is None else fp8,
            "mem_bw": gpu.mem_bw_bytes_per_s, "link_bw": link_gbs_per_direction(gpu) * 1e9}
