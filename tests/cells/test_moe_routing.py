"""ours's routing skew: expert loads under the collector's power-law routing, recomputed here
from the distribution's definition, and what they change in a fused-MoE layer."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from leaderboard.cells.schema import CELL_SCHEMA
from leaderboard_core.contract import Home
from leaderboard_core.specs import load_gpu_specs
from predictors.ours import Ours
from predictors.ours.config import load_constants
from predictors.ours.factors import power_law_loads
from tests.predictors.test_rooflines import cells as _cells

SPAN = {"many_lo": 1.0, "many_hi_share": 0.8, "few_lo": 0.01, "few_hi": 2.0}


def _fitted(model: Ours) -> Ours:
    """``model`` fitted on the default home, the A100 (fit reads no rows)."""
    a100 = load_gpu_specs()["a100_sxm"]
    return model.fit(Home("a100_sxm", a100, "a100_vidur", pl.DataFrame(schema=CELL_SCHEMA)))


def _quantile_draw(u: float, alpha: float, lo: float, hi: float) -> float:
    """The draw at quantile u of x^-alpha on [lo, hi], found by bisection on the CDF (its
    integral written out), not by the closed-form inverse the code uses."""
    e = 1 - alpha
    cdf = lambda x: (x ** e - lo ** e) / (hi ** e - lo ** e)  # noqa: E731
    a, b = lo, hi
    for _ in range(200):
        a, b = ((a + b) / 2, b) if cdf((a + b) / 2) < u else (a, (a + b) / 2)
    return (a + b) / 2


@pytest.mark.parametrize(("tokens", "topk", "experts"), [(16, 8, 128), (4, 2, 8), (300, 2, 8)])
def test_loads_are_the_distributions_quantiles_scaled_to_the_rows(tokens, topk, experts):
    rows = tokens * topk
    lo, hi = (1.0, 0.8 * tokens) if rows > experts else (0.01, 2.0)
    draws = np.array([_quantile_draw((i + 0.5) / experts, 1.01, lo, hi) for i in range(experts)])
    want = np.sort(np.round(rows * draws / draws.sum()))[::-1]
    got = power_law_loads(tokens, topk, experts, 1.01, SPAN)
    assert got.sum() == rows and got.max() <= tokens and (got >= 0).all()
    # rounding moves at most a few rows, always onto or off the largest experts
    capped = np.abs(np.minimum(want, tokens) - want).sum()
    assert np.abs(got - want).sum() <= abs(rows - want.sum()) + 2 * capped
    assert np.count_nonzero(got) == np.count_nonzero(want)


def test_few_tokens_touch_few_experts_and_cap_at_the_tokens():
    # Qwen3-30B-A3B, 16 tokens top-8 over 128 experts: the draw is log-uniform-like on [0.01, 2],
    # so an expert gets a row only if its draw is above half a row's share: ln(2 / 0.188) /
    # ln(2 / 0.01) of the experts, about 45 %, are touched, not all 128 as when balanced
    loads = power_law_loads(16, 8, 128, 1.01, SPAN)
    assert 0.35 * 128 < np.count_nonzero(loads) < 0.55 * 128
    assert power_law_loads(1000, 2, 8, 1.01, SPAN).max() == 1000  # one token picks an expert once


def test_ours_reads_fewer_expert_weights_under_skewed_routing():
    """Qwen3-30B-A3B TP1, 16 decodes on the H100: memory-bound, so the MoE time falls by about
    the share of experts the skewed routing leaves untouched; the routing switch turns it off."""
    steps = _cells(("qwen3-30b-a3b", 1, [1] * 16, [512] * 16)).drop("gt_ms")
    skewed = steps.with_columns(moe_routing=pl.lit("power_law_1.01"))
    h100 = load_gpu_specs()["h100_sxm"]

    def moe_ms(frame, **switches):
        model = _fitted(Ours(**switches))
        return float(model.predict_by_op(frame, h100)["moe"][0])

    balanced = moe_ms(steps)
    span = load_constants()["moe"]["power_law_span"]
    touched = np.count_nonzero(power_law_loads(16, 8, 128, 1.01, span))
    assert moe_ms(skewed) < balanced * (touched / 128 + 0.15)
    assert moe_ms(skewed, routing=False) == pytest.approx(balanced, rel=1e-12)
    stated = steps.with_columns(moe_routing=pl.lit("balanced"))
    assert moe_ms(stated) == pytest.approx(balanced, rel=1e-12)


def _recomputed_loads(tokens: int, topk: int, experts: int) -> np.ndarray:
    rows = tokens * topk
    lo, hi = (1.0, 0.8 * tokens) if rows > experts else (0.01, 2.0)
    draws = np.array([_quantile_draw((i + 0.5) / experts, 1.01, lo, hi) for i in range(experts)])
    return np.round(rows * draws / draws.sum())


@pytest.mark.parametrize(("tokens", "block"), [(4, 16), (200, 64)])
def test_skewed_rows_are_padded_per_expert_to_vllms_block(tokens, block):
    """Mixtral's 8 experts, top-2: each expert's rows padded up to BLOCK_SIZE_M (16 when the
    tokens are no more than the experts, else 64), summed; compared with loads recomputed here
    (both cases stay under the cap; at 200 tokens rounding gives 401 rows, one taken off the
    largest expert)."""
    from leaderboard_core.specs import load_gpu_specs as specs
    from predictors.ours.config import Device
    from predictors.ours.ops import Switches, fused_moe

    loads = np.sort(_recomputed_loads(tokens, 2, 8))
    loads[-1] -= loads.sum() - tokens * 2
    assert loads.max() <= tokens
    c = load_constants()
    one = lambda v: np.array([float(v)])  # noqa: E731
    got = fused_moe(one(tokens), one(2), one(8), one(4096), one(14336), Device.of(specs()["h100_sxm"], c),
                    c, Switches(), skew=one(1.01))
    assert got["padded_rows"][0] == (np.ceil(loads / block) * block).sum()


def test_spread_experts_under_skewed_routing_are_not_supported():
    from leaderboard_core.contract import NotSupported

    steps = _cells(("qwen3-30b-a3b", 2, [1] * 16, [512] * 16)).drop("gt_ms").with_columns(
        moe_routing=pl.lit("power_law_1.01"), moe_ep=pl.lit(2))
    model = _fitted(Ours())
    with pytest.raises(NotSupported, match="heaviest"):
        model.predict(steps, load_gpu_specs()["h100_sxm"])
    with pytest.raises(ValueError, match="neither 'balanced'"):
        model.predict(steps.with_columns(moe_routing=pl.lit("zipf")), load_gpu_specs()["h100_sxm"])
