"""RESULTS.md sections the harness gathers from the predictors: the sections each predictor offers
of its own (``ours``: its ablation ladder, targets and wall-clock mode), one ``explain`` example
per predictor that offers one, the kernel floors behind ``ours``'s missed targets, and the
predict-throughput benchmark of every predictor.

Every number is read from the current leaderboard runs, from a live ``explain`` of the committed
code, or from a benchmark's JSON: ``benchmarks/predict_throughput.json`` and
``benchmarks/kernel_floors.json`` (each written by its script with ``--json``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
from rich.console import Console

from leaderboard.seal import predictor_index
from leaderboard_core import paths
from leaderboard_core.report_tables import fmt, table

THROUGHPUT_JSON = paths.REPO_ROOT / "benchmarks" / "predict_throughput.json"
FLOORS_JSON = paths.REPO_ROOT / "benchmarks" / "kernel_floors.json"
SEAL_JSON = paths.REPO_ROOT / "benchmarks" / "seal_overhead.json"
FLOOR_COLUMNS = ("attention_us", "ours_attention_us", "allreduce_us", "ours_allreduce_us")
# The dataset of the report's explain examples: an unseen GPU of the main family.
EXPLAIN_DATASET = "h200_vidur"


def predictor_sections(runs: pl.DataFrame) -> list[str]:
    """The sections the suite's own predictors offer (``report_sections``), made in a sealed
    child (``predictor_index.report_sections``). Only sections headed with a built-in
    predictor's name are kept, whole: a ``predictors_path`` module's hook could otherwise print
    a table that reads as the leaderboard's (the second hostile review of seal v3 did)."""
    own = [name for name, d in predictor_index.index().items()
           if not predictor_index.folder_of(d["module"])]
    kept, keeping = [], False
    for line in predictor_index.report_sections(runs):
        if line.startswith("## "):
            keeping = any(line[3:] == name or line[3:].startswith((f"{name}:", f"{name} "))
                          for name in own)
        if keeping:
            kept.append(line)
    return kept


def explain_examples(runs: pl.DataFrame) -> list[str]:
    """One explained cell per predictor that offers ``explain`` and has a run on
    ``EXPLAIN_DATASET``: a live fit, so only when a report is made."""
    from leaderboard.present import cells_explained  # reads the store and fits

    ran = set(runs.filter(pl.col("dataset") == EXPLAIN_DATASET)["predictor"])
    owners = {name: d["explains"] for name, d in predictor_index.index().items()
              if not predictor_index.folder_of(d["module"])}  # the suite's own only
    # the ladder rungs of ``ours`` share its explain: the first name of each owner is shown
    chosen = {owners[name]: name for name in sorted(ran, reverse=True) if owners.get(name)}
    lines = []
    for predictor in sorted(chosen.values()):
        model, (cell_id,) = cells_explained.explained_cells(predictor, EXPLAIN_DATASET)
        console = Console(record=True, width=170, file=io.StringIO())
        cells_explained.render(model, cell_id, console)
        lines += [f"## {predictor}: one cell explained", "",
                  f"`python -m leaderboard.explain predictor={predictor} dataset={EXPLAIN_DATASET}` "
                  "(its first cell):", "", "```", console.export_text().rstrip(), "```", ""]
    return lines


def shown_path(path: Path) -> Path:
    """``path`` from the repository root when it lies inside it, as a fresh clone has it."""
    path = Path(path).resolve()
    return path.relative_to(paths.REPO_ROOT) if path.is_relative_to(paths.REPO_ROOT) else path


def benchmark_json(path: Path, script: str) -> tuple[dict | None, str]:
    """The rows ``benchmarks/<script>.py`` wrote to ``path`` (None until it has), and the
    command that writes them there."""
    path = Path(path)
    command = f"`python benchmarks/{script}.py --json {shown_path(path)}`"
    return (json.loads(path.read_text()) if path.exists() else None), command


def benchmark_section(prose: str, tables: list[str], bench: dict) -> list[str]:
    """A benchmark's section of the report: its ``prose``, its ``tables`` and the line under
    them that gives the code and date the benchmark ran at and how long it took."""
    return [prose, "", *tables, "",
            f"Code {bench['code_version']}, {bench['date']}, {bench['seconds']:.0f} s.", ""]


def benchmark_set_row(path: Path, script: str, dataset: str) -> dict | None:
    """The row a serving benchmark's JSON at ``path`` (written by ``benchmarks/<script>.py``)
    holds for ``dataset`` with every backend together; None before it ran, or where it has none."""
    bench, _ = benchmark_json(path, script)
    return None if bench is None else next(
        (r for r in bench["rows"] if r["dataset"] == dataset and r["backend"] == "all"), None)


def _widest_spread(rows: list[dict], key: str) -> tuple[str, float] | None:
    """(GPU, (max - min) / min in %) of the GPU whose measured ``key`` moves most between vLLM
    versions; None if no GPU has it at two versions."""
    spreads = []
    for gpu in dict.fromkeys(r["gpu"] for r in rows):
        values = [r[key] for r in rows if r["gpu"] == gpu and r[key] is not None]
        if len(values) >= 2:
            spreads.append((gpu, (max(values) - min(values)) / min(values) * 100))
    return max(spreads, key=lambda s: s[1], default=None)


