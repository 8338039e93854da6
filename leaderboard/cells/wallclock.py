"""``a100_splitwise`` and ``h100_splitwise``: splitwise-sim's measured end-to-end step times.

Each (model, TP, batch, prompt, generated tokens) point gives two cells: the whole-batch prefill
step (``prompt_time``) and one decode iteration (``token_time``), each the median over the point's
repeats, with max - min as the spread. Nothing is composed: these are wall clocks.
Workload ids are the ``_vidur`` datasets' own, so one step has one id in every family.
"""

from __future__ import annotations

import statistics

import duckdb

from leaderboard.cells.common import cell_set, fetch, phase_counts, render_card, source_lines
from leaderboard.cells.schema import CellSet, workload_id

SOURCE = "splitwise"
DATASETS = {"a100_sxm": "a100_splitwise", "h100_sxm": "h100_splitwise"}
POINT = ["model", "tp", "batch_size", "prompt_size", "token_size"]
MEASURED = ["prompt_time_ms", "token_time_ms", "e2e_time_ms"]
def _median_cell(sku: str, point: dict, phase: str, q_lens: list[int],
                 ctx_lens: list[int], repeats: list[dict], column: str) -> tuple[dict, list]:
    cell_id = (f"{phase}/{point['model']}/tp{point['tp']}/b{point['batch_size']}"
               f"/p{point['prompt_size']}/t{point['token_size']}")
    values = [r[column] for r in repeats]
    cell = {"cell_id": cell_id, "sku": sku, "phase": phase, "model": point["model"],
            "tp": point["tp"], "q_lens": q_lens, "ctx_lens": ctx_lens,
            "workload_id": workload_id(point["model"], point["tp"], q_lens, ctx_lens),
            "gt_ms": statistics.median(values), "gt_kind": "wall_clock",
            "gt_spread_ms": max(values) - min(values), "source": SOURCE,
            "backend": repeats[0]["backend"], "backend_version": repeats[0]["backend_version"],
            "composed": False, "weight": 1, "trace": None, "scheduler": None}
    lineage = [{"cell_id": cell_id, "op": "step", "table_name": "step_wallclock",
                "key": r["lineage_key"], "latency_ms": r[column], "count": 1}
               for r in repeats]
    return cell, lineage


def build_splitwise(con: duckdb.DuckDBPyConnection) -> list[CellSet]:
    out = []
    for sku, name in DATASETS.items():
        rows = fetch(con, "step_wallclock", "source = ? AND sku = ?", [SOURCE, sku],
                     f"{', '.join(POINT)}, repeat")
        if not rows:
            continue
        points: dict[tuple, list[dict]] = {}
        seen, copies = set(), 0
        for r in rows:
            # The sweeps share their centre point and upstream lists it once per sweep with the
            # very same numbers: one measurement, which must not weigh three times.
            fingerprint = tuple(r[c] for c in POINT + MEASURED)
            if fingerprint in seen:
                copies += 1
                continue
            seen.add(fingerprint)
            points.setdefault(tuple(r[c] for c in POINT), []).append(r)
        cells, lineage = [], []
        for values, repeats in points.items():
            point = dict(zip(POINT, values, strict=True))
            bs, prompt = point["batch_size"], point["prompt_size"]
            # token_time averages the decode iterations over token_size generated tokens, so the
            # context grows from prompt to prompt + token_size: the midpoint stands for it.
            mid = prompt + point["token_size"] // 2
            for phase, q, ctx, column in (("prefill", prompt, 0, "prompt_time_ms"),
                                          ("decode", 1, mid, "token_time_ms")):
                cell, lin = _median_cell(sku, point, phase, [q] * bs, [ctx] * bs,
                                         repeats, column)
                cells.append(cell)
                lineage += lin
        files = {(r["file"], r["file_sha256"]) for r in rows}
        excluded = con.execute("SELECT count(*) FROM quarantine WHERE source = ? "
                               "AND table_name = 'step_wallclock'", [SOURCE]).fetchone()[0]
        configs = sorted({(p[0], p[1]) for p in points})
        card = render_card(
            "splitwise", name=name, sku=sku, cells=len(cells), points=len(points),
            **phase_counts(cells), sources=source_lines(con, files), copies=copies,
            excluded=excluded, configs=", ".join(f"{m} TP{tp}" for m, tp in configs),
            repeats=len(rows) - copies)
        out.append(cell_set(name, sku, cells, lineage, card))
    return out
