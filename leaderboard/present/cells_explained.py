"""A cell, term by term, beside what was measured: the predictor fitted in a sealed child as a
run does, its ``explain`` tables and per-op split of the cells asked for, and each measured op of
a cell from its lineage. ``python -m leaderboard.explain`` prints it; the report shows the worst
cell of ``ours``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
from rich.console import Console
from rich.table import Table

from leaderboard.run import readings
from leaderboard.run.inputs import InputError
from leaderboard.run.run_inputs import RunInputs, RunSpec, load_inputs, require_card_scope
from leaderboard.score import metrics
from leaderboard.seal import predictor_index, sandbox
from leaderboard.store import database
from leaderboard_core.contract import GROUND_TRUTH_COLUMNS, NotSupported


@dataclass
class Explained:
    """A fitted predictor's answers, made in its sealed child: every scored cell's prediction
    (``predicted``), and per cell asked for its ``explain`` tables, per-op split and prediction."""

    predictor: str
    cells: pl.DataFrame  # the scored cells, ground truth included (this process's)
    gpu: object
    lineage: pl.DataFrame
    predicted: np.ndarray | None = None
    explained: dict = field(default_factory=dict)


def load(predictor: str, dataset: str) -> tuple[dict, RunInputs]:
    described = predictor_index.get(predictor)
    if not described["explains"]:  # before a fit that may be long
        raise InputError(f"predictor '{predictor}' offers no explain; its prediction only is "
                         "scored (a predictor offers one by overriding Predictor.explain); "
                         "ours and its rungs have one")
    database.ensure()
    inputs = load_inputs(RunSpec(predictor, dataset, {}))
    if inputs.level != "step":
        raise InputError(f"explain takes a step dataset (cells with their measured ops); "
                         f"{dataset} holds {inputs.target_row['kind']}, not cells: pick a _vidur, "
                         "_vidur19 or _vidurprof one (python -m leaderboard.data list)")
    try:  # what a run would decline, explain declines too (an MoE cell for a dense card)
        require_card_scope(predictor, described["card"], inputs)
    except NotSupported as exc:
        raise InputError(str(exc)) from exc
    return described, inputs


def sealed(described: dict, inputs: RunInputs, cell_ids=None) -> Explained:
    """Fit in a sealed child as a run does (a wall-clock target first takes its deploy reading,
    and the cells it touched are not scored), then predict every cell (``cell_ids`` None) or
    explain the given ones."""
    budget = readings.cap(len(inputs.target))
    supplier = readings.Supplier(inputs.target, inputs.target_lineage, budget)
    code = predictor_index.code_of(described)
    pred, _, facts = sandbox.fit_and_predict(
        described, described["defaults"], inputs.home, inputs.target.drop(GROUND_TRUTH_COLUMNS),
        inputs.gpu, "step" if cell_ids is None else "explain", budget, supplier,
        inputs.data_roots, code.readable, code.registered, explain=cell_ids or (),
        code_hash=code.code_hash)
    if facts["invalid_reasons"]:
        raise InputError(f"{described['name']} could not be explained: "
                         f"{'; '.join(facts['invalid_reasons'])}")
    return Explained(described["name"], supplier.scored(), inputs.gpu, inputs.target_lineage,
                     pred, facts.get("explained", {}))


def worst(model: Explained, k: int) -> list[str]:
    """The ids of the ``k`` cells with the largest absolute error."""
    errors = np.abs(metrics.errors(model.predicted, model.cells["gt_ms"].to_numpy()))
    return [model.cells["cell_id"][int(i)] for i in np.argsort(-errors)[:k]]


def measured_ops(model: Explained, cell: pl.DataFrame, answer: dict) -> dict | None:
    """The cell's measured ops (one row per op: calls, ms per call, ms in all) beside the
    predictor's own split of its prediction, when it offers one."""
    rows = model.lineage.filter(pl.col("cell_id") == cell["cell_id"][0])
    if rows.is_empty():
        return None
    per_op = rows.group_by("op", maintain_order=True).agg(
        pl.col("count").sum().alias("calls"), (pl.col("latency_ms") * pl.col("count")).sum()
        .alias("measured_ms"))
    split = answer["by_op"]
    table = []
    for op, calls, measured in per_op.iter_rows():
        predicted = split.get(op)
        table.append({"op": op, "calls": calls, "measured ms": f"{measured:.4f}",
                      "predicted ms": "-" if predicted is None else f"{predicted:.4f}",
                      "error %": "-" if predicted is None
                      else f"{metrics.errors(predicted, measured):+.1f}"})
    note = ("measured: each op's points from the cell's lineage, times its calls" if split else
            f"measured: from the cell's lineage; {model.predictor} does not split its "
            "prediction by op")
    return {"title": "measured ops of this cell", "rows": table, "note": note}


def render(model: Explained, cell_id: str, console: Console) -> None:
    cell, answer = model.cells.filter(pl.col("cell_id") == cell_id), model.explained[cell_id]
    c0, gpu = cell.row(0, named=True), model.gpu
    tables = [t for t in answer["tables"] if isinstance(t, dict)]
    if ops := measured_ops(model, cell, answer):
        tables.append(ops)
    console.print(f"[bold]{model.predictor}[/] on {gpu.sku} ({gpu['arch']}): cell "
                  f"{c0['cell_id']}, {c0['model']} TP{c0['tp']}, {c0['phase']}, "
                  f"{c0['num_requests']} requests, {c0['total_tokens']} tokens, ground truth "
                  f"{c0['gt_kind']}")
    for spec in tables:
        if spec.get("note"):
            console.print(str(spec["note"]))
        console.print(_table(str(spec.get("title", "")), list(spec.get("rows", []))))
    predicted = answer["pred"]
    console.print(f"predicted {predicted:.4f} ms, measured {c0['gt_ms']:.4f} ms, error "
                  f"{metrics.errors(predicted, c0['gt_ms']):+.2f} %")


def explained_cells(predictor: str, dataset: str, wanted: str | None = None,
                    k: int | None = None) -> tuple[Explained, list[str]]:
    """The cells to show (the ``k`` worst, ``wanted``, or the first scored one), explained."""
    described, inputs = load(predictor, dataset)
    if k:
        chosen = worst(sealed(described, inputs), k)
    else:
        scored = readings.Supplier(inputs.target, inputs.target_lineage, 0).scored()
        chosen = [wanted or scored["cell_id"][0]]
    model = sealed(described, inputs, chosen)
    for cell_id in chosen:
        if cell_id not in model.explained:
            cells = model.cells["cell_id"]
            close = [c for c in cells if cell_id in c][:3] or cells.head(3).to_list()
            raise InputError(f"no cell '{cell_id}' in {dataset} (deploy-reading rows are not "
                             f"explained: they are not scored). Cell ids look like: "
                             f"{', '.join(close)}; explain.worst=K picks the K worst cells, and "
                             "every id is in a run's predictions.parquet (column cell_id)")
    return model, chosen


def _table(title: str, rows: list[dict]) -> Table:
    table = Table(title=title)
    for col in rows[0] if rows else ():
        texts = [str(r.get(col, "")) for r in rows]
        numeric = all(t.replace(".", "", 1).lstrip("+-").isdigit() or t == "-" for t in texts)
        table.add_column(col, justify="right" if numeric else "left")
    for r in rows:
        table.add_row(*(str(r.get(col, "")) for col in rows[0]))
    return table


# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
