"""``python -m leaderboard.explain predictor=ours dataset=h200_vidur [explain.cell=ID | explain.worst=K]``:
a cell, term by term, beside what was measured.

Fits the predictor as a run does (a wall-clock target first takes its deploy reading), asks it
for its ``explain`` of the blind cell (the tables it offers; ``ours`` gives each op of a layer
with its factors, then the step's terms), prints each measured op of the cell (from its lineage)
beside the predictor's split of the prediction where it offers one (``predict_by_op``), and sets
the prediction against the measured time. ``explain.worst=K`` predicts every cell and explains
the K with the largest error. This command reads the store, so it is a diagnostic, not a scored
run. With neither key, the dataset's first cell is explained.
"""

from __future__ import annotations

import sys

import numpy as np
import polars as pl
from rich.console import Console
from rich.table import Table

from leaderboard import metrics
from leaderboard.config import command_config
from leaderboard.inputs import InputError, guarded
from leaderboard.readings import take_in_process
from leaderboard.run_inputs import RunSpec, load_inputs, require_card_scope
from leaderboard_core.contract import GROUND_TRUTH_COLUMNS, NotSupported
from predictors import registry
from predictors.base import Predictor


def load(predictor: str, dataset: str):
    if registry.get(predictor).explain is Predictor.explain:  # before a fit that may be long
        raise InputError(f"predictor '{predictor}' offers no explain; its prediction only is "
                         "scored (a predictor offers one by overriding Predictor.explain); "
                         "ours and its rungs have one")
    inputs = load_inputs(RunSpec(predictor, dataset, {}))
    if inputs.level != "step":
        raise InputError(f"explain takes a step dataset (cells with their measured ops); "
                         f"{dataset} holds {inputs.target_row['kind']}, not cells: pick a _vidur, "
                         "_vidur19 or _vidurprof one (python -m leaderboard.data list)")
    card = registry.describe(predictor, registry.get(predictor))["card"]
    try:  # what a run would decline, explain declines too (an MoE cell for a dense card)
        require_card_scope(predictor, card, inputs)
    except NotSupported as exc:
        raise InputError(str(exc)) from exc
    model = registry.build(predictor).fit(inputs.home)
    # as a run: the cells a deploy reading touched are not scored
    cells, _ = take_in_process(model, inputs.target, inputs.target_lineage, inputs.gpu)
    return model, cells, inputs.gpu, inputs.target_lineage


def worst(model, cells: pl.DataFrame, gpu, k: int) -> list[str]:
    """The ids of the ``k`` cells with the largest absolute error."""
    predicted = model.predict(cells.drop(GROUND_TRUTH_COLUMNS), gpu)
    errors = np.abs(metrics.errors(predicted, cells["gt_ms"].to_numpy()))
    return [cells["cell_id"][int(i)] for i in np.argsort(-errors)[:k]]


def measured_ops(model, cell: pl.DataFrame, lineage: pl.DataFrame, gpu) -> dict | None:
    """The cell's measured ops (one row per op: calls, ms per call, ms in all) beside the
    predictor's own split of its prediction, when it offers one."""
    rows = lineage.filter(pl.col("cell_id") == cell["cell_id"][0])
    if rows.is_empty():
        return None
    per_op = rows.group_by("op", maintain_order=True).agg(
        pl.col("count").sum().alias("calls"), (pl.col("latency_ms") * pl.col("count")).sum()
        .alias("measured_ms"))
    split = model.predict_by_op(cell.drop(GROUND_TRUTH_COLUMNS), gpu) or {}
    table = []
    for op, calls, measured in per_op.iter_rows():
        predicted = float(split[op][0]) if op in split else None
        table.append({"op": op, "calls": calls, "measured ms": f"{measured:.4f}",
                      "predicted ms": "-" if predicted is None else f"{predicted:.4f}",
                      "error %": "-" if predicted is None
                      else f"{metrics.errors(predicted, measured):+.1f}"})
    note = ("measured: each op's points from the cell's lineage, times its calls" if split else
            f"measured: from the cell's lineage; {model.name} does not split its prediction by op")
    return {"title": "measured ops of this cell", "rows": table, "note": note}


def render(model, cell: pl.DataFrame, gpu, console: Console,
           lineage: pl.DataFrame | None = None) -> None:
    c0 = cell.row(0, named=True)
    blind = cell.drop(GROUND_TRUTH_COLUMNS)
    tables = list(model.explain(blind, gpu) or [])
    if lineage is not None and (ops := measured_ops(model, cell, lineage, gpu)):
        tables.append(ops)
    console.print(f"[bold]{model.name}[/] on {gpu.sku} ({gpu['arch']}): cell {c0['cell_id']}, "
                  f"{c0['model']} TP{c0['tp']}, {c0['phase']}, {c0['num_requests']} requests, "
                  f"{c0['total_tokens']} tokens, ground truth {c0['gt_kind']}")
    for spec in tables:
        if spec.get("note"):
            console.print(spec["note"])
        console.print(_table(spec["title"], spec["rows"]))
    predicted = float(model.predict(blind, gpu)[0])
    console.print(f"predicted {predicted:.4f} ms, measured {c0['gt_ms']:.4f} ms, error "
                  f"{metrics.errors(predicted, c0['gt_ms']):+.2f} %")


def _table(title: str, rows: list[dict]) -> Table:
    table = Table(title=title)
    for col in rows[0] if rows else ():
        texts = [str(r.get(col, "")) for r in rows]
        numeric = all(t.replace(".", "", 1).lstrip("+-").isdigit() or t == "-" for t in texts)
        table.add_column(col, justify="right" if numeric else "left")
    for r in rows:
        table.add_row(*(str(r.get(col, "")) for col in rows[0]))
    return table


def arguments(argv: list[str]) -> tuple[str, str, str | None, int | None]:
    """(predictor, dataset, cell, worst) from Hydra overrides; the old ``cell=ID`` still works."""
    cfg = command_config(argv, "python -m leaderboard.explain", __doc__, "explain",
                         {"cell": "explain.cell"})
    wanted, k = cfg.explain.cell, cfg.explain.worst  # worst checked with the root keys
    if wanted is not None and k is not None:
        raise InputError("explain.cell and explain.worst pick the cells two ways: pass one")
    return cfg.predictor.name, cfg.dataset.name, None if wanted is None else str(wanted), k


def main(argv: list[str]) -> None:
    predictor, dataset, wanted, k = arguments(argv)
    model, cells, gpu, lineage = load(predictor, dataset)
    chosen = worst(model, cells, gpu, k) if k else [wanted or cells["cell_id"][0]]
    for cell_id in chosen:
        cell = cells.filter(pl.col("cell_id") == cell_id)
        if cell.is_empty():
            close = [c for c in cells["cell_id"] if cell_id in c][:3] or cells["cell_id"].head(3)
            raise InputError(f"no cell '{cell_id}' in {dataset} (deploy-reading rows are not "
                             f"explained: they are not scored). Cell ids look like: "
                             f"{', '.join(close)}; explain.worst=K picks the K worst cells, and "
                             "every id is in a run's predictions.parquet (column cell_id)")
        render(model, cell, gpu, Console(width=200), lineage)


if __name__ == "__main__":
    guarded(main, "python -m leaderboard.explain")(sys.argv[1:])

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
