"""A leaderboard for LLM step-latency predictors, scored on real GPU measurements."""

__version__ = "0.1.0"
