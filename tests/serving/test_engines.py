"""What each engine's run is replayed with: its token budget and admission rules by version, its
KV capacity and memory fraction, its host time, the frontend reading and the KV cache's dtype."""

from __future__ import annotations

import copy
import json

import numpy as np
import polars as pl
import pytest
from conftest import SHARED, requires_shared

from leaderboard.serving import simulate
from leaderboard_core.specs import load_gpu_specs, load_models


def test_a_vllm_closed_loop_takes_its_launchers_budget_where_its_template_passes_it():
    """aiconfigurator's generator launches an aggregated vLLM worker with
    --max-num-batched-tokens = concurrency + isl + 1500, a flag its launch template passes from
    vLLM 0.14.1; 0.12.0, an unknown version, a recorded-arrival run and the other backends
    keep the defaults (8192 tokens on an 80 GB H100)."""
    from leaderboard.serving.simulate import policy_for

    m, gpu = load_models()["qwen3-32b"], load_gpu_specs()["h100_sxm"]
    for version, budget in (("0.19.0", 8 + 1024 + 1500), ("0.14.1", 2532), ("0.14.0", 8192),
                            ("0.12.0", 8192), ("unknown", 8192)):
        assert policy_for("vllm", "any", m, 2, gpu, version=version, closed_loop=(8, 1024)
                          ).token_budget == budget, version
    assert policy_for("vllm", "any", m, 2, gpu, version="0.19.0").token_budget == 8192
    for backend in ("sglang", "trtllm"):
        assert policy_for(backend, "any", m, 2, gpu, version="9.9", closed_loop=(8, 1024)
                          ).token_budget == 8192
    # a run whose metadata states its limits keeps them
    stated = policy_for("vllm", "RTX4090/Llama-3.1-8B", load_models()["llama-3.1-8b"], 1,
                        load_gpu_specs()["rtx4090"], version="0.19.0", closed_loop=(8, 1024))
    assert (stated.token_budget, stated.max_seqs) == (2048, 256)


def test_a_rule_marked_unrecorded_holds_for_an_unknown_version_only(monkeypatch):
    """``unrecorded: true`` (benchmarks/engine_choices.py's launch_rule) gives the launcher's
    budget to a run whose version is not recorded; a recorded older release stays out."""
    from leaderboard.cells.common import schedulers_conf
    from leaderboard.serving.simulate import policy_for

    monkeypatch.setitem(schedulers_conf()["backends"]["vllm"]["closed_loop_launch"], "unrecorded", True)
    m, gpu = load_models()["qwen3-32b"], load_gpu_specs()["h100_sxm"]
    for version, budget in (("unknown", 8 + 1024 + 1500), (None, 2532), ("0.12.0", 8192),
                            ("0.14.1", 2532)):
        assert policy_for("vllm", "any", m, 2, gpu, version=version, closed_loop=(8, 1024)
                          ).token_budget == budget, version


def test_vllm_prefix_caching_everywhere_and_whole_sequence_admission_from_0_19():
    from leaderboard.serving.simulate import policy_for

    m, gpu = load_models()["qwen3-32b"], load_gpu_specs()["h100_sxm"]
    for version, whole in (("0.19.0", True), ("0.20.1", True), ("0.18.0", False),
                           ("0.12.0", False), ("unknown", False), (None, False)):
        policy = policy_for("vllm", "any", m, 2, gpu, version=version)
        assert (policy.prefix_cache_block, policy.whole_sequence_admission) == (16, whole), version
    for backend in ("sglang", "trtllm"):
        policy = policy_for(backend, "any", m, 2, gpu, version="9.9")
        assert (policy.prefix_cache_block, policy.whole_sequence_admission) == (0, False)


