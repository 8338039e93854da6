"""``python -m leaderboard``: see ``leaderboard.cli``."""

import sys

from leaderboard.cli import check_choices, main
from leaderboard.config import register_predictor_nodes

register_predictor_nodes()
check_choices(sys.argv[1:])
main()

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
