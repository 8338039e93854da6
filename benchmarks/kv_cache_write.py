"""Whether the oracle's attention tables hold the KV-cache write, and what the write gives the
serving oracle where they do not.

Each step of a layer writes the new tokens' keys and values into the paged KV cache. vLLM's
FlashAttention backend once did this inside its forward; vLLM moved it into an op of its own
(``unified_kv_cache_update``, PR 25954, "Split FlashAttn attention and cache update"; the
cold-start regression it caused was reported against main on 2026-01-28, vllm issue 33267), and
later backends followed (tracking issue 32335). aiconfigurator's collector times the backend's
``impl.forward`` alone (``collector/vllm/collect_attn.py``), so a table collected after the
split holds no write, and one collected before holds it. No release note in reach names the
first release with the split; the tables bracket it. Where a GPU has decode attention timed at
vLLM 0.14.0 and 0.19.0, this differences the two at every shape both time (the replay's KV
dtype, no sliding window) and groups the difference by the bytes a call writes (batch x the KV
elements a GPU holds per token, ``kv_elements_per_token``, x the dtype's bytes). A kernel
dropped from the later table leaves a difference positive at most shapes and about one launch
where little is written. Where much is written the difference also holds what changed in the
attention kernel between the versions, which moves it both ways (the table gives each group's
median over one launch plus the write at the datasheet bandwidth: under it at 512 KiB to 1 MiB
on the H100 and H200, 2.2 to 3.3 times it at 8 MiB), so there it bounds the write in neither
direction.

The oracle reads attention at its step set's version: 0.14.0 for the BF16 `_silicon` sets,
0.19.0 for the FP8 and MoE ones. Each set whose oracle reads a version at or past 0.19.0 on a
GPU that has the difference is replayed twice with the oracle's step timer: as the headline, and
with each step's write added to every layer, read from the GPU's difference at the measured
bytes nearest the step's (its new tokens x the KV elements one GPU holds per token x the dtype's
bytes, on a log scale; a step writing more than the largest measured call reads that call). A
set read at 0.14.0 or before, one read between the two versions, one on a GPU without a 0.14.0
table (the B200), and LLMServingSim's profile (a whole attention layer) are listed, not replayed.
Prints markdown; ``--json PATH`` also writes the rows, which the report shows:

    .venv/bin/python benchmarks/kv_cache_write.py --json benchmarks/kv_cache_write.json
"""

from __future__ import annotations

import json
import time

import numpy as np
import polars as pl
from closed_loop_waves import json_argument, oracle_sets, oracle_timer, stamped
from light_kernels import nearest_count

from leaderboard.cells.common import schedulers_conf
from leaderboard.present.serving_kv_write import kv_write_tables
from leaderboard.serving import simulate
from leaderboard.store import database
from leaderboard_core import progress
from leaderboard_core.specs import KV_CACHE_BYTES, kv_elements_per_token, load_gpu_specs, load_models
from leaderboard_core.versioning import release

# The two aiconfigurator versions whose decode attention is differenced: the BF16 step sets'
# and the FP8 and MoE step sets'.
BEFORE, AFTER = "0.14.0", "0.19.0"
SHAPE = ("batch", "kv_len", "num_heads", "num_kv_heads", "head_dim")


def kv_dtype() -> str:
    """The KV cache dtype the headline replays every backend with."""
    return simulate.kv_cache_dtype(schedulers_conf())


def table_difference() -> pl.DataFrame:
    """``by_bytes_written`` over every decode shape the store times at both versions (the
    replay's KV dtype, no sliding window)."""
    with database.connect() as con:
        times = con.sql(
            "SELECT sku, backend_version, batch, kv_len, num_heads, num_kv_heads, head_dim, "
            "median(latency_ms) AS latency_ms FROM attention WHERE source = 'aiconfigurator' "
            "AND backend = 'vllm' AND phase = 'decode' AND kv_dtype = ? "
            "AND coalesce(window_size, 0) = 0 AND backend_version IN (?, ?) GROUP BY ALL",
            params=[kv_dtype(), BEFORE, AFTER]).pl()
    return by_bytes_written(times, load_gpu_specs(), KV_CACHE_BYTES[kv_dtype()])


def by_bytes_written(times: pl.DataFrame, gpus: dict, element_bytes: float) -> pl.DataFrame:
    """Per GPU and bytes written a call (``element_bytes`` an element), over the decode shapes
    of ``times`` timed at both versions: how many, the median and quartiles of BEFORE minus
    AFTER (µs), the share of them positive (%), and the median over what one launch (the GPU's
    median at its smallest write) plus the write at the GPU's datasheet bandwidth would cost
    (reading the new keys and values and writing them: twice the bytes)."""
    paired = times.filter(backend_version=BEFORE).join(
        times.filter(backend_version=AFTER), on=["sku", *SHAPE], suffix="_after")
    bandwidth = pl.DataFrame({"sku": list(gpus), "bytes_per_us": [
        float(g["mem_bw_gbs"]) * 1e3 for g in gpus.values()]})
    return (paired.with_columns(
                # keys and values of the heads one GPU holds: the tables' heads are per GPU
                written_bytes=pl.col("batch") * pl.col("num_kv_heads") * pl.col("head_dim")
                * 2 * element_bytes,
                difference_us=(pl.col("latency_ms") - pl.col("latency_ms_after")) * 1e3)
            .group_by("sku", "written_bytes").agg(
                shapes=pl.len(), median_us=pl.col("difference_us").median(),
                q25_us=pl.col("difference_us").quantile(0.25),
                q75_us=pl.col("difference_us").quantile(0.75),
                positive=(pl.col("difference_us") > 0).mean() * 100)
            .sort("sku", "written_bytes")
            .join(bandwidth, on="sku", how="left", maintain_order="left")
            .with_columns(over_launch_and_write=pl.col("median_us") / (
                pl.col("median_us").first().over("sku")
                + 2 * pl.col("written_bytes") / pl.col("bytes_per_us")))
            .drop("bytes_per_us"))


