"""``<sku>_vidur``, ``<sku>_vidur19`` and ``<sku>_vidur_fp8`` datasets: Vidur's composition over
aiconfigurator's ops (the FP8 family reads the per-tensor FP8 GEMMs, all else as in bf16).

Per layer: the QKV, O, gate/up and down GEMMs at m = the step's tokens (TP-sharded n and k), one
prefill attention kernel over the step's prompts, one decode attention kernel over its decodes,
and the TP all-reduce twice; times the number of layers. Each is one measured point, as the
engine runs one kernel per call: the step is snapped to the measured grid (snapping.py), never
summed from sub-batches. A mixed step is the exception: vLLM V1's FlashAttention backend runs
its prompts and decodes as one kernel, which aiconfigurator never timed, so its two attention
points stand in for one call and the cell is labelled ``composed`` (kept out of the headline
``all``). Embedding, LM head, sampling and the light kernels (norms, activation, rope, residual
add) are not in the ground truth: aiconfigurator did not measure them. The KV-cache write is
likely in a 0.14.0 table's attention and not in a 0.19.0 one (``benchmarks/kv_cache_write.py``).
"""

from __future__ import annotations

import hashlib
from collections import Counter

import duckdb

from leaderboard.cells import memory, vidur_card
from leaderboard.cells.common import cell_set, family_configs
from leaderboard.cells.distortion import Tally
from leaderboard.cells.grid import Grid, common_axes, load_grid, measured_versions, vidur_version
from leaderboard.cells.schema import CellSet, is_decode, workload_id
from leaderboard.cells.snapping import Snapped, phase_of_step, shape_of, snap, uniform_steps
from leaderboard.cells.traces import has_traces, replayed_steps
from leaderboard_core import paths, yaml_io
from leaderboard_core.specs import GpuSpec, is_moe, load_models, moe_shapes, tp_shapes, uncomposable_reason
from leaderboard_core.versioning import release

CONFIG = paths.CONF_DIR / "cells" / "vidur.yaml"
BF16 = 2
GT_KIND = "gpu_block"


def compose(grid: Grid, model: dict, tp: int, q_lens: list[int], ctx_lens: list[int]):
    """Ground truth of one step on one GPU: (ms, warm share, lineage rows) or None when a point
    is not measured or the step is not one attention point per kind."""
    step = uniform(q_lens, ctx_lens)
    return compose_snapped(grid, model, tp, step) if step else None


def uniform(q_lens: list[int], ctx_lens: list[int]) -> Snapped | None:
    """The step as one decode batch at one context and one prompt batch of one length from an
    empty cache, or None when it is not."""
    decode = [c for q, c in zip(q_lens, ctx_lens, strict=True) if is_decode(q, c)]
    prefill = [(q, c) for q, c in zip(q_lens, ctx_lens, strict=True) if not is_decode(q, c)]
    if len(set(decode)) > 1 or len(set(prefill)) > 1 or any(c for _, c in prefill):
        return None
    return Snapped(len(decode), decode[0] if decode else 0, len(prefill),
                   prefill[0][0] if prefill else 0)


def compose_snapped(grid: Grid, model: dict, tp: int, step: Snapped):
    s = tp_shapes(model, tp)
    tokens, layers = step.tokens, model["num_layers"]
    ffn_layers, points = layers, [(f"gemm_{op}", grid.gemm.get((tokens, *s[op])), layers)
                                  for op in ("qkv", "o")]
    if is_moe(model):  # the routed experts of a layer: one fused-MoE kernel
        e = moe_shapes(model, tp)
        points.append(("moe", grid.moe.get((tokens, e["hidden"], model["moe_intermediate_size"],
                                            e["topk"], e["experts"], tp)), e["moe_layers"]))
        ffn_layers = e["dense_layers"]
    if ffn_layers:
        points += [(f"gemm_{op}", grid.gemm.get((tokens, *s[op])), ffn_layers)
                   for op in ("gate_up", "down")]
    if step.n_decode:
        points.append(("attn_decode", grid.decode.get((step.n_decode, step.ctx, s["heads"],
                                                       s["kv_heads"])), layers))
    if step.n_prefill:
        points.append(("attn_prefill", grid.prefill.get((step.n_prefill, step.length, s["heads"],
                                                         s["kv_heads"])), layers))
    if tp > 1:
        points.append(("allreduce", grid.allreduce.get((tp, tokens * s["hidden"] * BF16)),
                       2 * layers))
    if any(p is None for _, p, _ in points):
        return None
    total = sum(p.latency_ms * n for _, p, n in points)
    warm = sum(p.latency_ms * n for _, p, n in points if p.warm)
    return total, warm / total, points


