"""The re-implementations against the real packages (``pip install -e '.[fidelity]'``).

* ``vidur`` 0.0.26: its own random-forest training (profile loading and filtering, the grid
  search on its MAPE scorer) on its pinned A100 Llama-2-7B ``mlp.csv``, against the forest
  ``rf_verbatim`` fits on the same rows. Vidur's full predictor cannot be built here: its
  constructor also trains the attention forests on ``attention.csv``, which is not among the
  pinned files (over 4 MiB upstream), so the check covers the token-level ops, through Vidur's
  training code on a bare instance.
* ``genz-llm`` 0.0.16: GenZ's decode and prefill model of Llama-2-7B on an A100 SXM datasheet,
  against ``genz`` on the same steps.

Skipped, with the reason, where a package is missing. Slow: each forest search takes seconds.
"""

from __future__ import annotations

import tempfile
import types
import warnings

import numpy as np
import pytest

from leaderboard.ingest import sources
from leaderboard_core.specs import load_gpu_specs
from predictors import registry
from predictors.rf import GRIDS, TOKEN_ROUNDING, fit_forest
from tests.predictors.test_rooflines import cells

pytestmark = pytest.mark.slow
MLP_CSV = "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"
# Vidur's names of the four GEMMs rf_verbatim forecasts, in the ground truth's names.
VIDUR_GEMMS = {"attn_pre_proj": "gemm_qkv", "attn_post_proj": "gemm_o",
               "mlp_up_proj": "gemm_gate_up", "mlp_down_proj": "gemm_down"}


def _vidur_profile_path() -> str:
    pin = next(p for p in sources.load_pins() if p.path == MLP_CSV)
    try:
        return str(sources.resolve([pin])[0].path)
    except sources.SourceError as exc:
        pytest.skip(f"Vidur's pinned A100 profile is not available here: {exc}")


def _vidur_trainer(tp: int):
    """Vidur's RandomForrestExecutionTimePredictor without its constructor (which would also
    train the attention forests on the unpinned attention.csv), set up as the constructor
    does for Llama-2-7B, with rf_verbatim's reduced grid so both search the same candidates."""
    vidur = pytest.importorskip("vidur.execution_time_predictor.random_forrest_execution_time_predictor",
                                reason="vidur 0.0.26 is not installed (pip install -e '.[fidelity]')")
    from vidur.config import RandomForrestExecutionTimePredictorConfig
    from vidur.config.model_config import BaseModelConfig

    grid = GRIDS["reduced"]
    trainer = vidur.RandomForrestExecutionTimePredictor.__new__(vidur.RandomForrestExecutionTimePredictor)
    trainer._config = RandomForrestExecutionTimePredictorConfig(
        num_estimators=grid["n_estimators"], max_depth=grid["max_depth"],
        min_samples_split=grid["min_samples_split"], no_cache=True, num_training_job_threads=1)
    trainer._model_config = BaseModelConfig.create_from_name("meta-llama/Llama-2-7b-hf")
    trainer._replica_config = types.SimpleNamespace(tensor_parallel_size=tp)
    trainer._cache_dir, trainer._block_size, trainer._max_tokens = tempfile.mkdtemp(), 16, 4096
    return trainer


