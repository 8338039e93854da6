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
add, KV-cache write) are not in the ground truth: aiconfigurator did not measure them.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import duckdb
import yaml

from leaderboard import families
from leaderboard.cells import fp8_check, memory
from leaderboard.cells.common import PHASES, cell_set, phase_counts, render_card, source_lines
from leaderboard.cells.distortion import Tally
from leaderboard.cells.grid import Grid, common_axes, load_grid, measured_versions, vidur_version
from leaderboard.cells.schema import CellSet, is_decode, workload_id
from leaderboard.cells.snapping import Snapped, phase_of_step, shape_of, snap, uniform_steps
from leaderboard.cells.traces import has_traces, replayed_steps
from leaderboard_core import paths
from leaderboard_core.specs import GpuSpec, attention_kind, is_moe, load_models, moe_shapes, tp_shapes

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


def _tokens_ok(axes: dict, model: dict, tp: int):
    m_grid, ar, moe = set(axes["m"]), set(axes["allreduce_bytes"]), set(axes["moe_tokens"])
    return lambda t: (t in m_grid and (tp == 1 or t * model["hidden_size"] * BF16 in ar)
                      and (not is_moe(model) or t in moe))


def _versions(con, sku: str, wanted: str | None) -> list[str]:
    """The versions a family may read on this GPU, in preference order: ``null``, the home's
    version or the nearest later one; ``"X"``, X only; ``"X+"``, X or any later one."""
    if wanted is None:
        found = vidur_version(con, sku)
        return [found] if found else []
    if wanted.endswith("+"):
        floor = tuple(map(int, wanted[:-1].split(".")))
        return [v for v in measured_versions(con, sku) if tuple(map(int, v.split("."))) >= floor]
    return [wanted] if wanted in measured_versions(con, sku) else []


def _grid(con, sku: str, fam: dict, dtype: str) -> Grid | None:
    """The first grid of ``_versions`` holding GEMMs of ``dtype`` (after the build's FP8 check
    has quarantined the tables that fail it) and, for an MoE family, MoE layers at its token
    distribution; None if the GPU has none."""
    distribution = fam.get("moe_distribution")
    for version in _versions(con, sku, fam["version"]):
        grid = load_grid(con, sku, version, dtype, distribution)
        if grid.gemm and (distribution is None or grid.moe):
            return grid
    return None


def build_vidur(con: duckdb.DuckDBPyConnection, gpus: dict[str, GpuSpec]) -> list[CellSet]:
    cfg = yaml.safe_load(CONFIG.read_text())
    if not has_traces(con):
        return []  # a partial store (sources.only) without the traces
    shapes = Counter((trace, sched, shape_of(slots))
                     for trace, sched, slots in replayed_steps(con, cfg))
    skus = [r[0] for r in con.execute(
        "SELECT DISTINCT sku FROM gemm WHERE source = 'aiconfigurator' ORDER BY sku").fetchall()]
    return [s for suffix, fam in cfg["families"].items()
            for s in _family(con, gpus, cfg, skus, shapes, suffix, fam)]


def _family(con, gpus, cfg, skus, shapes, suffix: str, fam: dict) -> list:
    dtype = fam.get("gemm_dtype", "bf16")
    grids = {sku: grid for sku in skus if (grid := _grid(con, sku, fam, dtype))}
    members = [grids[s] for s in fam["gpus"] if s in grids]
    if not members:
        return []
    axes, models, tally = common_axes(members), load_models(), Tally()
    workloads, configs = [], _configs(cfg, fam)
    for entry in configs:
        _require_composable(suffix, models[entry["model"]])
        model, tp = models[entry["model"]], entry["tp"]
        ok, snapped_of, found = _tokens_ok(axes, model, tp), {}, {}
        for (trace, sched, shape), count in sorted(shapes.items(), key=str):
            if shape not in snapped_of:
                snapped_of[shape] = snap(shape, axes, ok)
            tally.add(shape, snapped_of[shape], count)
            if snapped_of[shape]:
                found.setdefault(snapped_of[shape], [trace, sched, 0])[2] += count
        for step in uniform_steps(axes, ok):  # measured uniform batches fill thin phases
            found.setdefault(step, [None, "uniform", 0])
        workloads += _sample(entry, found, cfg["cells_per_phase"], members, model)
    return [_cell_set(con, grid, workloads, models, cfg, suffix, fam, tally, gpus)
            for sku, grid in sorted(grids.items())]


def _configs(cfg: dict, fam: dict) -> list[dict]:
    """The family's own model x TP configurations, else the file's shared ones."""
    return fam.get("configs", cfg["configs"])


def _require_composable(suffix: str, model: dict) -> None:
    """Only GQA attention and MoE layers without shared experts are composed: an MLA model's
    projections and a shared expert's GEMMs are not in this composition yet."""
    if attention_kind(model) != "gqa" or model.get("shared_experts"):
        raise ValueError(f"conf/cells/vidur.yaml family {suffix}: {model['name']} has "
                         f"{attention_kind(model).upper()} attention and "
                         f"{model.get('shared_experts', 0)} shared experts; the cells compose GQA "
                         "models without shared experts only. Remove it from the family's configs.")


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
                      "moe_routing": fam.get("moe_distribution")})
        lineage += [{"cell_id": w["workload_id"], "op": op, "table_name": p.table, "key": p.key,
                     "latency_ms": p.latency_ms, "count": n} for op, p, n in points]
    name = f"{gpu['short_name']}_{suffix}"
    card = _card(con, name, grid, cells, cfg, fam, tally, len(workloads) - len(cells) - too_big,
                 too_big, models, gpus)
    return cell_set(name, grid.sku, cells, lineage, card)