def _token_rule(model: dict, tp: int) -> tuple[int, bool]:
    """What decides which token counts a configuration can take: the all-reduce message's
    hidden size under TP (0 without one) and whether an MoE kernel must be measured there."""
    return (model["hidden_size"] if tp > 1 else 0, is_moe(model))


def _tokens_ok(axes: dict, rule: tuple[int, bool]):
    (hidden, moe), m_grid = rule, set(axes["m"])
    ar, moe_tokens = set(axes["allreduce_bytes"]), set(axes["moe_tokens"])
    return lambda t: (t in m_grid and (not hidden or t * hidden * BF16 in ar)
                      and (not moe or t in moe_tokens))


def _versions(con, sku: str, wanted: str | None) -> list[str]:
    """The versions a family may read on this GPU, in preference order: ``null``, the home's
    version or the nearest later one; ``"X"``, X only; ``"X+"``, X or any later one."""
    if wanted is None:
        found = vidur_version(con, sku)
        return [found] if found else []
    if wanted.endswith("+"):
        floor = release(wanted[:-1])
        return [v for v in measured_versions(con, sku) if release(v) >= floor]
    return [wanted] if wanted in measured_versions(con, sku) else []


def _grid(con, sku: str, fam: dict, dtype: str, dense_memo: dict) -> Grid | None:
    """The first grid of ``_versions`` holding GEMMs of ``dtype`` (after the build's FP8 check
    has quarantined the tables that fail it) and, for an MoE family, MoE layers at its token
    distribution; None if the GPU has none."""
    distribution = fam.get("moe_distribution")
    for version in _versions(con, sku, fam["version"]):
        grid = load_grid(con, sku, version, dtype, distribution, dense_memo,
                         fam.get("expert_parallel", False))
        if grid.gemm and (distribution is None or grid.moe):
            return grid
    return None


def build_vidur(con: duckdb.DuckDBPyConnection, gpus: dict[str, GpuSpec]) -> list[CellSet]:
    cfg = yaml_io.safe_load(CONFIG.read_text())
    if not has_traces(con):
        return []  # a partial store (sources.only) without the traces
    # Each distinct replayed shape once, with its count and the first (trace, scheduler) that
    # replayed it (in a fixed order), so every configuration snaps each shape once.
    shapes: dict = {}
    for (trace, sched, shape), count in sorted(Counter(
            (trace, sched, shape_of(slots)) for trace, sched, slots in replayed_steps(con, cfg)
    ).items(), key=str):
        shapes.setdefault(shape, [trace, sched, 0])[2] += count
    skus = [r[0] for r in con.execute(
        "SELECT DISTINCT sku FROM gemm WHERE source = 'aiconfigurator' ORDER BY sku").fetchall()]
    dense_memo: dict = {}
    return [s for suffix, fam in cfg["families"].items()
            for s in _family(con, gpus, cfg, skus, shapes, suffix, fam, dense_memo)]


