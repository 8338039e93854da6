"""``python -m leaderboard.calibrate predictor=<name>``: refit a predictor's frozen constants.

The harness builds the homes the predictor asks for (``calibration_homes``: by role, each its
dataset and which op points) exactly as a leaderboard run does, and hands them to the
predictor's ``calibrate_constants``, which writes the constants and returns them (printed as JSON). The
predictor never opens the store; a predictor without frozen constants says so.
"""

from __future__ import annotations

import json
import sys

from leaderboard.run.config import command_config
from leaderboard.run.inputs import InputError, guarded
from leaderboard.run.run_inputs import RunSpec, load_inputs
from leaderboard.store import database
from predictors import registry


def calibrate(name: str) -> dict:
    cls = registry.get(name)
    wanted = cls.calibration_homes()
    if wanted is None:
        raise InputError(f"predictor '{name}' has no frozen constants to calibrate; "
                         "ours has (predictor=ours)")
    database.ensure()
    homes = {role: load_inputs(RunSpec(name, fields["dataset"], {}, **{
        k: v for k, v in fields.items() if k != "dataset"})).home
        for role, fields in wanted.items()}
    return cls.calibrate_constants(homes)


def main(argv: list[str]) -> None:
    cfg = command_config(argv, "python -m leaderboard.calibrate", __doc__, "predictor", {})
    fitted = calibrate(cfg.predictor.name)
    json.dump(fitted, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    guarded(main, "python -m leaderboard.calibrate")(sys.argv[1:])

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
