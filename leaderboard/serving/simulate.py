"""From serving targets and a step timer to predicted TTFT and TPOT per target.

Each silicon target is one closed-loop run; the RTX4090 targets are the requests of one run with
recorded arrivals, replayed together; each e2e target is one static batch run offline
(``static_batch``), scored on its end-to-end latency or, with one output token, its TTFT. The
scheduler limits of each backend and the KV capacity come from ``conf/serving/schedulers.yaml``
and the GPU's datasheet memory.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard.cells import memory
from leaderboard.cells.common import SCHEDULERS, schedulers_conf
from leaderboard.serving import static_batch
from leaderboard.serving.batched import SwitchedTimer, price_together
from leaderboard.serving.replay import (
    StepTimer,
    closed_loop_plan,
    closed_loop_timeline,
    recorded_arrivals,
)
from leaderboard.serving.scheduler import Policy
from leaderboard.serving.sglang_kv import static_memory_fraction
from leaderboard_core.specs import KV_CACHE_BYTES, SIXTEEN_BIT_KV, GpuSpec, kv_elements_per_token
from leaderboard_core.versioning import release


def kv_cache_dtype(conf: dict) -> str:
    """The KV cache dtype every backend is replayed with (``simulation.kv_cache_dtype``)."""
    return known_kv_dtype(conf["simulation"]["kv_cache_dtype"], f"simulation.kv_cache_dtype in {SCHEDULERS}")


def known_kv_dtype(dtype: str, named_by: str) -> str:
    """``dtype``, a KV cache dtype that ``named_by`` gives, if the tables know it."""
    if dtype not in KV_CACHE_BYTES:
        raise ValueError(f"{named_by}: '{dtype}' is none of {sorted(KV_CACHE_BYTES)}")
    return dtype


def kv_capacity(m: dict, tp: int, gpu: GpuSpec, fraction: float, conf: dict,
                gemm_dtype: str = "bf16", of_free: bool = False) -> int:
    """KV tokens an engine of ``tp`` GPUs holds after its weights (memory in GiB, as
    ``nvidia-smi`` and the engines count it): ``fraction`` of each GPU's memory less its weight
    shard, or with ``of_free`` (TensorRT-LLM's ``free_gpu_memory_fraction``) ``fraction`` of what
    the weight shard leaves free (TensorRT-LLM also subtracts its profiled activation peak, CUDA
    graphs and NCCL buffers, which no record gives, so this overstates its KV). A token's KV
    takes room on every GPU (``kv_elements_per_token``)."""
    total, weights = float(gpu["mem_gb"]) * 2**30, memory.weight_bytes(m, tp, gemm_dtype)
    free = tp * (fraction * (total - weights) if of_free else fraction * total - weights)
    per_token = (m["num_layers"] * tp * kv_elements_per_token(m, tp)
                 * KV_CACHE_BYTES[kv_cache_dtype(conf)])
    if free <= per_token:
        raise ValueError(f"{m['name']} at TP {tp} does not fit {gpu.sku}'s {gpu['mem_gb']} GB")
    return int(free // per_token)


def memory_rule(b: dict, gpu: GpuSpec, tp: int, version: str | None) -> tuple[float, bool]:
    """An engine's memory rule (its backend's yaml entry ``b``, ``tp`` GPUs): the share of memory
    it gives weights and KV (the yaml's ``memory_fraction``, or SGLang's own rule where it has
    one), and whether that share is of the memory the weights leave free (``of_free``)."""
    kind = b.get("memory_rule", {}).get("kind")
    if kind != "sglang_static":
        return b["memory_fraction"], kind == "of_free"
    # a version not recorded, or not a release number ('unknown', a commit): today's rule
    general = release(version) is None or _from_version(version, b["memory_rule"])
    return static_memory_fraction(float(gpu["mem_gb"]), tp, general), False


def _from_version(version: str | None, rule: dict | None) -> bool:
    """Whether a yaml rule holds at a backend ``version``: at or after its ``from_version``; an
    unrecorded version ('unknown', a commit) only where the rule says ``unrecorded: true``."""
    if rule is None:
        return False
    found = release(version)
    return rule.get("unrecorded", False) if found is None else found >= release(rule["from_version"])


def policy_for(backend: str, run: str, model: dict, tp: int, gpu: GpuSpec,
               gemm_dtype: str = "bf16", version: str | None = None,
               closed_loop: tuple[int, int] | None = None,
               offline_model: str | None = None) -> Policy:
    """The scheduler of one run of ``backend`` ``version``; ``closed_loop``: (concurrency, isl)
    of a closed-loop run, whose launcher set the token budget from them where the backend's
    ``closed_loop_launch`` says its version's launch template passes it; ``offline_model``: the
    model of one static batch run offline (``_offline_fields``). Either way the KV capacity is
    worked out once, here."""
    conf = schedulers_conf()
    if backend not in conf["backends"]:
        raise ValueError(f"no scheduler for backend '{backend}'; add it to {SCHEDULERS} "
                         f"(known: {sorted(conf['backends'])})")
    b = conf["backends"][backend]
    if offline_model is not None:
        fields = _offline_fields(b, backend, offline_model)
        fraction, of_free = b["memory_fraction"], False
    else:
        limits = b["large_gpu" if float(gpu["mem_gb"]) >= b["large_gpu_min_gb"] else "small_gpu"]
        stated = conf.get("runs", {}).get(run, {})
        if closed_loop is not None and _from_version(version, b.get("closed_loop_launch")):
            concurrency, isl = closed_loop
            stated = {"token_budget": concurrency + isl + b["closed_loop_launch"]["extra_tokens"],
                      **stated}
        fields = {"kind": b["policy"],
                  "token_budget": stated.get("token_budget", limits["token_budget"]),
                  "max_seqs": stated.get("max_seqs", limits["max_seqs"]),
                  "kv_rule": b.get("kv_rule", "reserve"),
                  "prefix_cache_block": b.get("prefix_caching", {}).get("block_tokens", 0),
                  "whole_sequence_admission": _from_version(
                      version, b.get("whole_sequence_admission"))}
        if stated.get("kv_tokens"):
            return Policy(**fields, kv_tokens=stated["kv_tokens"])
        fraction, of_free = memory_rule(b, gpu, tp, version)
    return Policy(**fields, kv_tokens=kv_capacity(model, tp, gpu, fraction, conf, gemm_dtype,
                                                  of_free))


def _offline_fields(b: dict, backend: str, model_name: str) -> dict:
    """The scheduler of one static batch run offline by the backend's V0 engine (the yaml's
    ``offline_v0``): whole-prompt prefill steps up to max(max_model_len, 2048) tokens, or steps
    that decode every running request."""
    offline = b.get("offline_v0")
    if offline is None:
        raise ValueError(f"no offline_v0 scheduler for backend '{backend}' in {SCHEDULERS}")
    if model_name not in offline["max_model_len"]:
        raise ValueError(f"{model_name}: no max_model_len in {SCHEDULERS} backends.{backend}."
                         "offline_v0; add the model's max_position_embeddings there")
    return {"kind": offline["policy"], "max_seqs": offline["max_seqs"],
            "token_budget": max(offline["max_model_len"][model_name], offline["min_token_budget"]),
            "kv_rule": offline["kv_rule"]}


def run_engine(first: dict, models: dict, gpu: GpuSpec, timer: StepTimer,
               host_in_steps: bool = False) -> tuple[Policy, StepTimer]:
    """The scheduler of the run of a target row ``first``, and ``timer`` as that run's steps
    are priced: with its backend's host time at its version (added, or overlapped with the
    step; none where ``host_in_steps``: the predictor's step times already hold the host's, as
    a predictor fitted on wall-clock steps gives them), its experts' placement and its KV
    cache's dtype."""
    closed = (first["concurrency"], first["isl"]) if first["load"] == "closed" else None
    policy = policy_for(first["backend"], first["run"], models[first["model"]], int(first["tp"]),
                        gpu, first["gemm_dtype"], first["backend_version"], closed,
                        first["model"] if first["load"] == "static" else None)
    timed = timer if host_in_steps else with_host_time(timer, first["backend"],
                                                       first["backend_version"])
    placed = with_expert_placement(timed, first.get("moe_ep"))
    return policy, with_kv_cache(placed, kv_cache_dtype(schedulers_conf()))


