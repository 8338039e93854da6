"""The named factors of ``ours`` (docs/ours.md), each a small vectorized function.

Compute branch: ``eta_c = f_clk * eta_cl * eta_act * eta_duty``. Memory branch: ``eta_mem(x)``
with ``x = working set / L2``. Every function takes numpy arrays and returns arrays of the same
shape, so a step's ops are timed for a million cells at once. The values they are fed come from
``conf/ours/constants.yaml`` (physical, or fitted on the home GPU only) and the GPU's datasheet.
"""

from __future__ import annotations

import numpy as np

from leaderboard_core.specs import GpuSpec
from predictors._roofline import ring_allreduce_s


def clock_factor(arch: dict, home_f_clk: float) -> float:
    """f_clk: sustained / datasheet tensor clock under load. The architecture's documented
    reading where there is one; else (null) the home GPU's fitted droop. docs/ours.md allows
    one deploy reading instead; the gpu_block targets take none."""
    return float(home_f_clk if arch["f_clk"] is None else arch["f_clk"])


def uses_clusters(gpu: GpuSpec, arch: dict) -> bool:
    """Hopper and datacenter Blackwell (sm90, sm100) schedule GEMMs as thread-block clusters;
    Ampere, Ada and consumer Blackwell (sm120) do not (seed report E1.12)."""
    return bool(arch["clusters"]) and compute_major(gpu) < 12


def compute_major(gpu: GpuSpec) -> int:
    return int(str(gpu.data.get("compute_capability", "0")).split(".")[0])


def cta_cap(gpu: GpuSpec, arch: dict) -> int:
    """How many CTAs run at once. Without clusters: every SM. With clusters of ``cluster_size``
    CTAs, only whole clusters are placed, and a cluster never spans a GPC. The bf16 GEMMs that
    cuBLAS/CUTLASS pick on sm90 and sm100 use clusters of 2 (CUTLASS's default 2x1x1 cluster
    shape), and a TPC is 2 SMs, so every SM holds a cluster slot: the cap is the SM count less
    the remainder of a cluster. The seed's 7 x 16 = 112 cap on H100 (E1.11, an ncu reading on
    its own board) is not derivable from this documentation and is not applied."""
    sms = int(gpu["sm_count"])
    if not uses_clusters(gpu, arch):
        return sms
    size = int(arch["cluster_size"])
    return max(sms - sms % size, size)


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


def per_cta_seconds(ctas: np.ndarray, sms: int, cta_s: float) -> np.ndarray:
    """Fixed work per CTA, spread over the SMs: each CTA of an attention kernel (one per request
    and KV head in decode, one per head and 128-query tile in prefill) loads its query and page
    indices and writes its output whatever its KV length, ``cta_s`` SM-seconds (at the home
    clock) each. It is what a large batch of short contexts costs."""
    return ctas * cta_s / sms


def floor_clock_scale(home_clock_mhz: float, clock_mhz: float) -> float:
    """A kernel floor is a fixed count of serial SM cycles (prologue, index math, the few
    dependent loads before the first useful work), so it shrinks with the sustained clock:
    home floor x home clock / target clock. Both clocks are datasheet boost x f_clk."""
    return float(home_clock_mhz) / float(clock_mhz)


def split_kv_floor(batch: np.ndarray, split_kv: bool, extra_s: float) -> np.ndarray:
    """The extra floor of sm8x decode attention from a batch of 2 on: the FlashAttention-2 /
    FlashInfer path of Ampere and Ada switches to a split-KV kernel plus a merge kernel (the
    home A100 jumps from ~12 to ~18 us there); sm90/sm100 run one persistent kernel."""
    return np.where(split_kv & (batch >= 2), extra_s, 0.0)


# Overrides of the collectives constants that leave NCCL one protocol: an infinite latency
# never wins the faster of the two (the home's NCCL points are Simple; a reading solves each).
NCCL_SIMPLE_ONLY = {"nccl_ll_base_s": np.inf}
NCCL_LL_ONLY = {"nccl_step_s": np.inf}


