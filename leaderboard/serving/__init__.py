"""Serving-level ground truth and scoring: measured TTFT and TPOT against a replay of each
deployment's load whose every step a predictor times (``datasets``, ``scheduler``, ``replay``,
``simulate``, ``scoring``)."""