def _family(con, gpus, cfg, skus, shapes, suffix: str, fam: dict, dense_memo: dict) -> list:
    dtype = fam.get("gemm_dtype", "bf16")
    grids = {sku: grid for sku in skus if (grid := _grid(con, sku, fam, dtype, dense_memo))}
    members = [grids[s] for s in fam["gpus"] if s in grids]
    if not members:
        return []
    axes, models, tally = common_axes(members), load_models(), Tally()
    by_rule: dict[tuple, list[dict]] = {}  # configurations of one token rule snap alike
    for entry in family_configs(cfg, fam):
        _require_composable(suffix, models[entry["model"]])
        by_rule.setdefault(_token_rule(models[entry["model"]], entry["tp"]), []).append(entry)
    workloads = []
    for rule, entries in by_rule.items():
        ok, found = _tokens_ok(axes, rule), {}
        for shape, (trace, sched, count) in shapes.items():
            snapped = snap(shape, axes, ok)
            tally.add(shape, snapped, count * len(entries))  # once per configuration
            if snapped:
                found.setdefault(snapped, [trace, sched, 0])[2] += count
        for step in uniform_steps(axes, ok):  # measured uniform batches fill thin phases
            found.setdefault(step, [None, "uniform", 0])
        for entry in entries:
            workloads += _sample(entry, found, cfg["cells_per_phase"], members,
                                 models[entry["model"]])
    return [_cell_set(con, grid, workloads, models, cfg, suffix, fam, tally, gpus)
            for sku, grid in sorted(grids.items())]


def _require_composable(suffix: str, model: dict) -> None:
    if why := uncomposable_reason(model):
        raise ValueError(f"conf/cells/vidur.yaml family {suffix}: {model['name']} has {why}. "
                         "Remove it from the family's configs.")


def _sample(entry: dict, found: dict, per_phase: int, members: list[Grid], model: dict) -> list:
    """Up to ``per_phase`` steps per phase that at least one family GPU measured: replayed ones
    first, then measured uniform batches, each in a hash order (deterministic)."""
    def order(item):
        step, (_, _, weight) = item
        return weight == 0, hashlib.sha256(f"{entry['model']}|{entry['tp']}|{step}".encode()
                                           ).hexdigest()

    taken, out = Counter(), []
    for step, (trace, sched, weight) in sorted(found.items(), key=order):
        phase = phase_of_step(step)
        if taken[phase] < per_phase and any(
                compose_snapped(g, model, entry["tp"], step) for g in members):
            taken[phase] += 1
            q, c = step.workload()
            out.append({"workload_id": workload_id(entry["model"], entry["tp"], q, c),
                        "model": entry["model"], "tp": entry["tp"], "q_lens": q, "ctx_lens": c,
                        "trace": trace, "scheduler": sched, "weight": weight, "phase": phase,
                        "step": step})
    return out


def _cell_set(con, grid: Grid, workloads, models, cfg, suffix, fam, tally,
              gpus: dict[str, GpuSpec]):
    cells, lineage, too_big, gpu = [], [], 0, gpus[grid.sku]
    dtype = fam.get("gemm_dtype", "bf16")
    for w in map(dict, workloads):
        step = w.pop("step")
        if not memory.fits(models[w["model"]], w["tp"], w["q_lens"], w["ctx_lens"],
                           gpu["mem_gb"], dtype):
            too_big += 1  # weights plus KV cache above what a server may use: no such state
            continue
        result = compose_snapped(grid, models[w["model"]], w["tp"], step)
        if result is None:
            continue  # kept where measured: this GPU lacks a point of this workload
        total, warm, points = result
        cells.append({**w, "cell_id": w["workload_id"], "sku": grid.sku, "gt_ms": total,
                      "gt_kind": GT_KIND, "source": "aiconfigurator", "backend": "vllm",
                      "backend_version": grid.version, "composed": w["phase"] == "mixed",
                      "warm_share": warm,
                      "gemm_dtype": fam.get("gemm_dtype", "bf16"),
                      "moe_routing": fam.get("moe_distribution"),
                      "moe_ep": w["tp"] if fam.get("expert_parallel") else None})
        lineage += [{"cell_id": w["workload_id"], "op": op, "table_name": p.table, "key": p.key,
                     "latency_ms": p.latency_ms, "count": n} for op, p, n in points]
    name = f"{gpu['short_name']}_{suffix}"
    card = vidur_card.render(con, name, grid, cells, cfg, fam, tally,
                             len(workloads) - len(cells) - too_big, too_big, models, gpus)
    return cell_set(name, grid.sku, cells, lineage, card)