def test_vidur_forests_match_rf_verbatim_on_vidurs_a100_profile():
    """Tolerance: both sides are sklearn's RandomForestRegressor with the same hyper-parameters
    on the same rows; the one difference is the bootstrap seed (Vidur sets no random_state,
    rf_verbatim fixes 0). On these exact, noise-free tables the forests then agree to well under
    1 % at the median; between profiled token counts (Vidur profiles every 8 to 1024, then
    every 16 and 32) the trees' split points fall differently, which moves a few predictions by
    up to a few percent. So: median |ratio - 1| below 0.5 %, every point within 5 %."""
    trainer = _vidur_trainer(tp=1)  # skips, with the reason, without the package
    import pandas as pd
    from vidur.execution_time_predictor.sklearn_execution_time_predictor import ModelType

    profile = trainer._load_compute_df(_vidur_profile_path())
    assert len(profile) > 200  # 259 token counts of Llama-2-7B at TP1
    tokens = np.arange(TOKEN_ROUNDING, 4096 + 1, TOKEN_ROUNDING)  # the T8 values a step reads
    for vidur_op in VIDUR_GEMMS:
        target = f"time_stats.{vidur_op}.median"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Vidur's forests take no random_state, so they draw from numpy's global generator:
            # seed it, or the widest gap moves from run to run (one run in several went past 5 %).
            np.random.seed(0)
            theirs = trainer._train_model(vidur_op, ModelType.COMPUTE, profile, ["num_tokens"], target)
        ours = fit_forest(profile[["num_tokens"]].to_numpy(np.float64), profile[target].to_numpy(),
                          "reduced", random_state=0)
        expected = theirs.predict(pd.DataFrame({"num_tokens": tokens}))
        got = ours.predict(tokens[:, None].astype(np.float64))
        gap = np.abs(got / expected - 1.0)
        assert np.median(gap) < 0.005 and gap.max() < 0.05, (vidur_op, np.median(gap), gap.max())
        # and both fit the profile itself as Vidur reports (about 1 % training MAPE)
        measured = profile[target].to_numpy()
        assert np.mean(np.abs(ours.predict(profile[["num_tokens"]].to_numpy(np.float64))
                              / measured - 1)) < 0.03


def _genz_step_ms(phase: str, batch: int, context: int, gpu) -> float:
    """GenZ's own latency of one Llama-2-7B TP1 step, classifier removed (the suite's steps
    leave out the LM head, baselines.md §0.2), efficiencies 1, beam width 1."""
    pytest.importorskip("GenZ", reason="genz-llm 0.0.16 is not installed (pip install -e '.[fidelity]')")
    from GenZ.analyse_model import get_model_df
    from GenZ.LLM_inference.utils import get_inference_system
    from GenZ.Models import create_full_decode_model, create_full_prefill_model
    from GenZ.unit import Unit

    system = get_inference_system(system_name={
        "real_values": True, "Flops": gpu["bf16_dense_tflops"], "Memory_BW": gpu["mem_bw_gbs"],
        "Memory_size": 80, "ICN": 150}, bits="bf16", ceff=1, meff=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if phase == "decode":
            model = create_full_decode_model(name="meta-llama/Llama-2-7B",
                                             input_sequence_length=context, output_gen_tokens=0)
            frame = get_model_df(model, system, Unit(), batch, intermediate_on_chip=True,
                                 beam_merge=False, beam_size=1)
        else:
            model = create_full_prefill_model(name="meta-llama/Llama-2-7B",
                                              input_sequence_length=context)
            frame = get_model_df(model, system, Unit(), batch, intermediate_on_chip=True)
    layer = frame.loc[frame["Layer Name"].str.match(r"^(QKV|Logit|Attend|Out Proj|up\+gate|down)"),
                      "Latency (msec)"].astype(float).sum()
    return layer * 32  # the repeated block, once per layer of Llama-2-7B


@pytest.mark.parametrize(("phase", "batch", "context"),
                         [("decode", 1, 1024), ("decode", 8, 512), ("decode", 32, 2048),
                          ("prefill", 1, 512), ("prefill", 1, 2048)])
def test_genz_matches_the_package(phase, batch, context):
    """Every op of the package's decode and prefill models is in ``genz``'s chunked form with
    the same MACs and bytes (weights once, K and V of each context, no causal halving). The
    chunked form (§3.2) also counts the MLP's activations off-chip in decode, a few hundred kB
    against 13 GB of weights (measured: at most 0.1 %), and leaves the QKV and output
    projections' activations out in prefill, where those GEMMs are compute-bound (0.0 %).
    Tolerance 0.5 %."""
    gpu = load_gpu_specs()["a100_sxm"]
    expected = _genz_step_ms(phase, batch, context, gpu)
    q, ctx = ([1] * batch, [context] * batch) if phase == "decode" else ([context], [0])
    got = registry.build("genz").predict(cells(("llama-2-7b", 1, q, ctx)), gpu)[0]
    assert got == pytest.approx(expected, rel=0.005)
