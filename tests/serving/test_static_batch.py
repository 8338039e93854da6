"""The e2e family's replay: one static batch's steps, worked out by hand, and its scheduler."""

from __future__ import annotations

import numpy as np
import pytest

from leaderboard.serving import static_batch
from leaderboard.serving.scheduler import Policy
from leaderboard.serving.simulate import policy_for
from leaderboard_core.specs import load_gpu_specs, load_models


def steps(plan) -> list[list[tuple[int, int]]]:
    """(new tokens, cached tokens) of each step's requests, step by step."""
    shapes = plan.shapes
    by_shape = [list(zip(shapes["q"][shapes["step"] == s].tolist(),
                         shapes["ctx"][shapes["step"] == s].tolist(), strict=True))
                for s in range(int(shapes["step"].max()) + 1)]
    return [by_shape[s] for s in plan.inverse]


def test_a_small_batch_is_two_prefill_steps_then_its_decodes():
    """6 prompts of 1,024 tokens, 4 output tokens, a 4,096-token budget and room for all:
    4 whole prompts, then the other 2 (each prompt's last token gives its first output), then
    osl - 1 = 3 decodes of all 6 at contexts 1,024, 1,025 and 1,026. Steps of 10, 5, 2, 2, 2 ms:
    the last first token at 15 ms, the batch done at 21 ms."""
    policy = Policy("prefill_first", 4096, 256, 10**6, "reserve")
    plan = static_batch.plan(policy, isl=1024, osl=4, batch=6)
    assert steps(plan) == [[(1024, 0)] * 4, [(1024, 0)] * 2,
                           [(1, 1024)] * 6, [(1, 1025)] * 6, [(1, 1026)] * 6]
    assert static_batch.times(plan, np.array([10.0, 5.0, 2.0, 2.0, 2.0])) == (15.0, 21.0)


def test_a_static_batch_is_scheduled_once_and_read_back_as_scheduled(monkeypatch):
    """The second plan of the same batch is the kept one (no scheduling: the engine is never
    made), equal to the first in every array."""
    policy = Policy("prefill_first", 4096, 256, 10**6, "reserve")
    first = static_batch.plan(policy, isl=1024, osl=4, batch=6)
    monkeypatch.setattr(static_batch, "new_engine", None)  # scheduling again would fail here
    again = static_batch.plan(policy, isl=1024, osl=4, batch=6)
    for name, array in first.arrays().items():
        np.testing.assert_array_equal(again.arrays()[name], array, err_msg=name)
    assert steps(again) == steps(first)


def test_one_output_token_is_the_prefill_alone():
    plan = static_batch.plan(Policy("prefill_first", 2048, 256, 10**6, "reserve"), 1024, 1, 3)
    assert steps(plan) == [[(1024, 0)] * 2, [(1024, 0)]]
    assert static_batch.times(plan, np.array([7.0, 4.0])) == (11.0, 11.0)


def test_a_batch_larger_than_the_cache_runs_in_waves():
    """Room for two requests' prompt and output (2 x (8 + 3) = 22 tokens of 25): the first two
    prefill and decode to the end before the third is admitted."""
    plan = static_batch.plan(Policy("prefill_first", 64, 256, 25, "reserve"), 8, 3, 3)
    assert steps(plan) == [[(8, 0)] * 2, [(1, 8)] * 2, [(1, 9)] * 2, [(8, 0)], [(1, 8)], [(1, 9)]]


@pytest.mark.parametrize(("model", "sku", "kind", "budget"), [
    ("llama-2-7b", "h100_sxm", "prefill_first", 4096),  # max_model_len 4,096
    ("llama-3-8b", "mi300x", "prefill_first", 8192),
    ("mistral-7b", "h100_sxm", "prefill_first", 32768),  # 32,768 is not above 32K
    ("qwen2-7b", "mi300x", "prefill_first", 131072),  # chunked prefill off, as the runs set it
])
def test_the_offline_budget_follows_vllm_v0_defaults(model, sku, kind, budget):
    models, gpu = load_models(), load_gpu_specs()[sku]
    policy = policy_for("vllm", "", models[model], 1, gpu, offline_model=model)
    assert (policy.kind, policy.token_budget, policy.max_seqs) == (kind, budget, 256)
    # 90 % of the memory less the weights, over the KV bytes of a token (2 bytes, K and V)
    m = models[model]
    per_token = m["num_layers"] * 2 * m["num_kv_heads"] * m["head_dim"] * 2
    assert policy.kv_tokens == pytest.approx(
        (0.9 * gpu["mem_gb"] * 2**30 - _weights(m)) / per_token, rel=0.02)


def _weights(m: dict) -> float:
    """BF16 bytes of a dense gated model's weights, recomputed from its shape."""
    h, q = m["hidden_size"], m["num_heads"] * m["head_dim"]
    kv = m["num_kv_heads"] * m["head_dim"]
    layer = h * (q + 2 * kv) + q * h + 3 * h * m["intermediate_size"]
    return 2.0 * (m["num_layers"] * layer + 2 * m["vocab_size"] * h)


def test_a_backend_without_an_offline_scheduler_is_refused():
    with pytest.raises(ValueError, match="no offline_v0 scheduler for backend 'sglang'"):
        policy_for("sglang", "", load_models()["llama-2-7b"], 1, load_gpu_specs()["h100_sxm"],
                   offline_model="llama-2-7b")
