"""Real request traces from the store, replayed through the schedulers of conf/cells/vidur.yaml.

Vidur's processed traces (Azure code and conversation with arrival times, arXiv summarization
without) and the ShareGPT requests of LLMServingSim's RTX 4090 serving run. A trace without
arrival times gets seeded Poisson arrivals.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import duckdb
import numpy as np

from leaderboard.cells.scheduler import Replay, Request, Slot, requests_from_trace


class TraceError(ValueError):
    """A trace row cannot be replayed; the message names the trace, the row and the fix."""


def has_traces(con: duckdb.DuckDBPyConnection) -> bool:
    return con.execute("SELECT count(*) FROM request_traces").fetchall()[0][0] > 0


def load_trace(con: duckdb.DuckDBPyConnection, name: str, limit: int):
    if name == "sharegpt":
        rows = con.execute(
            "SELECT input_toks, output_toks, arrival_time - min(arrival_time) OVER () "
            "FROM serving_requests ORDER BY arrival_time, request_id LIMIT ?", [limit]).fetchall()
    else:
        rows = con.execute(
            "SELECT prefill_tokens, decode_tokens, arrived_at_s FROM request_traces "
            "WHERE trace = ? ORDER BY request_idx LIMIT ?", [name, limit]).fetchall()
    if not rows:
        raise TraceError(f"trace '{name}' has no rows in the store; check conf/cells/vidur.yaml "
                         "traces against `SELECT DISTINCT trace FROM request_traces`")
    return [list(col) for col in zip(*rows, strict=True)]


def check_rows(name: str, prompts, outputs, arrivals) -> None:
    for i, (p, o, a) in enumerate(zip(prompts, outputs, arrivals, strict=True)):
        for label, value in (("prompt tokens", p), ("output tokens", o)):
            if value is None or not float(value).is_integer() or value < 1:
                raise TraceError(f"trace '{name}' row {i}: {label} = {value!r}; expected a whole "
                                 "number >= 1. Fix or drop the row upstream.")
        if a is not None and (not math.isfinite(a) or a < 0):
            raise TraceError(f"trace '{name}' row {i}: arrival = {a!r}; expected seconds >= 0")


def trace_requests(con, name: str, cfg: dict, max_prompt: int | None,
                   load_scale: float = 1.0) -> list[Request]:
    """The trace's requests; ``load_scale`` > 1 compresses its arrival times by that factor
    (the same requests, offered that many times faster), which crowds the batches."""
    if not load_scale > 0:
        raise TraceError(f"conf/cells/vidur.yaml load_scales: {load_scale!r}; expected a factor > 0")
    prompts, outputs, arrivals = load_trace(con, name, cfg["requests_per_trace"])
    if all(a is None for a in arrivals):
        rng = np.random.default_rng(cfg["seed"])
        gaps = rng.exponential(1.0 / cfg["arrival_rate_per_s"], len(prompts))
        arrivals = list(np.cumsum(gaps) - gaps[0])
    check_rows(name, prompts, outputs, arrivals)
    return requests_from_trace(prompts, outputs, [a / load_scale for a in arrivals], max_prompt)


def trace_label(trace: str, load_scale: float) -> str:
    return trace if load_scale == 1 else f"{trace}@{load_scale:g}x"


def base_trace(label: str) -> str:
    """The store's trace name behind a cell's ``trace`` label (``trace_label``)."""
    return label.split("@", 1)[0]


def replayed_steps(con, cfg: dict) -> Iterator[tuple[str, str, list[Slot]]]:
    """Every step of every (trace, load scale, scheduler) replay, with its trace label
    (``<trace>@<scale>x`` under a compressed load) and scheduler label."""
    for trace in cfg["traces"]:
        for scale in cfg.get("load_scales", [1]):
            for sched in cfg["schedulers"]:
                budget = sched["token_budget"]
                label = f"{sched['policy']}-{budget}"
                replay = Replay(sched["policy"], budget, max_steps=cfg["max_steps"])
                whole = budget if sched["policy"] == "vllm" else None
                for slots in replay.steps(trace_requests(con, trace, cfg, whole, scale)):
                    yield trace_label(trace, scale), label, slots
