"""``conf/ours/constants.yaml``: every constant of ``ours`` with its value and provenance.

Each leaf is ``{value: ..., provenance: "physical: ..." | "fitted on home ..."}``; the loader
refuses a leaf without a provenance, so no number enters the model unexplained. ``Device``
resolves one GPU's datasheet and its architecture's entry into the numbers the factors use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from leaderboard_core import paths, yaml_io
from leaderboard_core.specs import TOPOLOGIES, GpuSpec, SpecError
from predictors._roofline import fp8_peak_flops, link_gbs_per_direction, peak_flops
from predictors.ours import factors

CONSTANTS_PATH = paths.CONF_DIR / "ours" / "constants.yaml"
PROVENANCE_KINDS = ("physical", "published", "fitted on home", "measured grid", "default")


def _values(node: Any, where: str) -> Any:
    """Strip ``{value, provenance}`` leaves to their values, checking every provenance."""
    if isinstance(node, dict) and "value" in node:
        prov = str(node.get("provenance", ""))
        if not prov.startswith(PROVENANCE_KINDS):
            raise ValueError(f"{CONSTANTS_PATH}: {where} has no provenance starting with one of "
                             f"{PROVENANCE_KINDS}")
        return node["value"]
    if isinstance(node, dict):
        return {k: _values(v, f"{where}.{k}" if where else k) for k, v in node.items()}
    return node


@lru_cache(maxsize=4)
def load_constants() -> dict:
    raw = yaml_io.safe_load(CONSTANTS_PATH.read_text())
    return _values(raw, "")


def arch_entry(gpu: GpuSpec, constants: dict) -> dict:
    """The architecture's constants; an architecture the file does not name takes ``default``
    (Ampere-like: no clusters, the home's clock droop), so any GPU with a spec file works."""
    archs = constants["architectures"]
    return archs.get(str(gpu["arch"]).lower(), archs["default"])


@dataclass(frozen=True)
class Device:
    """One GPU as the factors see it: datasheet peaks plus its architecture's constants."""

    peak_flops: float
    fp8_peak_flops: float | None  # the datasheet FP8 dense peak; None: the GPU has no FP8
    mem_bw: float
    l2_bytes: float
    sms: int
    cta_cap: int
    f_clk: float
    eta_act: float
    link_bytes_per_s: float
    topology: str
    floor_scale: float
    split_kv: bool
    # vLLM's symmetric-memory size tables for this compute capability ({} where it has none).
    allreduce_tables: dict = field(hash=False, compare=False)

    @classmethod
    def of(cls, gpu: GpuSpec, constants: dict) -> Device:
        arch = arch_entry(gpu, constants)
        f_clk = factors.clock_factor(arch, constants["clock"]["home_f_clk"])
        home_clock = constants["clock"]["home_boost_mhz"] * constants["clock"]["home_f_clk"]
        return cls(peak_flops=peak_flops(gpu), fp8_peak_flops=fp8_peak_flops(gpu),
                   mem_bw=gpu.mem_bw_bytes_per_s,
                   l2_bytes=float(gpu["l2_mb"]) * 2**20, sms=int(gpu["sm_count"]),
                   cta_cap=factors.cta_cap(gpu, arch),
                   f_clk=f_clk, eta_act=float(arch["eta_act"]),
                   link_bytes_per_s=link_gbs_per_direction(gpu) * 1e9,
                   topology=topology(gpu),
                   floor_scale=factors.floor_clock_scale(
                       home_clock, float(gpu["boost_clock_mhz"]) * f_clk),
                   split_kv=factors.compute_major(gpu) == 8,
                   allreduce_tables=constants["collectives"]["symm_mem_tables"].get(
                       "sm" + str(gpu.data.get("compute_capability", "")).replace(".", ""), {}))


def topology(gpu: GpuSpec) -> str:
    """How the GPUs of a TP group reach each other (``interconnect.topology`` in conf/gpu); a
    spec without it: NVLink of node or rack scope is a switch, of pair scope a bridge, and a
    PCIe part goes through the host (no PCIe switch assumed)."""
    link = gpu["interconnect"]
    if link.get("topology"):
        if link["topology"] not in TOPOLOGIES:
            raise SpecError(f"{gpu.path}: interconnect.topology '{link['topology']}' is not one "
                            f"of {', '.join(TOPOLOGIES)}; fix it or drop the key")
        return str(link["topology"])
    if link.get("kind") == "nvlink":
        return "nvlink_bridge" if link.get("scope") == "pair" else "nvswitch"
    return "pcie_host"
