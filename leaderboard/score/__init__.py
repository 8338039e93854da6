"""Scoring a run's predictions: the metrics, rankings, decision scores and atlases, and reading
stored runs back.
"""