def host_time_added(backend: str, version: str | None) -> bool:
    """Whether the replay adds ``backend``'s measured host time (``host_time`` in the yaml) to
    each step of a run of ``version``: it has one, and the version is before the one whose
    scheduler overlaps it (``overlapped``). A ``version`` not recorded (None, 'unknown') is
    taken as older."""
    host = schedulers_conf()["backends"][backend].get("host_time", {})
    return "base_ms" in host and not _from_version(version, host.get("overlapped"))


def with_host_time(timer: StepTimer, backend: str, version: str | None) -> StepTimer:
    """``timer`` with the backend's measured per-step host time, the same for every predictor:
    added to the step (``host_time_added``), or, from the version whose scheduler overlaps it (a
    step's host work runs while the GPU runs the step before), only where it outlasts the
    step's GPU time. A backend with no measured host time adds none."""
    host = schedulers_conf()["backends"][backend].get("host_time", {})
    if "base_ms" not in host:
        return timer

    def host_ms(cells: pl.DataFrame) -> np.ndarray:
        return host["base_ms"] + host["per_request_ms"] * cells["num_requests"].to_numpy()

    if host_time_added(backend, version):
        return lambda cells: timer(cells) + host_ms(cells)
    return lambda cells: np.maximum(timer(cells), host_ms(cells))


