"""Op-level points shared by tests of several stages (``<sku>_ops`` rows)."""

import polars as pl

# One op-level GEMM point, for the guards on op-level predictions.
GEMM_POINT = pl.DataFrame({"op_family": ["gemm"], "phase": ["gemm"], "m": [64], "n": [4096],
                           "k": [4096], "batch": [None], "q_len": [None], "kv_len": [None],
                           "num_heads": [None], "num_kv_heads": [None], "head_dim": [None]})
