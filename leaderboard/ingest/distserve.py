"""DistServe: its released latency-model coefficients (OPT-13B/66B on A100-80GB).

These are a baseline's published parameters, not ground truth: they are stored as kind
``coefficients`` and never scored against. Each term is [a, b, c] of DistServe's fitted polynomial,
kept exactly as released (JSON-encoded), with the small/large decode batch threshold.
"""

from __future__ import annotations

import json

import polars as pl

from leaderboard.ingest.base import Adapter, BuildError, IngestContext, provenance, read_json
from leaderboard.ingest.sources import SourceFile

SOURCE = "distserve"
ROOT = "LLMServe__DistServe/simdistserve/estimators/profile_data"
SKU = "a100_sxm"  # "a100-80g": DistServe does not name the board; SXM assumed (its paper's cluster)


def ingest(files: list[SourceFile], ctx: IngestContext) -> list[tuple[str, pl.DataFrame]]:
    out = []
    for file in files:
        ctx.gpu(SKU, file)
        engine = file.path.name.split(".")[-2]  # profiler-a100-80g.<engine>.json
        rows = []
        for model, by_tp in read_json(file).items():
            for tp, params in by_tp.items():
                threshold = params.get("decoding_large_small_bs_threshold")
                for term, coefficients in params.items():
                    if term == "decoding_large_small_bs_threshold":
                        continue
                    if not isinstance(coefficients, list):
                        raise BuildError(f"{file.path}: {model} tp {tp} term {term} is not a list")
                    rows.append({"model": ctx.model(model, file), "tp": int(tp), "pp": 1,
                                 "engine": engine, "term": term,
                                 "coefficients": json.dumps(coefficients), "threshold": threshold})
        df = pl.DataFrame(rows)
        out.append(("coefficients", provenance(df, file, SOURCE, SKU, engine, "82831f1", "fitted")))
    return out


ADAPTER = Adapter(SOURCE, (f"{ROOT}/profiler-*.json",), ingest)
