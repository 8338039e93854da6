"""Re-derive the fitted constants of ``ours`` from the home GPUs' op points, and freeze them.

``python -m leaderboard.calibrate predictor=ours`` builds two homes exactly as a leaderboard run
does (the training split, seed 0, 30 % held out, the points behind its cells): a100_vidur, the
home of every BF16 constant, and h100_vidur_fp8, the FP8 family's home (the A100 has no FP8).
``Ours.calibrate_constants`` fits each op family's few constants by least squares on log time
over the A100 home's measured op points (GEMMs, prefill and decode attention, all-reduce), then
the two FP8 GEMM constants over the FP8 home's FP8 GEMMs at those, and rewrites the ``fitted on
home`` leaves of conf/ours/constants.yaml. No cell step time and no other GPU is read.
``fit_constants`` and ``fit_fp8`` are the pure parts (no file written). This module never
imports the harness: the harness hands it the homes.
"""

from __future__ import annotations

import copy

import numpy as np
import polars as pl
import yaml

from leaderboard_core import yaml_io
from leaderboard_core.contract import Home
from predictors.ours import config, factors, ops
from predictors.ours.config import Device
from predictors.ours.ops import Switches

GEMM_OPS = ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down")
FITTED_OPS = (*GEMM_OPS, "attn_prefill", "attn_decode", "allreduce")
FULL = Switches()


def _fit(residual, x0, lower, upper) -> None:
    """Robust bounded least squares on ``residual(x)``, which sets the constants it is given.
    The solver's last call may be a Jacobian probe beside the optimum, so ``residual`` is
    called once more at the optimum to leave the fitted values set. SciPy is imported here:
    only the calibrated variants fit, and its import was a third of every ``ours`` run's child
    (0.33 of about 1 s)."""
    from scipy.optimize import least_squares  # noqa: PLC0415

    residual(least_squares(residual, x0, bounds=(lower, upper), loss="soft_l1", f_scale=0.1).x)


def _log_err(pred: np.ndarray, measured_ms: np.ndarray) -> np.ndarray:
    return np.log(pred * 1e3) - np.log(measured_ms)


def _per_gpu(home: Home, frame: pl.DataFrame, c: dict, seconds) -> np.ndarray:
    """Log errors of ``seconds(rows, device)`` over every home GPU's rows, each against its own
    datasheet (several homes share the constants)."""
    return np.concatenate([_log_err(seconds(rows, Device.of(gpu, c)),
                                    rows["latency_ms"].to_numpy())
                           for gpu, rows in home.by_gpu(frame)])


def _columns(rows: pl.DataFrame, names: tuple[str, ...]) -> list[np.ndarray]:
    return [rows[x].to_numpy().astype(np.float64) for x in names]


def fit_gemm(frames: list[pl.DataFrame], c: dict, home: Home) -> None:
    g = pl.concat([f.select(*({"sku"} & set(f.columns)), "m", "n", "k", "latency_ms")
                   for f in frames])

    def seconds(rows, dev):
        return ops.gemm(*_columns(rows, ("m", "n", "k")), dev, c, FULL)["seconds"]

    def residual(x):
        c["clock"]["home_f_clk"], c["gemm"]["duty_c"], c["gemm"]["floor_s"] = x[0], x[1], x[2]
        c["memory_law"].update(dram=x[3], l2=x[4])
        return _per_gpu(home, g, c, seconds)

    # Bounds keep each factor physical: a clock can only droop, DRAM efficiency lies in
    # [0.5, 1], an L2-resident stream at most ~3x DRAM, a launch floor between 2 and 20 us.
    # The law's steepness p is set, not fitted: where the two ends come out close, as on the
    # A100 home, the points cannot tell one p from another.
    _fit(residual, [0.95, 2.0, 8e-6, 0.7, 1.0], [0.7, 0.0, 2e-6, 0.5, 0.5],
         [1.0, 20.0, 2e-5, 1.0, 3.0])


