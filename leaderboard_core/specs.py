"""GPU datasheets and model shapes, read from ``conf/gpu`` and ``conf/model``.

A user adds a GPU without editing the repo: ``$LEADERBOARD_GPU_SPECS`` (or the config key
``gpu_specs``) names an extra directory of ``<sku>.yaml`` files read alongside ``conf/gpu``.
A file there with the same sku replaces the repo's.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from leaderboard_core import paths, yaml_io
from leaderboard_core.naming import closest
from leaderboard_core.versioning import content_hash

GPU_REQUIRED = (
    "sku", "short_name", "vendor", "arch", "sm_count", "boost_clock_mhz", "bf16_dense_tflops",
    "mem_bw_gbs", "l2_mb", "mem_gb", "interconnect", "sources",
)
# ``interconnect`` keys: kind (nvlink | pcie), bw_gbs (bidirectional per GPU), scope (node, rack,
# pair), and topology, how a TP group's GPUs reach each other (optional; ours derives it from
# kind and scope when absent): through an NVLink switch, an NVLink bridge pair, a PCIe switch,
# or only the host's root complex.
TOPOLOGIES = ("nvswitch", "nvlink_bridge", "pcie_switch", "pcie_host")

# Optional dense tensor peaks below BF16, present only on chips with such tensor cores (FP8 from
# Ada and Hopper on, FP4 from Blackwell on), each with its source like the required peaks.
GPU_PRECISION_PEAKS = {"bf16": "bf16_dense_tflops", "fp8": "fp8_dense_tflops",
                       "fp4": "fp4_dense_tflops"}
MODEL_REQUIRED = (
    "name", "hf_id", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
    "intermediate_size", "gated_mlp", "vocab_size",
)

# Physical ranges: (low, high), low exclusive. A value outside fails with file, field and range.
GPU_RANGES = {
    "sm_count": (0, 1000), "boost_clock_mhz": (0, 5000), "bf16_dense_tflops": (0, 100_000),
    "mem_bw_gbs": (0, 100_000), "l2_mb": (0, 1024), "mem_gb": (0, 10_000),
}
# The vendors and architectures the suite knows. Another one is accepted with a warning (a new
# GPU needs only its spec file): its physical ranges are still checked, and each predictor
# treats it by its documented default or answers NotSupported with the reason.
GPU_KNOWN = {"vendor": ("nvidia", "amd", "intel"),
             "arch": ("pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell",
                      "cdna2", "cdna3", "cdna4", "gaudi", "xe_hpc")}
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]*$")
_WARNED: set[tuple[Path, str, str]] = set()
# A mixture-of-experts model names all of these (its published config's fields, renamed);
# ``dense_layers`` leading layers keep a dense FFN of ``intermediate_size`` (DeepSeek's
# first_k_dense_replace), the others route each token to ``experts_per_token`` of
# ``num_experts`` experts of ``moe_intermediate_size``, plus ``shared_experts`` always-on ones.
MOE_FIELDS = ("num_experts", "experts_per_token", "shared_experts", "moe_intermediate_size",
              "dense_layers")
# Attention kinds: grouped-query (multi-head and multi-query included) or DeepSeek's multi-head
# latent attention, whose shape needs the MLA fields.
ATTENTION_KINDS = ("gqa", "mla")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# How the model's published FP8 checkpoint scales its weights: one scale per tensor (the
# default) or per 128 x 128 block (DeepSeek-style ``weight_block_size``). vLLM runs a different
# kernel for each, and aiconfigurator times them as separate tables (``fp8``, ``fp8_block``).
FP8_SCALINGS = ("tensor", "block")
FP8_BLOCK_TABLES = "fp8_block"  # the measured tables' dtype of the block-scaled kernels
# Bytes a KV cache holds per element, by the measured tables' KV dtype names; the activations'
# dtype (bfloat16) is every engine's default, an 8-bit cache is a launch flag.
KV_CACHE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0}
DEFAULT_KV_DTYPE = "bfloat16"
FP8_KV = "fp8"
# The caches read as the step sets' cells hold theirs: a cell or query naming no KV dtype.
SIXTEEN_BIT_KV = tuple(dtype for dtype, size in KV_CACHE_BYTES.items() if size == 2)
MODEL_RANGES = {k: (0, 10_000_000) for k in ("num_layers", "hidden_size", "num_heads",
                                              "num_kv_heads", "head_dim", "intermediate_size",
                                              "vocab_size")}


class SpecError(ValueError):
    """A spec file is missing or malformed; the message names the file to add or fix."""


@dataclass(frozen=True)
class GpuSpec:
    sku: str
    data: dict[str, Any]
    path: Path

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def has_dense_peak(self, precision: str) -> bool:
        """Whether the datasheet gives a dense tensor peak at ``precision`` (the chip has such
        tensor cores)."""
        return GPU_PRECISION_PEAKS.get(precision) in self.data

    def dense_tflops(self, precision: str) -> float:
        """The datasheet dense tensor peak at ``precision`` (bf16, fp8 or fp4)."""
        key = GPU_PRECISION_PEAKS.get(precision)
        if not self.has_dense_peak(precision):
            raise SpecError(f"{self.path}: no {precision} dense peak ({key or 'unknown precision'}); "
                            f"known precisions: {sorted(GPU_PRECISION_PEAKS)}; add the key with "
                            "its source if the chip has such tensor cores")
        return float(self.data[key])

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return float(self.data["mem_bw_gbs"]) * 1e9


def gpu_spec_dirs(extra: str | os.PathLike | None = None) -> list[Path]:
    dirs = [paths.CONF_DIR / "gpu"]
    value = extra or os.environ.get("LEADERBOARD_GPU_SPECS")
    if value:
        dirs.append(Path(value).expanduser())
    return dirs


def _load_yaml(path: Path, required: tuple[str, ...]) -> dict[str, Any]:
    try:  # a copy: callers may change what they get, never what the next one reads
        data = copy.deepcopy(_parsed(path.read_text()))
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of keys, got {type(data).__name__}")
    missing = [k for k in required if k not in data]
    if missing:
        raise SpecError(f"{path}: missing required key(s) {', '.join(missing)}")
    return data


@functools.lru_cache(maxsize=512)
def _parsed(text: str) -> Any:
    """A spec file's text parsed once per process: every run reads about 90 of them, a rerun
    worker the same ones again. Keyed by the text, which is cheap to read, so an edit is seen
    however soon it follows the last read."""
    return yaml_io.safe_load(text)


def validate(path: Path, data: dict, ranges: dict, choices: dict) -> None:
    """Raise SpecError naming the file, the field and the allowed range or form; warn (on
    stderr, once) of a name outside ``choices``."""
    for key, (low, high) in ranges.items():
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
            raise SpecError(f"{path}: {key} = {value!r} is outside its physical range; "
                            f"allowed: a number > {low} and <= {high:,}")
    for key, allowed in choices.items():
        value = data[key]
        if not isinstance(value, str) or not NAME_PATTERN.match(value):
            raise SpecError(f"{path}: {key} = {value!r} must be a lower-case name "
                            f"(known: {', '.join(allowed)})")
        if value not in allowed and (path, key, value) not in _WARNED:
            _WARNED.add((path, key, value))  # once per process, however often specs load
            print(f"warning: {path}: {key} = {value!r} is not one the suite knows ("
                  f"{', '.join(allowed)}); accepted, and predictors treat it by their documented "
                  f"default.{closest(value, list(allowed))}", file=sys.stderr)
    if "l2_mb" in ranges and data["l2_mb"] >= data["mem_gb"] * 1024:
        raise SpecError(f"{path}: l2_mb = {data['l2_mb']} must be smaller than the memory "
                        f"(mem_gb = {data['mem_gb']}, i.e. {data['mem_gb'] * 1024:,} MB)")


def spec_hash(gpu: GpuSpec, models: dict) -> str:
    """What a run's numbers depend on in the specs: the target GPU's datasheet and every model
    shape (a changed spec is another result, like changed code)."""
    return content_hash(gpu.data, models)


def load_gpu_specs(extra: str | os.PathLike | None = None) -> dict[str, GpuSpec]:
    specs: dict[str, GpuSpec] = {}
    for directory in gpu_spec_dirs(extra):
        for path in sorted(directory.glob("*.yaml")):
            data = _load_yaml(path, GPU_REQUIRED)
            validate(path, data, GPU_RANGES, GPU_KNOWN)
            if data["sku"] != path.stem:
                raise SpecError(f"{path}: sku '{data['sku']}' must equal the file name '{path.stem}'")
            specs[path.stem] = GpuSpec(path.stem, data, path)
    return specs


def require_gpu(specs: dict[str, GpuSpec], sku: str, context: str) -> GpuSpec:
    if sku not in specs:
        dirs = " or ".join(str(d) for d in gpu_spec_dirs())
        raise SpecError(
            f"{context}: GPU '{sku}' has no spec file. Add {sku}.yaml to {dirs} "
            f"(or to a directory named by LEADERBOARD_GPU_SPECS), with at least the keys "
            f"{', '.join(GPU_REQUIRED)}; see conf/gpu/h100_sxm.yaml for an example."
        )
    return specs[sku]


def load_models() -> dict[str, dict[str, Any]]:
    models = {}
    for path in sorted((paths.CONF_DIR / "model").glob("*.yaml")):
        models[path.stem] = _load_yaml(path, MODEL_REQUIRED)
        validate(path, models[path.stem], MODEL_RANGES, {})
        _validate_layers(path, models[path.stem])
    return models


def _validate_layers(path: Path, model: dict) -> None:
    """The MoE fields come all together and fit the model; the attention kind is known, an
    MLA model gives its dims, and the FP8 scaling is a known one."""
    given = [f for f in MOE_FIELDS if f in model]
    if given and len(given) != len(MOE_FIELDS):
        raise SpecError(f"{path}: an MoE model needs all of {', '.join(MOE_FIELDS)}; missing "
                        f"{', '.join(f for f in MOE_FIELDS if f not in model)}")
    if given:
        for f in MOE_FIELDS:
            if isinstance(model[f], bool) or not isinstance(model[f], int) or model[f] < 0:
                raise SpecError(f"{path}: {f} = {model[f]!r} must be a whole number >= 0")
        if not 0 < model["experts_per_token"] <= model["num_experts"]:
            raise SpecError(f"{path}: experts_per_token = {model['experts_per_token']} must be "
                            f"between 1 and num_experts = {model['num_experts']}")
        if model["dense_layers"] >= model["num_layers"]:
            raise SpecError(f"{path}: dense_layers = {model['dense_layers']} leaves no MoE layer "
                            f"of num_layers = {model['num_layers']}")
    kind = model.get("attention", "gqa")
    if kind not in ATTENTION_KINDS:
        raise SpecError(f"{path}: attention = {kind!r} is not one of {', '.join(ATTENTION_KINDS)}"
                        f"{closest(str(kind), list(ATTENTION_KINDS))}")
    if kind == "mla" and (missing := [f for f in MLA_FIELDS if f not in model]):
        raise SpecError(f"{path}: an MLA model needs {', '.join(missing)}")
    if (scaling := model.get("fp8_scaling", "tensor")) not in FP8_SCALINGS:
        raise SpecError(f"{path}: fp8_scaling = {scaling!r} is not one of {', '.join(FP8_SCALINGS)}."
                        f"{closest(str(scaling), list(FP8_SCALINGS))}")


def is_moe(model: dict) -> bool:
    return "num_experts" in model


def fp8_scaling(model: dict) -> str:
    """How the model's FP8 checkpoint scales its weights (``FP8_SCALINGS``)."""
    return model.get("fp8_scaling", "tensor")


