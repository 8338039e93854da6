"""``neusight_tiles``: a NeuSight-style learned predictor (Lee et al., ASPLOS'25), re-implemented
from the paper's description: a kernel runs as tiles in waves over the SMs; a small network
predicts how far each kernel stays from its tiled roofline, from the tile shape and the GPU's
datasheet; the prediction never undercuts the roofline.

Per op point (each op a step runs, composed as the ``_vidur`` cells are: ``predictors._step_ops``):

- tiles: a GEMM's output in ``TILE`` x ``TILE`` blocks; a prefill attention's query rows in
  ``TILE``-row blocks per request and head; a decode attention's requests x KV heads; an
  all-reduce one tile per GPU (a collective has no wave structure to learn);
- waves = ceil(tiles / SMs) on the GPU the point runs on, and the tiled roofline = the op's
  roofline (``_roofline.point_seconds``) x waves x SMs / tiles, which charges the last wave's
  idle SMs;
- an MLP per op family (scikit-learn's ``MLPRegressor``, standardized inputs) learns
  log(measured / tiled roofline) from log m, n, k (or batch, query, context, heads), log tiles,
  log waves, the last wave's fill, the tile's arithmetic intensity over the GPU's ridge point,
  and, with two or more home GPUs, the GPU's SMs, peak FLOP/s, bandwidth and L2 (one home
  holds them constant, and a network never taught them would answer a new GPU's values
  arbitrarily: it then learns the shape alone, and the waves and roofline carry the GPU);
- prediction = max(tiled roofline x exp(MLP), roofline).

Trained only on the home GPUs' measured op points (their whole grid under ``full_grid``), never
on the target. What differs from NeuSight: the tile size is one fixed 128 (NeuSight reads the
kernel's own tile from its launch), the network predicts the kernel's distance from its tiled
roofline rather than a per-tile utilisation, and NeuSight's own FP32 GEMMs of other GPUs are not
used (they are not a home's data). BF16 only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from leaderboard_core.contract import Home, NotSupported, PredictorCard
from leaderboard_core.specs import GpuSpec, load_models
from predictors._roofline import peaks, point_seconds
from predictors._step_ops import step_points
from predictors.base import Predictor
from predictors.registry import register

TILE = 128
FAMILIES = ("gemm", "attn_prefill", "attn_decode", "allreduce")
SHAPE_AXES = {"gemm": ("m", "n", "k"), "attn_prefill": ("batch", "q_len", "kv_len", "num_heads"),
              "attn_decode": ("batch", "kv_len", "num_kv_heads"), "allreduce": ("message_bytes",
                                                                                "num_gpus")}
NO_LM_HEAD_SLICING = float("inf")  # the network prices any width: the LM head is one GEMM


def family_of(op: str) -> str:
    return "gemm" if op.startswith("gemm") else op


def tiles(family: str, points: pl.DataFrame) -> np.ndarray:
    col = lambda c: points[c].to_numpy().astype(np.float64)  # noqa: E731
    if family == "gemm":
        return np.ceil(col("m") / TILE) * np.ceil(col("n") / TILE)
    if family == "attn_prefill":
        return col("batch") * col("num_heads") * np.ceil(col("q_len") / TILE)
    if family == "attn_decode":
        return col("batch") * col("num_kv_heads")
    return col("num_gpus")


def _gpu_row(gpu: GpuSpec) -> dict[str, float]:
    p = peaks(gpu)
    return {"sms": float(gpu["sm_count"]), "flops": p["flops"], "mem_bw": p["mem_bw"],
            "l2": float(gpu["l2_mb"]), "peaks": p}


def features(family: str, points: pl.DataFrame, gpu: dict, device: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inputs of the network, tiled roofline seconds, roofline seconds) of each point; the
    GPU's datasheet among the inputs with ``device``."""
    roof = point_seconds(family, points, gpu["peaks"])
    n_tiles = np.maximum(tiles(family, points), 1.0)
    waves = np.ceil(n_tiles / gpu["sms"])
    tiled = roof * waves * gpu["sms"] / n_tiles if family != "allreduce" else roof
    fill = n_tiles / (waves * gpu["sms"])
    shape = np.log(np.maximum(points.select(SHAPE_AXES[family]).to_numpy().astype(np.float64), 1.0))
    if family == "gemm":
        m, n, k = (points[c].to_numpy().astype(np.float64) for c in ("m", "n", "k"))
        intensity = 2 * m * n * k / (2.0 * (m * k + n * k + m * n))
    else:
        intensity = np.ones(len(points))
    ridge = gpu["flops"] / gpu["mem_bw"]
    x = np.column_stack([shape, np.log(n_tiles), np.log(waves), fill, np.log(intensity / ridge)])
    if device:
        sheet = np.log([gpu["sms"], gpu["flops"], gpu["mem_bw"], gpu["l2"]])
        x = np.column_stack([x, np.tile(sheet, (len(points), 1))])
    return x, np.maximum(tiled, 1e-12), np.maximum(roof, 1e-12)


