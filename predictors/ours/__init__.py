"""``ours``: the profiling-free step-time predictor of docs/ours.md, and its ablation ladder.

Step time = T_blocks (+ light kernels + LM head + S(N) on wall-clock targets). T_blocks sums
per-op rooflines, each slowed by named factors (predictors/ours/factors.py) whose constants are
physical or were fitted once on the home A100's op points (the FP8 GEMM ones on the FP8 family's
home, the H100) and frozen in conf/ours/constants.yaml (``python -m leaderboard.calibrate
predictor=ours`` re-derives them). ``fit`` reads no rows.

The ladder ``ours_r0_roofline`` ... ``ours_r9_fp8`` switches the factors on one rung at
a time; ``ours`` is the last rung plus the wall-clock terms. On ``gpu_block`` targets (the
``_vidur`` sets) the wall-clock terms are off: that ground truth has no light kernels, LM head or
host time, so ``ours`` equals ``ours_r9_fp8`` there.
"""

from __future__ import annotations

import inspect

import numpy as np
import polars as pl

from leaderboard_core.contract import (
    HELD_OUT_SHAPES,
    LAYER_OP_SOURCES,
    Home,
    NotSupported,
    PredictorCard,
    Reading,
    ReadingRequest,
)
from leaderboard_core.specs import GpuSpec
from predictors.base import Predictor
from predictors.ours import calibrate, config, factors, ops
from predictors.ours.config import Device
from predictors.ours.ops import Switches
from predictors.ours.step import block_times, blocks, wall_clock_extras
from predictors.registry import register
from predictors.steps import Steps

FACTORS = ("clock", "waves", "delivery", "l2_memory", "floors", "attention", "collectives",
           "routing", "fp8", "wall_clock")
# What wall_clock_extras adds, then S(N): in this order after the block terms.
WALL_CLOCK_TERMS = ("light_kernels", "lm_head", "host_floor")
# The block terms a layer-op ground truth (LAYER_OP_SOURCES) does not hold.
NOT_IN_LAYER_OPS = ("attn_prefill", "attn_decode", "allreduce")
LADDER = ("r0_roofline", "r1_clock", "r2_waves", "r3_delivery", "r4_l2_memory", "r5_floors",
          "r6_attention", "r7_collectives", "r8_routing", "r9_fp8")