@requires_shared
def test_the_rtx4090_runs_recorded_engine_is_the_one_replayed():
    """The LLMServingSim run's meta.json (pinned) states vLLM 0.19.0's resolved scheduler and
    cache: the replay's policy for that run must match it field by field."""
    from leaderboard.serving.simulate import policy_for

    meta = json.loads((SHARED / "casys-kaist__LLMServingSim/bench/examples/RTX4090/"
                       "Llama-3.1-8B/vllm/meta.json").read_text())
    sched, cache = meta["resolved_config"]["scheduler_config"], meta["kv_cache"]
    policy = policy_for("vllm", "RTX4090/Llama-3.1-8B", load_models()["llama-3.1-8b"], 1,
                        load_gpu_specs()["rtx4090"], version=meta["vllm_version"])
    assert (policy.token_budget, policy.max_seqs, policy.kv_tokens) == (
        sched["max_num_batched_tokens"], sched["max_num_seqs"], cache["num_kv_tokens"])
    assert policy.whole_sequence_admission == sched["scheduler_reserve_full_isl"]
    assert cache["enable_prefix_caching"] and policy.prefix_cache_block == cache["block_size"]
    assert sched["policy"] == "fcfs" and policy.kv_rule == "on_demand"


def test_kv_capacity_counts_gib_and_fp8_layers_at_one_byte():
    from leaderboard.cells.common import schedulers_conf
    from leaderboard.serving.simulate import kv_capacity

    m, gpu = load_models()["llama-3.1-70b"], load_gpu_specs()["h100_sxm"]
    # Llama-3.1-70B: 80 layers, hidden 8192, 64 query / 8 KV heads of 128, MLP 28672, vocab 128256
    layer = 8192 * (64 + 2 * 8) * 128 + 64 * 128 * 8192 + 3 * 8192 * 28672
    embeddings = 2 * 128256 * 8192 * 2  # embedding and LM head, BF16
    per_token = 2 * 80 * 8 * 128 * 2  # K and V, BF16
    memory = 0.9 * 80 * 2**30 * 2  # TP 2, GiB
    for dtype, layer_bytes in (("bf16", 2), ("fp8", 1)):
        expected = int((memory - 80 * layer * layer_bytes - embeddings) // per_token)
        assert kv_capacity(m, 2, gpu, 0.9, schedulers_conf(), dtype) == expected, dtype

    # TensorRT-LLM's fraction is of the memory the weights leave free
    for dtype, layer_bytes in (("bf16", 2), ("fp8", 1)):
        free = 2 * (80 * 2**30 - (80 * layer * layer_bytes + embeddings) / 2)
        expected = int(0.9 * free // per_token)
        assert kv_capacity(m, 2, gpu, 0.9, schedulers_conf(), dtype, of_free=True) == expected, dtype


def test_kv_capacity_counts_a_replicated_kv_head_on_every_gpu():
    """Qwen3-235B-A22B has 4 KV heads: at TP 8 each GPU holds one whole head (a replica), so a
    token takes 8 heads' room in all, twice what 4 heads shared would: half the tokens fit. At
    TP 4 the heads are shared and nothing is replicated."""
    from leaderboard.cells.common import schedulers_conf
    from leaderboard.cells.memory import weight_bytes
    from leaderboard.serving.simulate import kv_cache_dtype, kv_capacity
    from leaderboard_core.specs import KV_CACHE_BYTES

    m, gpu = load_models()["qwen3-235b-a22b"], load_gpu_specs()["b200_sxm"]
    assert m["num_kv_heads"] == 4
    for tp, heads_in_all in ((4, 4), (8, 8)):
        free = tp * (0.9 * float(gpu["mem_gb"]) * 2**30 - weight_bytes(m, tp, "fp8"))
        per_token = (2 * m["num_layers"] * heads_in_all * m["head_dim"]
                     * KV_CACHE_BYTES[kv_cache_dtype(schedulers_conf())])
        assert kv_capacity(m, tp, gpu, 0.9, schedulers_conf(), "fp8") == int(free // per_token), tp


def test_an_mla_model_caches_one_latent_a_token_and_layer_on_every_gpu():
    """DeepSeek-V3 caches kv_lora_rank 512 + qk_rope_head_dim 64 = 576 elements a token and
    layer, the same on every GPU of the group, not keys and values per head: at TP 8, 61 layers
    x 576 x 2 bytes = 70,272 bytes a GPU (per-head counting, 2 x 128 / 8 heads x 192, would give
    10.7 times that). The engine's capacity counts it on each of the 8 GPUs."""
    from leaderboard.cells.common import schedulers_conf
    from leaderboard.cells.memory import kv_bytes, weight_bytes
    from leaderboard.serving.simulate import kv_capacity

    m, gpu = load_models()["deepseek-v3"], load_gpu_specs()["b200_sxm"]
    assert (m["attention"], m["kv_lora_rank"], m["qk_rope_head_dim"]) == ("mla", 512, 64)
    assert kv_bytes(m, 8, [1], [0]) == 61 * 576 * 2
    free = 8 * (0.9 * float(gpu["mem_gb"]) * 2**30 - weight_bytes(m, 8, "fp8"))
    assert kv_capacity(m, 8, gpu, 0.9, schedulers_conf(), "fp8") == int(free // (8 * 61 * 576 * 2))


def test_sglang_memory_fraction_follows_its_version_rule_and_trtllm_takes_the_free_memory():
    from leaderboard.cells.common import schedulers_conf
    from leaderboard.serving.sglang_kv import static_memory_fraction
    from leaderboard.serving.simulate import kv_capacity, policy_for

    gib = 1024  # MiB
    # up to 0.5.1.post1: an 80 GB GPU reserves (9.5 + TP / 2) GiB, a 141 GB one (12 + TP / 2)
    assert static_memory_fraction(80, 1, general=False) == round((80 - 10) / 80, 3) == 0.875
    assert static_memory_fraction(80, 8, general=False) == round((80 - 13.5) / 80, 3)
    assert static_memory_fraction(141, 2, general=False) == round((141 - 13) / 141, 3)
    # general rule: 512 MiB + 1.5 x chunk + 2 x CUDA-graph ceiling + TP / 8 GiB
    assert static_memory_fraction(80, 1, general=True) == round(
        (80 * gib - (512 + 8192 * 1.5 + 256 * 2 + gib / 8)) / (80 * gib), 3)
    assert static_memory_fraction(80, 4, general=True) == round(
        (80 * gib - (512 + 8192 * 1.5 + 512 * 2 + gib / 2)) / (80 * gib), 3)
    assert static_memory_fraction(180, 2, general=True) == round(
        (180 * gib - (512 + 16384 * 1.5 + 512 * 2 + gib / 4)) / (180 * gib), 3)
    # under 60 GB a 4096-token chunk and a CUDA-graph ceiling of 32
    assert static_memory_fraction(40, 1, general=True) == round(
        (40 * gib - (512 + 4096 * 1.5 + 32 * 2 + gib / 8)) / (40 * gib), 3)
    with pytest.raises(ValueError, match="35 GiB"):
        static_memory_fraction(24, 1, general=True)

    m, gpu = load_models()["qwen3-32b"], load_gpu_specs()["h100_sxm"]
    for version, fraction in (("0.5.1.post1", 0.875), ("0.5.8.post1", 0.836), (None, 0.836),
                              ("unknown", 0.836)):
        policy = policy_for("sglang", "any", m, 1, gpu, version=version)
        assert policy.kv_tokens == kv_capacity(m, 1, gpu, fraction, schedulers_conf()), version
    trtllm = policy_for("trtllm", "any", m, 2, gpu)
    assert trtllm.kv_tokens == kv_capacity(m, 2, gpu, 0.9, schedulers_conf(), of_free=True)


def test_vllms_host_time_is_vidurs_cpu_overhead_fitted_over_its_rows(real_store):
    """The yaml's vLLM host time per step: least squares of the sum of the four CPU parts
    Vidur's simulator adds to a step over every (model, TP, batch size) of its profile,
    recomputed from the store's cpu_overheads table; SGLang and TRT-LLM state none."""
    from leaderboard.cells.common import schedulers_conf

    parts = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs")
    rows = real_store.sql(
        "SELECT batch_size, sum(latency_ms), count(*) FROM cpu_overheads WHERE source = 'vidur' "
        f"AND op IN {parts} GROUP BY model, tp, batch_size")
    assert len(rows) == 72 and {n for *_, n in rows} == {4}
    x = np.array([r[0] for r in rows], np.float64)
    y = np.array([r[1] for r in rows])
    design = np.stack([np.ones_like(x), x], axis=1)
    (base, per_request), *_ = np.linalg.lstsq(design, y, rcond=None)
    conf = schedulers_conf()["backends"]
    assert conf["vllm"]["host_time"]["base_ms"] == pytest.approx(base, abs=5e-4)
    assert conf["vllm"]["host_time"]["per_request_ms"] == pytest.approx(per_request, abs=5e-5)
    assert "base_ms" not in conf["sglang"]["host_time"]
    assert "base_ms" not in conf["trtllm"]["host_time"]


def test_every_backend_states_its_host_time_and_when_its_engine_overlaps_it():
    """Each backend's yaml entry says what a step's host time is (measured, or none) and from
    which version its engine overlaps host work with the GPU, each with a source: a backend
    added without them would be replayed with a host time nobody chose."""
    from leaderboard.cells.common import schedulers_conf
    from leaderboard_core.versioning import release

    for name, backend in schedulers_conf()["backends"].items():
        host = backend["host_time"]
        assert ("base_ms" in host) == ("per_request_ms" in host) == ("source" in host), name
        assert release(host["overlapped"]["from_version"]) is not None, name
        assert len(host["overlapped"]["source"]) > 40, name


@pytest.mark.parametrize(("backend", "version", "host"), [
    ("vllm", "0.12.0", "added"), ("vllm", "0.13.1", "added"), ("vllm", "unknown", "added"),
    ("vllm", None, "added"), ("vllm", "0.14.0rc1", "overlapped"), ("vllm", "0.14.0", "overlapped"),
    ("vllm", "0.19.0", "overlapped"), ("sglang", "0.5.1.post1", "none"),
    ("trtllm", "1.0.0rc3", "none")])
def test_a_step_pays_host_time_unless_its_engine_overlaps_it(backend, version, host):
    """A vLLM step before 0.14.0, or of an unrecorded version, adds Vidur's 1.422 ms + 0.0416
    ms per request. From 0.14.0 vLLM schedules asynchronously by default (release notes, PR
    27614): a step takes the longer of its GPU time and that host time. SGLang and TRT-LLM
    have no measured host time (and run overlap schedulers): their steps add none. The
    predicate the light-kernel benchmark reads says the same."""
    from leaderboard.serving.simulate import host_time_added, with_host_time

    requests = np.array([1, 8, 64, 512])  # 512 requests: 22.7 ms of host time, over a 10 ms step
    timed = with_host_time(lambda c: np.full(len(c), 10.0), backend, version)
    measured = 1.422 + 0.0416 * requests
    expected = {"added": 10.0 + measured, "overlapped": np.maximum(10.0, measured),
                "none": np.full(4, 10.0)}[host]
    np.testing.assert_allclose(timed(pl.DataFrame({"num_requests": requests})), expected)
    assert host_time_added(backend, version) is (host == "added")


def test_a_home_of_wall_clock_steps_gets_no_host_time_from_the_replay(monkeypatch):
    """A predictor fitted on wall-clock steps predicts the host's time with the GPU's: the
    replay adds the engine's host time only to a home of GPU-block times, never twice."""
    from leaderboard.serving import simulate
    from leaderboard.serving.scoring import home_times_host

    assert home_times_host(pl.DataFrame({"gt_kind": ["wall_clock"] * 2}))
    assert not home_times_host(pl.DataFrame({"gt_kind": ["gpu_block", "wall_clock"]}))
    assert not home_times_host(pl.DataFrame())
    monkeypatch.setattr(simulate, "policy_for", lambda *args: None)
    first = {"load": "recorded", "backend": "vllm", "backend_version": "0.12.0", "run": "r",
             "model": "m", "tp": 1, "gemm_dtype": "bf16"}
    cells = pl.DataFrame({"num_requests": np.array([1, 64])})

    def gpu_ms(c):
        return np.full(len(c), 10.0)

    _, block_home = simulate.run_engine(first, {"m": {}}, None, gpu_ms)
    _, wall_home = simulate.run_engine(first, {"m": {}}, None, gpu_ms, host_in_steps=True)
    np.testing.assert_allclose(block_home(cells), 10.0 + 1.422 + 0.0416 * np.array([1, 64]))
    np.testing.assert_allclose(wall_home(cells), 10.0)


def test_the_frontend_reading_adds_the_sourced_time_to_vllm_closed_loops_only():
    """vLLM closed loops: lockstep 100 and steady 80 ms against a measured 110; the reading adds
    8.4 and 12.2 ms to each. An SGLang load and a run of recorded arrivals stay out of it."""
    from leaderboard.present.serving_oracle import FRONTEND_MS, frontend_reading

    assert FRONTEND_MS == (8.4, 12.2)
    rows = pl.DataFrame({
        "dataset": "h100_silicon", "backend": ["vllm", "vllm", "sglang", "vllm"],
        "concurrency": pl.Series([8, 8, 8, None], dtype=pl.Int64),
        "phase": ["ttft", "ttft_steady", "ttft", "ttft"],
        "pred_ms": [100.0, 80.0, 10.0, 10.0], "gt_ms": [110.0, 110.0, 110.0, 110.0]})
    row = next(line for line in frontend_reading(rows) if line.startswith("| h100_silicon"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    lockstep = " / ".join(f"{abs(p / 110 - 1) * 100:.1f}" for p in (100.0, 108.4, 112.2))
    steady = " / ".join(f"{abs(p / 110 - 1) * 100:.1f}" for p in (80.0, 88.4, 92.2))
    assert cells == ["h100_silicon", "1", lockstep, steady] == [
        "h100_silicon", "1", "9.1 / 1.5 / 2.0", "27.3 / 19.6 / 16.2"]
    assert frontend_reading(rows.filter(pl.col("backend") == "sglang")) == []


def test_an_unknown_kv_cache_dtype_names_the_key_and_the_known_ones():
    conf = copy.deepcopy(simulate.schedulers_conf())
    conf["simulation"]["kv_cache_dtype"] = "fp4"
    with pytest.raises(ValueError, match=r"simulation.kv_cache_dtype in .*schedulers.yaml: 'fp4' "
                                         r"is none of \['bfloat16', 'float16', 'fp8', 'int8'\]"):
        simulate.kv_capacity(load_models()["llama-3.1-8b"], 1, load_gpu_specs()["h100_sxm"], 0.9,
                             conf)
    with pytest.raises(ValueError, match=r"with_kv_cache: 'fp4' is none of"):
        simulate.with_kv_cache(lambda cells: np.ones(len(cells)), "fp4")


def test_the_headline_replays_the_cache_the_tables_read_when_a_step_names_none():
    """The yaml's cache is the default one (a 16-bit cache whose steps name no dtype), so the
    headline's steps read the very attention points the step sets' cells are built from."""
    from leaderboard_core.specs import DEFAULT_KV_DTYPE, SIXTEEN_BIT_KV

    assert simulate.kv_cache_dtype(simulate.schedulers_conf()) == DEFAULT_KV_DTYPE
    assert DEFAULT_KV_DTYPE in SIXTEEN_BIT_KV


def test_a_sixteen_bit_kv_cache_leaves_the_step_timer_as_it_is():
    """The headline's BF16 cache (and a float16 one) hands the predictor the very timer, so its
    steps carry no ``kv_dtype``; an FP8 cache names it on every step."""
    seen = []

    def timer(cells):
        seen.append(cells.columns)
        return np.ones(len(cells))

    assert simulate.with_kv_cache(timer, "bfloat16") is timer
    assert simulate.with_kv_cache(timer, "float16") is timer
    simulate.with_kv_cache(timer, "fp8")(pl.DataFrame({"num_requests": [1, 2]}))
    assert seen == [["num_requests", "kv_dtype"]]
