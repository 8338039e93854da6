"""One run: its configuration, inputs, homes and split, the readings it may take, its evaluation,
and the leaderboard's list of runs.
"""
