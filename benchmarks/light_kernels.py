"""How much of the oracle's TPOT error the light kernels and sampling account for, which no
kernel table holds.

The oracle prices a replayed step from the target GPU's measured GEMM, attention, all-reduce and
fused-MoE tables and the LM head. The engine also runs a layer's light kernels: the two RMSNorms,
rotary embedding, the gated activation and the residual adds (Qwen3's per-head q/k norms have no
measurement here), and a step ends in sampling. aiconfigurator timed none of these on any GPU
(the KV-cache write is ``benchmarks/kv_cache_write.py``'s). Two pinned sources time light
kernels as an engine runs them:

- Vidur (``model_ops``, ``source = 'vidur'``, ``h100_sxm``): its engine's own kernels, one
  RMSNorm, rotary, activation and add each, the GPU time of each op's kernels from its
  profiler (whole microseconds), at 1 to 4,096 tokens, six models at TP 1 to 8 (five of them
  built as the serving models are). Of the closed-loop sets' GPUs (H100, H200, B200, GB200),
  the only one with light kernels timed; read for all of them, unscaled.
- LLMServingSim's vLLM 0.19 profile of the RTX 4090 (``source = 'llmservingsim'``, backend
  vLLM): vLLM's own kernels, eager, of Llama-3.1-8B at TP 1, 1 to 2,048 tokens: the RMSNorm
  (its residual add fused in; a layer calls it twice, as ``leaderboard/cells/profiles.py``
  counts it), the rotary embedding and the activation, and the sampler at 1 to 256 sequences.
  Read for ``rtx4090_serving``, a vLLM 0.19 run of that model on that GPU: the one set whose
  own GPU, engine and version have them timed, so the one direct check. Its sampler, the only
  one timed, is read for every set, unscaled (the datacenter GPUs' memory bandwidth is 3 to 8
  times the RTX 4090's, so there it likely costs less).

LLMServingSim's v0 profile (``layers.csv``) of the H100 times Hugging Face modules, whose
RMSNorm is several elementwise kernels (17 to 19 µs a norm at one token, against Vidur's 4 to
6): no serving engine runs those modules, so it is not read. Vidur's A100 and A40 and
LLMServingSim's RTX A6000 and RTX 3090 hold no serving set.

This replays every target of each serving set that has an oracle three times with the oracle's
step timer: as the headline replays it; with each step's light kernels added; and with the
sampler added as well, read at the measured sequence count nearest the step's requests (vLLM
computes logits for every scheduled request). Where the replay adds vLLM's host time to a step
(before 0.14.0, and an unrecorded version) that time already holds sampling (Vidur's
``sampler_e2e`` is one of its four parts), so no sampler is added there. Each op of
a layer is read at the measured point nearest the step: among the (model, TP) whose layer is
built as the step's model's (norm, gated MLP, sequential block: phi-2's LayerNorm and parallel
block are left out), the one whose op handles the nearest per-token element count (norms and
add: the hidden size; rope: the query and KV heads one GPU holds times the head size;
activation: the gate/up width per GPU), the first in name order among equals, at the nearest
measured token count (log scale; a step above the largest measured count reads that point,
short of its real cost). An MoE model's activation is counted on its dense layers only: the
fused-MoE tables time vLLM's experts call, activation included. Vidur times one residual add a
layer, the second; vLLM and SGLang run neither as a kernel of its own (they fuse both into the
norms), so the add read here stands for the traffic a fused norm adds.

An engine compiled with torch.compile (vLLM V1's default) or TRT-LLM fuses some of these into
neighbouring kernels (vLLM an FP8 quantization into the RMSNorm before a GEMM), and, but for
the RTX 4090's, its kernels are not the ones timed. So this is a sensitivity, not a
measurement of any run. Scores the TTFT and TPOT MAPE, the signed median TPOT error and the
TPOT gap per added client (whether they account for its growth) per set and backend. Prints
markdown; ``--json PATH`` also writes the rows, which the report shows:

    .venv/bin/python benchmarks/light_kernels.py --json benchmarks/light_kernels.json
"""

