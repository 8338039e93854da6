"""Probe predictors for the evaluation tests: a spy, broken ones, and cheats.

They live in an importable module because a run constructs, fits and predicts in a child
process, which finds the class by module and name. Each cheat tries one route to the target's
ground truth and predicts it exactly if the route works; where the route is closed it raises,
so a sealed harness answers with an INVALID run (or, for a route that finds nothing, no 0 %).
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import threading
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from leaderboard.store import database
from leaderboard_core import paths
from leaderboard_core.contract import PredictorCard, ReadingRequest
from predictors.base import Predictor

CARD = PredictorCard("analytical", "test", "probe", False)


def spy_dir():
    """Where the spy leaves what it saw: the child's cache home (under the run's predictor cache)."""
    return paths.home() / "spy"


class Spy(Predictor):
    card = CARD

    def fit(self, home):
        spy_dir().mkdir(parents=True, exist_ok=True)
        home.cells.write_ipc(spy_dir() / "home_cells.arrow")
        (spy_dir() / "home.json").write_text(json.dumps(
            {"sku": home.sku, "op_points": sum(len(f) for f in home.ops.values()),
             "op_ids": sorted({i for f in home.ops.values() if "cell_id" in f.columns
                               for i in f["cell_id"]})}))
        return super().fit(home)

    def predict(self, cells, gpu):
        spy_dir().mkdir(parents=True, exist_ok=True)  # a kept fit skips the fit's mkdir
        cells.write_ipc(spy_dir() / "cells.arrow")
        (spy_dir() / "gpu.json").write_text(json.dumps({"sku": gpu.sku}))
        return np.full(len(cells), 1.0)

    def predict_ops(self, points, gpu):
        points.write_ipc(spy_dir() / "points.arrow")
        return np.full(len(points), 0.01)


class SplitsBadly(Spy):
    """A per-op split that fails: the run must stay VALID and note it."""

    def predict_by_op(self, cells, gpu):
        raise ValueError("no split today")


class SplitsMisshapen(Spy):
    """A per-op split with one value too few, under a name that is also np.savez's argument."""

    def predict_by_op(self, cells, gpu):
        return {"allow_pickle": np.ones(len(cells) - 1)}


class Peek(Predictor):
    card = CARD

    def predict(self, cells, gpu):
        return cells["gt_ms"].to_numpy()


class Negative(Predictor):
    card = CARD

    def predict(self, cells, gpu):
        return np.where(np.arange(len(cells)) == 0, -1.0, 1.0)


class ReadsPrefill(Predictor):
    """Asks for up to ``rows`` prefill cells as its deploy reading; predicts their minimum."""

    card = CARD

    def __init__(self, rows: int = 16):
        self.rows = rows

    def request_reading(self, cells, gpu, budget):
        prefill = cells.filter(pl.col("phase") == "prefill")["cell_id"].head(self.rows)
        return ReadingRequest(cells=tuple(prefill))

    def take_reading(self, reading, gpu):
        self.floor_ = float(reading.cells["gt_ms"].min())

    def predict(self, cells, gpu):
        spy_dir().mkdir(parents=True, exist_ok=True)
        cells.write_ipc(spy_dir() / "scored.arrow")
        return np.full(len(cells), self.floor_)


class HoardsReading(ReadsPrefill):
    """Reads two prefill cells and keeps them in its predictor cache, where the next run on this
    target would find them beyond its cap."""

    def __init__(self, rows: int = 2):
        self.rows = rows

    def take_reading(self, reading, gpu):
        hoard = paths.home() / "hoard"
        hoard.mkdir(parents=True, exist_ok=True)
        reading.cells.write_ipc(hoard / f"{len(list(hoard.iterdir()))}.arrow")

    def predict(self, cells, gpu):
        return np.full(len(cells), 1.0)


class ReadsOpPoints(Predictor):
    """Asks for ``points`` attn_decode op points, named by the shapes of the home's (a shape is
    the same on every GPU of a family); keeps what it got in the spy folder; predicts 1 ms."""

    card = CARD

    def __init__(self, points: int = 3):
        self.points = points

    def fit(self, home):
        shapes = home.ops["attn_decode"].drop("latency_ms", "sku", "version", strict=False).unique().sort(
            "batch", "kv_len", "num_heads")
        self.shapes_ = shapes.head(self.points).to_dicts()
        return self

    def request_reading(self, cells, gpu, budget):
        return ReadingRequest(op_points=tuple({"op": "attn_decode", **s} for s in self.shapes_))

    def take_reading(self, reading, gpu):
        spy_dir().mkdir(parents=True, exist_ok=True)
        reading.ops["attn_decode"].write_ipc(spy_dir() / "op_reading.arrow")

    def predict(self, cells, gpu):
        return np.full(len(cells), 1.0)


