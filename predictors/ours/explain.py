"""``Ours.explain``: one cell's prediction term by term, as ``python -m leaderboard.explain``
prints it.

Each op of one layer of the step (as ``ours`` times it; an MoE layer's experts as one fused op)
with its FLOPs, bytes, bound (compute, memory or link), every factor's value and its time; then
the step's terms summed over the layers.
"""

from __future__ import annotations

import polars as pl

from leaderboard_core.specs import GpuSpec
from predictors.ours import ops
from predictors.ours.config import Device
from predictors.ours.step import FFN_GEMMS, allreduce_bytes, decode_kernel, gemm_shapes, prefill_kernel
from predictors.steps import Steps

FACTOR_COLUMNS = ("f_clk", "eta_cl", "eta_act", "eta_duty", "eta_fp8", "eta_kernel", "eta_mem")


def op_rows(model, cell: pl.DataFrame, gpu: GpuSpec) -> list[dict]:
    """Every op of one layer of the cell's step, with its factors."""
    s, dev = Steps.from_cells(cell), model.device(gpu)
    c, sw = model.constants_, model.switches
    rows = []
    for name, (n, k) in gemm_shapes(s).items():
        if name in FFN_GEMMS and not s.dense_layers[0]:
            continue  # every layer of this model routes its FFN to experts
        rows.append((f"{name} m={s.tokens[0]:.0f} n={n[0]:.0f} k={k[0]:.0f}", 1,
                     ops.gemm(s.tokens, n, k, dev, c, sw, s.fp8)))
    if s.moe_layers[0]:
        share = s.experts_per_gpu()  # this GPU's experts and routed tokens
        alpha = s.routing_alpha[0]
        routing = f"power-law {alpha:g} routing" if alpha and sw.routing else "balanced routing"
        rows.append((f"moe tokens={share['tokens'][0]:g} top-{s.topk[0]:.0f} of "
                     f"{share['experts'][0]:g} experts, width {share['width'][0]:.0f}, {routing} "
                     "(one fused-MoE layer, this GPU's share)", 1,
                     ops.fused_moe(share["tokens"], s.topk, share["experts"], s.hidden,
                                   share["width"], dev, c, sw, s.fp8, s.routing_alpha)))
    sharded = s.sharded()
    cells, n, q, ctx = prefill_kernel(s)
    if len(cells):
        rows.append((f"attn_prefill batch={n[0]:.0f} q={q[0]:.0f} ctx={ctx[0]:.0f} (one kernel)",
                     1, ops.prefill_attention(q, ctx, sharded["heads"] * n,
                                              sharded["kv_heads"] * n, s.head_dim, dev, c, sw)))
    cells, n, ctx = decode_kernel(s)
    if len(cells):
        rows.append((f"attn_decode batch={n[0]:.0f} kv={ctx[0]:.0f} (one kernel)", 1,
                     ops.decode_attention(n, ctx, sharded["heads"], sharded["kv_heads"],
                                          s.head_dim, dev, c, sw)))
    if s.tp[0] > 1:
        r = ops.allreduce(allreduce_bytes(s), s.tp, dev, c, sw)
        rows.append((f"allreduce tp={s.tp[0]:.0f} {dev.topology} {allreduce_regime(r)}", 2, r))
    return [{"op": label, "count": count, **{k: float(v[0]) for k, v in r.items()}}
            for label, count, r in rows]


def allreduce_regime(r: dict) -> str:
    """Which path and variant priced the all-reduce ``r`` (``ops.allreduce``'s first message)."""
    if "custom" not in r:
        return "bare ring"
    if r["custom"][0]:
        return "vLLM custom " + ("one-shot" if r["one_shot"][0] else "two-shot")
    if r["symm"][0]:
        return "symmetric memory (priced as custom two-shot)"
    return "NCCL " + ("LL" if r["nccl_ll"][0] else "Simple")


def _printed(r: dict) -> dict[str, str]:
    bound = ("compute" if r.get("compute_s", 0) >= r.get("memory_s", 0) else "memory") \
        if "compute_s" in r else "link"
    return {"op": r["op"], "count": str(r["count"]), "GFLOP": f"{r.get('flops', 0) / 1e9:.3f}",
            "MB": f"{r['bytes'] / 1e6:.2f}", "bound": bound,
            **{f: f"{r[f]:.3f}" if f in r else "-" for f in FACTOR_COLUMNS},
            "floor us": f"{r.get('floor_s', 0) * 1e6:.1f}",
            "per-CTA us": f"{r['cta_s'] * 1e6:.1f}" if "cta_s" in r else "-",
            "us": f"{r['seconds'] * 1e6:.1f}"}


def device_line(dev: Device) -> str:
    return (f"device: peak {dev.peak_flops / 1e12:.0f} TFLOP/s, DRAM {dev.mem_bw / 1e9:.0f}"
            f" GB/s, L2 {dev.l2_bytes / 2**20:.0f} MiB, {dev.sms} SMs, CTA cap "
            f"{dev.cta_cap}, f_clk {dev.f_clk:.3f}, eta_act {dev.eta_act:.2f}, floor scale "
            f"{dev.floor_scale:.3f} (home clock / this clock), split-KV decode floor "
            f"{'on' if dev.split_kv else 'off'}, interconnect {dev.topology} at "
            f"{dev.link_bytes_per_s / 1e9:.0f} GB/s a direction")


def explain(model, cell: pl.DataFrame, gpu: GpuSpec) -> list[dict]:
    """The tables of ``Predictor.explain`` for one blind cell."""
    parts = model.components(cell, gpu)
    terms = [{"term": name, "ms": f"{value[0] * 1e3:.4f}"} for name, value in parts.items()]
    terms.append({"term": "predicted", "ms": f"{sum(v[0] for v in parts.values()) * 1e3:.4f}"})
    tables = [{"title": "one layer, per op (x count)", "note": device_line(model.device(gpu)),
               "rows": [_printed(r) for r in op_rows(model, cell, gpu)]},
              {"title": "step terms, summed over the layers", "rows": terms}]
    if cell["gt_kind"][0] == "wall_clock":
        tables[-1]["note"] = (f"alpha {model.alpha_:.3f} (home fit); S(N) = "
                              f"{model.host_floor_[0] * 1e3:.3f} + {model.host_floor_[1] * 1e3:.4f}"
                              " (N-1) ms (deploy reading)")
    return tables

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
