"""What the oracle's error owes to engine choices that no serving record states.

aiconfigurator's silicon CSV records a run's backend, model, precision, parallelism and load,
not its launch flags. Three choices of the replay (``conf/serving/schedulers.yaml``) decide
how a KV-bound load holds its requests' KV (the first also how fast attention runs):

- ``fp8_kv``: every backend's KV cache in FP8, half the bytes a token, and each step's
  attention read from the GPU's FP8-KV attention tables (at the version of the step set the
  oracle fits on, beside the BF16 ones it reads). The headline keeps BF16, vLLM's
  ``--kv-cache-dtype auto`` for a BF16 or online-FP8 model; aiconfigurator's generator passes
  the flag only when a search result names a KV quantization, which its SDK infers for a
  checkpoint published in FP8, as the MoE sets' are (``conf/serving/schedulers.yaml``).
- ``fp8_kv_capacity``: the same cache, its capacity only: the steps' attention is still read
  from the BF16-KV tables, so the two rows part what FP8 KV owes to the loads it lets in at
  once from what it owes to faster attention.
- ``no_prefix_cache``: vLLM without prefix caching, so a preempted request recomputes its
  whole prompt. The headline keeps it on, V1's default, which aiconfigurator's generator leaves
  alone unless asked.

A fourth choice decides how many tokens a step takes:

- ``launch_rule``: the token budget of aiconfigurator's benchmark rule for an aggregated
  worker, concurrency + isl + 1500 (``generator/rule_plugin/benchmark/vllm.rule`` and
  ``trtllm.rule``, ``agg max_num_tokens``, ``max_batch_size`` taken as the concurrency), for
  every vLLM and TRT-LLM run, those of an unrecorded version included. The headline applies
  it to vLLM from 0.14.1 only, whose launch template passes the flag (the 0.12.0 one does
  not). The unrecorded ones replayed, the dense FP8 campaign, are dated 2025-10-29, before the
  public generator had any vLLM template or budget rule (ai-dynamo/aiconfigurator PR 144,
  opened 2025-12-01), and their budget is unrecorded; the choice measures what the rule would
  give them.
  TRT-LLM's templates pass ``max_num_tokens`` at every version, but the generator's deployment
  rule (``rule_plugin/trtllm.rule``) sets 512 or more as ``max_batch_size`` where the
  benchmark rule sets the concurrency, so which budget a TRT-LLM run had is not known either
  way.
  SGLang's rule caps a prefill batch's new tokens (``max_prefill_tokens`` isl + 1500) rather
  than a step's, which the replay does not model, so it is left out.

A fifth decides what a step's host work costs:

- ``trtllm_no_overlap``: TRT-LLM with its overlap scheduler off, so each step pays its host
  work on top of its GPU time. aiconfigurator's TRT-LLM launch templates default
  ``disable_overlap_scheduler`` to true; its generator's rules set it false for an aggregated
  worker, and the headline follows them and the engine's own default (overlap on, no host
  time added). No TRT-LLM host time is measured, so vLLM's measured one (Vidur's, the yaml's
  ``backends.vllm.host_time``) stands in.

A sixth decides how an idle engine takes a burst of requests:

- ``burst_together``: requests sent in one instant to an idle engine (a closed loop's first
  wave, and every client's resend when a wave ends in one step) run in one step. The headline
  runs the first of them alone and the rest in the next step (``simulation.idle_burst`` in
  the yaml): TRT-LLM's idle executor takes one request, and for vLLM and SGLang how many of a
  burst make the first step is a race no record times, of which these are the two ends.

And one takes aiconfigurator's benchmark as a whole:

- ``aiconfigurator_bench``: ``launch_rule`` with the request count of its benchmark template
  (``bench_run.sh.j2``): 50 x ``concurrency`` profiled requests, every one scored. The
  template's 2 x ``concurrency`` warm-up requests are a phase of their own that AIPerf lets
  drain before it profiles, so the profiled loop also starts from an idle engine and the
  warm-up is not replayed. The headline replays 4 waves, since no record states that a run
  came from that template (``benchmarks/closed_loop_waves.py`` measures the length alone).

This replays every target of each serving set that has an oracle with the oracle's step timer
(``table_scaled`` fitted on the target GPU's own kernel tables, as the oracle run fits it),
once as the headline replays it and once under each choice, and scores the TTFT and TPOT MAPE
over every target and over the targets the choice moves (predicted TTFT changed by more than
0.1 %), and counts the moved targets it brings closer to the measured TTFT. The targets
``fp8_kv_capacity`` and ``no_prefix_cache`` move (KV-bound loads only) are also listed one by
one. A progress bar runs per set and choice. Prints markdown; ``--json PATH`` also writes the
rows, which the report shows:

    .venv/bin/python benchmarks/engine_choices.py --json benchmarks/engine_choices.json
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import numpy as np
from closed_loop_waves import json_argument, oracle_sets, oracle_timer, stamped

from leaderboard.cells.common import schedulers_conf
from leaderboard.present.serving_unknowns import engine_choices_tables
from leaderboard.serving import simulate
from leaderboard_core import progress
from leaderboard_core.specs import FP8_KV, load_models

# aiconfigurator's benchmark budget for every vLLM and TRT-LLM closed loop, unrecorded versions too
LAUNCH_RULE = {("backends", "vllm", "closed_loop_launch", "from_version"): "0.0",
               ("backends", "vllm", "closed_loop_launch", "unrecorded"): True,
               ("backends", "trtllm", "closed_loop_launch"): {"extra_tokens": 1500,
                                                              "from_version": "0.0",
                                                              "unrecorded": True}}
# Each choice: the yaml keys it sets, as a path from the top of schedulers.yaml, and the value.
CHOICES = {
    "headline": {},
    "fp8_kv": {("simulation", "kv_cache_dtype"): FP8_KV},
    "fp8_kv_capacity": {("simulation", "kv_cache_dtype"): FP8_KV},
    "no_prefix_cache": {("backends", "vllm", "prefix_caching", "block_tokens"): 0},
    "launch_rule": LAUNCH_RULE,
    "trtllm_no_overlap": {("backends", "trtllm", "host_time", "overlapped"): None} | {
        ("backends", "trtllm", "host_time", key): schedulers_conf()["backends"]["vllm"][
            "host_time"][key] for key in ("base_ms", "per_request_ms")},
    "burst_together": {("simulation", "idle_burst"): "together"},
    "aiconfigurator_bench": LAUNCH_RULE | {("simulation", "waves"): 50},
}
# The choices whose steps are priced as the headline's: their cells do not name the KV dtype.
CAPACITY_ONLY = ("fp8_kv_capacity",)
# The choices whose moved targets are listed one by one: these two move only a few KV-bound
# loads; fp8_kv and the launch rule move most loads, and their table rows say how many they
# bring closer.
LISTED = ("fp8_kv_capacity", "no_prefix_cache")
ABSENT = object()  # a key the yaml does not have: the choice adds it, and it is removed again
MOVED = 1e-3  # a target is moved when its predicted TTFT changes by more than this share


@contextmanager
def engine_choice(changes: dict[tuple[str, ...], object]):
    """The replay's scheduler configuration with ``changes`` set, restored on the way out."""
    conf, saved = schedulers_conf(), []
    try:
        for (*parents, key), value in changes.items():
            node = conf
            for parent in parents:
                node = node[parent]
            saved.append((node, key, node.get(key, ABSENT)))
            node[key] = value
        yield
    finally:
        for node, key, old in reversed(saved):
            if old is ABSENT:
                del node[key]
            else:
                node[key] = old


