"""How long a closed loop the serving replay runs, and what the oracle's error owes to it.

A `_silicon` run is a closed loop whose request count the CSV does not record. The replay runs
``simulation.waves`` waves of ``concurrency`` requests (``conf/serving/schedulers.yaml``), all
clients sending their first request together. aiconfigurator's own benchmark template
(``generator/config/backend_templates/benchmark/bench_run.sh.j2``) sends concurrency x
``BENCH_MULTI_ROUND`` requests (50 unless its environment sets another count) after
2 x concurrency warm-up ones, and AIPerf waits for every warm-up response before it profiles, so
its profiled requests also start from an idle engine; public GenAI-Perf benchmark scripts often
send 10 x concurrency. This replays every closed-loop target of each
serving set that has an oracle, with the oracle's step timer (``table_scaled`` fitted on the
target GPU's own kernel tables, as the oracle run fits it), for several wave counts, each a
replay of its own (its last wave drains the engine, as a benchmark's does), and scores the mean
TTFT and TPOT over all waves, or over all but the first two (a warm-up that did not drain),
against the measured ones. Prints a markdown table; ``--json PATH`` also writes the rows, which
the report shows:

    .venv/bin/python benchmarks/closed_loop_waves.py --json benchmarks/closed_loop_waves.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard.cells.common import schedulers_conf
from leaderboard.present.serving_unknowns import closed_loop_table
from leaderboard.run.oracle import ORACLE, ORACLE_POINTS, oracle_home
from leaderboard.run.run_inputs import RunSpec, load_inputs
from leaderboard.serving import simulate
from leaderboard.serving.replay import closed_loop
from leaderboard.store import database
from leaderboard.store.catalog import StoreCatalog
from leaderboard_core.specs import load_models
from leaderboard_core.versioning import code_version
from predictors import registry

WAVES = (4, 10, 20, 50)
DROPPED = (0, 2)  # waves left out of the mean: none, or a warm-up of 2 x concurrency


def oracle_timer(dataset: str, home: str):
    """The oracle's step timer for ``dataset`` (no seal: a benchmark, not a scored run), and
    the run's inputs."""
    database.ensure()
    inputs = load_inputs(RunSpec(ORACLE, dataset, {}, home=home, home_points=ORACLE_POINTS))
    registry.discover()
    fitted = registry.get(ORACLE)().fit(inputs.home)
    return (lambda cells: np.asarray(fitted.predict(cells, inputs.gpu), np.float64)), inputs


def replay_errors(dataset: str, home: str) -> list[dict]:
    """Per backend, wave count and dropped waves: the oracle's TTFT and TPOT MAPE (%) over the
    set's closed-loop targets."""
    timer, inputs = oracle_timer(dataset, home)
    models, predicted = load_models(), []
    idle_burst = schedulers_conf()["simulation"]["idle_burst"]
    for (_, load), group in inputs.target.group_by("run", "load", maintain_order=True):
        first = group.row(0, named=True)
        if load != "closed":
            continue
        c = first["concurrency"]
        policy, timed = simulate.run_engine(first, models, inputs.gpu, timer)
        for waves in WAVES:
            loop = closed_loop(policy, first["isl"], first["osl"], c, waves * c, first["model"],
                               int(first["tp"]), timed, gemm_dtype=first["gemm_dtype"],
                               idle_burst=idle_burst)
            for dropped in DROPPED:
                kept = slice(dropped * c, None)
                predicted += [{"backend": first["backend"], "waves": waves, "dropped": dropped,
                               "ttft": float(np.mean(loop.ttft[kept])),
                               "tpot": float(np.nanmean(loop.tpot[kept])),
                               "gt_ttft": gt_ttft, "gt_tpot": gt_tpot}
                              for gt_ttft, gt_tpot in group.select("gt_ttft_ms", "gt_tpot_ms")
                              .iter_rows()]
    frame = pl.DataFrame(predicted).with_columns(
        ttft_ape=(pl.col("ttft") / pl.col("gt_ttft") - 1).abs() * 100,
        tpot_ape=(pl.col("tpot") / pl.col("gt_tpot") - 1).abs() * 100)
    every = frame.with_columns(backend=pl.lit("all"))
    return (pl.concat([every, frame]).group_by("backend", "waves", "dropped", maintain_order=True)
            .agg(n=pl.len(), ttft_mape=pl.col("ttft_ape").mean(),
                 tpot_mape=pl.col("tpot_ape").mean())
            .with_columns(dataset=pl.lit(dataset)).to_dicts())


def oracle_sets(closed_only: bool = True) -> list[tuple[str, str]]:
    """Every serving set that has an oracle, with the step set the oracle fits on: only those
    of closed loops unless ``closed_only`` is false (for the loop-length and launch-flag
    benchmarks: a run of recorded arrivals has no unstated loop length or launch flags)."""
    with StoreCatalog() as catalog:
        rows = catalog.datasets()
        chosen = {n for n, r in rows.items() if r["kind"] == "serving" and (
            not closed_only or (catalog.serving_targets(n)["load"] == "closed").any())}
    return [(name, home) for name in sorted(chosen)
            if (home := oracle_home(name, rows)) is not None]


def stamped(bench: dict, started: float) -> dict:
    """``bench`` with how long it took since ``started`` and the code and date it ran at."""
    return {**bench, "seconds": round(time.perf_counter() - started, 1),
            "code_version": code_version(), "date": datetime.now(UTC).date().isoformat()}


def json_argument(doc: str) -> Path | None:
    """The ``--json PATH`` a benchmark script described by ``doc`` writes its rows to."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    return parser.parse_args().json


def main() -> None:
    json_path = json_argument(__doc__)
    started, found = time.perf_counter(), []
    # One process per set: a set's replays leave the heap fragmented (about 4 GB on
    # h100_silicon that only malloc_trim hands back), and four sets in one process outgrew
    # a 24 GB machine.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn, max_tasks_per_child=1) as pool:
        for dataset, home in oracle_sets():
            print(f"{dataset}: the oracle on {home}, {len(WAVES)} wave counts", flush=True)
            found += pool.submit(replay_errors, dataset, home).result()
    bench = stamped({"waves": list(WAVES), "dropped": list(DROPPED), "rows": found}, started)
    print("\n".join(closed_loop_table(bench)))
    if json_path:
        json_path.write_text(json.dumps(bench, indent=1) + "\n")


if __name__ == "__main__":
    main()
