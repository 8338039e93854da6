"""Steps summed from per-layer op profiles: Vidur's own (``<gpu>_vidurprof``) and LLMServingSim's
(``<gpu>_llmservingsim``).

Ground truth is num_layers x the sum of one decoder layer's measured ops at the step's token
count, plus the measured attention of exactly that batch where the profiler has one. A step is
built only when every point it sums was measured: nothing is interpolated, rounded or fitted.
"""

from __future__ import annotations

from collections import Counter

import duckdb

from leaderboard.cells.common import (
    PHASES,
    cell_set,
    fetch,
    phase_counts,
    render_card,
    source_lines,
)
from leaderboard.cells.schema import CellSet, workload_id
from leaderboard_core.contract import VIDUR_OPS
from leaderboard_core.specs import load_models

VIDUR_DATASETS = {"a100_80gb_pcie": "a100_vidurprof", "a40": "a40_vidurprof",
                  "h100_sxm": "h100_vidurprof"}
LSS_DATASETS = {"h100_sxm": "h100_llmservingsim", "rtx_a6000": "a6000_llmservingsim",
                "rtx3090": "rtx3090_llmservingsim", "rtx4090": "rtx4090_llmservingsim"}
# One decoder layer per profiler file, with how often a layer runs each op. Embedding, final
# norm, LM head and sampler are outside the layers and left out.
LAYER_OPS = {
    # v0 PyTorch profiler: HF-style modules, one row per module.
    "layers.csv": {op: 1 for op in ("input_layernorm", "q_proj", "k_proj", "v_proj", "rope",
                                    "o_proj", "post_layernorm", "gate_proj", "up_proj", "act_fn",
                                    "down_proj")},
    # vLLM profiler: `layernorm` is the mean of one RMSNorm call and a layer makes two.
    "dense.csv": {"layernorm": 2, "qkv_proj": 1, "rotary_emb": 1, "o_proj": 1, "gate_up_proj": 1,
                  "act_fn": 1, "down_proj": 1},
}
V0_ATTENTION = "attn"  # layers.csv's own attention: one sequence of `input` tokens, empty cache
# A one-token request reads as a decode in the cell schema, and one at ctx 0 decodes nothing.
MIN_TOKENS = 2


def _compose(sku: str, source: str, model: str, tp: int, layers: int, phase: str,
             q_lens: list[int], ctx_lens: list[int], points: list[tuple]) -> tuple[dict, list]:
    """One cell from ``points`` = (op, table, store row, times per layer)."""
    wid = workload_id(model, tp, q_lens, ctx_lens)
    lineage = [{"cell_id": wid, "op": op, "table_name": table, "key": row["lineage_key"],
                "latency_ms": row["latency_ms"], "count": n * layers}
               for op, table, row, n in points]
    rows = [row for _, _, row, _ in points]
    cell = {"cell_id": wid, "workload_id": wid, "sku": sku, "model": model, "tp": tp,
            "phase": phase, "q_lens": q_lens, "ctx_lens": ctx_lens,
            "gt_ms": sum(x["latency_ms"] * x["count"] for x in lineage), "gt_kind": "gpu_block",
            "gt_spread_ms": None, "source": source,
            "backend": "+".join(sorted({r["backend"] for r in rows})),
            "backend_version": "+".join(sorted({r["backend_version"] for r in rows})),
            "composed": False, "weight": 1, "trace": None, "scheduler": None}
    return cell, lineage


def _config_rows(cells: list[dict], extra: dict[tuple, str]) -> str:
    """Markdown table rows: one per (model, TP), with its cells per phase."""
    counts = Counter((c["model"], c["tp"], c["phase"]) for c in cells)
    return "\n".join(f"| {m} | {tp} | {info} | "
                     + " | ".join(str(counts[(m, tp, p)]) for p in PHASES) + " |"
                     for (m, tp), info in sorted(extra.items()))


def build_vidurprof(con: duckdb.DuckDBPyConnection) -> list[CellSet]:
    models, out = load_models(), []
    marks = ", ".join("?" * len(VIDUR_OPS))
    for sku, name in VIDUR_DATASETS.items():
        rows = fetch(con, "model_ops", f"source = 'vidur' AND sku = ? AND kv_len = 0 "
                     f"AND op IN ({marks})", [sku, *VIDUR_OPS], "model, tp, num_tokens, op")
        if not rows:
            continue
        grid: dict[tuple, dict[int, dict[str, dict]]] = {}
        for r in rows:
            grid.setdefault((r["model"], r["tp"]), {}).setdefault(r["num_tokens"], {})[r["op"]] = r
        cells, lineage, gaps, info = [], [], 0, {}
        for (model, tp), by_tokens in grid.items():
            ops = sorted({op for at in by_tokens.values() for op in at})
            layers = models[model]["num_layers"]
            missing = [op for op in VIDUR_OPS if op not in ops]
            listed = f"all but {', '.join(missing)}" if missing else "all"
            info[(model, tp)] = f"{layers} | {listed} | {min(by_tokens)}..{max(by_tokens)}"
            for tokens, at in sorted(by_tokens.items()):
                if len(at) < len(ops):
                    gaps += 1
                    continue
                if tokens < MIN_TOKENS:
                    continue
                cell, lin = _compose(sku, "vidur", model, tp, layers, "prefill", [tokens], [0],
                                     [(op, "model_ops", at[op], 1) for op in ops])
                cells.append(cell)
                lineage += lin
        card = render_card(
            "vidurprof", name=name, sku=sku, cells=len(cells), **phase_counts(cells), gaps=gaps,
            configs=_config_rows(cells, info), min_tokens=MIN_TOKENS,
            sources=source_lines(con, {(r["file"], r["file_sha256"]) for r in rows}))
        out.append(cell_set(name, sku, cells, lineage, card))
    return out


