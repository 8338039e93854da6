"""``python -m leaderboard.check predictor=NAME [predictors_path=DIR]``: the predictor contract,
checked sealed.

Runs ``predictors.checks.check_predictor`` (scikit-learn's ``check_estimator`` for predictors:
parameters, ``fit`` returning ``self``, learned state, one finite positive float per cell, subsets,
``NotSupported``) on synthetic data in a child sealed and watched as a run's child is, so a
predictor that opens the store, a downloaded source or a past run while it is imported, fitted
or asked to predict fails the check as it would fail a run. Exit 0 when it passes, 1 when a rule
is broken (the message names it, the expected shape and the offending cells).
"""

from __future__ import annotations

import sys

from rich.console import Console

from leaderboard.run.config import command_config
from leaderboard.run.inputs import guarded
from leaderboard.seal import predictor_index


def main(argv: list[str]) -> int:
    cfg = command_config(argv, "python -m leaderboard.check", __doc__, "predictor", {})
    name, console = cfg.predictor.name, Console(stderr=True)
    try:
        answer = predictor_index.check(name)
    except ValueError as exc:  # it reached for sealed data, or its module does not import
        console.print(f"[red]{name} fails the check:[/] {exc}", highlight=False)
        return 1
    if "failed" in answer:
        console.print(f"[red]{name} fails the check:[/] {answer['failed']}", highlight=False)
        return 1
    console.print(f"[green]{name} passes the check[/] ({', '.join(answer['passed'])}), sealed",
                  highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main, "python -m leaderboard.check")(sys.argv[1:]))

# Checks predictors, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
