"""The named factors of ``ours`` (docs/ours.md), each a small vectorized function.

Compute branch: ``eta_c = f_clk * eta_cl * eta_act * eta_duty``. Memory branch: ``eta_mem(x)``
with ``x = working set / L2``. Every function takes numpy arrays and returns arrays of the same
shape, so a step's ops are timed for a million cells at once. The values they are fed come from
``conf/ours/constants.yaml`` (physical, or fitted on the home GPU only) and the GPU's datasheet.
"""

from __future__ import annotations

import numpy as np

from leaderboard.specs import GpuSpec
from predictors._roofline import ring_allreduce_s


def clock_factor(arch: dict, home_f_clk: float) -> float:
    """f_clk: sustained / datasheet tensor clock under load. The architecture's documented
    reading where there is one; else (null) the home GPU's fitted droop. docs/ours.md allows
    one deploy reading instead; the gpu_block targets take none."""
    return float(home_f_clk if arch["f_clk"] is None else arch["f_clk"])


def uses_clusters(gpu: GpuSpec, arch: dict) -> bool:
    """Hopper and datacenter Blackwell (sm90, sm100) schedule GEMMs as thread-block clusters;
    Ampere, Ada and consumer Blackwell (sm120) do not (seed report E1.12)."""
    major = int(str(gpu.data.get("compute_capability", "0")).split(".")[0])
    return bool(arch["clusters"]) and major < 12


def cta_cap(gpu: GpuSpec, arch: dict) -> int:
    """How many CTAs run at once. Without clusters: every SM. With clusters: the SMs of the GPCs
    that can hold whole clusters, ``(gpc_count - lost_gpcs) * sms_per_gpc_for_clusters``; on H100
    that is 7 x 16 = 112 of 132 SMs (seed report E1.11, ncu on 35/36 shapes). A GPU whose spec
    lacks ``gpc_count`` takes its architecture's documented default."""
    sms = int(gpu["sm_count"])
    if not uses_clusters(gpu, arch):
        return sms
    gpcs = gpu.data.get("gpc_count") or arch["default_gpc_count"]
    cap = (int(gpcs) - int(arch["lost_gpcs"])) * int(arch["cluster_sms_per_gpc"])
    return int(min(max(cap, 1), sms))


def wave_efficiency(m: np.ndarray, n: np.ndarray, k: np.ndarray, sms: int, cap: int,
                    tile_m: int, tile_n: int, tile_k: int) -> np.ndarray:
    """eta_cl: useful work over the work the SMs are held for. Output tiles pad m and n up to
    the tile (a small m gets the smallest power-of-two m-tile that holds it, as cuBLAS's
    small-M kernels do); a grid smaller than the CTA cap is split along k where k is long
    enough (split-K, at least 4 main-loop steps per split); then the tiles run in waves of at
    most ``cap`` CTAs on ``sms`` SMs, so a partly empty last wave and SMs a cluster cap leaves
    idle both count as lost."""
    tm = np.minimum(tile_m, np.maximum(16.0, 2.0 ** np.ceil(np.log2(np.maximum(m, 1.0)))))
    tiles_m, tiles_n = np.ceil(m / tm), np.ceil(n / tile_n)
    tiles = tiles_m * tiles_n
    split = np.clip(np.floor(cap / tiles), 1.0, np.maximum(np.floor(k / (4.0 * tile_k)), 1.0))
    ctas = tiles * split
    waves = np.ceil(ctas / cap)
    padding = (m * n) / (tiles_m * tm * tiles_n * tile_n)
    return padding * ctas / (waves * sms)


def duty_cycle(k: np.ndarray, c: float, tile_k: int) -> np.ndarray:
    """eta_duty = 1 / (1 + c / tiles_per_CTA): each output tile pays a prologue and epilogue
    worth ``c`` main-loop iterations, amortized over its ``k / tile_k`` iterations."""
    return 1.0 / (1.0 + c / np.maximum(k / tile_k, 1.0))


def l2_memory_efficiency(working_set_bytes: np.ndarray, l2_bytes: float, law: dict) -> np.ndarray:
    """eta_mem(x), x = working set / L2: the L2-reuse law. A working set that stays in L2
    (x << 1) streams at ``l2`` times the DRAM peak, one far larger than L2 at ``dram``; the
    transition is a logistic in log x centred at x = 1 with steepness ``p``."""
    x = np.maximum(working_set_bytes / l2_bytes, 1e-9)
    return law["dram"] + (law["l2"] - law["dram"]) / (1.0 + x ** law["p"])


def decode_parallelism(ctas: np.ndarray, sms: int, knee: float) -> np.ndarray:
    """Fraction of the memory system a decode-attention kernel can keep busy: with fewer
    (request x KV head) CTAs than ``knee`` per SM, bandwidth grows with the CTA count."""
    return np.minimum(1.0, ctas / (knee * sms))


def allreduce_seconds(message_bytes: np.ndarray, tp: np.ndarray, link_bytes_per_s: float,
                      coll: dict) -> np.ndarray:
    """TP all-reduce: a latency floor plus the ring's ``2(P-1)/P`` bytes over one link direction
    at efficiency ``eta``. vLLM's custom all-reduce serves messages up to ``custom_max_bytes``;
    larger ones fall back to NCCL with its own floor and efficiency (both regimes fitted on the
    home GPU)."""
    volume = ring_allreduce_s(message_bytes, tp, link_bytes_per_s, 0.0, 0.0)
    custom = coll["custom_floor_s"] + volume / coll["custom_eta"]
    nccl = coll["nccl_floor_s"] + volume / coll["nccl_eta"]
    seconds = np.where(message_bytes <= coll["custom_max_bytes"], custom, nccl)
    return np.where(tp > 1, seconds, 0.0)


def host_floor_seconds(num_requests: np.ndarray, s_floor: float, s_slope: float) -> np.ndarray:
    """S(N) = s_floor + s_slope (N - 1): the scheduler's host time for N requests, the one term
    not derivable from a datasheet (calibrated once per GPU on wall-clock targets)."""
    return s_floor + s_slope * (num_requests - 1.0)