class CacheWrite:
    """Each step's KV-cache write (ms) on one GPU: per layer, the GPU's table difference at the
    measured bytes nearest the step's."""

    def __init__(self, difference: pl.DataFrame, models: dict):
        self.models, self.element_bytes = models, KV_CACHE_BYTES[kv_dtype()]
        self.written = difference["written_bytes"].to_numpy().astype(float)
        self.layer_us = difference["median_us"].to_numpy()

    def step_ms(self, cells: pl.DataFrame) -> np.ndarray:
        out = np.zeros(len(cells))
        indexed = cells.with_row_index("_i")
        for (name, tp), group in indexed.group_by("model", "tp"):
            model = self.models[name]
            per_token = kv_elements_per_token(model, int(tp)) * self.element_bytes
            # at least one token: the nearest point is read on a log scale
            written = np.maximum(group["total_tokens"].to_numpy(), 1) * per_token
            out[group["_i"].to_numpy()] = (model["num_layers"] / 1e3
                                           * nearest_count(self.written, self.layer_us, written))
        return out


def step_set(home: str) -> dict:
    """The oracle's step set ``home``: its source, GPU and one vLLM version."""
    with database.connect() as con:
        source, sku, versions = con.sql("SELECT source, sku, backend_versions FROM datasets "
                                        "WHERE name = ?", params=[home]).fetchall()[0]
    versions = json.loads(versions)
    if len(versions) != 1:
        raise ValueError(f"step set {home} holds vLLM versions {versions}; expected one")
    return {"source": source, "sku": sku, "version": versions[0]}


def not_replayed(home: dict, differenced: set[str]) -> str | None:
    """Why the write is not added to the oracle on step set ``home`` (``step_set``'s), or None
    where it is."""
    if home["source"] != "aiconfigurator":
        return f"{home['source']}'s profile times a whole attention layer"
    version = release(home["version"])
    if version is not None and version <= release(BEFORE):
        return (f"its oracle reads vLLM {home['version']}'s tables, at or before {BEFORE}: where "
                "the difference is the write, they hold it")
    if version is None or version < release(AFTER):
        return (f"its oracle reads vLLM {home['version']}'s tables, before {AFTER}: whether they "
                "hold the write is unknown")
    if home["sku"] not in differenced:
        return f"no vLLM {BEFORE} table of {home['sku']} to difference"
    return None


def replay(dataset: str, home: str, difference: pl.DataFrame) -> list[dict]:
    """Per backend (and all together): the oracle's TTFT / TPOT MAPE and signed median TPOT
    error (%) on ``dataset``, as the headline replays it and with the KV-cache write added, and
    the median write added to a step (ms)."""
    timer, inputs = oracle_timer(dataset, home)
    models = load_models()
    write = CacheWrite(difference.filter(sku=inputs.gpu.sku), models)

    def with_write(cells: pl.DataFrame) -> np.ndarray:
        return timer(cells) + write.step_ms(cells)

    frame = inputs.target.select("backend", "gt_ttft_ms", "gt_tpot_ms")
    for name, step_timer in (("headline", timer), ("write", with_write)):
        with progress.track(f"{dataset}: {name}", len(inputs.target)) as bar:
            ttft, tpot = simulate.predict_targets(inputs.target, models, inputs.gpu, step_timer,
                                                  progress=bar.advance)[:2]
        frame = frame.with_columns(pl.Series(f"{name}_ttft", ttft), pl.Series(f"{name}_tpot", tpot))
    every = pl.concat([frame.with_columns(backend=pl.lit("all")), frame])

    def error(name: str, phase: str) -> pl.Expr:
        return (pl.col(f"{name}_{phase}") / pl.col(f"gt_{phase}_ms") - 1) * 100

    return (every.group_by("backend", maintain_order=True)
            .agg(n=pl.len(), **{f"{name}_{phase}_mape": error(name, phase).abs().mean()
                                for name in ("headline", "write") for phase in ("ttft", "tpot")},
                 **{f"{name}_tpot_signed_median": error(name, "tpot").median()
                    for name in ("headline", "write")},
                 tpot_added_ms=(pl.col("write_tpot") - pl.col("headline_tpot")).median())
            .with_columns(dataset=pl.lit(dataset), sku=pl.lit(inputs.gpu.sku)).to_dicts())


def main() -> None:
    json_path = json_argument(__doc__)
    started, rows, listed = time.perf_counter(), [], []
    difference = table_difference()
    differenced = set(difference["sku"])
    for dataset, home in oracle_sets(closed_only=False):
        read = step_set(home)
        if (why := not_replayed(read, differenced)) is not None:
            listed.append({"dataset": dataset, **read, "why": why})
            continue
        print(f"{dataset}: the oracle on {home} (vLLM {read['version']}), with and without "
              "the write", flush=True)
        rows += [{**row, "version": read["version"]} for row in replay(dataset, home, difference)]
    bench = stamped({"before": BEFORE, "after": AFTER, "difference": difference.to_dicts(),
                     "rows": rows, "listed": listed}, started)
    print("\n".join(kv_write_tables(bench)))
    if json_path:
        json_path.write_text(json.dumps(bench, indent=1) + "\n")


if __name__ == "__main__":
    main()