def by_tp(table: dict | None, tp: np.ndarray, default: float) -> np.ndarray:
    """A per-TP-degree value for each element (vLLM keys its all-reduce thresholds by world
    size); a degree the table does not list takes ``default``."""
    out = np.full(np.shape(tp), float(default))
    for size, value in (table or {}).items():
        out = np.where(tp == int(size), float(value), out)
    return out


def allreduce_path(message_bytes: np.ndarray, tp: np.ndarray, topology: str, coll: dict,
                   tables: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vLLM custom all-reduce, symmetric-memory all-reduce, bandwidth divisor) per message, by
    topology (one of leaderboard_core.specs.TOPOLOGIES), TP degree and the compute capability's
    symmetric-memory ``tables`` (vLLM has them for sm90 and sm100); the rest goes to NCCL.
    vLLM's custom all-reduce runs on 2, 4, 6 or 8 GPUs with peer access between all of them: an
    NVLink switch, or 2 GPUs (a bridge pair, or two GPUs on PCIe; vLLM disables it beyond 2
    PCIe-only GPUs). It takes messages strictly below ``custom_max_bytes``. On an NVLink switch
    with tables, its limit is the smaller of that and the table's, and the symmetric-memory
    all-reduce takes messages from there up to its own table's size. NCCL uses the same peer
    path where there is one (through a PCIe switch too). A group of more than 2 GPUs on
    ``pcie_host``, or past a bridge pair, has no peer path: NCCL goes through host memory at
    the CPU root complex, and the P GPUs' rings share what one link carries in each direction,
    so the bandwidth divisor is P."""
    switch = topology == "nvswitch"
    peer = np.ones_like(tp, dtype=bool) if switch else tp <= 2
    mib = 2.0**20
    custom_max = np.full(np.shape(tp), float(coll["custom_max_bytes"]))
    if switch:
        custom_max = np.minimum(custom_max, by_tp(tables.get("custom_max_mib"), tp, np.inf) * mib)
    custom = peer & np.isin(tp, coll["custom_world_sizes"]) & (message_bytes < custom_max)
    symm_max = by_tp(tables.get("symm_max_mib"), tp, 0.0) * mib if switch else 0.0 * custom_max
    symm = ~custom & (message_bytes < symm_max)
    through_host = (tp > 2) & (topology in ("pcie_host", "nvlink_bridge"))
    return custom, symm, np.where(through_host, tp, 1.0)


def allreduce_terms(message_bytes: np.ndarray, tp: np.ndarray, link_bytes_per_s: float,
                    topology: str, coll: dict, tables: dict) -> dict[str, np.ndarray]:
    """TP all-reduce in the regime ``allreduce_path`` picks: ``seconds`` and, per message, which
    path (``custom``, ``symm``, else NCCL) and variant (``one_shot``, ``nccl_ll``) priced it.
    vLLM's custom all-reduce is one-shot (one barrier; every GPU reads its P-1 peers' whole
    message) for 2 GPUs and below the per-TP one-shot size (``one_shot_max_kib``), else two-shot
    (two barriers; reduce-scatter then all-gather, the ring's ``2(P-1)/P`` bytes). The
    symmetric-memory all-reduce is priced as the custom two-shot, whichever kernel vLLM runs
    (docs/ours.md). NCCL's ring is ``2(P-1)`` dependent steps, each with a hop latency, plus
    the ring's bytes, in the faster of its Simple protocol (the home-fitted step latency) and
    its low-latency LL protocol (the latencies of NCCL's tuning model by link kind, half the
    bandwidth). Floors, step latency and efficiencies are fitted on the home GPU (an
    NVLink-switch node with custom and NCCL paths only)."""
    custom, symm, divisor = allreduce_path(message_bytes, tp, topology, coll, tables)
    volume = ring_allreduce_s(message_bytes, tp, link_bytes_per_s, 0.0, 0.0) * divisor
    floor, eta = coll["custom_floor_s"], coll["custom_eta"]
    one_shot = (tp <= 2) | (message_bytes < by_tp(coll["one_shot_max_kib"], tp, 0.0) * 1024)
    two_shot_s = 2.0 * floor + volume / eta
    custom_s = np.where(one_shot, floor + (tp - 1.0) * message_bytes / link_bytes_per_s / eta,
                        two_shot_s)
    steps = 2.0 * (tp - 1.0)
    simple_s = steps * coll["nccl_step_s"] + volume / coll["nccl_eta"]
    # NCCL's low-latency protocol at the latencies of NCCL's own tuning model, half the
    # payload per line; the step takes the faster of it and the home-fitted Simple (NCCL's
    # tuner makes the same choice with its own Simple model, so the crossover is near, not it).
    over_nvlink = (topology == "nvswitch") | ((topology == "nvlink_bridge") & (tp <= 2))
    hop_s = np.where(over_nvlink, coll["nccl_ll_hop_s_nvlink"], coll["nccl_ll_hop_s_pcie"])
    ll_s = (coll["nccl_ll_base_s"] + steps * hop_s
            + volume / (coll["nccl_eta"] * coll["nccl_ll_payload"]))
    seconds = np.where(custom, custom_s, np.where(symm, two_shot_s, np.minimum(simple_s, ll_s)))
    return {"seconds": np.where(tp > 1, seconds, 0.0), "custom": custom, "symm": symm,
            "one_shot": custom & one_shot, "nccl_ll": ~custom & ~symm & (ll_s < simple_s)}


def host_floor_seconds(num_requests: np.ndarray, s_floor: float, s_slope: float) -> np.ndarray:
    """S(N) = s_floor + s_slope (N - 1): the scheduler's host time for N requests, the one term
    not derivable from a datasheet (calibrated once per GPU on wall-clock targets)."""
    return s_floor + s_slope * (num_requests - 1.0)


def power_law_loads(tokens: float, topk: float, experts: int, alpha: float,
                    span: dict) -> np.ndarray:
    """Rows each expert receives under power-law routing, as aiconfigurator's MoE collector
    describes drawing them (its power-law note): one draw per expert from ``x^-alpha`` on
    [lo, hi], scaled to the ``tokens x topk`` rows and rounded; the span is [1, 0.8 tokens] when
    the rows outnumber the experts, else [0.01, 2] (``span``). The expected shape, not one random
    draw: the experts' draws sit at evenly spaced quantiles. The rounding remainder goes to the
    largest experts, and no expert takes more than ``tokens`` rows (a token picks an expert once),
    the excess moving to the next largest. The collector fixes the remainder and an expert picked
    twice by one token its own way, a few rows apart: an approximation of its draw."""
    rows = int(round(tokens * topk))
    if rows == 0:
        return np.zeros(experts)
    many = rows > experts
    lo = span["many_lo"] if many else span["few_lo"]
    hi = span["many_hi_share"] * tokens if many else span["few_hi"]
    u = (np.arange(experts) + 0.5) / experts
    e = 1.0 - alpha
    if hi <= lo:
        draws = np.full(experts, lo)
    elif abs(e) < 1e-9:  # alpha 1: the limit, log-uniform
        draws = lo * (hi / lo) ** u
    else:
        draws = ((hi ** e - lo ** e) * u + lo ** e) ** (1.0 / e)
    loads = np.round(rows * draws / draws.sum())[::-1]  # largest first
    loads = np.minimum(loads, np.ceil(tokens))
    spare = rows - loads.sum()
    for i in range(experts):  # remainder and excess to the largest that still have room
        if spare == 0:
            break
        step = np.clip(spare, -loads[i], np.ceil(tokens) - loads[i])
        loads[i] += step
        spare -= step
    return loads
