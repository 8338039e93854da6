"""Replay a measured load through the scheduler, timing every step with a predictor.

- Closed loop (aiconfigurator's silicon runs): ``concurrency`` clients, each sending its next
  request the moment the previous one ends, fixed isl/osl. The step sequence does not depend on
  time, so a run is scheduled to the end first and its steps are predicted in one call.
- Recorded arrivals (the RTX4090 vLLM run): which requests join a step depends on time. The
  replay schedules a window of steps ahead on a copy of the engine, predicts them in one call,
  keeps the steps that start before the next arrival and schedules the rest again with it.

Each step becomes one cell (model, TP, per-request new and cached tokens), the same view of a
step that ``predict(cells, gpu)`` scores on step-level datasets.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np
import polars as pl
import pyarrow as pa

from leaderboard.cells.schema import typed_columns
from leaderboard.serving import plan_store
from leaderboard.serving.scheduler import Engine, Policy, StepLog
from leaderboard.serving.sglang_kv import EstimatedEngine
from leaderboard_core.contract import GROUND_TRUTH_COLUMNS

StepTimer = Callable[[pl.DataFrame], np.ndarray]  # cells -> ms per cell
LOOKAHEAD_STEPS = 64
CLOSED_LOOP_STARTS = ("lockstep", "staggered")
# How an idle engine takes requests sent in the same instant: ``first_alone``, the first to
# arrive runs one step alone and the rest join the next; ``together``, the whole burst in one
# step. conf/serving/schedulers.yaml says which the replay takes, and why.
IDLE_BURSTS = ("first_alone", "together")


def new_engine(policy: Policy, prompt: np.ndarray, output: np.ndarray) -> Engine:
    """The engine of ``policy``'s KV rule: SGLang's estimate keeps state of its own."""
    if policy.kv_rule == "estimated":
        return EstimatedEngine(policy, prompt, output)
    return Engine(policy, prompt, output)


@dataclass
class Timeline:
    """Per request: arrival, first-scheduled, first-token and last-token times (ms)."""

    arrival: np.ndarray
    first: np.ndarray
    last: np.ndarray
    output: np.ndarray
    scheduled: np.ndarray

    @property
    def ttft(self) -> np.ndarray:
        return self.first - self.arrival

    @property
    def service(self) -> np.ndarray:
        """First token minus the start of the request's first step: TTFT without the queue."""
        return self.first - self.scheduled

    @property
    def tpot(self) -> np.ndarray:
        """Mean time per output token after the first (NaN for one-token outputs)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.output > 1, (self.last - self.first) / (self.output - 1), np.nan)


def _list_column(values: np.ndarray, offsets: np.ndarray) -> pl.Series:
    return pl.Series(pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()),
                                                   pa.array(values, pa.int64())))


def step_cells(log: dict[str, np.ndarray], model: str, tp: int, gemm_dtype: str = "bf16"
               ) -> pl.DataFrame:
    """One cell per step of ``log`` (entries ordered by step), with the derived columns a
    predictor reads; ``gemm_dtype``: the precision of the deployment's GEMMs."""
    step, q, ctx = log["step"], log["q"], log["ctx"]
    n = int(step.max()) + 1 if len(step) else 0
    counts = np.bincount(step, minlength=n)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    decode = (q == 1) & (ctx > 0)
    num_decode = np.bincount(step, weights=decode, minlength=n).astype(np.int64)
    total = np.bincount(step, weights=q, minlength=n).astype(np.int64)
    # Columns of one value, and the step names, as Polars expressions: Python lists of a
    # million strings were most of the time it took to lay out a long loop's steps.
    name = pl.concat_str(pl.lit("step"), pl.int_range(n, dtype=pl.Int64).cast(pl.String))
    cells = pl.DataFrame({
        "num_requests": counts.astype(np.int64), "num_decode": num_decode,
        "q_lens": _list_column(q, offsets), "ctx_lens": _list_column(ctx, offsets),
        "total_tokens": total,
        "decode_ctx_sum": np.bincount(step, weights=ctx * decode, minlength=n).astype(np.int64),
    }).with_columns(
        cell_id=name, workload_id=name, model=pl.lit(model, pl.String), tp=pl.lit(tp, pl.Int64),
        phase=pl.when(pl.col("num_decode") == pl.col("num_requests")).then(pl.lit("decode"))
        .when(pl.col("num_decode") == 0).then(pl.lit("prefill")).otherwise(pl.lit("mixed")),
        num_prefill=pl.col("num_requests") - pl.col("num_decode"),
        prefill_tokens=pl.col("total_tokens") - pl.col("num_decode"),
        gt_kind=pl.lit("serving", pl.String), weight=pl.lit(1, pl.Int64),
        gemm_dtype=pl.lit(gemm_dtype, pl.String))
    # The columns of a blind step-level cell, those the replay does not know left null.
    return cells.select(typed_columns(cells.columns, GROUND_TRUTH_COLUMNS))