def _batch(a: dict) -> tuple[list[int], list[int]]:
    """(q_lens, ctx_lens) of the batch one attention row measured."""
    if a["phase"] == "decode":
        return [1] * a["batch"], [a["kv_len"]] * a["batch"]
    decodes = a["n_decode"] or 0
    return ([a["q_len"]] * a["batch"] + [1] * decodes,
            [a["kv_len"]] * a["batch"] + [a["kv_decode"]] * decodes)


def build_llmservingsim(con: duckdb.DuckDBPyConnection) -> list[CellSet]:
    models, out = load_models(), []
    for sku, name in LSS_DATASETS.items():
        where = "source = 'llmservingsim' AND sku = ?"
        dense = fetch(con, "model_ops", f"{where} AND kv_len = 0", [sku],
                      "model, tp, num_tokens, op")
        attention = fetch(con, "attention", where, [sku],
                          "model, tp, phase, batch, q_len, kv_len, n_decode, kv_decode")
        layout: dict[tuple, str] = {}
        grid: dict[tuple, dict[int, dict[str, dict]]] = {}
        files = {(r["file"], r["file_sha256"]) for r in attention}
        for r in dense:
            kind = r["file"].rsplit("/", 1)[-1]
            if kind in LAYER_OPS and (r["op"] in LAYER_OPS[kind] or r["op"] == V0_ATTENTION):
                layout[(r["model"], r["tp"])] = kind
                files.add((r["file"], r["file_sha256"]))
                grid.setdefault((r["model"], r["tp"]), {}).setdefault(
                    r["num_tokens"], {})[r["op"]] = r
        if not grid:
            continue
        built: dict[str, tuple[dict, list]] = {}
        gaps = 0
        for a in attention:
            config = (a["model"], a["tp"])
            q_lens, ctx_lens = _batch(a)
            at = grid.get(config, {}).get(sum(q_lens), {})
            per_layer = LAYER_OPS[layout[config]] if config in layout else {}
            if not per_layer or any(op not in at for op in per_layer):
                gaps += 1
                continue
            points = [(op, "model_ops", at[op], n) for op, n in per_layer.items()]
            cell = _compose(sku, "llmservingsim", a["model"], a["tp"],
                            models[a["model"]]["num_layers"], a["phase"], q_lens, ctx_lens,
                            [*points, ("attention", "attention", a, 1)])
            built[cell[0]["cell_id"]] = cell
        # v0's own attention covers one sequence at an empty cache; where the attention table
        # measured the same step, that dedicated measurement is kept.
        for (model, tp), by_tokens in grid.items():
            per_layer = LAYER_OPS[layout[(model, tp)]]
            for tokens, at in sorted(by_tokens.items()):
                if tokens < MIN_TOKENS or any(op not in at for op in [*per_layer, V0_ATTENTION]):
                    continue
                points = [(op, "model_ops", at[op], n)
                          for op, n in [*per_layer.items(), (V0_ATTENTION, 1)]]
                cell = _compose(sku, "llmservingsim", model, tp, models[model]["num_layers"],
                                "prefill", [tokens], [0], points)
                built.setdefault(cell[0]["cell_id"], cell)
        cells = [c for c, _ in built.values()]
        lineage = [x for _, lin in built.values() for x in lin]
        info = {c: f"`{kind}` | {models[c[0]]['num_layers']}" for c, kind in layout.items()}
        layers_text = "\n".join(f"- `{kind}`: " + ", ".join(f"{op} x{n}" for op, n in ops.items())
                                for kind, ops in LAYER_OPS.items() if kind in layout.values())
        card = render_card(
            "llmservingsim", name=name, sku=sku, cells=len(cells), **phase_counts(cells),
            gaps=gaps, configs=_config_rows(cells, info), layer_ops=layers_text,
            min_tokens=MIN_TOKENS, sources=source_lines(con, files))
        out.append(cell_set(name, sku, cells, lineage, card))
    return out
