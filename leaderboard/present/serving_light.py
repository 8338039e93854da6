"""What the light kernels and sampling, which no kernel table holds, give the serving oracle,
from ``benchmarks/light_kernels.py``'s JSON."""

from __future__ import annotations

from pathlib import Path

from leaderboard.present import sections
from leaderboard_core import paths
from leaderboard_core.report_tables import fmt, table

LIGHT_JSON = paths.REPO_ROOT / "benchmarks" / "light_kernels.json"


READINGS = ("headline", "light", "sampled")


def _three(row: dict, metric: str) -> str:
    return " / ".join(fmt(row[f"{name}_{metric}"]) for name in READINGS)


def light_kernels_table(bench: dict) -> list[str]:
    """Per serving set and backend, the oracle as the headline replays it, with the light
    kernels added and with sampling added too (the script prints it too)."""
    rows = sorted(bench["rows"], key=lambda r: (r["dataset"], r["backend"] != "all", r["backend"]))
    return table(["dataset", "backend", "n", "light kernels of", "sampling added to",
                  "TTFT MAPE %: headline / + light / + sampling",
                  "TPOT MAPE %: headline / + light / + sampling",
                  "TPOT signed median %: headline / + light / + sampling",
                  "TPOT gap per client µs: headline / + light / + sampling"],
                 [[r["dataset"], r["backend"], str(r["n"]), r["light_source"],
                   str(r["sampling_added"]), _three(r, "ttft_mape"), _three(r, "tpot_mape"),
                   _three(r, "tpot_signed_median"), _three(r, "tpot_gap_per_client_us")]
                  for r in rows], "llrlrrrrr")


def light_kernels(path: Path = LIGHT_JSON) -> list[str]:
    """The report's paragraph and table on the light kernels and sampling."""
    bench, command = sections.benchmark_json(path, "light_kernels")
    if bench is None:
        return [f"No light-kernel benchmark yet ({command}).", ""]
    return sections.benchmark_section(
            f"What the kernel tables leave out of a step: the light kernels and sampling "
            f"({command}). The oracle's steps hold no norm, rotary embedding, residual add, "
            "sampler or, outside an MoE layer's fused experts, activation: aiconfigurator timed "
            "none on any GPU. Two pinned sources time them as an engine runs them. Vidur timed "
            "its own kernels on the H100 (one per op: the GPU time its profiler gives each), "
            "the only one of the closed-loop sets' GPUs with them timed; they are read for every "
            "closed-loop set, unscaled. LLMServingSim timed vLLM 0.19's own (eager) of "
            "Llama-3.1-8B on the RTX 4090, the GPU, engine version and model of "
            "`rtx4090_serving`, which reads them: the one direct check. Each set that has an "
            "oracle is replayed three times with the oracle's step timer: as the headline; with "
            "every layer's light kernels added (an MoE model's activation on its dense layers "
            "only), read at the point nearest the step's shape and token count (a step above "
            "the largest measured count reads that point, short of its cost); and with the RTX "
            "4090's sampler added too, the only one timed, at the step's request count, "
            "unscaled. A run whose replay adds vLLM's host time to each step (before 0.14.0, or "
            "unrecorded) gets no sampler: that host time, Vidur's, already holds sampling. A "
            "compiled engine (vLLM V1's default, TRT-LLM) fuses some light kernels into "
            "neighbouring ones, vLLM an FP8 quantization into the norm before a GEMM. Outside "
            "`rtx4090_serving`, a sensitivity, not a measurement of the runs. A negative signed "
            "median: the replay is faster than the engine. The TPOT gap per client is read as "
            "in the oracle's section above (measured minus replayed TPOT, the median slope over "
            "each backend's (model, TP, isl) of a line over the loads): where it stays positive "
            "after the added kernels, the measured TPOT grows with the clients by other work; "
            "where it turns negative, the added kernels grow faster than the measured TPOT.",
            light_kernels_table(bench), bench)


def light_kernels_measured(dataset: str, path: Path = LIGHT_JSON) -> str | None:
    """The clause of ``dataset``'s "what stops the oracle" line: its TTFT and TPOT with the
    light kernels and sampling added, beside the benchmark's own headline replay."""
    if (row := sections.benchmark_set_row(path, "light_kernels", dataset)) is None:
        return None
    said = (f"the light kernels ({row['light_source']}) added to every step "
            f"(`benchmarks/light_kernels.py`) give {fmt(row['light_ttft_mape'])} % TTFT and "
            f"{fmt(row['light_tpot_mape'])} % TPOT against {fmt(row['headline_ttft_mape'])} % and "
            f"{fmt(row['headline_tpot_mape'])} % (signed median TPOT "
            f"{fmt(row['light_tpot_signed_median'])} % against "
            f"{fmt(row['headline_tpot_signed_median'])} %)")
    if not row["sampling_added"]:
        return said + ("; no sampler is added, as the replay's host time of every one of its "
                       "runs already holds sampling")
    return (f"{said}, and with the {row['sampler_source']} sampler on {row['sampling_added']} of "
            f"its {row['n']} targets too {fmt(row['sampled_ttft_mape'])} % and "
            f"{fmt(row['sampled_tpot_mape'])} %")


# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
