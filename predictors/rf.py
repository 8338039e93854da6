"""Vidur's random-forest step-time predictor (MLSys'24, microsoft/vidur), re-implemented from
baselines.md §2 on the home GPU's measured op points.

One forest per op per (model, TP), with Vidur's features: the four GEMMs (Vidur's attn_pre_proj,
attn_post_proj, mlp_up_proj, mlp_down_proj) on ``[num_tokens]``; prefill attention on
``[kv_cache_size, prefill_chunk_size²]``, where a measured point of ``batch`` requests of
``q_len`` tokens is Vidur's one equivalent request with chunk² = batch·q_len²; decode attention
on ``[batch_size, kv_cache_size]``; all-reduce on ``[num_tokens = bytes / (hidden·2)]``.
An MoE model (which Vidur does not model) adds one forest, not Vidur's: the fused-MoE kernel
on ``[num_tokens]`` from the home's MoE points of the model's expert shape and TP, read at the
step's own token count (not rounded to 8) once per MoE layer, with the FFN GEMMs in the dense
layers only; ``rf_scaled`` scales it by the routed experts' roofline ratio.
Vidur's norms, rope, activation, residual add and KV-cache save are left out: aiconfigurator
did not measure them, so the ground truth has no rows to train them on (and no time for them).
On Vidur's own profiles (the ``_vidurprof`` family) the forests are Vidur's token-level ops
instead (``predictors.rf_tokens``).

A step is composed as Vidur does (§2.4), quirks kept: token ops at T rounded up to a multiple
of 8; decode attention once at (decode count, mean context floored then rounded up to 64), although
the ground truth sums one point per context group (``decode_attention="per_context_group"``
evaluates the forest per group instead; off by default); all prefills as one request with
Q = round(sqrt(Σq²)) and K = Σ ceil(c/64)·64; ×1.1 for GQA models when more than one request
shares a kernel; the all-reduce twice per layer plus 0.02 ms NCCL launch each; × layers.

The launch constant is CPU-side time, so it is priced only where the ground truth is wall clock
(``gt_kind`` other than ``gpu_block``: measured serving, Vidur's wall-clock steps; a cell without
``gt_kind`` counts as wall clock). On ``gpu_block`` cells (the CUDA-graph kernel times of the
``_vidur`` families) it is left out unless ``vidur_launch_on_gpu_block=True`` keeps Vidur's
quirk of adding it everywhere.

With several homes each home GPU's points are first scaled to the first home's datasheet by
their roofline-time ratio (``in_first_home_units``), then pooled: the forests learn first-home
times from every home.

``rf_verbatim`` returns the (first) home's predictions for any target GPU (§2.5). ``rf_scaled`` (§2.6 (b))
multiplies each op by its roofline-time ratio, target over home, at the step's real shapes,
using the datasheet peaks of ``Home.gpu`` (the A100 SXM the home points were measured on) and
of the target; the all-reduce forest by the interconnect bandwidth ratio (PCIe for the L40S,
as its spec says), never the 0.02 ms launch constant.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard_core import progress
from leaderboard_core.contract import Home, NotSupported, PredictorCard, expert_groups
from leaderboard_core.specs import is_moe, moe_shapes, tp_shapes
from predictors import _model_cache, rf_tokens
from predictors._forest import (
    GRIDS,
    KV_GRANULARITY,
    LOOKUP_BOUNDS,
    TOKEN_ROUNDING,
    OpForest,
    fit_forest,
    round_up,
    tabulated,
)
from predictors._roofline import (
    ALLREDUCES_PER_LAYER,
    in_first_home_units,
    peaks,
    roofline_ratios,
)
from predictors.base import Predictor
from predictors.registry import register
from predictors.steps import Steps

GEMMS = ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down")
GQA_BATCHING_FACTOR = 0.1
NCCL_LAUNCH_MS = 0.02
DECODE_MODES = ("mean_context", "per_context_group")
PREFILL_BATCHES = ("one", "all")


def ops_of(model: dict, tp: int) -> set[str]:
    """The ops rf prices in a step of this (model, TP), each a forest fitted on home points."""
    dense_ffn = not is_moe(model) or moe_shapes(model, tp)["dense_layers"]
    return ({"gemm_qkv", "gemm_o", "attn_prefill", "attn_decode"}
            | ({"gemm_gate_up", "gemm_down"} if dense_ffn else set())
            | ({"allreduce"} if tp > 1 else set()) | ({"moe"} if is_moe(model) else set()))


def training_rows(home: Home, model: dict, tp: int, prefill_batches: str = "one", ep: int = 1
                  ) -> dict[str, pl.DataFrame]:
    """Per op, the home's measured points of this (model, TP): features x, target y, row id.
    ``prefill_batches="one"`` keeps the prefill points of one request, the only ones Vidur's
    profiler measures (baselines.md §0.3); "all" also feeds batched points as one equivalent
    request, which puts kernels of very different speed on the same feature value. ``ep``: the
    GPUs the MoE experts are spread over whole (1: split over the TP group)."""
    # The shapes the ground truth's lineage is keyed by, so the filters below find its points.
    shapes = tp_shapes(model, tp)
    h, d, heads, kv_heads = shapes["hidden"], model["head_dim"], shapes["heads"], shapes["kv_heads"]
    priced = ops_of(model, tp)
    gemm_nk = {f"gemm_{op}": shapes[op] for op in ("qkv", "o", "gate_up", "down")
               if f"gemm_{op}" in priced}
    ops = {k: v.with_row_index("row") for k, v in in_first_home_units(home).items()}
    same_heads = ((pl.col("num_heads") == heads) & (pl.col("num_kv_heads") == kv_heads)
                  & (pl.col("head_dim") == d))
    rows = {op: ops[op].filter(n=n, k=k).select("row", x=pl.concat_list("m"), y="latency_ms")
            for op, (n, k) in gemm_nk.items()}
    prefill = ops["attn_prefill"].filter(same_heads)
    if prefill_batches == "one":
        prefill = prefill.filter(batch=1)
    rows["attn_prefill"] = prefill.select(
        "row", x=pl.concat_list(pl.col("batch") * pl.col("kv_len"),
                                pl.col("batch") * pl.col("q_len") ** 2), y="latency_ms")
    rows["attn_decode"] = ops["attn_decode"].filter(same_heads).select(
        "row", x=pl.concat_list("batch", "kv_len"), y="latency_ms")
    if tp > 1:
        rows["allreduce"] = ops["allreduce"].filter(num_gpus=tp).select(
            "row", x=pl.concat_list(pl.col("message_bytes") / (h * 2)), y="latency_ms")
    if is_moe(model):  # not Vidur's (it has no expert op): the fused-MoE kernel on [num_tokens]
        e = moe_shapes(model, tp)
        rows["moe"] = ops["moe"].filter(
            hidden_size=e["hidden"], inter_size=model["moe_intermediate_size"], topk=e["topk"],
            num_experts=e["experts"], moe_tp=tp // ep, moe_ep=ep).select(
                "row", x=pl.concat_list("num_tokens"), y="latency_ms")
    return rows


def gemm_precisions(cells: pl.DataFrame) -> set[str]:
    return set(cells["gemm_dtype"].drop_nulls()) if "gemm_dtype" in cells.columns else {"bf16"}


@register("rf_verbatim")
class VidurRandomForest(Predictor):
    card = PredictorCard(
        kind="profiled", reference="Vidur (Agrawal et al., MLSys'24), github.com/microsoft/vidur",
        description="Vidur's per-op random forests fitted on the home GPU's measured op points, "
                    "composed per step as Vidur does; home predictions returned for any GPU",
        needs_profiled_rows=True, precisions=("bf16", "fp8"), layers=("dense", "moe", "moe_ep"))

    param_choices = {"grid": tuple(GRIDS), "decode_attention": tuple(DECODE_MODES),
                     "prefill_batches": tuple(PREFILL_BATCHES)}
    param_bounds = {"random_state": (0, 2**32 - 1)}  # numpy's seed range

    def __init__(self, grid: str = "reduced", random_state: int = 0,
                 decode_attention: str = "mean_context", prefill_batches: str = "one",
                 vidur_launch_on_gpu_block: bool = False):
        self.grid = grid
        self.random_state = random_state
        self.decode_attention = decode_attention
        self.prefill_batches = prefill_batches
        self.vidur_launch_on_gpu_block = vidur_launch_on_gpu_block

    def fit(self, home: Home) -> VidurRandomForest:
        if (self.grid not in GRIDS or self.decode_attention not in DECODE_MODES
                or self.prefill_batches not in PREFILL_BATCHES):
            raise ValueError(f"grid must be one of {sorted(GRIDS)}, decode_attention one of "
                             f"{DECODE_MODES} and prefill_batches one of {PREFILL_BATCHES}; got "
                             f"{self.grid!r}, {self.decode_attention!r}, {self.prefill_batches!r}")
        configs = sorted(set(home.cells.select("model", "tp").iter_rows()))
        self.expert_groups_ = expert_groups(home.cells)
        self.token_level_ = rf_tokens.is_token_profile(home)
        if unknown := sorted({name for name, _ in configs} - set(home.models)):
            raise NotSupported(f"rf needs each home model's shape; home {home.dataset} has no "
                               f"config for {unknown}")
        needed = set().union(*(ops_of(home.models[name], tp) for name, tp in configs))
        missing = sorted(needed - set(home.ops))
        if missing and not self.token_level_:
            raise NotSupported(f"rf needs the home's measured op points {sorted(needed)}, or Vidur's "
                               f"token-level profiles; dataset {home.dataset} has none for {missing} "
                               "(the _vidur and _vidurprof families have them)")
        self.forests_, self.cache_hits_, used = {}, 0, {}
        regressors = [(name, tp, op, rows) for name, tp in configs
                      for op, rows in self._rows_of(home, name, tp).items()]
        with progress.track(f"{self.name}: {self.grid}-grid forests on {home.dataset}",
                            total=len(regressors)) as bar:
            for name, tp, op, rows in regressors:
                if rows.is_empty():
                    raise NotSupported(f"home {home.dataset} has no {op} points for {name} TP{tp}")
                where = f"{name} TP{tp} {op} ({len(rows)} points)"
                bar.note(where)
                x, y = np.array(rows["x"].to_list(), dtype=np.float64), rows["y"].to_numpy()
                key = _model_cache.key_of(op, x.tolist(), y.tolist(), GRIDS[self.grid], self.random_state,
                                          LOOKUP_BOUNDS)
                self.forests_[(name, tp, op)], loaded = _model_cache.load_or_fit(
                    "rf", key, lambda x=x, y=y, op=op, where=where: self._tabulated(
                        op, x, y, lambda done, total: bar.note(f"{where}: CV fit {done}/{total}")))
                self.cache_hits_ += loaded
                used.setdefault(op, set()).update(rows["row"].to_list())
                bar.advance()
        self.trained_on_ = home.sku
        self.models_ = {name: home.models[name] for name, _ in configs}  # the shapes priced
        self.home_peaks_ = peaks(home.gpu)
        self.precisions_ = gemm_precisions(home.cells)  # the GEMMs its forests learned
        self.profiled_rows_ = sum(len(r) for r in used.values())  # distinct points; configs share some
        return self

    def _rows_of(self, home: Home, name: str, tp: int) -> dict[str, pl.DataFrame]:
        if self.token_level_:
            return rf_tokens.token_rows(home, name, tp)
        return training_rows(home, home.models[name], tp, self.prefill_batches,
                             self.expert_groups_[(name, tp)])

    def _tabulated(self, op: str, x: np.ndarray, y: np.ndarray, on_fold) -> OpForest:
        return tabulated(fit_forest(x, y, self.grid, self.random_state, on_fold), op, x.shape[1])

    def predict(self, cells: pl.DataFrame, gpu) -> np.ndarray:
        return sum(self.predict_by_op(cells, gpu).values())

    def predict_by_op(self, cells: pl.DataFrame, gpu) -> dict[str, np.ndarray]:
        """Each op's part of the step (ms), by the lineage op names, for the per-op atlas."""
        return self.op_ms(cells, Steps.from_cells(cells))

    def op_ms(self, cells: pl.DataFrame, steps: Steps) -> dict[str, np.ndarray]:
        """Per op, each cell's predicted home time over all layers (ms)."""
        unlearned = gemm_precisions(cells) - self.precisions_
        if unlearned:
            raise NotSupported(f"rf learned {'/'.join(sorted(self.precisions_))} GEMMs on its home "
                               f"and cannot price {'/'.join(sorted(unlearned))} steps; fit it on a "
                               "home of that precision")
        if self.token_level_:
            return self._token_op_ms(cells, steps)
        out = {op: np.zeros(steps.n) for op in (*GEMMS, "attn_prefill", "attn_decode", "allreduce",
                                                 "allreduce_launch", "moe")}
        sum_q2, kv_sum = steps.sum(steps.pf_q**2), steps.sum(round_up(steps.pf_ctx, KV_GRANULARITY))
        groups = self._decode_groups(cells) if self.decode_attention == "per_context_group" else None
        launch = self._launch_ms(cells)
        configs = (cells.select("model", "tp").with_row_index("i")
                   .group_by("model", "tp", maintain_order=True).agg("i"))
        placement = expert_groups(cells)
        for name, tp, rows in configs.iter_rows():
            if (name, tp, "attn_decode") not in self.forests_:
                raise NotSupported(f"rf was fitted on {sorted({k[:2] for k in self.forests_})}, "
                                   f"not on {name} TP{tp}")
            if placement[(name, tp)] != self.expert_groups_[(name, tp)]:
                raise NotSupported(f"rf learned {name} TP{tp} with its experts over "
                                   f"{self.expert_groups_[(name, tp)]} GPU(s) (moe_ep) and cannot "
                                   f"price them over {placement[(name, tp)]}; fit it on a home of "
                                   "that placement")
            i = np.asarray(rows)
            f = {op: self.forests_.get((name, tp, op)) for op in (*GEMMS, "attn_prefill",
                                                                  "attn_decode", "allreduce", "moe")}
            layers, gqa = steps.layers[i], GQA_BATCHING_FACTOR * (steps.heads[i] > steps.kv_heads[i])
            t8 = round_up(steps.tokens[i], TOKEN_ROUNDING)[:, None]
            priced = ops_of(self.models_[name], tp)
            for op in (g for g in GEMMS if g in priced):  # an MoE model's FFN GEMMs: dense layers
                count = layers if op in ("gemm_qkv", "gemm_o") else steps.dense_layers[i]
                out[op][i] = f[op](t8) * count
            if "moe" in priced:  # at the step's own tokens: rounding 1 up to 8 would route
                # to 8x the experts, a cost Vidur's rounding of its dense token ops never had
                out["moe"][i] = f["moe"](steps.tokens[i][:, None]) * steps.moe_layers[i]
            n_pf, n_dec = steps.num_prefill[i], steps.num_decode[i]
            chunk = np.rint(np.sqrt(sum_q2[i]))  # round half to even, as Python's round
            out["attn_prefill"][i] = (_forest_where(n_pf > 0, f["attn_prefill"], kv_sum[i], chunk**2)
                                      * (1 + gqa * (n_pf > 1)) * layers)
            out["attn_decode"][i] = (self._decode_attention(f["attn_decode"], steps, i, groups)
                                     * (1 + gqa * (n_dec > 1)) * layers)
            if tp > 1:
                out["allreduce"][i] = f["allreduce"](t8) * ALLREDUCES_PER_LAYER * layers
                out["allreduce_launch"][i] = launch[i] * ALLREDUCES_PER_LAYER * layers
        return out

    def _launch_ms(self, cells: pl.DataFrame) -> np.ndarray:
        """Vidur's NCCL launch per all-reduce, on the cells whose ground truth includes CPU time."""
        wall_clock = (np.ones(len(cells), bool) if "gt_kind" not in cells.columns
                      else (cells["gt_kind"] != "gpu_block").fill_null(True).to_numpy())
        return np.where(wall_clock | self.vidur_launch_on_gpu_block, NCCL_LAUNCH_MS, 0.0)

    def _token_op_ms(self, cells: pl.DataFrame, steps: Steps) -> dict[str, np.ndarray]:
        """Vidur's token-level ops, each at T rounded up to 8, times the layers."""
        out = {op: np.zeros(steps.n) for op in {op for *_, op in self.forests_}}
        t8 = round_up(steps.tokens, TOKEN_ROUNDING)[:, None]
        configs = (cells.select("model", "tp").with_row_index("i")
                   .group_by("model", "tp", maintain_order=True).agg("i"))
        for name, tp, rows in configs.iter_rows():
            mine = {op: f for (n, t, op), f in self.forests_.items() if (n, t) == (name, tp)}
            if not mine:
                raise NotSupported(f"rf was fitted on {sorted({k[:2] for k in self.forests_})}, "
                                   f"not on {name} TP{tp}")
            i = np.asarray(rows)
            for op, forest in mine.items():
                out[op][i] = forest(t8[i]) * steps.layers[i]
        return out

    @staticmethod
    def _decode_attention(forest: OpForest, steps: Steps, i: np.ndarray, groups: pl.DataFrame | None
                          ) -> np.ndarray:
        """One kernel per cell at (decode count, mean context) as Vidur; or, with the context
        groups given, one per group at (its count, its context), summed as the ground truth is."""
        n_dec = steps.num_decode[i]
        if groups is None:
            mean_ctx = np.floor(steps.decode_ctx[i] / np.maximum(n_dec, 1))
            return _forest_where(n_dec > 0, forest, n_dec, round_up(mean_ctx, KV_GRANULARITY))
        g = groups.filter(pl.col("cell").is_in(i))
        per_group = forest(np.stack([g["batch"], round_up(g["ctx"], KV_GRANULARITY)], axis=1)) \
            if len(g) else np.zeros(0)
        return np.bincount(g["cell"].to_numpy(), per_group, minlength=steps.n)[i]

    @staticmethod
    def _decode_groups(cells: pl.DataFrame) -> pl.DataFrame:
        """One row per (cell, context) among decode requests, with how many share it."""
        return (cells.select(pl.int_range(pl.len()).alias("cell"), "q_lens", "ctx_lens")
                .explode("q_lens", "ctx_lens").filter((pl.col("q_lens") == 1) & (pl.col("ctx_lens") > 0))
                .group_by("cell", pl.col("ctx_lens").alias("ctx"), maintain_order=True)
                .agg(batch=pl.len()))


