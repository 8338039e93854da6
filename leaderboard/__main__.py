"""``python -m leaderboard``: see ``leaderboard.cli``."""

import os
import sys
import tempfile

from leaderboard.cli import SWEEP_LOG_ENV, _fail, check_choices, main, print_sweep
from leaderboard.run.config import register_predictor_nodes
from leaderboard.run.inputs import guarded


def leaderboard() -> int:
    argv = sys.argv[1:]
    try:
        register_predictor_nodes(argv)
    except (ValueError, ImportError) as exc:  # a bad predictors_path: say which, and stop
        _fail(str(exc))
    check_choices(argv)
    if not ({"-m", "--multirun"} & set(argv)):
        main()
        return 0
    with tempfile.NamedTemporaryFile(prefix="leaderboard-sweep-", suffix=".jsonl") as log:
        os.environ[SWEEP_LOG_ENV] = log.name
        main()
        return print_sweep(log.name)


sys.exit(guarded(leaderboard, "python -m leaderboard")())

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
