"""Silicon rows no replay can explain, found from the rows themselves.

In one TRT-LLM campaign (Llama-3.1-8B on H100) a group's mean TTFT *falls* as the closed loop's
concurrency c grows, at every output length, and is close to ``a + b (osl - 1) TPOT / (c - 1)``:
the first token waits for a share b of one other request's whole decode, as if one of the c
slots were unusable. A step-time replay cannot produce that: more clients in flight never
shorten the wait for a first token there. Such a group's rows are left out, with the fit that
describes them, and the serving card lists each group.

The test is the impossibility itself: at every output length TTFT at the group's largest
c <= ``MAX_CONCURRENCY`` is below TTFT at its smallest c > 1, over at least two output lengths
and two concurrencies each, and the fitted b is above ``MIN_SLOPE`` (half of a decode: a wait
that long cannot be scheduling noise). A group's c = 1 row (no other request to wait for) and
its rows above ``MAX_CONCURRENCY`` stay in: the campaign's own later rows are erratic, not
explained by the slope, and the card says so.

A second test is physical. A decode step reads every weight it multiplies by and every cached
token of every request in the batch, so it can take no less than those bytes over the GPU's
datasheet memory bandwidth. Over a request's decode its batch averages ``concurrency``
requests at ``isl + osl / 2`` tokens each, if all of them are in flight together (the test is
made only where their BF16 KV at full length fits beside the weights, and it assumes the
stated load is the engine's), so its mean TPOT, stalls included, is at least that floor. A run
measured well below the floor with the BF16 KV cache the replay gives it ran something its
record omits or misstates: a smaller KV cache (FP8), speculative decoding, another load or
another GPU. Its campaign's runs share their launch, so all of them are left out, and the card
lists the runs below the floor with it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard.cells import memory
from leaderboard_core.specs import GpuSpec, is_moe, moe_shapes

GROUP = ("sku", "model_path", "backend", "backend_version", "precision", "tp", "isl")
MAX_CONCURRENCY = 32
MIN_SLOPE = 0.5
REASON = (f"TTFT falls as concurrency grows (c <= {MAX_CONCURRENCY}, every output length) and "
          f"follows a + b (osl - 1) TPOT / (c - 1) with b > {MIN_SLOPE}: a closed-loop artefact "
          "no step replay produces")


def slope_fit(osl: np.ndarray, tpot: np.ndarray, c: np.ndarray, ttft: np.ndarray
              ) -> tuple[float, float, float]:
    """Least squares of TTFT on x = (osl - 1) TPOT / (c - 1): (a, b, R²)."""
    x = (osl - 1) * tpot / (c - 1)
    design = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, ttft, rcond=None)
    residual = ttft - design @ np.array([a, b])
    spread = ((ttft - ttft.mean()) ** 2).sum()
    return float(a), float(b), float(1 - (residual**2).sum() / spread) if spread else 0.0


def _falls_with_load(group: pl.DataFrame) -> bool:
    by_osl = [g.sort("c") for _, g in group.group_by("osl") if g["c"].n_unique() >= 2]
    return len(by_osl) >= 2 and all(g["ttft_ms"][-1] < g["ttft_ms"][0] for g in by_osl)


def slope_artefacts(runs: pl.DataFrame) -> dict[int, tuple[float, float, float]]:
    """Row number -> the group's fit (a, b, R²), for every row at 1 < c <= ``MAX_CONCURRENCY``
    of a group whose TTFT falls with load and follows the slope. Only rows not already left
    out (``why`` null) are read."""
    load = pl.coalesce("concurrency", "batch_size")
    candidates = runs.filter(pl.col("why").is_null() & (load > 1) & (load <= MAX_CONCURRENCY)
                             & pl.col("ttft_ms").is_not_null() & pl.col("tpot_ms").is_not_null())
    out = {}
    for _, group in candidates.with_columns(c=load).group_by(GROUP, maintain_order=True):
        if not _falls_with_load(group):
            continue
        a, b, r2 = slope_fit(*(group[k].to_numpy().astype(float)
                               for k in ("osl", "tpot_ms", "c", "ttft_ms")))
        if b > MIN_SLOPE:
            out.update(dict.fromkeys(group["row"].to_list(), (a, b, r2)))
    return out


def fit_table(runs: pl.DataFrame, fits: dict[int, tuple[float, float, float]]) -> str:
    """Markdown: each flagged group's fit."""
    rows = ["| GPU | model | backend | TP | isl | rows | a ms | b | R² |",
            "|---|---|---|---|---|---|---|---|---|"]
    flagged = runs.filter(pl.col("row").is_in(list(fits)))
    for key, group in flagged.group_by(GROUP, maintain_order=True):
        sku, model, backend, version, _, tp, isl = key
        a, b, r2 = fits[group["row"][0]]
        rows.append(f"| {sku} | {model} | {backend} {version} | {tp} | {isl} | {len(group)} | "
                    f"{a:.0f} | {b:.2f} | {r2:.3f} |")
    return "\n".join(rows) if flagged.height else "None."


