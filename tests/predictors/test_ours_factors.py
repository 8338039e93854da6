"""Each factor of ``ours`` at its edges (predictors/ours/factors.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from leaderboard_core.specs import GpuSpec
from predictors.ours import factors

HOPPER = {"f_clk": None, "clusters": True, "cluster_size": 2}
AMPERE = {"f_clk": None, "clusters": False}


def spec(**data) -> GpuSpec:
    return GpuSpec(data.get("sku", "test"), data, Path("test.yaml"))


def test_one_wave_against_two():
    sms = cap = 108
    full = factors.wave_efficiency(np.array([128.0]), np.array([128.0 * 108]), np.array([64.0]),
                                   sms, cap, 128, 128, 64)
    spill = factors.wave_efficiency(np.array([128.0]), np.array([128.0 * 109]), np.array([64.0]),
                                    sms, cap, 128, 128, 64)
    assert full[0] == pytest.approx(1.0)
    assert spill[0] == pytest.approx(109 / 216)  # a second wave with one CTA in it


def test_tile_padding_and_small_m_tiles():
    # m = 160 needs two 128-row tiles: 62.5 % of the padded tile rows are used.
    eff = factors.wave_efficiency(np.array([160.0]), np.array([128.0 * 54]), np.array([64.0]),
                                  108, 108, 128, 128, 64)
    assert eff[0] == pytest.approx(160 / 256)
    # m = 1 gets a 16-row tile, not a 128-row one.
    small = factors.wave_efficiency(np.array([1.0]), np.array([128.0 * 108]), np.array([64.0]),
                                    108, 108, 128, 128, 64)
    assert small[0] == pytest.approx(1 / 16)


def test_split_k_fills_idle_sms_only_when_k_is_long():
    m, n = np.array([16.0]), np.array([128.0 * 12])
    short = factors.wave_efficiency(m, n, np.array([64.0]), 108, 108, 128, 128, 64)
    long = factors.wave_efficiency(m, n, np.array([8192.0]), 108, 108, 128, 128, 64)
    assert long[0] > 5 * short[0]


def test_two_cta_clusters_fill_every_sm_of_h100():
    h100 = spec(sm_count=132, gpc_count=8, compute_capability="9.0")
    assert factors.cta_cap(h100, HOPPER) == 132  # 66 TPCs x 2 SMs, one 2-CTA cluster each
    assert factors.cta_cap(spec(sm_count=133, compute_capability="9.0"), HOPPER) == 132
    full = factors.wave_efficiency(np.array([128.0 * 132]), np.array([128.0]), np.array([64.0]),
                                   132, 132, 128, 128, 64)
    assert full[0] == pytest.approx(1.0)


def test_gpu_without_clusters_uses_every_sm():
    a100 = spec(sm_count=108, gpc_count=7, compute_capability="8.0")
    assert factors.cta_cap(a100, AMPERE) == 108
    # Consumer Blackwell (sm120) has no clusters even under a cluster architecture entry.
    sm120 = spec(sm_count=170, gpc_count=None, compute_capability="12.0")
    assert not factors.uses_clusters(sm120, HOPPER)
    assert factors.cta_cap(sm120, HOPPER) == 170


def test_duty_cycle_amortizes_over_k():
    k = np.array([64.0, 1024.0, 65536.0])
    eff = factors.duty_cycle(k, 3.0, 64)
    assert np.all(np.diff(eff) > 0) and eff[-1] > 0.99
    assert factors.duty_cycle(k, 0.0, 64) == pytest.approx(np.ones(3))


def test_l2_resident_against_dram_bound():
    law = {"dram": 0.7, "l2": 1.5, "p": 2.0}
    l2 = 40 * 2**20
    resident = factors.l2_memory_efficiency(np.array([l2 / 100]), l2, law)
    dram = factors.l2_memory_efficiency(np.array([l2 * 100]), l2, law)
    half = factors.l2_memory_efficiency(np.array([l2]), l2, law)
    assert resident[0] == pytest.approx(1.5, rel=1e-3)
    assert dram[0] == pytest.approx(0.7, rel=1e-3)
    assert half[0] == pytest.approx((0.7 + 1.5) / 2)


def test_clock_reading_or_home_droop():
    assert factors.clock_factor({"f_clk": 0.57}, 0.94) == 0.57
    assert factors.clock_factor({"f_clk": None}, 0.94) == 0.94


def test_decode_parallelism_saturates():
    p = factors.decode_parallelism(np.array([1.0, 10.0, 1e6]), 100, 0.1)
    assert p == pytest.approx([0.1, 1.0, 1.0])


COLL = {"custom_floor_s": 5e-6, "custom_eta": 0.5, "nccl_step_s": 4e-6, "nccl_eta": 0.7,
        "custom_max_bytes": 8 * 2**20, "custom_world_sizes": [2, 4, 6, 8],
        "one_shot_max_kib": {4: 512, 6: 256, 8: 256},
        "nccl_ll_base_s": 6.6e-6, "nccl_ll_hop_s_nvlink": 0.6e-6, "nccl_ll_hop_s_pcie": 1e-6,
        "nccl_ll_payload": 0.5}
# vLLM's sm90 tables: the custom limit is the smaller of 8 MiB and 64 MiB (TP2) or 1/4 MiB
# (TP8); symmetric memory takes the messages past it up to 64 MiB.
SM90 = {"custom_max_mib": {2: 64, 4: 32, 6: 0.5, 8: 0.25}, "symm_max_mib": {2: 64, 4: 32, 6: 64,
                                                                             8: 64}}


def allreduce_seconds(*args) -> np.ndarray:
    return factors.allreduce_terms(*args)["seconds"]


def test_allreduce_regimes_and_single_gpu():
    size = np.array([1e3, 8 * 2**20 - 16, 8 * 2**20, 1e6])
    tp = np.array([2.0, 2.0, 2.0, 1.0])
    t = allreduce_seconds(size, tp, 300e9, "nvswitch", COLL, {})
    assert t[0] == pytest.approx(5e-6 + 1e3 / 300e9 / 0.5)
    # vLLM's custom all-reduce takes messages strictly below its limit; at it, NCCL: 2 ring
    # steps of latency at TP2 plus the ring's bytes.
    assert t[1] == pytest.approx(5e-6 + (8 * 2**20 - 16) / 300e9 / 0.5)
    assert t[2] == pytest.approx(8e-6 + 8 * 2**20 / 300e9 / 0.7)
    assert t[3] == 0.0


def test_custom_allreduce_one_shot_then_two_shot_by_tp():
    # Below 512 KiB at TP4 one barrier and every GPU reads its 3 peers' whole message; at
    # 512 KiB two barriers and the ring's 2 x 3/4 of it.
    small, large = 256 * 2**10, 512 * 2**10
    t = allreduce_seconds(np.array([small, large, small]), np.array([4.0, 4.0, 8.0]),
                                  300e9, "nvswitch", COLL, {})
    assert t[0] == pytest.approx(5e-6 + 3 * small / 300e9 / 0.5)
    assert t[1] == pytest.approx(10e-6 + 1.5 * large / 300e9 / 0.5)
    # At TP8 the one-shot limit is 256 KiB: 256 KiB is already two-shot (2 x 7/8 of it).
    assert t[2] == pytest.approx(10e-6 + 1.75 * small / 300e9 / 0.5)
    terms = factors.allreduce_terms(np.array([small, large, small]), np.array([4.0, 4.0, 8.0]),
                                    300e9, "nvswitch", COLL, {})
    assert terms["one_shot"].tolist() == [True, False, False] and terms["custom"].all()


def test_symm_mem_tables_move_messages_between_custom_symm_and_nccl():
    mib = 2**20
    size = np.array([4 * mib, 32 * mib, 1 * mib, 100 * mib])
    tp = np.array([2.0, 2.0, 8.0, 8.0])
    custom, symm, _ = factors.allreduce_path(size, tp, "nvswitch", COLL, SM90)
    assert custom.tolist() == [True, False, False, False]
    assert symm.tolist() == [False, True, True, False]
    # Without tables (sm80): custom below 8 MiB, NCCL above, no symmetric memory.
    custom, symm, _ = factors.allreduce_path(size, tp, "nvswitch", COLL, {})
    assert custom.tolist() == [True, False, True, False] and not symm.any()
    # The symmetric-memory path is priced as the custom two-shot; NCCL past its table.
    t = allreduce_seconds(size, tp, 450e9, "nvswitch", COLL, SM90)
    assert t[1] == pytest.approx(10e-6 + 32 * mib / 450e9 / 0.5)
    assert t[2] == pytest.approx(10e-6 + 1.75 * mib / 450e9 / 0.5)
    assert t[3] == pytest.approx(14 * 4e-6 + 1.75 * 100 * mib / 450e9 / 0.7)


def test_symm_mem_tables_need_an_nvlink_switch_and_a_supported_tp():
    mib = 2**20
    # A TP2 bridge pair keeps the 8 MiB custom limit: the tables are a switch's.
    custom, symm, _ = factors.allreduce_path(np.array([4.0 * mib]), np.array([2.0]),
                                             "nvlink_bridge", COLL, SM90)
    assert custom.tolist() == [True] and not symm.any()
    # vLLM's custom all-reduce runs on 2, 4, 6 or 8 GPUs only: TP3 and TP16 go to NCCL.
    size, tp = np.array([64e3, 64e3]), np.array([3.0, 16.0])
    custom, symm, _ = factors.allreduce_path(size, tp, "nvswitch", COLL, SM90)
    assert not custom.any() and not symm.any()
    t = allreduce_seconds(size, tp, 450e9, "nvswitch", COLL, SM90)
    assert t[0] == pytest.approx(6.6e-6 + 4 * 0.6e-6 + (4 / 3) * 64e3 / 450e9 / 0.35)  # LL


def test_allreduce_path_by_topology_and_tp():
    size, tp = np.full(3, 1e6), np.array([2.0, 4.0, 8.0])
    custom, _, divisor = factors.allreduce_path(size, tp, "nvswitch", COLL, {})
    assert custom.tolist() == [True, True, True] and divisor.tolist() == [1.0, 1.0, 1.0]
    custom, _, divisor = factors.allreduce_path(size, tp, "pcie_host", COLL, {})
    assert custom.tolist() == [True, False, False] and divisor.tolist() == [1.0, 4.0, 8.0]
    custom, _, divisor = factors.allreduce_path(size, tp, "pcie_switch", COLL, {})
    assert custom.tolist() == [True, False, False] and divisor.tolist() == [1.0, 1.0, 1.0]
    custom, _, divisor = factors.allreduce_path(size, tp, "nvlink_bridge", COLL, {})
    assert custom.tolist() == [True, False, False] and divisor.tolist() == [1.0, 4.0, 8.0]


def test_pcie_host_allreduce_by_hand():
    # TP4, 1 MB through the host over PCIe Gen4 (32 GB/s a direction): each GPU's ring moves
    # 2 x 3/4 x 1 MB, the 4 GPUs share one link's worth of the root complex, at NCCL's
    # efficiency, after 2 x 3 ring steps of latency.
    t = allreduce_seconds(np.array([1e6]), np.array([4.0]), 32e9, "pcie_host", COLL, {})
    assert t[0] == pytest.approx(6 * 4e-6 + 4 * (1.5e6 / 32e9) / 0.7)
    # TP2 on PCIe keeps vLLM's custom all-reduce, at the link's full rate.
    t2 = allreduce_seconds(np.array([1e6]), np.array([2.0]), 32e9, "pcie_host", COLL, {})
    assert t2[0] == pytest.approx(5e-6 + (1e6 / 32e9) / 0.5)


def test_nccl_takes_its_low_latency_protocol_for_small_messages():
    # TP8, 8 KiB through the host over PCIe (32 GB/s a direction, shared by 8): Simple pays
    # 14 steps of 4 us; LL pays NCCL's 6.6 us base and 14 PCIe hops of 1 us, at half the
    # bandwidth. LL is faster, and is what NCCL runs.
    volume = 8 * 1.75 * 8192 / 32e9
    t = allreduce_seconds(np.array([8192.0]), np.array([8.0]), 32e9, "pcie_host", COLL, {})
    assert t[0] == pytest.approx(6.6e-6 + 14e-6 + volume / (0.7 * 0.5))
    assert t[0] < 14 * 4e-6 + volume / 0.7
    # 8 MiB at TP8 through the host: LL's half bandwidth loses, NCCL runs Simple.
    terms = factors.allreduce_terms(np.array([8192.0, 8 * 2.0**20]), np.array([8.0, 8.0]), 32e9,
                                    "pcie_host", COLL, {})
    assert terms["nccl_ll"].tolist() == [True, False] and not terms["custom"].any()
    # Over NVLink the hops are 0.6 us: TP3 on a switch (no custom kernel for 3 GPUs), 4 KiB.
    t = allreduce_seconds(np.array([4096.0]), np.array([3.0]), 300e9, "nvswitch", COLL, {})
    assert t[0] == pytest.approx(6.6e-6 + 4 * 0.6e-6 + (4 / 3) * 4096 / 300e9 / 0.35)


def test_nccl_ll_hops_follow_the_link_kind():
    # TP4, 4 KiB: a PCIe switch keeps each GPU's own link (no divisor) but pays PCIe hops; a
    # bridge pair's group of 4 goes through the host: PCIe hops and the link shared by 4.
    size, tp, ring = np.array([4096.0]), np.array([4.0]), 1.5 * 4096
    t = allreduce_seconds(size, tp, 32e9, "pcie_switch", COLL, {})
    assert t[0] == pytest.approx(6.6e-6 + 6 * 1e-6 + ring / 32e9 / 0.35)
    t = allreduce_seconds(size, tp, 56e9, "nvlink_bridge", COLL, {})
    assert t[0] == pytest.approx(6.6e-6 + 6 * 1e-6 + 4 * ring / 56e9 / 0.35)


def test_per_cta_seconds_spread_over_the_sms():
    # 2,048 requests x 8 KV heads = 16,384 CTAs of 3 us of one SM each, over 128 SMs: 384 us.
    assert factors.per_cta_seconds(np.array([16384.0]), 128, 3e-6)[0] == pytest.approx(384e-6)


def test_floor_scales_with_the_sustained_clock():
    # A100 home 1,410 MHz against H100 1,980 MHz and L40S 2,520 MHz, at one droop.
    assert factors.floor_clock_scale(1410 * 0.94, 1980 * 0.94) == pytest.approx(0.712121, rel=1e-5)
    assert factors.floor_clock_scale(1410 * 0.94, 2520 * 0.94) == pytest.approx(0.559524, rel=1e-5)
    assert factors.floor_clock_scale(1410.0, 1410.0) == 1.0


def test_split_kv_floor_only_from_batch_two_on_sm8x():
    batch = np.array([1.0, 2.0, 64.0])
    assert factors.split_kv_floor(batch, True, 6e-6).tolist() == [0.0, 6e-6, 6e-6]
    assert factors.split_kv_floor(batch, False, 6e-6).tolist() == [0.0, 0.0, 0.0]


def test_host_floor_is_linear_in_requests():
    s = factors.host_floor_seconds(np.array([1.0, 2.0, 11.0]), 0.003, 0.0001)
    assert s == pytest.approx([0.003, 0.0031, 0.004])


def test_attention_per_cta_costs_by_hand():
    """On the home A100 (floor scale 1, 108 SMs), with per-CTA costs of 3 and 2 us: a decode
    kernel of 2,048 requests x 8 KV heads pays 2048 x 8 x 3 us / 108; a prefill kernel of 32
    heads x 1,000 tokens (8 query tiles of 128) pays 32 x 8 x 2 us / 108. Switching floors or
    attention off drops both."""
    from leaderboard_core.specs import load_gpu_specs
    from predictors.ours import config, ops
    from predictors.ours.config import Device
    from predictors.ours.ops import Switches

    c = copy.deepcopy(config.load_constants())
    c["attention"].update(decode_cta_s=3e-6, prefill_cta_s=2e-6)
    dev = Device.of(load_gpu_specs()["a100_sxm"], c)
    assert dev.floor_scale == pytest.approx(1.0) and dev.sms == 108
    one = np.array([1.0])
    decode = ops.decode_attention(2048 * one, 1 * one, 32 * one, 8 * one, 128 * one, dev, c,
                                  Switches())
    assert decode["cta_s"][0] == pytest.approx(2048 * 8 * 3e-6 / 108)
    prefill = ops.prefill_attention(1000 * one, 0 * one, 32 * one, 8 * one, 128 * one, dev, c,
                                    Switches())
    assert prefill["cta_s"][0] == pytest.approx(32 * 8 * 2e-6 / 108)
    for off in (Switches(floors=False), Switches(attention=False)):
        assert ops.decode_attention(2048 * one, one, 32 * one, 8 * one, 128 * one, dev, c,
                                    off)["cta_s"][0] == 0.0
        assert ops.prefill_attention(1000 * one, 0 * one, 32 * one, 8 * one, 128 * one, dev, c,
                                     off)["cta_s"][0] == 0.0