def _card(con, name, grid: Grid, cells: list[dict], cfg, fam, tally: Tally, missing: int,
          too_big: int, models: dict, gpus: dict[str, GpuSpec]) -> str:
    gpu = gpus[grid.sku]
    counts = phase_counts(cells)
    replayed = sum(c["weight"] for c in cells)
    warm = [c for c in cells if c["warm_share"] > 0]
    gt = sum(c["gt_ms"] for c in cells) or 1.0
    return render_card(
        fam.get("card", "vidur"), name=name, gemm_dtype=fam.get("gemm_dtype", "bf16"),
        by_config=_by_config(cells), sku=grid.sku, version=grid.version, cells=len(cells),
        **counts,
        configs=", ".join(f"{c['model']} TP{c['tp']}" for c in _configs(cfg, fam)),
        family=", ".join(fam["gpus"]), member="yes" if grid.sku in fam["gpus"] else "no",
        missing=missing, composed=sum(c["composed"] for c in cells), distortion=tally.table(),
        per_phase=cfg["cells_per_phase"],
        origin=_origin(cells),
        replayed_share=f"{replayed / max(sum(tally.steps.values()), 1):.1%}",
        warm_cells=len(warm), warm_mean=f"{sum(c['warm_share'] for c in cells) / max(len(cells), 1):.1%}",
        warm_gt=f"{sum(c['gt_ms'] * c['warm_share'] for c in cells) / gt:.1%}",
        files=source_lines(con, grid.files), fp8_checks=_fp8_checks(con, gpus),
        too_big=too_big, memory_limit=f"{memory.UTILIZATION:.0%} of {gpu['mem_gb']} GiB",
        lm_head=_lm_head(_configs(cfg, fam), models, fam.get("gemm_dtype", "bf16")),
        distribution=fam.get("moe_distribution"), home=families.of(name).home,
    )


def _lm_head(configs: list[dict], models: dict, dtype: str) -> str:
    """Markdown: per configuration, the LM head's weight bytes against all its layers' linear
    weights (what a memory-bound decode step streams), from the model shapes."""
    rows = ["| model | TP | LM head / layers' linear weights |", "|---|---|---|"]
    for entry in configs:
        model, tp = models[entry["model"]], entry["tp"]
        share = memory.lm_head_bytes(model, tp) / (
            model["num_layers"] * memory.layer_weight_bytes(model, tp, dtype))
        rows.append(f"| {entry['model']} | {tp} | {share:.1%} |")
    return "\n".join(rows)


def _fp8_checks(con, gpus: dict[str, GpuSpec]) -> str:
    """Markdown: every FP8 table the build checked (``fp8_check``), kept or quarantined. The
    store holds the kept tables' FP8 rows only, so the check rerun on it gives those."""
    gemm = con.sql(f"""SELECT source, sku, backend_version, dtype, m, n, k, latency_ms FROM gemm
                           WHERE source = '{fp8_check.SOURCE}' AND m >= {fp8_check.LARGE}
                           AND n >= {fp8_check.LARGE} AND k >= {fp8_check.LARGE}""").pl()
    kept = [(r["sku"], r["backend_version"], "kept", fp8_check.detail(r))
            for r in fp8_check.table_checks(gemm, gpus).iter_rows(named=True)]
    dropped = con.execute("SELECT DISTINCT sku, json_extract_string(row, '$.backend_version'), "
                          "'quarantined', detail FROM quarantine WHERE reason = ?",
                          [fp8_check.REASON]).fetchall()
    rows = sorted(kept + dropped, key=lambda r: (r[0], tuple(map(int, r[1].split(".")))))
    return "\n".join(["| GPU | vLLM | verdict | measured |", "|---|---|---|---|",
                      *(f"| {sku} | {v} | {verdict} | {what} |" for sku, v, verdict, what in rows)])


def _origin(cells: list[dict]) -> str:
    """Markdown: per phase, cells from replayed steps, uniform cells, and the replayed weight."""
    total = sum(c["weight"] for c in cells) or 1
    rows = ["| phase | cells from replayed steps | uniform cells | share of replayed weight |",
            "|---|---|---|---|"]
    for phase in PHASES:
        mine = [c for c in cells if c["phase"] == phase]
        replayed = [c for c in mine if c["weight"]]
        rows.append(f"| {phase} | {len(replayed)} | {len(mine) - len(replayed)} | "
                    f"{sum(c['weight'] for c in replayed) / total:.1%} |")
    return "\n".join(rows)


def _by_config(cells: list[dict]) -> str:
    """Markdown: cells per phase and model x TP."""
    rows = ["| model | TP | prefill | decode | mixed |", "|---|---|---|---|---|"]
    for model, tp in sorted({(c["model"], c["tp"]) for c in cells}):
        mine = Counter(c["phase"] for c in cells if (c["model"], c["tp"]) == (model, tp))
        rows.append(f"| {model} | {tp} | " + " | ".join(str(mine[p]) for p in PHASES) + " |")
    return "\n".join(rows)