def floor_table(rows: list[dict], allreduce: dict) -> list[str]:
    """The markdown table of ``benchmarks/kernel_floors.py``'s rows (the script prints it too)."""
    body = [[r["gpu"], r["vllm"], "yes" if r["in_vidur"] else "",
             *(fmt(r[k]) for k in FLOOR_COLUMNS)] for r in rows]
    return table(["GPU", "vLLM", "in _vidur", "decode attention µs", "ours µs",
                  f"TP{allreduce['num_gpus']} all-reduce µs", "ours µs"], body, "lllrrrr")


def kernel_floors(path: Path = FLOORS_JSON) -> list[str]:
    """Two kernel floors per GPU and vLLM version, measured and as ``ours`` prices them
    (``benchmarks/kernel_floors.py``): part of why ``ours`` misses its decode targets."""
    title = "## Kernel floors by GPU and vLLM version, and ours's price"
    if not path.exists():
        return [title, "", f"No benchmark result at `{shown_path(path)}` yet.", ""]
    bench = json.loads(path.read_text())
    attention, allreduce, found = bench["attention"], bench["allreduce"], bench["rows"]
    moved = []
    for kernel, key in (("decode-attention", "attention_us"), ("all-reduce", "allreduce_us")):
        if widest := _widest_spread(found, key):
            moved.append(f"the {kernel} floor moves by up to {widest[1]:.0f} % ({widest[0]})")
    return [title, "",
            "Many decode kernels run near their fixed floor. "
            "`python benchmarks/kernel_floors.py --json benchmarks/kernel_floors.json` reads two "
            "from the store, on every GPU of the `_vidur` family at every vLLM version "
            f"aiconfigurator measured: decode attention of {attention['batch']} request over "
            f"{attention['kv_len']} cached tokens ({attention['num_heads']} query heads, "
            f"{attention['num_kv_heads']} KV heads, head size {attention['head_dim']}: the "
            "`_vidur` cells' most used shape; bf16), and the "
            f"TP{allreduce['num_gpus']} all-reduce of {allreduce['message_bytes'] // 1024} KiB "
            "under CUDA graphs (vLLM's custom all-reduce). Beside each is `ours`'s price of the "
            "same kernel, from the datasheet and the A100 home's fit; it does not see the vLLM "
            "version, so it has one price per GPU. `in _vidur`: the version the `_vidur` "
            "dataset's cells come from. "
            + (f"Between vLLM versions on one GPU, {' and '.join(moved)}: a spread no datasheet "
               "number or home fit can follow. " if moved else "")
            + "Which ops carry the error of each phase and GPU is in the per-op section's "
            f"tables by phase. Code {bench['code_version']}, {bench['date']}.", "",
            *floor_table(found, allreduce)]


def throughput(path: Path = THROUGHPUT_JSON) -> list[str]:
    if not path.exists():
        return ["## Predict throughput benchmark", "",
                f"No benchmark result at `{shown_path(path)}` yet.", ""]
    bench = json.loads(path.read_text())
    rows = [[r["predictor"], r.get("kind", "?"), fmt(r.get("fit_s"), 3), f"{r.get('cells', 0):,}",
             fmt(r.get("cells_per_s"), 0), fmt(r.get("target_cells_per_s"), 0),
             {True: "yes", False: "**NO**", None: "—"}[r.get("target_met")]]
            for r in bench["results"]]
    return ["## Predict throughput benchmark", "",
            "`python benchmarks/predict_throughput.py --json benchmarks/predict_throughput.json`: "
            f"fit on {bench['home']}'s training split, predict {bench['target']} cells replicated, "
            f"one core, best of {bench['repeats']}; load average "
            f"{bench['load_average_1min'][0]:.1f} → {bench['load_average_1min'][1]:.1f}; code "
            f"{bench['code_version']}, {bench['date']}.", "",
            *table(["predictor", "kind", "fit s", "cells", "cells/s", "target", "met"], rows,
                   "llrrrrl")]

def seal_overhead(path: Path = SEAL_JSON) -> list[str]:
    if not path.exists():
        return ["## Seal cost benchmark", "", f"No benchmark result at `{shown_path(path)}` yet.", ""]
    bench = json.loads(path.read_text())
    rows = [[r["predictor"], r["dataset"], fmt(r["walled_s"], 2), r["walled_sandbox"],
             fmt(r["bare_s"], 2), r["bare_sandbox"], fmt(r["ratio"], 2),
             "yes" if r["met"] else "**NO**"] for r in bench["results"]]
    return ["## Seal cost benchmark", "",
            "`python benchmarks/seal_overhead.py --json benchmarks/seal_overhead.json`: the "
            "median wall time of a whole run with every wall of the seal, and with the parent's "
            "walls taken down (no namespaces, no scan of the readable roots; the child still "
            f"confines itself with Landlock, and serving still replays in the harness), median "
            f"of {bench['repeats']}; target walled / bare ≤ {bench['target_ratio']}; code "
            f"{bench['code_version']}, {bench['date']}.", "",
            *table(["predictor", "dataset", "walled s", "sandbox", "bare s", "sandbox",
                    "ratio", "met"], rows, "llrlrlrl")]


# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
