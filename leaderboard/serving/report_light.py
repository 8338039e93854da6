"""What the light kernels, which no kernel table holds, give the serving oracle, from
``benchmarks/light_kernels.py``'s JSON."""

from __future__ import annotations

from pathlib import Path

from leaderboard import report_sections
from leaderboard_core import paths
from leaderboard_core.report_tables import fmt, table

LIGHT_JSON = paths.REPO_ROOT / "benchmarks" / "light_kernels.json"


def light_kernels_table(bench: dict) -> list[str]:
    """Per serving set and backend, the oracle as the headline replays it and with the light
    kernels added (the script prints it too)."""
    rows = sorted(bench["rows"], key=lambda r: (r["dataset"], r["backend"] != "all", r["backend"]))
    return table(["dataset", "backend", "n", "TTFT MAPE %: headline / + light", "TPOT MAPE %: "
                  "headline / + light", "TPOT signed median %: headline / + light"],
                 [[r["dataset"], r["backend"], str(r["n"]),
                   f"{fmt(r['headline_ttft_mape'])} / {fmt(r['light_ttft_mape'])}",
                   f"{fmt(r['headline_tpot_mape'])} / {fmt(r['light_tpot_mape'])}",
                   f"{fmt(r['headline_tpot_signed_median'])} / "
                   f"{fmt(r['light_tpot_signed_median'])}"] for r in rows], "llrrrr")


def light_kernels(path: Path = LIGHT_JSON) -> list[str]:
    """The report's paragraph and table on the light kernels."""
    bench, command = report_sections.benchmark_json(path, "light_kernels")
    if bench is None:
        return [f"No light-kernel benchmark yet ({command}).", ""]
    return [f"What the kernel tables leave out of a step: the light kernels ({command}). The "
            "oracle's steps hold no norm, rotary embedding, residual add or, outside an MoE "
            "layer's fused experts, activation: aiconfigurator timed none on any GPU. Of the "
            "closed-loop sets' GPUs only the H100 has them timed, by Vidur (its own kernels, "
            "one per op: the GPU time its profiler gives each). Each closed-loop set that has "
            "an oracle is replayed twice with the oracle's step timer: as the headline, and "
            "with every layer's light kernels added (an MoE model's activation on its dense "
            "layers only), read at Vidur's H100 point nearest the step's shape and token count, "
            "on every GPU (no other of them is measured, and they are not scaled; a step above "
            "4,096 tokens reads the 4,096 point, short of its cost). A compiled engine (vLLM "
            "V1's default, TRT-LLM) fuses some of them into neighbouring kernels, vLLM an FP8 "
            "quantization into the norm before a GEMM, and its kernels are not Vidur's: "
            "LLMServingSim's vLLM profile of the RTX 4090 gives vLLM's own at about half "
            "Vidur's H100 figures. A sensitivity, not a measurement of the runs. A negative "
            "signed median: the replay is faster than the engine.",
            "", *light_kernels_table(bench), "",
            f"Code {bench['code_version']}, {bench['date']}, {bench['seconds']:.0f} s.", ""]


def light_kernels_measured(dataset: str, path: Path = LIGHT_JSON) -> str | None:
    """The clause of ``dataset``'s "what stops the oracle" line: its TTFT and TPOT with the
    light kernels added, beside the benchmark's own headline replay."""
    bench, _ = report_sections.benchmark_json(path, "light_kernels")
    if bench is None:
        return None
    row = next((r for r in bench["rows"] if r["dataset"] == dataset and r["backend"] == "all"),
               None)
    if row is None:
        return None
    return (f"Vidur's H100 light kernels added to every step (`benchmarks/light_kernels.py`) "
            f"give {fmt(row['light_ttft_mape'])} % TTFT and {fmt(row['light_tpot_mape'])} % TPOT "
            f"against {fmt(row['headline_ttft_mape'])} % and {fmt(row['headline_tpot_mape'])} % "
            f"(signed median TPOT {fmt(row['light_tpot_signed_median'])} % against "
            f"{fmt(row['headline_tpot_signed_median'])} %)")


# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
