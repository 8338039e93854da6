"""How much of the oracle's TPOT error the light kernels account for, which no kernel table holds.

The oracle prices a replayed step from the target GPU's measured GEMM, attention, all-reduce and
fused-MoE tables and the LM head. The engine also runs a layer's light kernels: the two RMSNorms,
rotary embedding, the gated activation and the residual adds (the KV-cache write, Qwen3's
per-head q/k norms and sampling have no measurement here). aiconfigurator timed none of them on
any GPU. Of the GPUs of the closed-loop serving sets (H100, H200, B200, GB200) only the H100 has
them measured, by two pinned sources:

- Vidur (``model_ops``, ``source = 'vidur'``, ``h100_sxm``): its engine's own kernels, one
  RMSNorm, rotary, activation and add each, the GPU time of each op's kernels from its
  profiler (whole microseconds), at 1 to 4,096 tokens, six models at TP 1 to 8 (five of them
  built as the serving models are). Read here.
- LLMServingSim's v0 profile (``layers.csv``): Hugging Face modules, whose RMSNorm is several
  elementwise kernels (17 to 19 µs a norm at one token, against Vidur's 4 to 6), for
  Llama-3.1-8B and 70B only. Not read: no serving engine runs those modules.

Elsewhere: Vidur also profiled the A100 and A40, and LLMServingSim the RTX A6000 and RTX 3090,
which no serving set holds. LLMServingSim's vLLM 0.19 profile of the RTX 4090 times vLLM's own
kernels (eager): at one token 1.85 µs a norm, 2.18 the rotary embedding, 2.59 the activation,
about half Vidur's H100 figures on a slower GPU. The RTX 4090's serving set has recorded
arrivals, not a closed loop, so it is not replayed here; the figures say Vidur's kernels may
cost more than vLLM's.

This replays every target of each closed-loop serving set that has an oracle twice with the
oracle's step timer: as the headline replays it, and with each step's light kernels added, every
GPU read at the H100's measurements (no other of these GPUs is measured, and they are not
scaled). Each op of
a layer is read at Vidur's measured point nearest the step: among the (model, TP) whose layer is
built as the step's model's (norm, gated MLP, sequential block: phi-2's LayerNorm and parallel
block are left out), the one whose op handles the nearest per-token element count (norms and
add: the hidden size; rope: the query and KV heads one GPU holds times the head size;
activation: the gate/up width per GPU), the first in name order among equals, at the nearest
measured token count (log scale; a step above 4,096 tokens reads the 4,096 point, short of its
real cost). An MoE model's activation is counted on its dense layers only: the fused-MoE tables
time vLLM's experts call, activation included. Each op runs once per layer, as Vidur's own step
cells count it (``leaderboard/cells/profiles.py``). Vidur times one residual add a layer, the
second; vLLM and SGLang run neither as a kernel of its own (they fuse both into the norms), so
the add read here stands for the traffic a fused norm adds.

An engine compiled with torch.compile (vLLM V1's default) or TRT-LLM fuses some of these into
neighbouring kernels (vLLM an FP8 quantization into the RMSNorm before a GEMM), and its kernels
are not Vidur's. So this is a sensitivity, not a measurement of any run. Scores the TTFT and
TPOT MAPE and the signed median TPOT error per set and backend. Prints markdown; ``--json PATH``
also writes the rows, which the report shows:

    .venv/bin/python benchmarks/light_kernels.py --json benchmarks/light_kernels.json
"""

from __future__ import annotations

import json
import time

import numpy as np
import polars as pl
from closed_loop_waves import json_argument, oracle_sets, oracle_timer, stamped

from leaderboard import store
from leaderboard.cells.memory import kv_heads_per_gpu
from leaderboard.serving import simulate
from leaderboard.serving.report_light import light_kernels_table
from leaderboard_core import progress
from leaderboard_core.specs import is_moe, load_models, moe_shapes, tp_shapes

MEASURED_ON = "h100_sxm"  # of the closed-loop sets' GPUs, the only one whose light kernels are timed
# What decides which light kernels a layer runs: its norm, its MLP's gate and its block's order.
LAYER_BUILD = ("norm", "gated_mlp", "parallel_block")