def fit_prefill(p: pl.DataFrame, c: dict, home: Home) -> None:
    def seconds(rows, dev):
        b, q, h, kvh, hd = _columns(rows, ("batch", "q_len", "num_heads", "num_kv_heads",
                                           "head_dim"))
        # A measured point of ``batch`` equal requests is one kernel: b times the work.
        return ops.prefill_attention(q, 0.0 * q, h * b, kvh * b, hd, dev, c, FULL)["seconds"]

    def residual(x):
        a = c["attention"]
        a["prefill_eta"], a["prefill_floor_s"], a["prefill_cta_s"] = x
        return _per_gpu(home, p, c, seconds)

    _fit(residual, [0.5, 1e-5, 1e-6], [0.05, 0.0, 0.0], [1.0, 5e-5, 1e-4])


def fit_decode(d: pl.DataFrame, c: dict, home: Home) -> None:
    def seconds(rows, dev):
        columns = _columns(rows, ("batch", "kv_len", "num_heads", "num_kv_heads", "head_dim"))
        return ops.decode_attention(*columns, dev, c, FULL)["seconds"]

    def residual(x):
        a = c["attention"]
        (a["decode_eta"], a["decode_knee"], a["decode_floor_s"], a["decode_split_floor_s"],
         a["decode_cta_s"]) = x
        return _per_gpu(home, d, c, seconds)

    # The split-KV extra floor is identifiable on the home only because sm80 takes that path
    # from batch 2 on (factors.split_kv_floor): batch-1 points pin the base floor.
    _fit(residual, [0.7, 0.2, 1e-5, 5e-6, 1e-6], [0.05, 1e-3, 0.0, 0.0, 0.0],
         [2.0, 20.0, 5e-5, 3e-5, 1e-4])


def fit_allreduce(a: pl.DataFrame, c: dict, home: Home) -> None:
    def seconds(rows, dev):
        # NCCL's LL protocol is priced from NCCL's own latencies, not fitted: the home's NCCL
        # points (8 MiB and up) run Simple, so they are priced as Simple only, lest LL stand in.
        simple = {**c, "collectives": {**c["collectives"], **factors.NCCL_SIMPLE_ONLY}}
        return ops.allreduce(*_columns(rows, ("message_bytes", "num_gpus")), dev, simple,
                             FULL)["seconds"]

    def residual(x):
        coll = c["collectives"]
        coll["custom_floor_s"], coll["custom_eta"], coll["nccl_step_s"], coll["nccl_eta"] = x
        return _per_gpu(home, a, c, seconds)

    _fit(residual, [5e-6, 0.6, 2e-5, 0.6], [0.0, 0.05, 0.0, 0.05], [5e-5, 2.0, 2e-4, 2.0])


def fp8_gemm_points(home: Home) -> pl.DataFrame:
    """The home's FP8 GEMM points, every GEMM op's together (empty where it holds none)."""
    gemms = [home.ops[o] for o in GEMM_OPS if o in home.ops and "dtype" in home.ops[o].columns]
    frames = [f.filter(pl.col("dtype") == "fp8").select(*({"sku"} & set(f.columns)), "m", "n", "k",
                                                         "latency_ms") for f in gemms]
    return pl.concat(frames, how="diagonal") if frames else pl.DataFrame()


def fit_fp8(home: Home, c: dict) -> int:
    """``fp8.gemm_eta`` and ``fp8.quant_floor_s`` over the home's FP8 GEMMs, with every other
    constant held; returns how many points it fitted."""
    if missing := [o for o in GEMM_OPS if o not in home.ops]:
        raise ValueError(f"home {home.dataset} has no {', '.join(missing)} points: fp8.* is "
                         "fitted over every GEMM op's FP8 points")
    g = fp8_gemm_points(home)
    if g.is_empty():
        raise ValueError(f"home {home.dataset} holds no FP8 GEMM points to fit fp8.* on")

    def seconds(rows, dev):
        return ops.gemm(*_columns(rows, ("m", "n", "k")), dev, c, FULL, fp8=True)["seconds"]

    def residual(x):
        c["fp8"]["gemm_eta"], c["fp8"]["quant_floor_s"] = x
        return _per_gpu(home, g, c, seconds)

    # An FP8 kernel is no more efficient than the BF16 one at its own peak by more than a
    # little, and the quantization before it is one or two short kernels (at most 20 us).
    _fit(residual, [0.7, 2e-6], [0.1, 0.0], [1.2, 2e-5])
    return len(g)