def with_expert_placement(timer: StepTimer, moe_ep: int | None) -> StepTimer:
    """``timer`` on steps whose MoE experts are spread whole over ``moe_ep`` GPUs (expert
    parallelism): each step cell says so in its ``moe_ep``, as the step datasets' cells do."""
    if not moe_ep or moe_ep == 1:
        return timer
    return lambda cells: timer(cells.with_columns(moe_ep=pl.lit(moe_ep, pl.Int64)))


def with_kv_cache(timer: StepTimer, kv_dtype: str) -> StepTimer:
    """``timer`` on steps whose KV cache is held in ``kv_dtype``: each step cell says so in its
    ``kv_dtype`` where that is an 8-bit cache (no column: a 16-bit cache, the only one the step
    sets' cells and most homes' tables hold, read as the home holds it)."""
    if known_kv_dtype(kv_dtype, "with_kv_cache") in SIXTEEN_BIT_KV:
        return timer
    return lambda cells: timer(cells.with_columns(kv_dtype=pl.lit(kv_dtype)))


def predict_targets(targets: pl.DataFrame, models: dict, gpu: GpuSpec, timer: StepTimer,
                    progress=None, host_in_steps: bool = False) -> tuple[np.ndarray, ...]:
    """Predicted TTFT, TPOT, service time, steady-state TTFT and end-to-end latency (ms) per
    target row, in the rows' order (service time, first token minus first scheduled, for
    recorded arrivals only; steady-state TTFT, the closed loop's other bound, for closed loops
    only; end-to-end latency, and TTFT as the batch's last first token, for static batches)."""
    ttft, tpot, service, steady, e2e = (np.full(len(targets), np.nan) for _ in range(5))
    indexed = targets.with_row_index("_i")
    sim = schedulers_conf()["simulation"]
    bound = sim["steady_state"]
    switched = SwitchedTimer(timer)
    loops = []  # per closed-loop target group: its rows, concurrency, and two (plan, cells)
    statics = []  # per static batch: its rows, plan, timer and steps
    for (_, load), group in indexed.group_by("run", "load", maintain_order=True):
        first = group.row(0, named=True)
        model, tp = first["model"], int(first["tp"])
        policy, timed = run_engine(first, models, gpu, switched, host_in_steps)
        rows = group["_i"].to_numpy()
        if load == "static":  # scheduled now, priced below with every closed loop
            batch_plan = static_batch.plan(policy, first["isl"], first["osl"],
                                           first["concurrency"])
            statics.append((rows, batch_plan, timed,
                            batch_plan.cells(model, tp, first["gemm_dtype"])))
            continue
        if load == "closed":  # scheduled now, priced below with every other closed loop
            c = first["concurrency"]
            planned = [closed_loop_plan(policy, first["isl"], first["osl"], c, sim["waves"] * c,
                                        start, idle_burst=sim["idle_burst"])
                       for start in (sim["closed_loop_start"], bound["start"])]
            loops.append((rows, c, first["osl"], timed, [
                (plan, arrival, plan.cells(model, tp, first["gemm_dtype"]))
                for plan, arrival in planned]))
            continue
        timeline = recorded_arrivals(policy, group["arrival_ms"].to_numpy(),
                                     group["isl"].to_numpy(), group["osl"].to_numpy(),
                                     model, tp, timed, first["gemm_dtype"])
        ttft[rows], tpot[rows], service[rows] = timeline.ttft, timeline.tpot, timeline.service
        if progress is not None:
            progress(len(rows))
    shape_ms = iter(price_together(switched, [
        *[(timed, cells) for *_, timed, planned in loops for _, _, cells in planned],
        *[(timed, cells) for *_, timed, cells in statics]]))
    for rows, c, osl, _, planned in loops:
        (plan, arrival, _), (steady_plan, steady_arrival, _) = planned
        timeline = closed_loop_timeline(plan, arrival, next(shape_ms)[plan.inverse], osl)
        kept = slice(sim["warmup_waves"] * c, None)  # the first waves warm the engine up
        ttft[rows] = np.mean(timeline.ttft[kept])
        tpot[rows] = np.nanmean(timeline.tpot[kept])
        steady_timeline = closed_loop_timeline(steady_plan, steady_arrival,
                                               next(shape_ms)[steady_plan.inverse], osl)
        steady[rows] = np.mean(steady_timeline.ttft[bound["warmup_waves"] * c:])
        if progress is not None:
            progress(len(rows))
    for rows, batch_plan, _, _ in statics:
        ttft[rows], e2e[rows] = static_batch.times(batch_plan,
                                                   next(shape_ms)[batch_plan.inverse])
        if progress is not None:
            progress(len(rows))
    return ttft, tpot, service, steady, e2e