def attention_kind(model: dict) -> str:
    return model.get("attention", "gqa")


def uncomposable_reason(model: dict) -> str | None:
    """Why the step composition (the MoE cells and the serving replay alike) cannot price this
    model's layers yet, or None: it composes GQA attention over the whole context, and MoE
    layers without shared experts; an MLA model's projections, a shared expert's GEMMs and a
    sliding window's shorter attention are not in it."""
    if attention_kind(model) != "gqa" or model.get("shared_experts"):
        return (f"{attention_kind(model).upper()} attention and {model.get('shared_experts', 0)} "
                "shared experts: the step composition prices GQA models without shared experts "
                "only")
    if model.get("sliding_window"):
        return (f"sliding-window attention ({model['sliding_window']} tokens on some layers): the "
                "step composition prices attention over the whole context only")
    return None


def moe_shapes(model: dict, tp: int) -> dict[str, int]:
    """Per GPU, one MoE layer under vLLM's default tensor parallelism of the experts (each
    expert's intermediate split over the TP group, every GPU holding every expert): the
    experts, the top-k, the shared experts, the per-GPU expert width, the hidden size, and the
    counts of MoE and dense layers."""
    return {"experts": model["num_experts"], "topk": model["experts_per_token"],
            "shared": model["shared_experts"], "inter": model["moe_intermediate_size"] // tp,
            "hidden": model["hidden_size"], "moe_layers": model["num_layers"] - model["dense_layers"],
            "dense_layers": model["dense_layers"]}