def bf16_kv_attention(timer):
    """``timer`` on steps that do not name their KV dtype: attention read as over a BF16 cache."""
    return lambda cells: timer(cells.drop("kv_dtype", strict=False))


def replay_choices(dataset: str, home: str) -> tuple[list[dict], list[dict]]:
    """The oracle's TTFT / TPOT MAPE (%) on ``dataset`` under each choice, over every target
    and over the targets the choice moves; and the moved targets, one row each."""
    timer, inputs = oracle_timer(dataset, home)
    targets, models = inputs.target, load_models()
    predicted = {}
    for name, changes in CHOICES.items():
        step_timer = bf16_kv_attention(timer) if name in CAPACITY_ONLY else timer
        with engine_choice(changes), progress.track(f"{dataset}: {name}", len(targets)) as bar:
            ttft, tpot, *_ = simulate.predict_targets(targets, models, inputs.gpu, step_timer,
                                                        progress=bar.advance)
        predicted[name] = (ttft, tpot)
    gt_ttft, gt_tpot = targets["gt_ttft_ms"].to_numpy(), targets["gt_tpot_ms"].to_numpy()

    def mape(pred: np.ndarray, gt: np.ndarray, rows: np.ndarray) -> float | None:
        return float(np.mean(np.abs(pred[rows] / gt[rows] - 1)) * 100) if rows.any() else None

    every = np.ones(len(targets), dtype=bool)
    headline_ttft = predicted["headline"][0]
    summary, moved_rows = [], np.zeros(len(targets), dtype=bool)
    for name, (ttft, tpot) in predicted.items():
        moved = np.abs(ttft / headline_ttft - 1) > MOVED
        closer = moved & (np.abs(ttft / gt_ttft - 1) < np.abs(headline_ttft / gt_ttft - 1))
        if name in LISTED:
            moved_rows |= moved
        summary.append({"dataset": dataset, "choice": name, "n": len(targets),
                        "ttft_mape": mape(ttft, gt_ttft, every),
                        "tpot_mape": mape(tpot, gt_tpot, every), "moved": int(moved.sum()),
                        "closer": int(closer.sum()),
                        "moved_ttft_mape": mape(ttft, gt_ttft, moved),
                        "moved_headline_ttft_mape": mape(headline_ttft, gt_ttft, moved)})
    shown = targets.select("backend", "tp", "isl", "osl", "concurrency", "gt_ttft_ms")
    moved_targets = [{"dataset": dataset, **row,
                      **{f"{name}_ttft_ms": float(ttft[i]) for name, (ttft, _) in predicted.items()}}
                     for i, row in enumerate(shown.iter_rows(named=True)) if moved_rows[i]]
    return summary, moved_targets


def main() -> None:
    json_path = json_argument(__doc__)
    started, summary, moved = time.perf_counter(), [], []
    for dataset, home in oracle_sets():
        print(f"{dataset}: the oracle on {home}, {len(CHOICES)} engine choices", flush=True)
        found, targets = replay_choices(dataset, home)
        summary, moved = summary + found, moved + targets
    bench = stamped({"choices": list(CHOICES), "rows": summary, "moved": moved}, started)
    print("\n".join(engine_choices_tables(bench)))
    if json_path:
        json_path.write_text(json.dumps(bench, indent=1) + "\n")


if __name__ == "__main__":
    main()
