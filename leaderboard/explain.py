"""``python -m leaderboard.explain predictor=ours dataset=h200_vidur [explain.cell=ID | explain.worst=K]``:
a cell, term by term, beside what was measured.

Fits the predictor in a sealed child as a run does (a wall-clock target first takes its deploy
reading), asks it there for its ``explain`` of the blind cell (the tables it offers; ``ours``
gives each op of a layer with its factors, then the step's terms), prints each measured op of
the cell (from its lineage) beside the predictor's split of the prediction where it offers one
(``predict_by_op``), and sets the prediction against the measured time. ``explain.worst=K``
predicts every cell and explains the K with the largest error. This command reads the store, so
it is a diagnostic, not a scored run. With neither key, the dataset's first cell is explained.
"""

from __future__ import annotations

import sys

from rich.console import Console

from leaderboard.present.cells_explained import explained_cells, render
from leaderboard.run.config import command_config
from leaderboard.run.inputs import InputError, guarded


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
    model, chosen = explained_cells(predictor, dataset, wanted, k)
    for cell_id in chosen:
        render(model, cell_id, Console(width=200))


if __name__ == "__main__":
    guarded(main, "python -m leaderboard.explain")(sys.argv[1:])

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