@register("ours")
class Ours(Predictor):
    card = PredictorCard(
        kind="analytical", reference="docs/ours.md; reference/seed-report.txt sections 2 and 4",
        description="per-op roofline x named factors (clock, wave/cluster, tensor-core activity, "
                    "duty cycle, L2-reuse memory law, floors, attention, collectives, MoE "
                    "routing skew); constants physical or frozen from the home A100's op "
                    "points; S(N) from one deploy reading on wall-clock targets; FP8 GEMMs at "
                    "the FP8 dense peak with 1-byte inputs, their efficiency and quantization "
                    "floor frozen from the FP8 home H100's GEMMs; MoE layers as one fused-MoE op over "
                    "the routed rows",
        needs_profiled_rows=False, precisions=("bf16", "fp8"), layers=("dense", "moe", "moe_ep"))

    def __init__(self, clock: bool = True, waves: bool = True, delivery: bool = True,
                 l2_memory: bool = True, floors: bool = True, attention: bool = True,
                 collectives: bool = True, routing: bool = True, fp8: bool = True,
                 wall_clock: bool = True):
        self.clock, self.waves, self.delivery = clock, waves, delivery
        self.l2_memory, self.floors, self.attention = l2_memory, floors, attention
        self.collectives, self.routing, self.fp8 = collectives, routing, fp8
        self.wall_clock = wall_clock

    @property
    def switches(self) -> Switches:
        return Switches(**{f: bool(getattr(self, f)) for f in FACTORS if f != "wall_clock"})

    def fit(self, home: Home) -> Ours:
        """The GPU-time constants are read frozen; ``profiled_rows_`` counts the home op points
        they were once fitted on, so the card's cost is not understated. They are refitted on
        what fit is given where the frozen ones would see more: several homes, or a home whose
        scored shapes are held out of its points (``held_out_shapes``). A wall-clock home (the
        splitwise family) also gives alpha, the block-time scale of a real engine, fitted here
        on the home's training steps only (with a home S(N) that is then discarded: each target
        calibrates its own from its deploy reading)."""
        self.constants_ = config.load_constants()
        refit = len(home.gpus) > 1 or home.points == HELD_OUT_SHAPES
        if refit:
            if missing := sorted(set(calibrate.FITTED_OPS) - set(home.ops)):
                raise NotSupported(f"refitting ours's home constants on home {home.dataset} "
                                   f"({home.points}) needs its points of {', '.join(missing)}; it "
                                   f"holds {', '.join(sorted(home.ops)) or 'none'}")
            if not calibrate.fp8_gemm_points(home).is_empty():
                raise NotSupported(f"home {home.dataset} ({home.points}) holds FP8 GEMM points: "
                                   "ours refits only its BF16 constants on several homes or "
                                   "held-out shapes, and its FP8 ones are frozen from one home")
            self.constants_ = calibrate.fit_constants(home, self.constants_)
        self.trained_on_ = "+".join(home.gpus) if len(home.gpus) > 1 else self.constants_["home"]["sku"]
        self.home_gpus_ = tuple(home.gpus)
        # The GPU each frozen set of constants was fitted on (none: refitted on this home).
        self.frozen_from_ = {"home": None if refit else self.constants_["home"]["sku"],
                             "fp8": self.constants_["fp8"]["sku"]}
        # Every point the constants in use were fitted on: the BF16 home's and the FP8 home's.
        self.profiled_rows_ = int(self.constants_["home"]["op_rows"] + self.constants_["fp8"]["op_rows"])
        self.host_floor_, self.alpha_ = (0.0, 0.0), 1.0
        wall = home.cells.filter(pl.col("gt_kind") == "wall_clock")
        if self.wall_clock and len(wall) >= 3:
            self.alpha_ = self._fit_alpha(wall, home.gpu)
            self.profiled_rows_ += len(wall)
        return self

    def _fit_alpha(self, wall: pl.DataFrame, gpu: GpuSpec) -> float:
        """alpha by least squares on relative error: gt = alpha * T_gpu + s_floor + s_slope (N-1)."""
        parts = self.components(wall, gpu)
        gpu_s = sum(v for k, v in parts.items() if k != "host_floor")
        gt = wall["gt_ms"].to_numpy() * 1e-3
        n = wall["num_requests"].to_numpy().astype(np.float64)
        design = np.column_stack([gpu_s, np.ones_like(n), n - 1.0]) / gt[:, None]
        alpha = np.linalg.lstsq(design, np.ones_like(gt), rcond=None)[0][0]
        return float(alpha)

    def components(self, cells: pl.DataFrame, gpu: GpuSpec) -> dict[str, np.ndarray]:
        """Seconds per cell of each term that ``predict`` sums (``explain`` prints them)."""
        dev = self.device(gpu)
        fp8 = "gemm_dtype" in cells.columns and (cells["gemm_dtype"] == "fp8").any()
        self._refuse_in_sample(gpu, ("home", "fp8") if fp8 and self.fp8 else ("home",))
        if dev.fp8_peak_flops is None and fp8:
            raise NotSupported(f"{gpu.sku} has no fp8_dense_tflops in its spec: ours cannot price "
                               "its FP8 GEMMs (add the datasheet FP8 dense peak)")
        parts = [self._block_components(cells.slice(lo, hi - lo), dev)
                 for lo, hi in blocks(cells["num_requests"].to_numpy())]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _refuse_in_sample(self, gpu: GpuSpec, sections: tuple[str, ...]) -> None:
        """NotSupported on a GPU that is not this run's home but fitted constants in use
        (``sections`` of the constants): scored as unseen, it would be scored in-sample."""
        hit = [s for s in sections if self.frozen_from_[s] == gpu.sku and gpu.sku not in self.home_gpus_]
        if hit:
            c = self.constants_
            what = " and ".join({"home": "home", "fp8": "FP8"}[s] for s in hit)
            datasets = ", ".join(c[s]["dataset"] for s in hit)
            fixes = ("run it as the home, or predictor.fp8=false" if hit == ["fp8"] else
                     "run it as the home, or with several homes, on whose points they are refitted")
            raise NotSupported(f"ours's {what} constants were fitted on {gpu.sku} ({datasets}); "
                               f"scored as unseen here it would be in-sample ({fixes})")

    def _block_components(self, cells: pl.DataFrame, dev: Device) -> dict[str, np.ndarray]:
        """The block terms, then ``light_kernels`` (and, with the wall-clock terms on, the LM
        head and S(N)): the same keys for every block, zero where a cell has no such term."""
        s = Steps.from_cells(cells)
        parts = block_times(s, dev, self.constants_, self.switches)
        zero = np.zeros(s.n)
        wall = ((cells["gt_kind"] == "wall_clock").to_numpy() if self.wall_clock
                else np.zeros(s.n, dtype=bool))
        layer_ops = (cells["source"].is_in(list(LAYER_OP_SOURCES)).to_numpy()
                     if "source" in cells.columns else np.zeros(s.n, dtype=bool))
        if not (wall.any() or layer_ops.any()):  # gpu_block steps: the block terms only
            tail = WALL_CLOCK_TERMS if self.wall_clock else ("light_kernels",)
            return {**parts, **{k: zero for k in tail}}
        extras = wall_clock_extras(s, dev, self.constants_, self.switches)
        # Layer-op ground truth: the GEMMs and light kernels, no attention kernel, no all-reduce.
        for name in NOT_IN_LAYER_OPS:
            parts[name] = np.where(layer_ops, 0.0, parts[name])
        light = np.where(layer_ops, extras["light_kernels"], 0.0)
        if not self.wall_clock:
            return {**parts, "light_kernels": light}
        # alpha scales every GPU term of a wall-clock step; S(N) is host time, unscaled.
        parts = {k: np.where(wall, self.alpha_ * v, v) for k, v in parts.items()}
        parts.update({k: np.where(wall, self.alpha_ * v, 0.0) for k, v in extras.items()})
        parts["light_kernels"] = parts["light_kernels"] + light
        parts["host_floor"] = np.where(
            wall, factors.host_floor_seconds(s.num_requests, *self.host_floor_), 0.0)
        return parts

    def predict(self, cells: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        return sum(self.components(cells, gpu).values()) * 1e3

    def predict_by_op(self, cells: pl.DataFrame, gpu: GpuSpec) -> dict[str, np.ndarray]:
        """The terms ``predict`` sums, in ms; the block terms carry the lineage op names."""
        return {name: seconds * 1e3 for name, seconds in self.components(cells, gpu).items()}

    def device(self, gpu: GpuSpec) -> Device:
        """The target as the model sees it: its datasheet through the frozen constants."""
        return Device.of(gpu, self.constants_)

    def predict_ops(self, points: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        """One measured kernel per point (``<sku>_ops``): a GEMM, or an attention kernel over
        ``batch`` equal requests, timed by the same op functions a step sums."""
        self._refuse_in_sample(gpu, ("home",))
        return self.op_seconds(points, self.device(gpu)) * 1e3

    def op_seconds(self, points: pl.DataFrame, dev: Device) -> np.ndarray:
        c, sw = self.constants_, self.switches
        col = lambda name: points[name].fill_null(1).to_numpy().astype(np.float64)  # noqa: E731
        gemm = (points["op_family"] == "gemm").to_numpy()
        # The harness names op phases attn_prefill / attn_decode (leaderboard.run.op_level).
        prefill = points["phase"].str.ends_with("prefill").to_numpy() & ~gemm
        b, heads, kv_heads, d = col("batch"), col("num_heads"), col("num_kv_heads"), col("head_dim")
        seconds = np.where(gemm, ops.gemm(col("m"), col("n"), col("k"), dev, c, sw)["seconds"], 0.0)
        # A prefill point of ``batch`` equal requests is one kernel: b times the heads' work.
        seconds += np.where(prefill, ops.prefill_attention(
            col("q_len"), 0.0 * b, heads * b, kv_heads * b, d, dev, c, sw)["seconds"], 0.0)
        seconds += np.where(~gemm & ~prefill, ops.decode_attention(
            b, col("kv_len"), heads, kv_heads, d, dev, c, sw)["seconds"], 0.0)
        return seconds

    def request_reading(self, cells: pl.DataFrame, gpu: GpuSpec, budget: int
                        ) -> ReadingRequest | None:
        """Wall-clock targets only: a short decode batch-size sweep, at most ``budget`` cells
        spread from its smallest to its largest batch. The sweep: of the (model, TP) first in
        name order that has decode cells of at least two batch sizes at one per-request
        context, the cells at the context most of its decode cells share (on splitwise:
        bloom-176b TP8, batch 1..64, prompt 512 + 128 generated tokens, 7 cells)."""
        if not self.wall_clock or budget < 1 or "gt_kind" not in cells.columns:
            return None
        decode = cells.filter((pl.col("gt_kind") == "wall_clock") & (pl.col("phase") == "decode")
                              ).with_columns(ctx=pl.col("decode_ctx_sum") // pl.col("num_decode"))
        for _, config_cells in decode.sort("model", "tp").group_by(["model", "tp"],
                                                                   maintain_order=True):
            sweep = config_cells.filter(pl.col("ctx") == config_cells["ctx"].mode().sort()[0])
            if sweep["num_decode"].n_unique() >= 2:
                sweep = sweep.sort("num_decode", "cell_id")
                picks = np.unique(np.linspace(0, len(sweep) - 1, min(budget, len(sweep))).round())
                return ReadingRequest(cells=tuple(sweep["cell_id"].gather(picks.astype(int))))
        return None

    def take_reading(self, reading: Reading, gpu: GpuSpec) -> None:
        """S(N) = s_floor + s_slope (N - 1) by least squares on the reading's measured time
        left over after the GPU terms (the floor alone from a one-batch-size reading)."""
        self.host_floor_ = (0.0, 0.0)
        cells = reading.cells
        rest = cells["gt_ms"].to_numpy() * 1e-3 - sum(self.components(cells, gpu).values())
        n = cells["num_requests"].to_numpy().astype(np.float64)
        design = np.column_stack([np.ones_like(n), n - 1.0])[:, :1 + (np.unique(n).size > 1)]
        fitted = np.linalg.lstsq(design, rest, rcond=None)[0]
        self.host_floor_ = (float(fitted[0]), float(fitted[1]) if len(fitted) > 1 else 0.0)

    # The hooks' modules are imported when called: they import this package's submodules.

    def explain(self, cell: pl.DataFrame, gpu: GpuSpec) -> list[dict]:
        from predictors.ours.explain import explain

        return explain(self, cell, gpu)

    @classmethod
    def report_sections(cls, runs: pl.DataFrame) -> list[str]:
        from predictors.ours.report import sections

        return sections(runs)

    @classmethod
    def calibration_homes(cls) -> dict[str, dict[str, str]]:
        # The points behind the training cells: the protocol the frozen constants were fitted under.
        c = config.load_constants()
        return {"home": {"dataset": c["home"]["dataset"], "home_points": "behind_cells"},
                "fp8": {"dataset": c["fp8"]["dataset"], "home_points": "behind_cells"}}

    @classmethod
    def calibrate_constants(cls, homes: dict[str, Home]) -> dict:
        return calibrate.calibrate(homes)


def _rung(name: str, enabled: tuple[str, ...]) -> type[Ours]:
    """A ladder rung: ``Ours`` with the factors up to this rung on by default."""
    defaults = {f: f in enabled for f in FACTORS}

    def __init__(self, **params):
        Ours.__init__(self, **{**defaults, **params})

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(f, inspect.Parameter.KEYWORD_ONLY, default=v)
               for f, v in defaults.items()]
    __init__.__signature__ = inspect.Signature(params)
    # The rungs are compared on whole steps; the per-op atlas is the full model's.
    cls = type(f"Ours_{name}", (Ours,), {"__init__": __init__, "__doc__": f"ours, ladder {name}",
                                         "predict_by_op": Predictor.predict_by_op})
    return register(f"ours_{name}")(cls)


RUNGS = {name: _rung(name, FACTORS[:i]) for i, name in enumerate(LADDER)}