from __future__ import annotations

import json
import time

import numpy as np
import polars as pl
from closed_loop_waves import json_argument, oracle_sets, oracle_timer, stamped

from leaderboard.cells.profiles import LAYER_OPS as PROFILED_LAYER_OPS
from leaderboard.present.serving_light import light_kernels_table
from leaderboard.present.serving_oracle import measured_gap
from leaderboard.serving import simulate
from leaderboard.store import database
from leaderboard_core import progress
from leaderboard_core.specs import is_moe, load_models, moe_shapes, tp_shapes

VIDUR_GPU = "h100_sxm"  # of the closed-loop sets' GPUs, the only one whose light kernels are timed
# What decides which light kernels a layer runs: its norm, its MLP's gate and its block's order.
LAYER_BUILD = ("norm", "gated_mlp", "parallel_block")
# Per source, each light op of a layer it times: what the op handles per token ("hidden",
# "rope", "act") and how many times a layer calls it.
LAYER_OPS = {
    "vidur": {"input_layernorm": ("hidden", 1), "post_attention_layernorm": ("hidden", 1),
              "add": ("hidden", 1), "attn_rope": ("rope", 1), "mlp_act": ("act", 1)},
    "llmservingsim": {op: (kind, PROFILED_LAYER_OPS["dense.csv"][op]) for op, kind in
                      (("layernorm", "hidden"), ("rotary_emb", "rope"), ("act_fn", "act"))},
}


def per_token_elements(model: dict, tp: int) -> dict[str, float]:
    """Per kind of light op, the elements it handles per token on one GPU of ``tp``."""
    s = tp_shapes(model, tp)
    return {"hidden": s["hidden"], "act": s["gate_up"][0],
            "rope": (s["heads"] + s["kv_heads"]) * model["head_dim"]}


