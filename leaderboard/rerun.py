"""Rerun the whole leaderboard: every registered predictor on every leaderboard dataset.

The leaderboard datasets are the store's datasets of every family registered with
``leaderboard=True`` (``leaderboard.cells.families``): today the six ``_vidur`` GPUs (A100 home; again
with the family's ``two_homes``; and again leaving each GPU out, the other five its homes), the
version-matched ``_vidur19`` sets (H100 home), the
FP8-GEMM ``_vidur_fp8`` sets (H100 home), Vidur's own profiles (``_vidurprof``), the splitwise
pair, the op-level ``<sku>_ops`` sets (for predictors with ``predict_ops``) and the serving sets
(``<sku>_silicon``, ``<sku>_silicon_fp8``, ``rtx4090_serving``), with the serving oracle, and each
predictor on the ``_vidur`` home with whole configurations and their shapes held out
(``split.home_points=held_out_shapes``); those protocol runs draw no run atlas.
Each run is what ``python -m leaderboard predictor=P
dataset=D`` does with the default config (default parameters, the ``heldout`` split, the
dataset's configured home), run in a pool of worker processes (Polars and BLAS on one thread, each
replaced after ``RUNS_PER_WORKER`` runs: see there why) because a run is single-threaded,
Python-bound work. ``python -m leaderboard.rerun [report.jobs=N runs_dir=DIR]`` reruns into
``runs_dir`` and prints each outcome; ``python -m leaderboard.report report.rerun=true`` does the
same, then writes RESULTS.md. Only runs that are stale (their predictor's or the harness's code
changed, or a dataset version) or missing are redone (``rerun.all=true``: every run);
``rerun.dry_run=true`` lists them; ``predictor=a,b`` reruns those predictors only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

from rich.console import Console

from leaderboard.run import roster
from leaderboard.run.evaluate import RunSpec, run
from leaderboard.run.inputs import InputError
from leaderboard.score import results
from leaderboard.seal import predictor_index
from leaderboard.store import database
from leaderboard_core import paths, progress
from leaderboard_core.contract import NotSupported
from leaderboard_core.naming import suggestion
from leaderboard_core.versioning import content_hash

# A worker is replaced after this many runs, and runs Polars on one thread. With Polars' thread
# pool a process kept about 2.1 GB more after each h200_silicon_moe run (ours: 2.3, 4.4, 6.6 GB
# resident after one, two, three runs; with one thread 2.2, 2.4, 2.4); workers reached 13 GB
# and were killed for memory on a 24 GB machine. A run is Python-bound and the rerun already
# runs one per core.
# Most of that growth was the serving replay's reference cycle (mended in 079ad0b): the rerun
# after it peaked at 2.2 GB in use on the machine, its largest worker at 0.7 GB (sampled every
# 20 s), against 21.4 and 12.4 GB before. The replacement stays, as a cheap bound: every 100
# runs. At 40 (when a run took 3 s) a rerun started 41 workers, each paying its imports and the
# predictor index (about 1.5 s) and laying out again the homes and step cells the one before
# had kept, a tenth of a run's 0.75 s now.
RUNS_PER_WORKER = 100
# One thread each for Polars and the BLAS a run's child loads (read once, at import; the sandbox
# passes the BLAS settings to the child). OpenBLAS's own threads spin while they wait: on 2
# cores, a neusight_tiles fit beside another run took 157 s with them and 12 s without, and the
# run beside it 149 s against 5 s (the same numbers either way).
SINGLE_THREADED = {"POLARS_MAX_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


@dataclass
class Outcome:
    predictor: str
    dataset: str
    status: str  # "valid" | "invalid" | "not supported: ..." | "error: ..."
    seconds: float
    homes: list[str] | None = None  # the spec's homes (None: the dataset's own)
    home_points: str = ""
    # A refusal raised before a run is scored (a card's scope, a serving child's NotSupported)
    # leaves no run folder, so what it was made with is kept here (``made_with``): a later
    # rerun skips it while that stands.
    made_with: str | None = None

    @classmethod
    def of(cls, spec: RunSpec, status: str, seconds: float) -> Outcome:
        homes = None if spec.home is None else [spec.home] if isinstance(spec.home, str) \
            else list(spec.home)
        return cls(spec.predictor, spec.dataset, status, seconds, homes, spec.home_points)

    @property
    def key(self) -> tuple:
        return roster.spec_key(self.predictor, self.dataset, self.homes, self.home_points)


def _run_one(spec: RunSpec) -> Outcome:
    started = time.perf_counter()
    try:
        metrics = run(spec).metrics
        reasons = metrics["invalid_reasons"]
        status = "valid" if metrics["valid"] else (
            f"not supported: {reasons[0].removeprefix('NotSupported: ')}"
            if reasons and all(r.startswith("NotSupported:") for r in reasons) else "invalid")
    except NotSupported as exc:
        status = f"not supported: {exc}"
    except Exception as exc:  # noqa: BLE001 - one broken predictor must not stop the others
        status = f"error: {type(exc).__name__}: {exc}"
    return Outcome.of(spec, status, time.perf_counter() - started)


def _worker_setup(folders: tuple[str, ...] = ()) -> None:
    """A worker draws no bar of its own, never builds the store (built once above) and knows
    the ``predictors_path`` folders this process was given (a spawned worker starts afresh)."""
    for folder in folders:
        predictor_index.include(folder)
    progress.show(False)
    os.environ[database.STALE_ENV] = "refuse"


def in_workers(fn: Callable, items: list, jobs: int) -> Iterator:
    """``fn`` of each item in ``jobs`` worker processes, each replaced after ``RUNS_PER_WORKER``
    calls; results in the order they finish. At most ``jobs`` calls are handed to the pool at
    once: on Python before 3.13 a pool with ``max_tasks_per_child`` that holds queued work
    stops replacing its workers and hangs (CPython gh-115634), and a submit is what starts a
    replacement. Spawned, not forked: forking a process that already started Polars' thread
    pool can deadlock. The workers, spawned as the calls need them, inherit the thread counts
    (``SINGLE_THREADED``) from this process's environment, set for the loop's lifetime."""
    previous = {k: os.environ.get(k) for k in SINGLE_THREADED}
    os.environ.update(SINGLE_THREADED)
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"),
                                 initializer=_worker_setup,
                                 initargs=(tuple(predictor_index.included()),),
                                 max_tasks_per_child=RUNS_PER_WORKER) as pool:
            todo, running = list(reversed(items)), set()
            while todo or running:
                while todo and len(running) < jobs:
                    running.add(pool.submit(fn, todo.pop()))
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                yield from (future.result() for future in finished)
    finally:
        for key, value in previous.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value


LAUNCHERS = ("pool", "slurm", "local")
SLURM_CONF = paths.CONF_DIR / "hydra" / "launcher" / "slurm.yaml"


def _job(spec: RunSpec, folders: tuple[str, ...]) -> Outcome:
    """One run as a submitit job: a fresh process on a node, set up as a pool worker is."""
    os.environ.update(SINGLE_THREADED)
    _worker_setup(folders)
    return _run_one(spec)


def in_jobs(specs: list[RunSpec], launcher: str, folder: Path, partition: str | None = None
            ) -> Iterator[Outcome]:
    """Each spec as one task of a submitit array: on SLURM (``launcher="slurm"``, with the
    resources of ``conf/hydra/launcher/slurm.yaml``, the file ``-m hydra/launcher=slurm`` runs
    with) or on this machine (``"local"``: every task at once, for tests); outcomes in the order
    submitted. A task that dies (killed, timed out) is an outcome with the error, never a lost
    run."""
    import submitit  # noqa: PLC0415 - only for a rerun sent through it
    from omegaconf import OmegaConf  # noqa: PLC0415

    executor = submitit.AutoExecutor(folder=str(folder), cluster=launcher)
    if launcher == "slurm":
        conf = OmegaConf.load(SLURM_CONF)
        executor.update_parameters(
            timeout_min=conf.timeout_min, cpus_per_task=conf.cpus_per_task, mem_gb=conf.mem_gb,
            nodes=conf.nodes, tasks_per_node=conf.tasks_per_node,
            **({"slurm_partition": partition} if partition else {}))
    folders = tuple(predictor_index.included())
    jobs = executor.map_array(_job, specs, [folders] * len(specs))
    for spec, job in zip(specs, jobs, strict=True):
        try:
            yield job.result()
        except Exception as exc:  # noqa: BLE001 - a dead task is this run's outcome
            yield Outcome.of(spec, f"error: {type(exc).__name__}: {exc}", 0.0)


def rerun_all(runs_dir: Path, jobs: int = 2, everything: bool = False, dry_run: bool = False,
              predictors: list[str] | None = None, launcher: str = "pool",
              partition: str | None = None) -> list[Outcome]:
    """Run every leaderboard run (of ``predictors`` only, where given) that is stale or missing
    (``everything``: all of them), ``jobs`` processes at a time; ``dry_run`` lists them and
    runs none; ``launcher``: one of ``LAUNCHERS`` (``in_workers`` here, or ``in_jobs``).
    Records the wall time and each outcome in ``roster.TIMING_FILE``, an earlier rerun's
    outcomes kept for the runs not redone."""
    if launcher not in LAUNCHERS:
        raise InputError(f"rerun.launcher={launcher} is not one of {', '.join(LAUNCHERS)}")
    Console(stderr=True).print("rerun: checking the store (built first if stale)", highlight=False)
    database.ensure()  # build once here rather than racing for the build lock in every worker
    started = time.perf_counter()
    every = [s for s in roster.run_specs(runs_dir) if predictors is None or s.predictor in predictors]
    versions = results.store_versions()
    made_with = _made_with({s.predictor for s in every}, versions)
    refused = set() if everything else refused_before(runs_dir, made_with)
    specs = every if everything else [s for s in roster.pending(every, runs_dir, versions)
                                      if Outcome.of(s, "", 0.0).key not in refused]
    Console(stderr=True).print(f"rerun: {len(specs)} of {len(every)} runs are stale or missing"
                               f"{' (rerun.all=true: running all)' if everything else ''}",
                               highlight=False)
    if dry_run:
        return [Outcome.of(s, "would run", 0.0) for s in specs]
    outcomes = []
    where = f"{jobs} processes" if launcher == "pool" else f"submitit ({launcher})"
    done_runs = (in_workers(_run_one, specs, jobs) if launcher == "pool" else
                 in_jobs(specs, launcher, runs_dir / ".submitit", partition))
    with progress.track(f"rerun: {len(specs)} runs, {where}", total=len(specs)) as bar:
        bar.note(f"starting {where}")
        # The workers draw no bars of their own: this one owns the terminal.
        for done in done_runs:
            outcomes.append(done)
            bar.note(f"last: {done.predictor} on {done.dataset}, {done.status.split(':')[0]} "
                     f"in {done.seconds:.0f} s")
            bar.advance()
    order = {Outcome.of(s, "", 0.0).key: i for i, s in enumerate(specs)}
    outcomes.sort(key=lambda o: order[o.key])
    for o in outcomes:
        if o.status.startswith("not supported"):
            o.made_with = made_with[o.predictor]
    _record(runs_dir, outcomes, time.perf_counter() - started, jobs, len(specs) == len(every)
            and predictors is None)
    return outcomes


def _recorded(entry: dict) -> Outcome:
    """An outcome of ``roster.TIMING_FILE``."""
    return Outcome(**{k: v for k, v in entry.items() if k in Outcome.__dataclass_fields__})


def _made_with(predictors: set[str], versions: dict[str, str]) -> dict[str, str]:
    """Per predictor, a hash of what any of its runs could depend on, taken before a rerun
    starts: its code hash (the harness and its own files), every dataset's version and every
    GPU spec with the model shapes. Coarser than a run's own record (any dataset's new version
    retries every refusal), never finer."""
    world = content_hash(sorted(versions.items()), sorted(results.spec_hashes().items()))
    return {p: content_hash(predictor_index.code_hash_of(p), world) for p in predictors}


def refused_before(runs_dir: Path, made_with: dict[str, str]) -> set[tuple]:
    """The keys of the specs the last rerun into ``runs_dir`` found not supported, made with
    what is here now (``_made_with``)."""
    last = roster.last_rerun(runs_dir) or {}
    return {o.key for o in map(_recorded, last.get("outcomes", []))
            if o.status.startswith("not supported") and o.made_with is not None
            and o.made_with == made_with.get(o.predictor)}


def _record(runs_dir: Path, outcomes: list[Outcome], seconds: float, jobs: int,
            full: bool) -> None:
    """``roster.TIMING_FILE``: this rerun's time, and every outcome, an earlier one's kept for the
    (predictor, dataset) pairs not rerun; ``full_rerun`` only for a rerun of every run."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / roster.TIMING_FILE
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    redone = {o.key for o in outcomes}
    # an entry of a record older than homes and home points names no spec: it is dropped
    kept = [o for o in earlier.get("outcomes", [])
            if "home_points" in o and _recorded(o).key not in redone]
    timing = {"seconds": seconds, "jobs": jobs, "runs": len(outcomes), "cores": os.cpu_count(),
              "full_rerun": earlier.get("full_rerun"), "outcomes": kept + [asdict(o)
                                                                          for o in outcomes]}
    if full:
        timing["full_rerun"] = {"runs": len(outcomes), "seconds": round(seconds),
                                "jobs": jobs, "cores": os.cpu_count()}
    path.write_text(json.dumps(timing, indent=1) + "\n")