def model_by_alias(models: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Every spelling the upstream data uses for a model, mapped to its config name."""
    index: dict[str, str] = {}
    for name, data in models.items():
        for alias in [name, data["hf_id"], data["hf_id"].split("/")[-1], *data.get("aliases", [])]:
            index[alias.lower()] = name
    return index


def resolve_model(models: dict[str, dict[str, Any]], spelling: str, context: str) -> str:
    index = model_by_alias(models)
    key = spelling.lower()
    if key not in index:
        raise SpecError(
            f"{context}: model '{spelling}' has no config. Add conf/model/<name>.yaml listing "
            f"'{spelling}' under aliases."
        )
    return index[key]


def kv_heads_per_gpu(model: dict, tp: int) -> int:
    """The KV heads one GPU of ``tp`` holds: its share of them, or one whole head where TP
    outnumbers them (each GPU then keeps a replica, as vLLM's QKV projection does). A TP that
    neither divides the KV heads nor is a multiple of them is refused, as vLLM refuses it."""
    nkv = model["num_kv_heads"]
    if nkv % tp and tp % nkv:
        raise SpecError(f"model '{model.get('name', 'unnamed')}' has {nkv} KV heads: TP {tp} "
                        "neither divides them nor is a multiple of them, which vLLM's QKV "
                        "projection refuses; use a TP that does")
    return max(nkv // tp, 1)


def kv_elements_per_token(model: dict, tp: int) -> int:
    """The KV-cache elements one GPU of ``tp`` holds per token and layer: the keys and values of
    its KV heads (``kv_heads_per_gpu``), or an MLA model's one compressed latent and rotary key
    (``kv_lora_rank + qk_rope_head_dim``), which every head reads and every GPU holds whole."""
    if model.get("attention") == "mla":
        return model["kv_lora_rank"] + model["qk_rope_head_dim"]
    return 2 * kv_heads_per_gpu(model, tp) * model["head_dim"]


def tp_shapes(model: dict, tp: int) -> dict[str, tuple[int, int] | int]:
    """Per-GPU GEMM (n, k) and attention heads under Megatron TP sharding (a KV head replicated
    where TP outnumbers them). A TP that does not divide the query heads is refused."""
    h, d = model["hidden_size"], model["head_dim"]
    nq, f = model["num_heads"], model["intermediate_size"]
    if nq % tp:
        raise SpecError(f"model '{model.get('name', 'unnamed')}' has {nq} attention heads, "
                        f"which TP {tp} does not divide; use a TP that does")
    kv = kv_heads_per_gpu(model, tp)
    up = 2 * f if model["gated_mlp"] else f
    return {"qkv": ((nq // tp + 2 * kv) * d, h), "o": (h, nq * d // tp),
            "gate_up": (up // tp, h), "down": (h, f // tp),
            "heads": nq // tp, "kv_heads": kv, "hidden": h}
