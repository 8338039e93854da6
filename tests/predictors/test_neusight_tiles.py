"""neusight_tiles: tiles, waves and the tiled roofline by hand; a network that learns a known
distance from it on one GPU carries it to another through the waves and the datasheet."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from leaderboard_core.contract import Home
from leaderboard_core.specs import load_gpu_specs
from predictors._roofline import peaks, point_seconds
from predictors.neusight_tiles import NeuSightTiles, features, tiles


def test_tiles_waves_and_the_tiled_roofline_by_hand():
    a100 = load_gpu_specs()["a100_sxm"]  # 108 SMs
    gemm = pl.DataFrame({"m": [200, 4096], "n": [300, 4096], "k": [4096, 4096]})
    assert tiles("gemm", gemm).tolist() == [2 * 3, 32 * 32]
    gpu = {"sms": 108.0, "flops": peaks(a100)["flops"], "mem_bw": peaks(a100)["mem_bw"],
           "l2": 40.0, "peaks": peaks(a100)}
    _, tiled, roof = features("gemm", gemm, gpu)
    np.testing.assert_allclose(roof, point_seconds("gemm", gemm, peaks(a100)))
    # 6 tiles fill 6 of 108 SMs in one wave; 1024 tiles take 10 waves of 108
    np.testing.assert_allclose(tiled / roof, [108 / 6, 10 * 108 / 1024])
    decode = pl.DataFrame({"batch": [8], "kv_len": [1024], "num_kv_heads": [8], "num_heads": [32],
                           "head_dim": [128], "q_len": [1]})
    assert tiles("attn_decode", decode).tolist() == [64]


def _grid_home(law: float) -> Home:
    """An A100 home whose every GEMM point takes ``law`` x its tiled roofline."""
    gpu = load_gpu_specs()["a100_sxm"]
    sizes = [64, 256, 1024, 4096, 16384]
    grid = pl.DataFrame([{"m": m, "n": n, "k": k} for m in sizes for n in sizes for k in sizes])
    row = {"sms": float(gpu["sm_count"]), "flops": peaks(gpu)["flops"],
           "mem_bw": peaks(gpu)["mem_bw"], "l2": float(gpu["l2_mb"]), "peaks": peaks(gpu)}
    _, tiled, _ = features("gemm", grid, row)
    ops = {"gemm_qkv": grid.with_columns(latency_ms=pl.Series(law * tiled * 1e3))}
    return Home(sku="a100_sxm", gpu=gpu, dataset="grid", cells=pl.DataFrame(), ops=ops)


def test_a_learned_distance_carries_to_another_gpu_and_never_undercuts_the_roofline():
    fitted = NeuSightTiles().fit(_grid_home(law=2.0))
    h100 = load_gpu_specs()["h100_sxm"]
    query = pl.DataFrame({"m": [128, 512, 2048, 8192], "n": [512, 2048, 4096, 8192],
                          "k": [1024, 4096, 2048, 8192], "phase": ["gemm"] * 4})
    row = {"sms": float(h100["sm_count"]), "flops": peaks(h100)["flops"],
           "mem_bw": peaks(h100)["mem_bw"], "l2": float(h100["l2_mb"]), "peaks": peaks(h100)}
    _, tiled, roof = features("gemm", query, row)
    ms = fitted.predict_ops(query, h100)
    # the H100's own waves (132 SMs) and peaks, times the distance learned on the A100
    np.testing.assert_allclose(ms, 2.0 * tiled * 1e3, rtol=0.1)
    assert (ms >= roof * 1e3 * (1 - 1e-12)).all()
    under = NeuSightTiles().fit(_grid_home(law=0.01))  # a law below the roofline is capped
    np.testing.assert_allclose(under.predict_ops(query, h100), roof * 1e3, rtol=1e-9)


def test_fit_learns_only_trailing_underscore_state_and_refuses_fp8():
    from leaderboard_core.contract import NotSupported

    fitted = NeuSightTiles(hidden=8).fit(_grid_home(law=1.5))
    assert fitted.get_params() == {"hidden": 8, "seed": 0}
    cells = pl.DataFrame({"model": ["llama-3-8b"], "tp": [1], "total_tokens": [8],
                          "num_requests": [8], "num_decode": [8], "num_prefill": [0],
                          "prefill_tokens": [0], "decode_ctx_sum": [8 * 512],
                          "gemm_dtype": ["fp8"], "gt_kind": ["gpu_block"]})
    with pytest.raises(NotSupported, match="BF16 GEMMs only"):
        fitted.predict(cells, load_gpu_specs()["h100_sxm"])


@pytest.mark.parametrize("first", ["a100_sxm", "h100_sxm"])
def test_a_several_gpu_home_trains_in_its_rows_order(first, monkeypatch):
    # The network's fit depends on the order of its training rows; grouped in hash order, a
    # several-GPU home's rows came in an order that changed from call to call, and so did the
    # numbers it scored.
    import predictors.neusight_tiles as module

    specs = load_gpu_specs()
    order = [first, *({"a100_sxm", "h100_sxm"} - {first})]
    grid = _grid_home(law=2.0).ops["gemm_qkv"]
    frame = pl.concat([grid.with_columns(sku=pl.lit(sku)) for sku in order])
    home = Home(sku=order[0], gpu=specs[order[0]], dataset="grid", cells=pl.DataFrame(),
                ops={"gemm_qkv": frame}, gpus={sku: specs[sku] for sku in order})
    seen, features_of = [], module.features
    by_sms = {float(specs[sku]["sm_count"]): sku for sku in order}

    def noting_the_gpu(family, rows, gpu, *rest):
        seen.append(by_sms[gpu["sms"]])
        return features_of(family, rows, gpu, *rest)

    monkeypatch.setattr(module, "features", noting_the_gpu)
    for _ in range(8):  # hash order changes from call to call: one fit could pass by chance
        seen.clear()
        NeuSightTiles(hidden=4).fit(home)
        assert seen == order


def test_the_kept_network_predicts_what_scikit_learn_predicts_to_the_bit():
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from predictors.neusight_tiles import Network

    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(400, 7)) * [1, 10, 100, 1, 3, 0.1, 5], rng.normal(size=400)
    pipeline = make_pipeline(StandardScaler(), MLPRegressor(
        hidden_layer_sizes=(16, 16), max_iter=50, random_state=0)).fit(x, y)
    asked = rng.normal(size=(257, 7)) * [1, 10, 100, 1, 3, 0.1, 5]
    np.testing.assert_array_equal(Network.of(pipeline).predict(asked), pipeline.predict(asked))
    with pytest.raises(ValueError):  # scikit-learn refuses a non-finite input, and so does it
        pipeline.predict(np.where(asked > 50, np.inf, asked))
    with pytest.raises(ValueError, match="NaN or infinity"):
        Network.of(pipeline).predict(np.where(asked > 50, np.inf, asked))
    with pytest.raises(ValueError, match="ReLU"):
        Network.of(make_pipeline(StandardScaler(), MLPRegressor(
            hidden_layer_sizes=(4,), max_iter=5, activation="tanh")).fit(x, y))


def test_a_kept_fit_loads_and_predicts_without_scikit_learn(tmp_path):
    import pickle
    import subprocess
    import sys

    h100 = load_gpu_specs()["h100_sxm"]
    query = pl.DataFrame({"m": [128, 8192], "n": [512, 8192], "k": [1024, 8192],
                          "phase": ["gemm"] * 2})
    fitted = NeuSightTiles(hidden=8).fit(_grid_home(law=2.0))
    (tmp_path / "fit.pickle").write_bytes(pickle.dumps((fitted, h100, query)))
    script = ("import pickle, sys; import numpy as np\n"
              f"fitted, gpu, query = pickle.loads(open({str(tmp_path / 'fit.pickle')!r}, 'rb')"
              ".read())\n"
              "np.save(sys.argv[1], fitted.predict_ops(query, gpu))\n"
              "assert 'sklearn' not in sys.modules, 'scikit-learn was imported'\n")
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "ms.npy")], check=True)
    np.testing.assert_array_equal(np.load(tmp_path / "ms.npy"), fitted.predict_ops(query, h100))
