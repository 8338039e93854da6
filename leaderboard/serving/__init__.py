"""The serving replay: a deployment's measured load scheduled step by step as its engine would
(``scheduler``, ``sglang_kv``, ``replay``, ``simulate``), each step timed by a predictor, and the
replayed TTFT and TPOT set beside the measured ones (``scoring``). The serving targets themselves
are cells' work (``leaderboard.cells.serving_targets``)."""