@dataclass
class Network:
    """A fitted ``StandardScaler`` + ``MLPRegressor`` (ReLU, identity output) as its arrays,
    evaluated with the operations of scikit-learn's own ``predict``, in its order, so to the bit
    (``tests/predictors/test_neusight_tiles.py``): a kept fit then loads, and a run predicts,
    without importing scikit-learn (about 1.5 s of a run)."""

    mean: np.ndarray
    scale: np.ndarray
    coefs: list[np.ndarray]
    intercepts: list[np.ndarray]

    @classmethod
    def of(cls, pipeline) -> Network:
        scaler, mlp = pipeline[0], pipeline[-1]
        if (mlp.activation, mlp.out_activation_) != ("relu", "identity") or not (
                scaler.with_mean and scaler.with_std):
            raise ValueError("Network evaluates a centred and scaled ReLU regressor only")
        return cls(scaler.mean_, scaler.scale_, list(mlp.coefs_), list(mlp.intercepts_))

    def predict(self, x: np.ndarray) -> np.ndarray:
        activation = np.array(x, dtype=np.float64)
        if not np.isfinite(activation).all():  # refused, as scikit-learn refuses them
            raise ValueError("the network's inputs hold NaN or infinity")
        activation -= self.mean
        activation /= self.scale
        last = len(self.coefs) - 1
        for i, (weights, bias) in enumerate(zip(self.coefs, self.intercepts, strict=True)):
            activation = activation @ weights
            activation += bias
            if i != last:
                np.maximum(activation, 0, out=activation)
        return activation.ravel()


@register("neusight_tiles")
class NeuSightTiles(Predictor):
    card = PredictorCard(
        kind="profiled",
        reference="NeuSight (Lee et al., ASPLOS'25): tile decomposition, waves over the SMs, a "
                  "learned distance from the tiled roofline, bounded by the roofline; "
                  "re-implemented from the paper",
        description="per op: an MLP on tile shape and datasheet features predicts log(measured / "
                    "tiled roofline), fitted on the home GPUs' op points; never below the "
                    "roofline", needs_profiled_rows=True)

    param_bounds = {"hidden": (4, 1024)}

    def __init__(self, hidden: int = 64, seed: int = 0):
        self.hidden, self.seed = hidden, seed

    def fit(self, home: Home) -> NeuSightTiles:
        by_family: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        gpus = home.gpus or {home.sku: home.gpu}
        self.device_inputs_ = len(gpus) > 1
        for op, frame in home.ops.items():
            family = family_of(op)
            if family not in FAMILIES or frame.is_empty():
                continue
            frame = frame.fill_null(0)
            # in the frame's order: the network's fit depends on the order of its rows
            for sku, rows in (frame.group_by("sku", maintain_order=True)
                              if "sku" in frame.columns and len(gpus) > 1
                              else [((home.sku,), frame)]):
                x, tiled, _ = features(family, rows, _gpu_row(gpus[sku[0]]), self.device_inputs_)
                y = np.log(rows["latency_ms"].to_numpy() * 1e-3 / tiled)
                by_family.setdefault(family, []).append((x, y))
        if "gemm" not in by_family:
            raise NotSupported(f"neusight_tiles learns from the home's measured op points; dataset "
                               f"{home.dataset} has none (the _vidur and _ops families have them)")
        from sklearn.neural_network import MLPRegressor  # noqa: PLC0415 - to fit only (Network)
        from sklearn.pipeline import make_pipeline  # noqa: PLC0415
        from sklearn.preprocessing import StandardScaler  # noqa: PLC0415

        self.networks_ = {}
        for family, parts in by_family.items():
            x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
            network = make_pipeline(StandardScaler(), MLPRegressor(
                hidden_layer_sizes=(self.hidden, self.hidden), max_iter=400, early_stopping=True,
                tol=1e-6, n_iter_no_change=20,
                random_state=self.seed))
            self.networks_[family] = Network.of(network.fit(x, y))
        self.trained_on_ = "+".join(sorted(gpus))
        self.profiled_rows_ = sum(len(f) for f in home.ops.values())
        return self

    def _seconds(self, family: str, points: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        if family not in self.networks_:
            raise NotSupported(f"the home measured no {family} points to learn from")
        x, tiled, roof = features(family, points, _gpu_row(gpu), self.device_inputs_)
        return np.maximum(tiled * np.exp(self.networks_[family].predict(x)), roof)

    def predict(self, cells: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        if "gemm_dtype" in cells.columns and (cells["gemm_dtype"].fill_null("bf16") != "bf16").any():
            raise NotSupported("neusight_tiles is trained and priced on BF16 GEMMs only")
        total = np.zeros(len(cells))
        parts = step_points(cells, load_models(), NO_LM_HEAD_SLICING)
        for family in FAMILIES:  # one network call per family
            mine = [(i, calls, q) for f, i, calls, q in parts if f == family and len(i)]
            if mine:
                seconds = self._seconds(family, pl.concat([q for *_, q in mine],
                                                          how="diagonal_relaxed"), gpu)
                np.add.at(total, np.concatenate([i for i, *_ in mine]),
                          seconds * 1e3 * np.concatenate([c for _, c, _ in mine]))
        return total

    def predict_ops(self, points: pl.DataFrame, gpu: GpuSpec) -> np.ndarray:
        out = np.zeros(len(points))
        indexed = points.with_row_index("_p")
        for (phase,), rows in indexed.group_by("phase"):
            out[rows["_p"].to_numpy()] = self._seconds(family_of(phase), rows.fill_null(0), gpu) * 1e3
        return out