def per_token_elements(model: dict, tp: int) -> dict[str, float]:
    """Per light op, the elements it handles per token on one GPU of ``tp``."""
    s = tp_shapes(model, tp)
    return {"input_layernorm": s["hidden"], "post_attention_layernorm": s["hidden"],
            "add": s["hidden"], "mlp_act": s["gate_up"][0],
            "attn_rope": (s["heads"] + kv_heads_per_gpu(model, tp)) * model["head_dim"]}


class LightKernels:
    """Each step's light-kernel time (ms), read from Vidur's measured H100 points."""

    def __init__(self, points: pl.DataFrame, models: dict):
        self.models = models
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
                key=lambda k: abs(np.log(per_token_elements(self.models[k[1]], k[2])[op]
                                         / elements))) for op, elements in wanted.items()}
        return self.nearest[(name, tp)]

    def layer_ms(self, name: str, tp: int, tokens: np.ndarray) -> dict[str, np.ndarray]:
        """Per op, one layer's time at each of ``tokens``: the nearest measured token count."""
        out = {}
        for op, key in self._nearest_configs(name, tp).items():
            measured, latency = self.points[key]
            right = np.clip(np.searchsorted(measured, tokens), 1, len(measured) - 1)
            left = right - 1
            pick = np.where(np.abs(np.log(tokens / measured[left]))
                            <= np.abs(np.log(measured[right] / tokens)), left, right)
            out[op] = latency[pick]
        return out

    def step_ms(self, cells: pl.DataFrame) -> np.ndarray:
        out = np.zeros(len(cells))
        indexed = cells.with_row_index("_i")
        for (name, tp), group in indexed.group_by("model", "tp"):
            model = self.models[name]
            ops = self.layer_ms(name, int(tp), np.maximum(group["total_tokens"].to_numpy(), 1))
            layers = float(model["num_layers"])
            act_layers = float(moe_shapes(model, int(tp))["dense_layers"]) if is_moe(model) else layers
            out[group["_i"].to_numpy()] = sum(
                ms * (act_layers if op == "mlp_act" else layers) for op, ms in ops.items())
        return out


def measured_points() -> pl.DataFrame:
    with store.connect() as con:
        return con.sql("SELECT op, model, tp, num_tokens, latency_ms FROM model_ops WHERE "
                       "source = 'vidur' AND sku = ? AND op_family = 'light' AND kv_len = 0",
                       params=[MEASURED_ON]).pl()


def replay(dataset: str, home: str, light: LightKernels) -> list[dict]:
    """Per backend (and all together): the oracle's TTFT / TPOT MAPE and signed median TPOT
    error (%) on ``dataset``, as the headline replays it and with the light kernels added."""
    timer, inputs = oracle_timer(dataset, home)
    targets, models = inputs.target, load_models()
    readings = {"headline": timer, "light": lambda cells: timer(cells) + light.step_ms(cells)}
    frame = targets.select("backend", "gt_ttft_ms", "gt_tpot_ms")
    for name, step_timer in readings.items():
        with progress.track(f"{dataset}: {name}", len(targets)) as bar:
            ttft, tpot, _, _ = simulate.predict_targets(targets, models, inputs.gpu, step_timer,
                                                        progress=bar.advance)
        frame = frame.with_columns(pl.Series(f"{name}_ttft", ttft), pl.Series(f"{name}_tpot", tpot))
    every = pl.concat([frame.with_columns(backend=pl.lit("all")), frame])

    def error(name: str, phase: str) -> pl.Expr:
        return (pl.col(f"{name}_{phase}") / pl.col(f"gt_{phase}_ms") - 1) * 100

    return (every.group_by("backend", maintain_order=True).agg(
        n=pl.len(), **{f"{name}_{phase}_mape": error(name, phase).abs().mean()
                       for name in readings for phase in ("ttft", "tpot")},
        **{f"{name}_tpot_signed_median": error(name, "tpot").median() for name in readings})
        .with_columns(dataset=pl.lit(dataset)).to_dicts())


def main() -> None:
    json_path = json_argument(__doc__)
    started, rows = time.perf_counter(), []
    light = LightKernels(measured_points(), load_models())
    for dataset, home in oracle_sets():
        print(f"{dataset}: the oracle on {home}, with and without light kernels", flush=True)
        rows += replay(dataset, home, light)
    bench = stamped({"measured_on": MEASURED_ON, "rows": rows}, started)
    print("\n".join(light_kernels_table(bench)))
    if json_path:
        json_path.write_text(json.dumps(bench, indent=1) + "\n")


if __name__ == "__main__":
    main()
