"""The registry and the contract every registered predictor keeps (one test over all of them)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from probe_predictors import TwoMsSteps

from leaderboard_core.contract import GROUND_TRUTH_COLUMNS, NotSupported, PredictorCard
from predictors import registry
from predictors.base import Predictor
from predictors.checks import check_predictor

CARD = PredictorCard("analytical", "test", "a constant", False)


@pytest.fixture
def scratch_registry(monkeypatch):
    registry.discover()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_duplicate_names_are_rejected(scratch_registry):
    @registry.register("dup_probe")
    class First(Predictor):
        card = CARD

    with pytest.raises(ValueError, match="already registered"):
        @registry.register("dup_probe")
        class Second(Predictor):
            card = CARD


def test_a_class_without_a_card_is_rejected(scratch_registry):
    with pytest.raises(TypeError, match="PredictorCard"):
        @registry.register("no_card_probe")
        class NoCard(Predictor):
            pass


def test_typo_lists_valid_names_and_the_closest(scratch_registry):
    @registry.register("roofline_probe")
    class Probe(Predictor):
        card = CARD

    with pytest.raises(registry.UnknownPredictor) as err:
        registry.get("roofline_prob")
    assert "Did you mean 'roofline_probe'?" in str(err.value)
    assert all(name in str(err.value) for name in registry.names())


def test_unknown_parameter_names_the_valid_ones(scratch_registry):
    @registry.register("param_probe")
    class Probe(Predictor):
        card = CARD

        def __init__(self, eff: float = 1.0):
            self.eff = eff

    with pytest.raises(ValueError, match="its parameters: eff"):
        registry.build("param_probe", {"efficiency": 0.5})
    assert registry.build("param_probe", {"eff": 0.5}).get_params() == {"eff": 0.5}


def test_the_registry_has_the_baselines():
    assert {"rf_verbatim", "rf_scaled", "genz", "genz_calibrated", "llm_viewer", "liminal",
            "distserve", "distserve_scaled", "ours"} <= set(registry.names())


# Predictors whose fit on the A100 home takes over 15 s (its forests): their contract check is
# marked long, so make test-long and CI run it.
SLOW_TO_FIT = ("rf_scaled", "rf_verbatim")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.long) if n in SLOW_TO_FIT
                                  else n for n in registry.names()])
def test_contract(name, real_home):
    """scikit-learn's estimator contract, blind prediction and valid output, per predictor."""
    cls = registry.get(name)
    assert cls.card.kind in ("analytical", "learned", "profiled")
    defaults = cls.default_params()
    assert set(defaults) == set(cls.param_names()), "every hyper-parameter needs a default"
    estimator = cls()
    assert estimator.get_params() == defaults
    before = set(vars(estimator))
    assert estimator.fit(real_home.home) is estimator
    learned = set(vars(estimator)) - before
    assert all(a.endswith("_") for a in learned), f"learned state must end in _: {learned}"
    assert estimator.trained_on_ == "a100_sxm"
    assert estimator.get_params() == defaults, "fit must not change hyper-parameters"
    sample, gpu = real_home.target.sample(200, seed=0).drop(GROUND_TRUTH_COLUMNS), real_home.gpu
    try:
        estimator.predict(sample.head(1), gpu)
    except NotSupported:  # a predictor that states it cannot leave its home GPU (blis_blackbox)
        home = real_home.home
        sample, gpu = home.cells.sample(200, seed=0).drop(GROUND_TRUTH_COLUMNS), home.gpu
    kept = sample.clone()
    pred = estimator.predict(sample, gpu)
    assert isinstance(pred, np.ndarray) and pred.shape == (200,)
    assert np.isfinite(pred).all() and (pred > 0).all()
    assert sample.equals(kept), "predict must not modify its input"
    np.testing.assert_array_equal(estimator.predict(sample, gpu), pred)
    reordered = estimator.predict(sample.reverse(), gpu)
    np.testing.assert_allclose(reordered[::-1], pred, rtol=1e-12)
    assert isinstance(sample, pl.DataFrame)


OP_PREDICTORS = [n for n in registry.names() if registry.describe(n, registry.get(n))["predicts_ops"]]


@pytest.mark.parametrize("name", OP_PREDICTORS)
def test_op_level_contract(name, real_store, real_home):
    """Predictors that time single kernels give one finite positive ms per op point."""
    import duckdb

    from leaderboard.cells.ops import op_points
    from leaderboard.run.op_level import MEASURED, with_ids

    with duckdb.connect(str(real_store.path), read_only=True) as con:
        points = with_ids(op_points(con, "h200_sxm_ops")).rename({"latency_ms": "gt_ms"})
    sample = pl.concat([points.filter(pl.col("phase") == p).sample(100, seed=0)
                        for p in ("gemm", "attn_prefill", "attn_decode")]).drop(MEASURED)
    estimator = registry.build(name).fit(real_home.home)
    pred = estimator.predict_ops(sample, real_home.gpu)
    assert pred.shape == (300,) and np.isfinite(pred).all() and (pred > 0).all()
    big = sample.filter(pl.col("phase") == "gemm").sort("m")
    timed = estimator.predict_ops(big, real_home.gpu)
    work = (big["m"] * big["n"] * big["k"]).to_numpy()
    assert timed[np.argmax(work)] > timed[np.argmin(work)], "more GEMM work must take longer"


@pytest.mark.parametrize("name", registry.names())
def test_check_predictor_passes_on_synthetic_data(name):
    """The public contract check, with no store and no ../shared."""
    done = check_predictor(registry.get(name))
    assert done[:2] == ["parameters", "fit"] or done[1].startswith("NotSupported")


class _Broken(Predictor):
    card = CARD

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def predict(self, cells, gpu):
        # each call depends on the batch it is given: not one value per cell on its own
        return np.full(len(cells), float(len(cells)) * self.scale)


def test_check_predictor_catches_a_prediction_that_depends_on_the_batch():
    with pytest.raises(AssertionError, match="subset"):
        check_predictor(_Broken)


def test_check_predictor_catches_fit_not_returning_self():
    class NoSelf(_Broken):
        def fit(self, home):
            self.fitted_ = True

    with pytest.raises(AssertionError, match="must return self"):
        check_predictor(NoSelf)


def test_check_predictor_catches_unnamed_learned_state():
    class Leaky(_Broken):
        def fit(self, home):
            self.mean = 1.0
            return self

    with pytest.raises(AssertionError, match="end in _"):
        check_predictor(Leaky)


def test_check_predictor_catches_a_per_op_split_that_does_not_sum_to_the_step():
    class Split(TwoMsSteps):
        def predict_by_op(self, cells, gpu):
            return {"gemm": np.full(len(cells), 1.0), "allreduce": np.full(len(cells), 0.5)}

    with pytest.raises(AssertionError, match="sum to predict"):
        check_predictor(Split)

    class Exact(TwoMsSteps):
        def predict_by_op(self, cells, gpu):
            return {"gemm": np.full(len(cells), 1.5), "allreduce": np.full(len(cells), 0.5)}

    assert check_predictor(Exact)[-1] == "predict"