def nearest_count(measured: np.ndarray, latency: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``latency`` at the ``measured`` count (sorted) nearest each of ``counts``, on a log
    scale; past either end, the end's."""
    right = np.clip(np.searchsorted(measured, counts), 1, len(measured) - 1)
    left = right - 1
    pick = np.where(np.abs(np.log(counts / measured[left]))
                    <= np.abs(np.log(measured[right] / counts)), left, right)
    return latency[pick]


class LightKernels:
    """Each step's light-kernel time (ms), read from one source's measured points (``ops``:
    that source's entry of ``LAYER_OPS``)."""

    def __init__(self, points: pl.DataFrame, models: dict, ops: dict = LAYER_OPS["vidur"]):
        self.models, self.ops = models, ops
        self.points = {key: (group["num_tokens"].to_numpy(), group["latency_ms"].to_numpy())
                       for key, group in points.sort("num_tokens")
                       .group_by("op", "model", "tp", maintain_order=True)}
        self.configs = sorted({(model, tp) for _, model, tp in self.points})
        self.nearest: dict[tuple[str, int], dict[str, tuple]] = {}

    def _nearest_configs(self, name: str, tp: int) -> dict[str, tuple]:
        """Per op, the measured (op, model, TP) of a layer built as ``name``'s whose per-token
        elements are nearest."""
        if (name, tp) not in self.nearest:
            wanted = per_token_elements(self.models[name], tp)
            build = [self.models[name].get(k) for k in LAYER_BUILD]
            alike = [(m, t) for m, t in self.configs
                     if [self.models[m].get(k) for k in LAYER_BUILD] == build]
            if not alike:
                raise ValueError(f"no measured light kernels of a layer built as {name}'s "
                                 f"({dict(zip(LAYER_BUILD, build, strict=True))})")
            self.nearest[(name, tp)] = {op: min(
                ((op, m, t) for m, t in alike if (op, m, t) in self.points),
                key=lambda k: abs(np.log(per_token_elements(self.models[k[1]], k[2])[kind]
                                         / wanted[kind]))) for op, (kind, _) in self.ops.items()}
        return self.nearest[(name, tp)]

    def layer_ms(self, name: str, tp: int, tokens: np.ndarray) -> dict[str, np.ndarray]:
        """Per op, one call's time at each of ``tokens``: the nearest measured token count."""
        return {op: nearest_count(*self.points[key], tokens)
                for op, key in self._nearest_configs(name, tp).items()}

    def step_ms(self, cells: pl.DataFrame) -> np.ndarray:
        out = np.zeros(len(cells))
        indexed = cells.with_row_index("_i")
        for (name, tp), group in indexed.group_by("model", "tp"):
            model = self.models[name]
            ops = self.layer_ms(name, int(tp), np.maximum(group["total_tokens"].to_numpy(), 1))
            layers = float(model["num_layers"])
            act_layers = float(moe_shapes(model, int(tp))["dense_layers"]) if is_moe(model) else layers
            out[group["_i"].to_numpy()] = sum(
                ms * calls * (act_layers if kind == "act" else layers)
                for op, ms in ops.items() for kind, calls in [self.ops[op]])
        return out


class Sampler:
    """Each step's sampling time (ms): the measured sampler at the sequence count nearest the
    step's requests. ``points``: one profile's (GPU, model, TP) sampler, never several pooled."""

    def __init__(self, points: pl.DataFrame):
        profiles = points.select("sku", "model", "tp").unique()
        if len(profiles) != 1:
            raise ValueError(f"expected one sampler profile, found {len(profiles)}: "
                             f"{profiles.rows()}; choose which one a step reads")
        self.profile = profiles.row(0, named=True)
        ordered = points.sort("num_tokens")
        self.counts, self.latency = ordered["num_tokens"].to_numpy(), ordered["latency_ms"].to_numpy()

    def step_ms(self, cells: pl.DataFrame) -> np.ndarray:
        return nearest_count(self.counts, self.latency,
                             np.maximum(cells["num_requests"].to_numpy(), 1))


def measured_points() -> pl.DataFrame:
    """Every light op and sampler an engine timed: Vidur's H100 points and the vLLM profiles."""
    with database.connect() as con:
        return con.sql("SELECT source, sku, op, model, tp, num_tokens, latency_ms "
                       "FROM model_ops WHERE kv_len = 0 AND ((source = 'vidur' AND sku = ? AND "
                       "op_family = 'light') OR (source = 'llmservingsim' AND backend = 'vllm' "
                       "AND op_family IN ('light', 'sampler')))", params=[VIDUR_GPU]).pl()


def light_source(points: pl.DataFrame, sku: str) -> tuple[str, pl.DataFrame]:
    """The light kernels a set on ``sku`` reads: the GPU's own, timed in vLLM, where any (the
    RTX 4090's, at vLLM 0.19.0, the version of its serving run); else Vidur's H100. Returns the
    source's name and its points."""
    own = points.filter(source="llmservingsim", sku=sku).filter(
        pl.col("op").is_in(list(LAYER_OPS["llmservingsim"])))
    if len(own):
        return "llmservingsim", own
    return "vidur", points.filter(source="vidur")


def predict_parts(targets: pl.DataFrame, held: pl.Series, timers: tuple, predict
                  ) -> tuple[np.ndarray, np.ndarray]:
    """TTFT and TPOT per row of ``targets`` (which carry their row number in ``_target``): the
    ``held`` rows predicted with ``timers[0]``, the others with ``timers[1]``, by
    ``predict(part, timer) -> (ttft, tpot)`` in the part's row order, put back in place."""
    ttft, tpot = np.full(len(targets), np.nan), np.full(len(targets), np.nan)
    for part, step_timer in ((targets.filter(held), timers[0]), (targets.filter(~held), timers[1])):
        if len(part):
            at = part["_target"].to_numpy()
            ttft[at], tpot[at] = predict(part, step_timer)
    return ttft, tpot


def replay(dataset: str, home: str, points: pl.DataFrame) -> list[dict]:
    """Per backend (and all together): the oracle's TTFT / TPOT MAPE, signed median TPOT error
    (%) and TPOT gap per added client (µs, as the report's oracle section reads it) on
    ``dataset``, as the headline replays it, with the light kernels added, and with sampling
    added too."""
    timer, inputs = oracle_timer(dataset, home)
    targets, models = inputs.target.with_row_index("_target"), load_models()
    source, light_points = light_source(points, inputs.gpu.sku)
    light = LightKernels(light_points, models, LAYER_OPS[source])
    sampler = Sampler(points.filter(op="sampler"))

    def with_light(cells: pl.DataFrame) -> np.ndarray:
        return timer(cells) + light.step_ms(cells)

    def with_sampling(cells: pl.DataFrame) -> np.ndarray:
        return with_light(cells) + sampler.step_ms(cells)

    # Per reading, the step timer of a run whose host time holds sampling, and of any other.
    readings = {"headline": (timer, timer), "light": (with_light, with_light),
                "sampled": (with_light, with_sampling)}
    held = pl.Series("held", [simulate.host_time_added(b, v) for b, v in targets.select(
        "backend", "backend_version").iter_rows()])
    frame = targets.select("backend", "model", "tp", "isl", "concurrency", "gt_ttft_ms",
                           "gt_tpot_ms").with_columns(held)
    for name, timers in readings.items():
        with progress.track(f"{dataset}: {name}", len(targets)) as bar:
            ttft, tpot = predict_parts(targets, held, timers, lambda part, step_timer: (
                simulate.predict_targets(part, models, inputs.gpu, step_timer,
                                         progress=bar.advance)[:2]))
        frame = frame.with_columns(pl.Series(f"{name}_ttft", ttft), pl.Series(f"{name}_tpot", tpot))
    every = pl.concat([frame.with_columns(backend=pl.lit("all")), frame])

    def error(name: str, phase: str) -> pl.Expr:
        return (pl.col(f"{name}_{phase}") / pl.col(f"gt_{phase}_ms") - 1) * 100

    found = (every.group_by("backend", maintain_order=True)
            .agg(n=pl.len(), sampling_added=(~pl.col("held")).sum(),
                 **{f"{name}_{phase}_mape": error(name, phase).abs().mean()
                    for name in readings for phase in ("ttft", "tpot")},
                 **{f"{name}_tpot_signed_median": error(name, "tpot").median() for name in readings})
            .with_columns(dataset=pl.lit(dataset), light_source=pl.lit(
                f"{source} {light_points['sku'][0]}"), sampler_source=pl.lit(
                sampler.profile["sku"])).to_dicts())
    for row in found:
        # A line per backend's (model, TP, isl): "all" pools the backends' lines, not their loads.
        parts = [part for (backend,), part in frame.group_by("backend")
                 if row["backend"] in ("all", backend)]
        for name in readings:
            slopes = [slope for part in parts for slope in measured_gap(part.select(
                "model", "tp", "isl", "concurrency", gt_ms="gt_tpot_ms",
                pred_ms=f"{name}_tpot"))[1]]
            row[f"{name}_tpot_gap_per_client_us"] = 1e3 * float(np.median(slopes)) if slopes else None
    return found


def main() -> None:
    json_path = json_argument(__doc__)
    started, rows = time.perf_counter(), []
    points = measured_points()
    for dataset, home in oracle_sets(closed_only=False):
        print(f"{dataset}: the oracle on {home}, with and without light kernels and sampling",
              flush=True)
        rows += replay(dataset, home, points)
    bench = stamped({"rows": rows}, started)
    print("\n".join(light_kernels_table(bench)))
    if json_path:
        json_path.write_text(json.dumps(bench, indent=1) + "\n")


if __name__ == "__main__":
    main()
