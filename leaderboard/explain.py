"""``python -m leaderboard.explain predictor=ours dataset=h200_vidur explain.cell=<cell_id>``: one cell,
term by term.

Fits the predictor as a run does (a wall-clock target first takes its deploy reading), asks it
for its ``explain`` of the blind cell (the tables it offers; ``ours`` gives each op of a layer
with its factors, then the step's terms) and sets its prediction against the measured time.
This command reads the store, so it is a diagnostic, not a scored run. ``cell`` may be omitted:
the dataset's first cell is explained.
"""

from __future__ import annotations

import sys

import polars as pl
from rich.console import Console
from rich.table import Table

from leaderboard import metrics
from leaderboard.config import command_config
from leaderboard.evaluate import RunSpec, load_inputs
from leaderboard.readings import take_in_process
from leaderboard_core.contract import GROUND_TRUTH_COLUMNS
from predictors import registry


def load(predictor: str, dataset: str):
    inputs = load_inputs(RunSpec(predictor, dataset, {}))
    model = registry.build(predictor).fit(inputs.home)
    # as a run: the cells a deploy reading touched are not scored
    cells, _ = take_in_process(model, inputs.target, inputs.target_lineage, inputs.gpu)
    return model, cells, inputs.gpu


def render(model, cell: pl.DataFrame, gpu, console: Console) -> None:
    c0 = cell.row(0, named=True)
    blind = cell.drop(GROUND_TRUTH_COLUMNS)
    tables = model.explain(blind, gpu)
    if tables is None:
        raise SystemExit(f"predictor '{model.name}' offers no explain; its prediction only is "
                         "scored (a predictor offers one by overriding Predictor.explain)")
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


def arguments(argv: list[str]) -> tuple[str, str, str | None]:
    """(predictor, dataset, cell) from Hydra overrides; the old ``cell=ID`` still works."""
    cfg = command_config(argv, "python -m leaderboard.explain", __doc__, "explain",
                         {"cell": "explain.cell"})
    return cfg.predictor.name, cfg.dataset.name, cfg.explain.cell


def main(argv: list[str]) -> None:
    predictor, dataset, wanted = arguments(argv)
    model, cells, gpu = load(predictor, dataset)
    wanted = wanted or cells["cell_id"][0]
    cell = cells.filter(pl.col("cell_id") == wanted)
    if cell.is_empty():
        close = [c for c in cells["cell_id"] if wanted in c][:3] or cells["cell_id"].head(3)
        raise SystemExit(f"no cell '{wanted}' in {dataset} (deploy-reading rows are not "
                         f"explained: they are not scored). Cell ids look like: "
                         f"{', '.join(close)}; every id is in the run's predictions.parquet "
                         "(column cell_id), or omit explain.cell for the first cell")
    render(model, cell, gpu, Console(width=200))


if __name__ == "__main__":
    main(sys.argv[1:])

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