# A campaign: the runs one launch recipe made (the file records no job, so runs of the same GPU,
# checkpoint, backend version and precision count as one).
CAMPAIGN = ("sku", "model_path", "backend", "backend_version", "precision")
# A run must lie this far below its floor: the datasheet bandwidth is a rounded figure and a
# measured mean carries its noise.
FLOOR_MARGIN = 0.95
FLOOR_REASON = ("a run of its campaign (GPU, checkpoint, backend version, precision) measured a "
                "mean TPOT below the least time the GPU's memory bandwidth allows its decode "
                "step with the BF16 KV cache the replay runs: the record omits or misstates "
                "something of the launch (the KV cache dtype, speculative decoding, the load "
                "or the GPU), and the campaign's runs share their launch")


def streamed_weight_bytes(model: dict, tp: int, gemm_dtype: str, moe_ep: int = 1) -> float:
    """The weights one decode step reads on one GPU, at least: the linear layers and the LM
    head; of an MoE layer the attention projections, and, where every GPU holds a slice of
    every expert, the top-k and shared experts' slices (which other experts a step reads
    depends on the routing; experts spread whole over GPUs may all sit elsewhere)."""
    if not is_moe(model):
        return model["num_layers"] * memory.layer_weight_bytes(model, tp, gemm_dtype) \
            + memory.lm_head_bytes(model, tp)
    attention, dense_ffn = memory.projection_elements(model, tp)
    e = moe_shapes(model, tp)
    experts = (e["topk"] + e["shared"]) * 3 * e["hidden"] * e["inter"] if moe_ep == 1 else 0
    return ((model["num_layers"] * attention + e["dense_layers"] * dense_ffn
             + e["moe_layers"] * experts) * memory.GEMM_BYTES[gemm_dtype]
            + memory.lm_head_bytes(model, tp))


def room_gib(model: dict, tp: int, gemm_dtype: str, concurrency: int, tokens: int,
             gpu: GpuSpec) -> float:
    """GiB left on one GPU, of ``memory.UTILIZATION`` of its memory, beside the weights and the
    BF16 KV of ``concurrency`` requests of ``tokens`` each (activations and CUDA graphs take
    some of it in a real engine)."""
    return memory.room_bytes(model, tp, [0] * concurrency, [tokens] * concurrency,
                             gpu["mem_gb"], gemm_dtype) / 2**30


def decode_floor_ms(model: dict, tp: int, gemm_dtype: str, concurrency: int, isl: int, osl: int,
                    gpu: GpuSpec, moe_ep: int = 1) -> float | None:
    """The least mean decode step (ms) of a closed loop of ``concurrency`` requests with a BF16
    KV cache: the weights it reads and the requests' KV at their mean decode context
    (``isl + osl / 2``), over the datasheet bandwidth. None when the BF16 KV of every request
    at its full length does not fit beside the weights (``room_gib`` negative): then fewer may
    have run at once, and the floor does not hold."""
    if room_gib(model, tp, gemm_dtype, concurrency, isl + osl, gpu) < 0:
        return None
    kv = memory.kv_bytes(model, tp, [0] * concurrency, [isl + osl / 2] * concurrency)
    return (streamed_weight_bytes(model, tp, gemm_dtype, moe_ep) + kv) \
        / gpu.mem_bw_bytes_per_s * 1e3


def below_decode_floor(runs: pl.DataFrame, gpus: dict[str, GpuSpec], models: dict[str, dict]
                       ) -> dict[int, float]:
    """Row number -> its decode floor (ms), for every row not already left out (``why`` null)
    whose measured mean TPOT lies below ``FLOOR_MARGIN`` of ``decode_floor_ms`` (a TPOT of 0
    records no decode, it is not a fast one)."""
    out = {}
    for r in runs.filter(pl.col("why").is_null() & (pl.col("tpot_ms") > 0)
                         & (pl.col("osl") > 1)).iter_rows(named=True):
        floor = decode_floor_ms(models[r["model"]], r["tp"], r["precision"], r["batch_size"],
                                r["isl"], r["osl"], gpus[r["sku"]], r["moe_ep"] or 1)
        if floor is not None and r["tpot_ms"] < FLOOR_MARGIN * floor:
            out[r["row"]] = floor
    return out


def campaign_rows(runs: pl.DataFrame, rows: list[int]) -> list[int]:
    """Every row not already left out that shares a ``CAMPAIGN`` with one of ``rows``."""
    hit = runs.filter(pl.col("row").is_in(rows)).select(CAMPAIGN).unique()
    return runs.filter(pl.col("why").is_null()).join(hit, on=list(CAMPAIGN), how="semi",
                                                     nulls_equal=True)["row"].to_list()


def floor_table(runs: pl.DataFrame, floors: dict[int, float], gpus: dict[str, GpuSpec],
                models: dict[str, dict]) -> str:
    """Markdown: each run below its decode floor, with the floor, the measured TPOT and the
    memory its premise leaves."""
    rows = ["| GPU | model | backend | precision | TP | isl | osl | concurrency | floor ms | "
            "measured TPOT ms | room left GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs.filter(pl.col("row").is_in(list(floors))).sort("row").iter_rows(named=True):
        room = room_gib(models[r["model"]], r["tp"], r["precision"], r["batch_size"],
                        r["isl"] + r["osl"], gpus[r["sku"]])
        rows.append(f"| {r['sku']} | {r['model_path']} | {r['backend']} {r['backend_version']} | "
                    f"{r['precision']} | {r['tp']} | {r['isl']} | {r['osl']} | {r['batch_size']} "
                    f"| {floors[r['row']]:.2f} | {r['tpot_ms']:.2f} | {room:.1f} |")
    return "\n".join(rows) if floors else "None."