def fit_constants(home: Home, constants: dict) -> dict:
    """The constants with every ``fitted on home`` value re-derived from ``home.ops``."""
    c = copy.deepcopy(constants)
    fit_gemm([home.ops[o] for o in GEMM_OPS], c, home)
    fit_prefill(home.ops["attn_prefill"], c, home)
    fit_decode(home.ops["attn_decode"], c, home)
    fit_allreduce(home.ops["allreduce"], c, home)
    c["home"]["op_rows"] = int(sum(len(home.ops[o]) for o in FITTED_OPS))
    return c


FITTED_LEAVES = [("clock", "home_f_clk"), ("gemm", "duty_c"), ("gemm", "floor_s"),
                 ("memory_law", "dram"), ("memory_law", "l2"),
                 ("attention", "prefill_eta"), ("attention", "prefill_floor_s"),
                 ("attention", "prefill_cta_s"),
                 ("attention", "decode_eta"), ("attention", "decode_knee"),
                 ("attention", "decode_floor_s"), ("attention", "decode_split_floor_s"),
                 ("attention", "decode_cta_s"), ("collectives", "custom_floor_s"),
                 ("collectives", "custom_eta"), ("collectives", "nccl_step_s"),
                 ("collectives", "nccl_eta"), ("home", "op_rows")]
FP8_LEAVES = [("fp8", "gemm_eta"), ("fp8", "quant_floor_s"), ("fp8", "op_rows")]


def _leaf_lines(node: dict, indent: int) -> list[str]:
    """YAML with one ``{value, provenance}`` leaf per line, as the file is written by hand."""
    lines = []
    for key, value in node.items():
        pad = " " * indent
        if isinstance(value, dict) and "value" in value:
            lines.append(f"{pad}{key}: " + yaml.safe_dump(value, default_flow_style=True,
                                                           width=10**6, sort_keys=False).strip())
        else:
            lines += [f"{pad}{key}:", *_leaf_lines(value, indent + 2)]
    return lines


def write(fitted: dict, command: str) -> None:
    raw = yaml_io.safe_load(config.CONSTANTS_PATH.read_text())
    header = [line for line in config.CONSTANTS_PATH.read_text().splitlines()
              if line.startswith("#")]
    where = {leaf: "a100_sxm (a100_vidur train split, home op points)" for leaf in FITTED_LEAVES}
    where.update({leaf: "h100_sxm (h100_vidur_fp8 train split, its FP8 GEMM points)"
                  for leaf in FP8_LEAVES})
    for (section, key), home in where.items():
        value = fitted[section][key]
        raw[section][key] = {"value": float(f"{value:.6g}") if key != "op_rows" else value,
                             "provenance": f"fitted on home {home} by `{command}`"}
    config.CONSTANTS_PATH.write_text("\n".join(header + _leaf_lines(raw, 0)) + "\n")
    config.load_constants.cache_clear()


COMMAND = "python -m leaderboard.calibrate predictor=ours"


def calibrate(homes: dict[str, Home]) -> dict[str, float]:
    """Fit the constants on ``homes`` (``home``: every BF16 constant; ``fp8``: the FP8 GEMM
    ones), rewrite conf/ours/constants.yaml, return the fitted leaves."""
    fitted = fit_constants(homes["home"], config.load_constants())
    fitted["fp8"]["op_rows"] = fit_fp8(homes["fp8"], fitted)
    write(fitted, COMMAND)
    return {f"{s}.{k}": fitted[s][k] for s, k in FITTED_LEAVES + FP8_LEAVES}


if __name__ == "__main__":
    raise SystemExit(f"The calibration needs the homes, which the harness builds: run `{COMMAND}`")
