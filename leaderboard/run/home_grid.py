"""The home GPU's whole measured grid, as Vidur's profiler would have collected it.

Vidur profiles its home GPU once, over a full grid of token counts, batch sizes and KV lengths,
and predicts any step from that. ``home_points=full_grid`` gives ``fit`` the same: every measured
point of the home GPU (the store's ``gemm``, ``attention`` and ``collective`` tables, at the
backend version the home dataset was built from) that the home's models can use: the GEMMs at
their four projection shapes and the home cells' precision (``gemm_dtype``), bf16 attention
over a bf16 KV cache at their head counts, and the graph-mode custom all-reduce at their TP
degrees. The frames have the columns of the lineage
keys (``leaderboard.run.homes.op_points``) plus the dtypes, so predictors read them the same way.
Then the held-out home cells are in-sample: their points are in the grid, as they are for Vidur.

``home_points=behind_cells`` keeps the earlier protocol: only the points the training cells were
summed from. ``home_points=held_out_shapes`` measures a home out of sample, as aiconfigurator's
hold-one-out tests do: the home's cells are split by (model, TP) configuration instead of by
workload, and fit gets the full grid of the training configurations less every point of a shape
a held-out cell reads (its GEMMs' n and k, its head layout, its all-reduce sizes at its TP),
and the training cells that read one of those points are dropped too (their ground truth is
made of them), so every op of a scored cell is a shape fit never saw.
``home_points=every_shape`` gives every measured point of the home GPU at that
version, whatever the shape or precision (every GEMM n and k of every dtype, every bf16 head
layout over a BF16 or an FP8 KV cache, every all-reduce group, every fused-MoE kernel under
balanced routing): the serving oracle's home (``leaderboard.run.oracle``), whose targets
run models, precisions, expert placements and (the replay's ``fp8_kv`` engine choice) KV
caches the home's cells never do. A GPU no aiconfigurator table holds (the RTX4090)
gives instead the vLLM profile LLMServingSim took of it (``cells.ops.profile_points_at``): its
projections and LM head as GEMMs of the profiled model, its prefill and decode attention.
"""

from __future__ import annotations

import polars as pl

from leaderboard.cells import families
from leaderboard.cells.grid import GEMM_DTYPES
from leaderboard_core.contract import HELD_OUT_SHAPES, HOME_POINTS
from leaderboard_core.specs import DEFAULT_KV_DTYPE, FP8_KV, tp_shapes

# The key columns that make an op point a shape, per lineage op family.
SHAPE_KEYS = {"gemm": ("n", "k"), "attn": ("num_heads", "num_kv_heads"),
              "allreduce": ("num_gpus", "message_bytes")}
GEMM_OPS = {"gemm_qkv": "qkv", "gemm_o": "o", "gemm_gate_up": "gate_up", "gemm_down": "down"}
OPS_SUFFIX = "_ops"
BF16 = "bfloat16"
HEAD_DIM = 128  # the only head size the cells use
GEMM_COLUMNS = ("dtype", "k", "m", "n", "sku", "version")
ATTENTION_COLUMNS = ("batch", "dtype", "head_dim", "kv_dtype", "kv_len", "num_heads",
                     "num_kv_heads", "phase", "q_len", "sku", "version")
COLLECTIVE_COLUMNS = ("backend", "message_bytes", "num_gpus", "sku", "version")
MOE_COLUMNS = ("dtype", "hidden_size", "inter_size", "moe_ep", "moe_tp", "num_experts",
               "num_tokens", "sku", "topk", "version")


def require_choice(home_points: str) -> None:
    if home_points not in HOME_POINTS:
        raise ValueError(f"split.home_points must be one of {HOME_POINTS}, got '{home_points}'")


def grid_version(row: dict) -> str:
    versions = row["backend_versions"]
    if len(versions) != 1:
        raise ValueError(f"home dataset {row['name']} was built from backend versions {versions}; "
                         "full_grid needs exactly one (pass split.home_points=behind_cells)")
    return versions[0]


