"""``<sku>_vidur`` datasets: Vidur's composition method over aiconfigurator's measured ops.

Per layer: the QKV, O, gate/up and down GEMMs at m = the step's tokens (TP-sharded n and k),
prefill and decode attention, and the TP all-reduce twice; times the number of layers. Embedding,
LM head, sampling and light kernels (norms, activation, rope, residual add) are not in the ground
truth: aiconfigurator did not measure the light kernels.
"""

from __future__ import annotations

from collections import Counter

import duckdb
import polars as pl
import yaml

from leaderboard import paths
from leaderboard.cells.common import render_card, source_lines
from leaderboard.cells.grid import Grid, common_axes, load_grid, vidur_version
from leaderboard.cells.schema import LINEAGE_SCHEMA, CellSet, derive, is_decode, phase_of, workload_id
from leaderboard.cells.snapping import binary_batches, fit, presnap
from leaderboard.cells.traces import has_traces, replayed_steps
from leaderboard.specs import GpuSpec, load_models, tp_shapes

CONFIG = paths.CONF_DIR / "cells" / "vidur.yaml"
BF16 = 2


def compose(grid: Grid, model: dict, tp: int, q_lens: list[int], ctx_lens: list[int]):
    """Ground truth of one snapped step on one GPU: (ms, composed flag, lineage rows) or None."""
    s = tp_shapes(model, tp)
    tokens, layers = sum(q_lens), model["num_layers"]
    points, lookups = [], Counter()
    for op in ("qkv", "o", "gate_up", "down"):
        points.append((f"gemm_{op}", grid.gemm.get((tokens, *s[op])), 1))
    groups = Counter((q, c) for q, c in zip(q_lens, ctx_lens, strict=True))
    for (q, c), count in sorted(groups.items()):
        decode = is_decode(q, c)
        table = grid.decode if decode else grid.prefill
        parts = binary_batches(count, grid.decode_batches if decode else grid.prefill_batches)
        if not parts:
            return None
        for b in parts:
            key = (b, c, s["heads"], s["kv_heads"]) if decode else (b, q, s["heads"], s["kv_heads"])
            op = "attn_decode" if decode else "attn_prefill"
            points.append((op, table.get(key), 1))
            lookups[op] += 1
    if tp > 1:
        ar = grid.allreduce.get((tp, tokens * s["hidden"] * BF16))
        points.append(("allreduce", ar, 2))
    if any(p is None for _, p, _ in points):
        return None
    lineage = [(op, p.table, p.key_json(), p.latency_ms, n * layers) for op, p, n in points]
    total = sum(lat * n for *_, lat, n in lineage)
    return total, any(n > 1 for n in lookups.values()), lineage


def _tokens_ok(axes: dict, model: dict, tp: int):
    m_grid, ar = set(axes["m"]), set(axes["allreduce_bytes"])
    return lambda t: t in m_grid and (tp == 1 or t * model["hidden_size"] * BF16 in ar)


def build_vidur(con: duckdb.DuckDBPyConnection, gpus: dict[str, GpuSpec]) -> list[CellSet]:
    cfg = yaml.safe_load(CONFIG.read_text())
    models = load_models()
    skus = [r[0] for r in con.execute(
        "SELECT DISTINCT sku FROM gemm WHERE source = 'aiconfigurator' ORDER BY sku").fetchall()]
    grids = {sku: load_grid(con, sku, v) for sku in skus if (v := vidur_version(con, sku))}
    family = [grids[s] for s in cfg["family"] if s in grids]
    if not family or not has_traces(con):
        return []  # a partial store (sources.only) without aiconfigurator or the traces
    axes = common_axes(family)
    presnapped = Counter((*presnap(slots, axes), trace, scheduler)
                         for trace, scheduler, slots in replayed_steps(con, cfg))
    workloads = []
    for entry in cfg["configs"]:
        model, tp = models[entry["model"]], entry["tp"]
        snapped = Counter()
        for (prefills, decodes, trace, scheduler), count in presnapped.items():
            step = fit(prefills, decodes, axes, _tokens_ok(axes, model, tp))
            if step:
                snapped[(tuple(step[0]), tuple(step[1]), trace, scheduler)] += count
        by_id = {}
        for (q, c, trace, scheduler), weight in sorted(snapped.items()):
            wid = workload_id(entry["model"], tp, list(q), list(c))
            prev = by_id.get(wid)
            by_id[wid] = (q, c, trace, scheduler, weight + (prev[4] if prev else 0))
        workloads += _sample(entry["model"], tp, by_id, cfg["cells_per_phase"], family, model)
    return [_cell_set(con, grid, workloads, models, cfg, gpus[sku]["short_name"])
            for sku, grid in sorted(grids.items())]


def _sample(name: str, tp: int, by_id: dict, per_phase: int, family, model) -> list[dict]:
    """Up to ``per_phase`` workloads per phase that every family GPU measured, taken in
    workload-id hash order: seeded and deterministic."""
    taken = Counter()
    out = []
    for wid, (q, c, t, s, w) in sorted(by_id.items()):
        phase = phase_of(q, c)
        if taken[phase] < per_phase and all(compose(g, model, tp, list(q), list(c))
                                            for g in family):
            taken[phase] += 1
            out.append({"workload_id": wid, "model": name, "tp": tp, "q_lens": list(q),
                        "ctx_lens": list(c), "trace": t, "scheduler": s, "weight": w,
                        "phase": phase})
    return out


def _cell_set(con, grid: Grid, workloads: list[dict], models: dict, cfg: dict, short_name: str):
    cells, lineage, missing = [], [], 0
    for w in workloads:
        result = compose(grid, models[w["model"]], w["tp"], w["q_lens"], w["ctx_lens"])
        if result is None:
            missing += 1
            continue
        total, composed, points = result
        cells.append({**w, "cell_id": w["workload_id"], "sku": grid.sku, "gt_ms": total,
                      "gt_kind": "gpu_block", "source": "aiconfigurator", "backend": "vllm",
                      "backend_version": grid.version, "composed": composed})
        lineage += [{"cell_id": w["workload_id"], "op": op, "table_name": t, "key": k,
                     "latency_ms": lat, "count": n} for op, t, k, lat, n in points]
    name = f"{short_name}_vidur"
    frame = derive(pl.DataFrame(cells).with_columns(dataset=pl.lit(name)))
    lineage_frame = pl.DataFrame(lineage, schema={k: v for k, v in LINEAGE_SCHEMA.items()
                                                  if k != "dataset"}).with_columns(
        dataset=pl.lit(name)).select(list(LINEAGE_SCHEMA))
    card = _card(con, name, grid, frame, cfg, missing, grid.sku in cfg["family"])
    return CellSet(name, grid.sku, frame, lineage_frame, card)


def _card(con, name, grid: Grid, cells: pl.DataFrame, cfg, missing: int, in_family: bool) -> str:
    counts = dict(cells.group_by("phase").len().iter_rows())
    configs = ", ".join(f"{c['model']} TP{c['tp']}" for c in cfg["configs"])
    return render_card(
        "vidur", name=name, sku=grid.sku, version=grid.version, cells=len(cells),
        prefill=counts.get("prefill", 0), decode=counts.get("decode", 0),
        mixed=counts.get("mixed", 0), composed_share=f"{cells['composed'].mean() or 0:.1%}",
        configs=configs, missing=missing,
        family="yes" if in_family else "no (workloads of the family, filtered to this grid)",
        files=source_lines(con, grid.files),
    )