class Cheat(Predictor):
    """Predicts ``truth(cells)``; a subclass names the route."""

    card = CARD

    def predict(self, cells, gpu):
        truth = self.truth(gpu).select("cell_id", "gt_ms")
        return cells.select("cell_id").join(truth, on="cell_id", how="left")["gt_ms"].to_numpy()


def _cells_of(con) -> pl.DataFrame:
    return con.execute("SELECT cell_id, gt_ms FROM cells WHERE dataset = 'h200_vidur'").pl()


class EnvStore(Cheat):
    def truth(self, gpu):
        path = os.path.join(os.environ["LEADERBOARD_HOME"], "store", "leaderboard.duckdb")
        with duckdb.connect(path, read_only=True) as con:
            return _cells_of(con)


class HomeStore(Cheat):
    def truth(self, gpu):
        with duckdb.connect(str(paths.home() / "store" / "leaderboard.duckdb"),
                            read_only=True) as con:
            return _cells_of(con)


class ThreadStore(Cheat):
    def truth(self, gpu):
        found = {}

        def steal():
            try:
                with database.connect() as con:
                    found["truth"] = _cells_of(con)
            except Exception as exc:  # noqa: BLE001 - carried back to the calling thread
                found["error"] = exc

        thread = threading.Thread(target=steal)
        thread.start()
        thread.join()
        if "error" in found:
            raise found["error"]
        return found["truth"]


class ConstructorStore(Cheat):
    def __init__(self):
        with database.connect() as con:
            self.truth_ = _cells_of(con)

    def truth(self, gpu):
        return self.truth_


class StackFrame(Cheat):
    def truth(self, gpu):
        for frame in inspect.stack():
            for value in frame.frame.f_locals.values():
                for frame_value in (value, getattr(value, "target", None)):
                    if (isinstance(frame_value, pl.DataFrame) and "gt_ms" in frame_value.columns
                            and (frame_value["sku"] == gpu.sku).all()):
                        return frame_value
        raise LookupError("no frame holds the target")


class GcObjects(Cheat):
    def truth(self, gpu):
        for obj in gc.get_objects():
            if (isinstance(obj, pl.DataFrame) and {"gt_ms", "cell_id", "sku"} <= set(obj.columns)
                    and (obj["sku"] == gpu.sku).all()):  # not the home's rows: the target's
                return obj
        raise LookupError("no live DataFrame holds the target's ground truth")


class RawUpstream(Cheat):
    """Reads the raw upstream splitwise file the store's splitwise cells were built from (under
    ``upstream``, the test's upstream folder: the child has no ``$LEADERBOARD_SOURCES``)."""

    def __init__(self, upstream: str = str(paths.SHARED_UPSTREAM)):
        self.upstream = upstream

    def truth(self, gpu):
        raw = (Path(self.upstream) / "Mutinifni__splitwise-sim" / "data" / "perf_model.csv"
               ).read_bytes()
        raise AssertionError(f"read {len(raw)} bytes of raw target measurements")


class QuietStore(Cheat):
    """Tries the store, catches the refusal and predicts 1 ms: it read nothing, yet it tried."""

    def predict(self, cells, gpu):
        try:
            with database.connect() as con:
                _cells_of(con)
        except Exception:  # noqa: BLE001, S110 - the point: a refusal swallowed
            pass
        return np.full(len(cells), 1.0)


class QuietUpstream(RawUpstream):
    """Tries the raw upstream file, catches the refusal and predicts 1 ms."""

    def predict(self, cells, gpu):
        try:
            self.truth(gpu)
        except (OSError, AssertionError):
            pass
        return np.full(len(cells), 1.0)


class ScansMetadata(Spy):
    """Honest, but asks for every installed distribution's entry points, as plugin-loading
    libraries do on import (each folder of sys.path is scanned)."""

    def predict(self, cells, gpu):
        import importlib.metadata  # noqa: PLC0415 - the scan is the point

        importlib.metadata.entry_points()
        return np.full(len(cells), 1.0)


class TwoMsSteps(Predictor):
    """Every step takes 2 ms: a serving replay's TTFT/TPOT can then be worked out by hand."""

    card = PredictorCard("analytical", "test", "every step 2 ms", False)

    def predict(self, cells, gpu):
        return np.full(len(cells), 2.0)


CHEATS = {"env_store": EnvStore, "home_store": HomeStore, "thread_store": ThreadStore,
          "constructor_store": ConstructorStore, "stack_frame": StackFrame,
          "gc_objects": GcObjects, "raw_upstream": RawUpstream, "quiet_store": QuietStore,
          "quiet_upstream": QuietUpstream, "scans_metadata": ScansMetadata}