def full_grid(catalog, row: dict, configs: list[tuple[str, int]] | None, models: dict,
              gemm_dtype: str = "bf16") -> dict[str, pl.DataFrame]:
    """Per op (the lineage's names), every measured home point of the (model, TP) configs, the
    GEMMs at ``gemm_dtype`` (the home cells' precision); ``configs=None``: of every shape and
    every precision (each GEMM op gets the whole GEMM table, ``moe`` every fused-MoE point)."""
    sku, version = row["sku"], grid_version(row)
    shapes = [tp_shapes(models[name], tp) for name, tp in configs or []]
    fam = families.of(row["name"])
    points = (catalog.profile_points_at(sku, version, models) if fam and fam.profile_grid
              else catalog.op_points_at(sku, version)).rename({"backend_version": "version"})
    if points.is_empty():
        raise ValueError(f"the catalog (store or export) has no {sku} GEMM and attention points "
                         f"at version {version}, "
                         f"the version home {row['name']} was built from; pass "
                         "split.home_points=behind_cells")
    gemm = points.filter(op_family="gemm")
    if configs is not None:
        gemm = gemm.filter(dtype=GEMM_DTYPES[gemm_dtype])
    out = {}
    for op, shape in GEMM_OPS.items():
        if configs is None:
            out[op] = _select(gemm, GEMM_COLUMNS)
            continue
        nk = pl.DataFrame(sorted({s[shape] for s in shapes}), schema=["n", "k"], orient="row")
        out[op] = _select(gemm.join(nk, on=["n", "k"], how="semi"), GEMM_COLUMNS)
    # The oracle's home (configs None) also gets the FP8-KV points, which it keys on.
    kv_dtypes = [DEFAULT_KV_DTYPE] if configs is not None else [DEFAULT_KV_DTYPE, FP8_KV]
    attention = points.filter(
        (pl.col("op_family") == "attention") & (pl.col("dtype") == BF16)
        & pl.col("kv_dtype").is_in(kv_dtypes) & (pl.col("head_dim") == HEAD_DIM)
        & (pl.col("window_size").fill_null(0) == 0))
    if configs is not None:
        heads = pl.DataFrame(sorted({(s["heads"], s["kv_heads"]) for s in shapes}),
                             schema=["num_heads", "num_kv_heads"], orient="row")
        attention = attention.join(heads, on=list(heads.columns), how="semi")
    for phase in ("prefill", "decode"):
        out[f"attn_{phase}"] = _select(attention.filter(phase=phase), ATTENTION_COLUMNS)
    tps = None if configs is None else sorted({tp for _, tp in configs if tp > 1})
    if tps is None or tps:
        collectives = catalog.collective_points(sku, version)
        out["allreduce"] = _select(collectives if tps is None else
                                   collectives.filter(pl.col("num_gpus").is_in(tps)),
                                   COLLECTIVE_COLUMNS)
    if configs is None and not (experts := catalog.moe_points_at(sku, version)).is_empty():
        out["moe"] = _select(experts, MOE_COLUMNS)
    return dict(sorted(out.items()))


def shapes_of(points: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """Per op family (``SHAPE_KEYS``), the distinct shapes the op points (as
    ``homes.op_points`` gives them) read."""
    out: dict[str, list[pl.DataFrame]] = {}
    for op, frame in points.items():
        family = _family(op)
        out.setdefault(family, []).append(frame.select(SHAPE_KEYS[family]))
    return {family: pl.concat(frames).unique() for family, frames in out.items()}


def without_shapes(grid: dict[str, pl.DataFrame], shapes: dict[str, pl.DataFrame]
                   ) -> dict[str, pl.DataFrame]:
    """``grid`` less every point of one of ``shapes`` (a GEMM's n and k leave all four GEMM
    ops)."""
    out = {}
    for op, points in grid.items():
        family = _family(op)
        out[op] = (points.join(shapes[family], on=list(SHAPE_KEYS[family]), how="anti")
                   if family in shapes else points)
    return out


def cells_reading(lineage: pl.DataFrame, shapes: dict[str, pl.DataFrame]) -> set[str]:
    """The cells of ``lineage`` that read a point of one of ``shapes``."""
    hits: set[str] = set()
    for (op,), group in lineage.group_by("op"):
        family = _family(op)
        if family not in shapes:
            continue
        keys = group["key"].str.json_decode(infer_schema_length=None).struct.unnest()
        read = pl.concat([group.select("cell_id"), keys.select(SHAPE_KEYS[family])],
                         how="horizontal")
        hits |= set(read.join(shapes[family], on=list(SHAPE_KEYS[family]), how="semi")["cell_id"])
    return hits


def _family(op: str) -> str:
    for family in SHAPE_KEYS:
        if op.startswith(family):
            return family
    raise ValueError(f"op '{op}' has no shape keys for {HELD_OUT_SHAPES} (known op families: "
                     f"{sorted(SHAPE_KEYS)}); its dataset has no op grid to hold shapes out of")


def _select(frame: pl.DataFrame, keys: tuple[str, ...]) -> pl.DataFrame:
    return frame.select(*keys, "latency_ms").unique(keys).sort(keys)