def step_times(log: dict[str, np.ndarray], model: str, tp: int, timer: StepTimer,
               gemm_dtype: str = "bf16") -> np.ndarray:
    """Predicted ms per step of ``log``. Steps that schedule the same new and cached tokens,
    request by request in the same order, are one cell to the predictor and are priced once: a
    closed loop's later waves repeat the steps of the earlier ones."""
    return Plan.of(log, np.zeros(0, np.int64)).price(model, tp, timer, gemm_dtype)


@dataclass
class Plan:
    """A step log as pricing needs it: the entries of each distinct step shape (``shapes``,
    whose ``step`` numbers the shapes), each step's shape (``inverse``), and per request the
    entries that finish its prompt, those that open it (no cached tokens) and its last step
    (-1: never scheduled). Compact where the log is not (a closed loop of 512 clients logs
    millions of entries), so a closed loop's plan, which no predictor changes, is kept
    (``leaderboard.serving.plan_store``)."""

    shapes: dict[str, np.ndarray]
    inverse: np.ndarray
    prompt_req: np.ndarray
    prompt_step: np.ndarray
    open_req: np.ndarray
    open_step: np.ndarray
    last_step: np.ndarray
    key: str = field(default="", compare=False)  # the kept plan's name (``plan_store.kept``)

    @classmethod
    def of(cls, log: dict[str, np.ndarray], prompt: np.ndarray) -> Plan:
        step, q, ctx, req = log["step"], log["q"], log["ctx"], log.get("req")
        n = int(step.max()) + 1 if len(step) else 0
        counts = np.bincount(step, minlength=n)
        if (counts == 0).any():  # step_cells numbers cells by their entries' steps
            raise ValueError(f"step {int(np.argmin(counts))} of the log schedules no request")
        offsets = np.concatenate([[0], np.cumsum(counts)])
        shape_of: dict[tuple[bytes, bytes], int] = {}
        first_steps: list[int] = []  # the first step of each distinct shape, in step order
        inverse = np.empty(n, np.int64)
        for i in range(n):
            a, b = offsets[i], offsets[i + 1]
            key = (q[a:b].tobytes(), ctx[a:b].tobytes())
            if key not in shape_of:
                shape_of[key] = len(first_steps)
                first_steps.append(i)
            inverse[i] = shape_of[key]
        is_first = np.zeros(n, bool)
        is_first[first_steps] = True
        keep = is_first[step]
        shapes = {"step": inverse[step[keep]], "q": q[keep], "ctx": ctx[keep]}
        if req is None or not len(prompt):  # pricing only
            empty = np.zeros(0, np.int64)
            return cls(shapes, inverse, empty, empty, empty, empty, empty)
        done_prompt = (ctx + q >= prompt[req]) & (ctx < prompt[req])
        opening = ctx == 0
        last_step = np.full(len(prompt), -1, np.int64)
        np.maximum.at(last_step, req, step)
        return cls(shapes, inverse, req[done_prompt], step[done_prompt], req[opening],
                   step[opening], last_step)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every field as a flat array, for ``plan_store``."""
        return {**{f"shape_{k}": v for k, v in self.shapes.items()},
                **{k: v for k, v in self.__dict__.items() if k not in ("shapes", "key")}}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], key: str = "") -> Plan:
        shapes = {k.removeprefix("shape_"): v for k, v in arrays.items() if k.startswith("shape_")}
        return cls(shapes, **{f.name: arrays[f.name] for f in fields(cls)
                              if f.name not in ("shapes", "key")}, key=key)

    def cells(self, model: str, tp: int, gemm_dtype: str) -> pl.DataFrame:
        """One cell per distinct step shape; ``[self.inverse]`` of their times times every step.
        A kept plan's cells are kept in this process too (``_kept_cells``)."""
        if not self.key:
            return step_cells(self.shapes, model, tp, gemm_dtype)
        # laid out from copies: a kept frame must not hold the plan file's mapping open
        return _kept_cells.get((self.key, model, tp, gemm_dtype), lambda: step_cells(
            {k: np.array(v) for k, v in self.shapes.items()}, model, tp, gemm_dtype))

    def price(self, model: str, tp: int, timer: StepTimer, gemm_dtype: str) -> np.ndarray:
        """Predicted ms per step."""
        return timer(self.cells(model, tp, gemm_dtype))[self.inverse]

    def times(self, step_end: np.ndarray, step_start: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """First-token time (end of the step finishing the prompt), last-token time and the
        start of the first step that computes the request's prompt, per request (NaN where not
        scheduled). A preempted request is recomputed from scratch: its first token and first
        scheduling are the earliest of its passes."""
        n = len(self.last_step)
        first, last, scheduled = np.full(n, np.inf), np.full(n, np.nan), np.full(n, np.inf)
        np.minimum.at(scheduled, self.open_req, step_start[self.open_step])
        np.minimum.at(first, self.prompt_req, step_end[self.prompt_step])
        first[np.isinf(first)], scheduled[np.isinf(scheduled)] = np.nan, np.nan
        seen = self.last_step >= 0
        last[seen] = step_end[self.last_step[seen]]
        return first, last, scheduled


class _KeptCells:
    """Step cells of kept plans, the least recently used dropped first, up to ``limit`` bytes
    in all (Polars' estimate). A rerun worker runs one serving set's predictors one after
    another, and each laid out the same plans' cells again (about 1.5 s of a silicon run); a
    plan's cells are a pure function of the plan and the deployment. Each caller gets its own
    shallow copy, so a wrapper that changed its frame in place would change no one else's."""

    def __init__(self, limit: int):
        self.limit, self.size = limit, 0
        self.frames: OrderedDict[tuple, tuple[pl.DataFrame, int]] = OrderedDict()

    def get(self, key: tuple, make: Callable[[], pl.DataFrame]) -> pl.DataFrame:
        if key in self.frames:
            self.frames.move_to_end(key)
            return self.frames[key][0].clone()
        frame = make()
        size = int(frame.estimated_size())
        self.frames[key], self.size = (frame, size), self.size + size
        while self.size > self.limit and len(self.frames) > 1:
            _, (_, dropped) = self.frames.popitem(last=False)
            self.size -= dropped
        return frame.clone()


# A silicon set's loops lay out about 23 million list entries, 17 to 100 bytes each by Polars'
# estimate: one large set's cells at a time.
_kept_cells = _KeptCells(limit=768 << 20)


def closed_loop(policy: Policy, isl: int, osl: int, concurrency: int, requests: int,
                model: str, tp: int, timer: StepTimer, start: str = "lockstep",
                gemm_dtype: str = "bf16", *, idle_burst: str) -> Timeline:
    """``requests`` fixed-length requests from ``concurrency`` clients that resend at once
    (``closed_loop_plan``), each step timed by ``timer``."""
    plan, arrival_step = closed_loop_plan(policy, isl, osl, concurrency, requests, start,
                                          idle_burst=idle_burst)
    return closed_loop_timeline(plan, arrival_step, plan.price(model, tp, timer, gemm_dtype),
                                osl)


def closed_loop_plan(policy: Policy, isl: int, osl: int, concurrency: int, requests: int,
                     start: str = "lockstep", *, idle_burst: str) -> tuple[Plan, np.ndarray]:
    """The steps of ``requests`` fixed-length requests from ``concurrency`` clients that resend
    at once, and the step each request was sent at: the same whatever the steps' times, so
    scheduled once and kept (``plan_store``).

    ``start``: ``lockstep`` sends every client's first request at step 0 (a deterministic
    replay has no jitter to part the clients; ``idle_burst`` alone splits them); ``staggered``
    sends client i's first request after i/concurrency of one request's decode steps, the
    steady state of a closed loop whose clients have drifted apart. A measured run lies between
    the two. ``idle_burst``: one of ``IDLE_BURSTS``, how an idle engine takes the requests sent
    in one instant (the first wave, or every client's resend when a wave ends in one step)."""
    if start not in CLOSED_LOOP_STARTS:
        raise ValueError(f"closed-loop start '{start}' is not one of {CLOSED_LOOP_STARTS}")
    if idle_burst not in IDLE_BURSTS:
        raise ValueError(f"idle burst '{idle_burst}' is not one of {IDLE_BURSTS}")
    key = [policy.__dict__, isl, osl, concurrency, requests, start, idle_burst]
    name, kept = plan_store.kept(key, lambda: _closed_loop_plan(
        policy, isl, osl, concurrency, requests, start, idle_burst))
    return Plan.from_arrays(kept, name), kept["arrival_step"]


def closed_loop_timeline(plan: Plan, arrival_step: np.ndarray, step_ms: np.ndarray,
                         osl: int) -> Timeline:
    """A closed loop's requests timed by its steps' times (``step_ms``, one per step)."""
    step_end = np.cumsum(step_ms)
    start_ms = np.concatenate([[0.0], step_end])
    first, last, scheduled = plan.times(step_end, start_ms[:-1])
    return Timeline(start_ms[arrival_step], first, last, np.full(len(arrival_step), osl),
                    scheduled)


def _closed_loop_plan(policy: Policy, isl: int, osl: int, concurrency: int, requests: int,
                      start: str, idle_burst: str) -> dict[str, np.ndarray]:
    """The closed loop's steps and each request's sending step: the same for every predictor,
    since a client sends when a step ends, whatever the step's time."""
    prompt, output = np.full(requests, isl), np.full(requests, osl)
    engine, log = new_engine(policy, prompt, output), StepLog()

    issued = min(concurrency, requests)
    first_sends = (np.zeros(issued, np.int64) if start == "lockstep"
                   else (np.arange(issued) * osl) // concurrency)
    arrival_step = np.zeros(requests, np.int64)  # the step count when the request was sent
    arrival_step[:issued] = first_sends
    pending = 0  # first requests not yet sent, in sending order
    sent = issued

    def due_first_sends() -> list[int]:
        nonlocal pending
        due = []
        while pending < issued and first_sends[pending] <= log.steps:
            due.append(pending)
            pending += 1
        return due

    def resends() -> list[int]:
        """The next requests of the clients whose requests the last step ended."""
        nonlocal sent
        burst = []
        while engine.finished:
            engine.finished.pop()
            if sent < requests:
                arrival_step[sent] = log.steps
                burst.append(sent)
                sent += 1
        return burst

    def send(burst: list[int]) -> None:
        # A loop, not a recursive closure: a closure naming itself is a reference cycle that
        # keeps this frame's engine and step log (gigabytes at 512 clients) alive until the
        # cyclic collector happens to run.
        while idle_burst == "first_alone" and len(burst) > 1 and not engine.busy:
            engine.arrive(burst[0])
            engine.step(log, 1)
            for r in burst[1:]:
                engine.arrive(r)
            burst = resends()  # a one-token request ends in its prompt step
        for r in burst:
            engine.arrive(r)

    while pending < issued or engine.busy:
        if not engine.busy:  # every sent request done before the next client starts: send now
            first_sends[pending] = arrival_step[pending] = log.steps
        while due := due_first_sends():  # a burst's lone step may make more clients due
            send(due)
        until = first_sends[pending] - log.steps if pending < issued else requests * (isl + osl)
        engine.step(log, int(until))
        send(resends())
    return {**Plan.of(log.arrays(), prompt).arrays(), "arrival_step": arrival_step}


def recorded_arrivals(policy: Policy, arrival_ms: np.ndarray, prompt: np.ndarray,
                      output: np.ndarray, model: str, tp: int, timer: StepTimer,
                      gemm_dtype: str = "bf16") -> Timeline:
    """Requests arriving at the recorded times (ms from the first); a request joins the first
    step that starts at or after its arrival."""
    order = np.argsort(arrival_ms, kind="stable")
    engine, n = new_engine(policy, prompt, output), len(prompt)
    first, last, scheduled = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    now, nxt = 0.0, 0
    while nxt < n or engine.busy:
        while nxt < n and arrival_ms[order[nxt]] <= now:
            engine.arrive(int(order[nxt]))
            nxt += 1
        if not engine.busy:
            now = float(arrival_ms[order[nxt]])
            continue
        ahead, log = copy.deepcopy(engine), StepLog()
        while ahead.busy and log.steps < LOOKAHEAD_STEPS:
            ahead.step(log, LOOKAHEAD_STEPS - log.steps)
        plan = Plan.of(log.arrays(), prompt)
        ends = now + np.cumsum(plan.price(model, tp, timer, gemm_dtype))
        starts = np.concatenate([[now], ends[:-1]])
        next_arrival = arrival_ms[order[nxt]] if nxt < n else np.inf
        keep = int((starts < next_arrival).sum())
        if keep < log.steps:  # an arrival joins mid-window: redo only the steps before it
            log = StepLog()
            while log.steps < keep:
                engine.step(log, keep - log.steps)
            plan = Plan.of(log.arrays(), prompt)
        else:
            engine = ahead
        f, la, sc = plan.times(ends[:keep], starts[:keep])
        # fmin/fmax skip NaN: a request's earliest first token and scheduling (a preempted one
        # passes twice), its latest last token
        first, scheduled, last = np.fmin(first, f), np.fmin(scheduled, sc), np.fmax(last, la)
        now = float(ends[keep - 1])
    return Timeline(arrival_ms.astype(np.float64), first, last, output, scheduled)
