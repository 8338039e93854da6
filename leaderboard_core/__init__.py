"""The vocabulary the harness (``leaderboard``) and the predictors (``predictors``) share:
datasheets and model shapes (``specs``), the suite's folders (``paths``), content hashes
(``versioning``), the seal (``guard``), progress for long work (``progress``) and the contract
types (``contract``). It imports neither side, so each side depends on it and not on the other.
"""
