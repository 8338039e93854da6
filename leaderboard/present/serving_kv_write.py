"""Whether the oracle's attention tables hold the KV-cache write, and what the write gives the
serving oracle where they do not, from ``benchmarks/kv_cache_write.py``'s JSON."""

from __future__ import annotations

from pathlib import Path

from leaderboard.present import sections
from leaderboard_core import paths
from leaderboard_core.report_tables import fmt, table

KV_WRITE_JSON = paths.REPO_ROOT / "benchmarks" / "kv_cache_write.json"
READINGS = ("headline", "write")


def _both(row: dict, metric: str) -> str:
    return " / ".join(fmt(row[f"{name}_{metric}"]) for name in READINGS)


def _bytes(n: float) -> str:
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def kv_write_tables(bench: dict) -> list[str]:
    """The table difference per GPU and bytes written, the replays, and the sets not replayed
    (the script prints them too)."""
    before, after = bench["before"], bench["after"]
    lines = table(["GPU", "bytes written a call", "shapes", f"{before} - {after} median µs",
                   "quartiles µs", "positive %", "x (one launch + the write at datasheet bandwidth)"],
                  [[r["sku"], _bytes(r["written_bytes"]), str(r["shapes"]), fmt(r["median_us"]),
                    f"{fmt(r['q25_us'])} / {fmt(r['q75_us'])}", fmt(r["positive"]),
                    fmt(r["over_launch_and_write"])] for r in bench["difference"]], "lrrrrrr")
    rows = sorted(bench["rows"], key=lambda r: (r["dataset"], r["backend"] != "all", r["backend"]))
    lines += [""] + table(["dataset", "backend", "n", "tables of vLLM", "TTFT MAPE %: headline / + write",
                           "TPOT MAPE %: headline / + write",
                           "TPOT signed median %: headline / + write", "TPOT added ms (median)"],
                          [[r["dataset"], r["backend"], str(r["n"]), r["version"],
                            _both(r, "ttft_mape"), _both(r, "tpot_mape"),
                            _both(r, "tpot_signed_median"), fmt(r["tpot_added_ms"], 2)]
                           for r in rows], "llrlrrrr")
    if bench["listed"]:
        lines += ["", "Not replayed: " + "; ".join(
            f"`{r['dataset']}` ({r['why']})" for r in sorted(bench["listed"],
                                                             key=lambda r: r["dataset"])) + "."]
    return lines


def kv_write(path: Path = KV_WRITE_JSON) -> list[str]:
    """The report's paragraph and tables on the KV-cache write."""
    bench, command = sections.benchmark_json(path, "kv_cache_write")
    if bench is None:
        return [f"No KV-cache-write benchmark yet ({command}).", ""]
    before, after = bench["before"], bench["after"]
    return sections.benchmark_section(
            f"Whether the attention tables hold the KV-cache write ({command}). aiconfigurator's "
            "collector times the attention backend's forward alone, and vLLM moved the "
            "FlashAttention backend's write of the new keys and values out of that forward "
            "into an op of its own (its PR 25954; later backends followed), so a table "
            "collected after the split holds no write. No release note in reach names the "
            f"first release with it; the tables bracket it. The first table: vLLM {before}'s "
            f"decode attention minus {after}'s at every shape both time on a GPU (the replay's "
            "KV dtype, no sliding window), by the bytes a call writes (batch x KV heads x head "
            "size x 2 x the dtype's bytes). A kernel dropped from the later table shows as a "
            "difference positive at most shapes and about one launch where little is written; "
            "where much is written the difference also holds what changed in the attention "
            "kernel, which moves it both ways (the last column: the median over one launch, the "
            "GPU's median at its smallest write, plus reading and writing the bytes at the "
            "datasheet bandwidth), so there it bounds the write in neither direction. The "
            f"oracle reads attention at its step set's version ({before} for the BF16 sets, "
            f"{after} for the FP8 and MoE ones). The second table: each set read at {after} on "
            "a GPU with both tables, replayed with the oracle's step timer as the headline and "
            "with every layer's write added, read from the GPU's difference at the measured "
            "bytes nearest the step's (a step writing more than the largest measured call reads "
            "that call).", kv_write_tables(bench), bench)


def kv_write_measured(dataset: str, path: Path = KV_WRITE_JSON) -> str | None:
    """The clause of ``dataset``'s "what stops the oracle" line: its TTFT and TPOT with the
    KV-cache write added, beside the benchmark's own headline replay; None where not replayed."""
    if (row := sections.benchmark_set_row(path, "kv_cache_write", dataset)) is None:
        return None
    return (f"the KV-cache write its vLLM {row['version']} attention tables omit "
            f"(`benchmarks/kv_cache_write.py`, {fmt(row['tpot_added_ms'], 2)} ms a token at the "
            f"median) gives {fmt(row['write_ttft_mape'])} % TTFT and "
            f"{fmt(row['write_tpot_mape'])} % TPOT against {fmt(row['headline_ttft_mape'])} % "
            f"and {fmt(row['headline_tpot_mape'])} % (signed median TPOT "
            f"{fmt(row['write_tpot_signed_median'])} % against "
            f"{fmt(row['headline_tpot_signed_median'])} %)")


# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