def main(argv: list[str]) -> int:
    from leaderboard.run.config import command_config

    chosen = [a.partition("=")[2] for a in argv if a.startswith("predictor=")]
    argv = [a for a in argv if not a.startswith("predictor=")]
    cfg = command_config(argv, "python -m leaderboard.rerun", __doc__, "rerun", {})
    predictors = chosen[-1].split(",") if chosen else None
    for name in predictors or []:
        if name not in predictor_index.names():
            hint = "" if cfg.predictors_path else " (a predictor of your own: pass predictors_path=DIR)"
            raise InputError(f"unknown predictor '{name}'; "
                             f"{suggestion(name, predictor_index.names())}{hint}")
    runs_dir = paths.from_user(cfg.runs_dir)
    outcomes = rerun_all(runs_dir, cfg.report.jobs, cfg.rerun.all, cfg.rerun.dry_run, predictors,
                         cfg.rerun.launcher, cfg.rerun.partition)
    for o in outcomes:
        print(f"{o.predictor} on {o.dataset}: {o.status} ({o.seconds:.1f} s)")
    bad = [o for o in outcomes if o.status not in ("valid", "would run")
           and not o.status.startswith("not supported")]
    unsupported = sum(o.status.startswith("not supported") for o in outcomes)
    print(f"{len(outcomes)} runs: {len(bad)} invalid or failed, {unsupported} not supported",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    from leaderboard.run.inputs import guarded

    sys.exit(guarded(main, "python -m leaderboard.rerun")(sys.argv[1:]))

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