def _forest_where(mask: np.ndarray, forest: OpForest, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The forest at (first, second) where ``mask``, else 0: features of empty ops never reach it."""
    out = np.zeros(len(mask))
    if mask.any():
        out[mask] = forest(np.stack([first[mask], second[mask]], axis=1))
    return out


@register("rf_scaled")
class VidurRandomForestScaled(VidurRandomForest):
    card = PredictorCard(
        kind="profiled", reference="Vidur (Agrawal et al., MLSys'24), github.com/microsoft/vidur; "
                                   "cross-GPU scaling is baselines.md §2.6 (b), not Vidur's",
        description="rf_verbatim's per-op home times, each scaled by its roofline-time ratio "
                    "(target over home datasheet peaks); all-reduce by interconnect bandwidth",
        needs_profiled_rows=True, precisions=("bf16", "fp8"), layers=("dense", "moe", "moe_ep"))

    def predict_by_op(self, cells: pl.DataFrame, gpu) -> dict[str, np.ndarray]:
        steps = Steps.from_cells(cells)
        home_ms = self.op_ms(cells, steps)
        target = peaks(gpu)
        if steps.fp8.any() and np.isnan(target["fp8_flops"]):
            raise NotSupported(f"{gpu.sku} has no fp8_dense_tflops in its spec: rf_scaled cannot "
                               "scale FP8 GEMMs to it (add the datasheet FP8 dense peak)")
        ratios = roofline_ratios(steps, self.home_peaks_, target)
        if self.token_level_:
            ratios = rf_tokens.scaled_ratios(ratios, self.home_peaks_, target)
        ratios["allreduce"] = self.home_peaks_["link_bw"] / target["link_bw"]
        ratios["allreduce_launch"] = 1.0  # Vidur's CPU-side NCCL launch constant
        return {op: ms * ratios[op] for op, ms in home_ms.items()}


@register("rf_exact")
class VidurRandomForestExact(VidurRandomForestScaled):
    """rf_scaled with forests fitted without bootstrap (``grid="exact"``): a labelled variant,
    not Vidur's configuration. On a sparse grid (21 GEMM m values, 2x apart) bootstrap leaves
    about a third of the points out of each tree, which then averages neighbours 2x away; without
    it every measured point is reproduced, so this is the forest at its in-sample strength."""

    card = PredictorCard(
        kind="profiled", reference="Vidur (Agrawal et al., MLSys'24) with bootstrap off; "
                                   "docs/baselines.md (rf_exact)",
        description="rf_scaled with trees fitted without bootstrap: every home point exact, "
                    "each op scaled to the target by its roofline-time ratio",
        needs_profiled_rows=True, precisions=("bf16", "fp8"), layers=("dense", "moe", "moe_ep"))

    def __init__(self, grid: str = "exact", random_state: int = 0,
                 decode_attention: str = "mean_context", prefill_batches: str = "one",
                 vidur_launch_on_gpu_block: bool = False):
        super().__init__(grid, random_state, decode_attention, prefill_batches,
                         vidur_launch_on_gpu_block)
