"""GPU and model specs, and the Hydra config, as configuration files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from leaderboard.ingest import aiconfigurator, distserve, llmservingsim, neusight, splitwise, vidur
from leaderboard.run.config import load_config
from leaderboard_core import paths, specs

GPU_FILES = sorted((paths.CONF_DIR / "gpu").glob("*.yaml"))
MODEL_FILES = sorted((paths.CONF_DIR / "model").glob("*.yaml"))
NUMERIC = ("bf16_dense_tflops", "mem_bw_gbs", "l2_mb", "sm_count", "boost_clock_mhz", "mem_gb")
# Data directories read by leaderboard_core.specs, not Hydra config groups.
NOT_GROUPS = {"gpu", "model"}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@pytest.mark.parametrize("path", GPU_FILES, ids=lambda p: p.stem)
def test_gpu_spec_file(path: Path):
    spec = yaml.safe_load(path.read_text())
    missing = [k for k in specs.GPU_REQUIRED if k not in spec]
    assert missing == []
    assert spec["sku"] == path.stem
    for key in NUMERIC:
        assert _is_number(spec[key]) and spec[key] > 0, f"{key} = {spec[key]!r}"
    assert isinstance(spec["sm_count"], int)
    assert isinstance(spec["interconnect"], dict) and spec["interconnect"].get("kind")
    assert isinstance(spec["sources"], dict) and spec["sources"]
    assert all(isinstance(v, str) and v.strip() for v in spec["sources"].values())
    assert spec["short_name"] and spec["vendor"] and spec["arch"]
    doubtful = spec.get("doubtful") or {}
    assert isinstance(doubtful, dict)


def test_gpu_specs_cover_every_gpu_in_the_data():
    gpus = specs.load_gpu_specs()
    assert set(gpus) == {p.stem for p in GPU_FILES}
    used = {*vidur.DEVICE_SKU.values(), *vidur.NODE_SKU.values(), *neusight.DEVICE_SKU.values(),
            *splitwise.HARDWARE_SKU.values(), *llmservingsim.HW_SKU.values(), distserve.SKU}
    assert used - set(gpus) == set()
    shared_aic = paths.SHARED_UPSTREAM / aiconfigurator.ROOT
    if shared_aic.is_dir():
        assert {p.name for p in shared_aic.iterdir() if p.is_dir()} <= set(gpus)


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_model_spec_file(path: Path):
    model = yaml.safe_load(path.read_text())
    assert [k for k in specs.MODEL_REQUIRED if k not in model] == []
    assert model["name"] == path.stem
    for key in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "vocab_size"):
        assert isinstance(model[key], int) and model[key] > 0, key
    assert model["num_heads"] % model["num_kv_heads"] == 0
    assert isinstance(model["gated_mlp"], bool)


def test_models_load_and_aliases_are_unique():
    models = specs.load_models()
    assert set(models) == {p.stem for p in MODEL_FILES}
    owner: dict[str, str] = {}
    for name, m in models.items():
        for alias in {name, m["hf_id"], m["hf_id"].split("/")[-1], *m.get("aliases", [])}:
            assert owner.setdefault(alias.lower(), name) == name, f"{alias}: two models"
    assert all(specs.resolve_model(models, a, "test") == n for a, n in owner.items())


def test_extra_gpu_spec_dir(tmp_path, monkeypatch):
    spec = yaml.safe_load((paths.CONF_DIR / "gpu" / "h100_sxm.yaml").read_text())
    (tmp_path / "newgpu.yaml").write_text(yaml.safe_dump({**spec, "sku": "newgpu"}))
    (tmp_path / "h100_sxm.yaml").write_text(yaml.safe_dump({**spec, "mem_bw_gbs": 1.0}))
    assert "newgpu" not in specs.load_gpu_specs()
    monkeypatch.setenv("LEADERBOARD_GPU_SPECS", str(tmp_path))
    gpus = specs.load_gpu_specs()
    assert gpus["newgpu"].path == tmp_path / "newgpu.yaml"
    assert gpus["h100_sxm"]["mem_bw_gbs"] == 1.0  # a user's file replaces the repo's
    monkeypatch.delenv("LEADERBOARD_GPU_SPECS")
    assert "newgpu" in specs.load_gpu_specs(tmp_path)  # the config key's path


def test_an_edited_spec_file_is_read_again_and_a_changed_copy_never_reaches_the_next(tmp_path):
    spec = yaml.safe_load((paths.CONF_DIR / "gpu" / "h100_sxm.yaml").read_text())
    path = tmp_path / "newgpu.yaml"
    path.write_text(yaml.safe_dump({**spec, "sku": "newgpu", "mem_bw_gbs": 1.0}))
    first = specs.load_gpu_specs(tmp_path)["newgpu"]
    first.data["mem_bw_gbs"] = 7.0  # a caller that changes what it got
    assert specs.load_gpu_specs(tmp_path)["newgpu"]["mem_bw_gbs"] == 1.0
    path.write_text(yaml.safe_dump({**spec, "sku": "newgpu", "mem_bw_gbs": 2222.5}))
    assert specs.load_gpu_specs(tmp_path)["newgpu"]["mem_bw_gbs"] == 2222.5
    path.write_text(yaml.safe_dump({**spec, "sku": "newgpu", "mem_bw_gbs": 3333.5}))  # same size
    assert specs.load_gpu_specs(tmp_path)["newgpu"]["mem_bw_gbs"] == 3333.5


@pytest.mark.parametrize("change, problem", [
    ({"sku": "other"}, "must equal the file name"),
    ({"mem_bw_gbs": None}, None),
])
def test_bad_gpu_spec_is_named(tmp_path, monkeypatch, change, problem):
    spec = yaml.safe_load((paths.CONF_DIR / "gpu" / "h100_sxm.yaml").read_text())
    spec = {**spec, "sku": "newgpu", **change}
    if problem is None:  # a missing key
        spec = {k: v for k, v in spec.items() if k != "mem_bw_gbs"}
        problem = "missing required key(s) mem_bw_gbs"
    (tmp_path / "newgpu.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("LEADERBOARD_GPU_SPECS", str(tmp_path))
    with pytest.raises(specs.SpecError) as err:
        specs.load_gpu_specs()
    assert str(tmp_path / "newgpu.yaml") in str(err.value) and problem in str(err.value)


def test_root_config_composes():
    cfg = load_config()
    assert cfg.sources.root is None and cfg.sources.only is None and cfg.gpu_specs is None
    cfg = load_config(["sources.root=/x", "gpu_specs=/y", "sources.only=[vidur]"])
    assert cfg.sources.root == "/x" and cfg.gpu_specs == "/y" and list(cfg.sources.only) == [
        "vidur"]


def _group_options() -> list[tuple[str, str]]:
    options = []
    for path in sorted(paths.CONF_DIR.rglob("*.yaml")):
        group = path.parent.relative_to(paths.CONF_DIR).as_posix()
        if group != "." and group.split("/")[0] not in NOT_GROUPS:
            options.append((group, path.stem))
    return options


def test_every_config_in_conf_composes():
    """The root config, and each option of every config group, with and without overrides."""
    options = _group_options()
    with initialize_config_dir(config_dir=str(paths.CONF_DIR), version_base="1.3"):
        root = compose(config_name="config")
        defaults = {k for k in root}
        for overrides in ([], ["sources.root=/x", "gpu_specs=/y"]):
            for group, name in [(None, None), *options]:
                extra = []
                if group is not None:
                    listed = group in defaults or group.startswith("hydra/")
                    extra = [f"{'' if listed else '+'}{group}={name}"]
                cfg = compose(config_name="config", overrides=[*extra, *overrides],
                              return_hydra_config=bool(group and group.startswith("hydra/")))
                assert "sources" in cfg
                if overrides:
                    assert cfg.sources.root == "/x" and cfg.gpu_specs == "/y"


def test_tp_shapes_replicate_a_kv_head_where_tp_outnumbers_them_and_refuse_the_rest():
    """Qwen3-235B-A22B: 64 query heads, 4 KV heads, head size 128. At TP 4 each GPU holds 16 + 1
    heads and its QKV projection writes (16 + 2 x 1) x 128 = 2,304 wide; at TP 8 each holds 8
    query heads and one KV head, a replica (vLLM's QKV projection keeps one KV head per GPU),
    (8 + 2 x 1) x 128 = 1,280 wide, where sharding all 4 over 8 would give 0 KV heads and
    (64 + 8) x 128 / 8 = 1,152. TP 3 shards neither 64 query heads nor 4 KV heads; Llama-3.1-8B
    at TP 16 has 32 / 16 query heads and a KV head replicated twice (8 KV heads), but at TP 3
    its 32 query heads do not split."""
    model = specs.load_models()["qwen3-235b-a22b"]
    assert (model["num_heads"], model["num_kv_heads"], model["head_dim"]) == (64, 4, 128)
    at4, at8 = specs.tp_shapes(model, 4), specs.tp_shapes(model, 8)
    assert (at4["heads"], at4["kv_heads"], at4["qkv"][0]) == (16, 1, 2304)
    assert (at8["heads"], at8["kv_heads"], at8["qkv"][0]) == (8, 1, 1280)
    llama = specs.load_models()["llama-3.1-8b"]
    assert specs.tp_shapes(llama, 16)["kv_heads"] == 1
    with pytest.raises(specs.SpecError, match="qwen3-235b-a22b.*4 KV heads: TP 3 neither divides"):
        specs.kv_heads_per_gpu(model, 3)
    with pytest.raises(specs.SpecError, match="llama-3.1-8b.*32 attention heads, which TP 3"):
        specs.tp_shapes(llama, 3)
    # 48 query heads split over TP 4, but 6 KV heads neither split over 4 nor replicate evenly
    odd = {**llama, "name": "odd", "num_heads": 48, "num_kv_heads": 6}
    with pytest.raises(specs.SpecError, match="'odd' has 6 KV heads: TP 4 neither divides"):
        specs.tp_shapes(odd, 4)
