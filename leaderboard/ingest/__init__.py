"""Adapters from each upstream project's file formats to the store's normalized tables, with the
pinned sources they read, the tables' schemas and the quarantine of bad rows."""

from leaderboard.ingest import (
    aiconfigurator,
    distserve,
    inference_bench,
    llmservingsim,
    neusight,
    silicon,
    splitwise,
    vidur,
)
from leaderboard.ingest.base import Adapter, BuildError, IngestContext

ADAPTERS: dict[str, Adapter] = {
    a.name: a
    for a in (aiconfigurator.ADAPTER, vidur.ADAPTER, splitwise.ADAPTER, llmservingsim.ADAPTER,
              neusight.ADAPTER, distserve.ADAPTER, silicon.ADAPTER,
              inference_bench.ADAPTER)
}

__all__ = ["ADAPTERS", "Adapter", "BuildError", "IngestContext"]
