"""``python -m leaderboard``: see ``leaderboard.cli``."""

import sys

from leaderboard.cli import _fail, check_choices, main
from leaderboard.config import register_predictor_nodes

try:
    register_predictor_nodes(sys.argv[1:])
except (ValueError, ImportError) as exc:  # a bad predictors_path: say which, and stop
    _fail(str(exc))
check_choices(sys.argv[1:])
main()

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
