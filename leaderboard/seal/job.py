"""The sealed side of a run, imported by ``leaderboard.seal.child`` once it is confined:
construct, fit, read, predict, and on serving datasets answer the step times the parent's replay
asks for. Everything the predictor does comes back as facts for the parent."""

from __future__ import annotations

import json
import pickle
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard.seal.bundle import gpu_of, read_frame, read_home, read_reading
from leaderboard_core import guard, progress
from leaderboard_core.contract import NotSupported


def _resolve(job: dict) -> type:
    """The class registered under the name the run asked for, with the module and class the
    harness was told of: the ``predictors_path`` folders of the job registered first (none for a
    predictor of the suite's own, so no folder's code runs beside it), then the described
    module imported (that module alone: importing every predictor would cost each run the
    imports of all their libraries). A folder's module could re-point the registry; a class
    other than the described one makes the run INVALID. A class the harness registered in its
    own process (the tests' probes, which no command line reaches) is found by module and name."""
    import importlib

    from predictors import registry

    ref = job["predictor"]
    for folder in job["include"]:
        registry.include(folder)
    found = importlib.import_module(ref["module"])
    registered = registry.imported().get(ref["name"])
    if registered is None and not job["include"] and not ref["module"].startswith("predictors."):
        for part in ref["qualname"].split("."):
            found = getattr(found, part)
        return found
    if registered is None or (registered.__module__, registered.__qualname__) != (
            ref["module"], ref["qualname"]):
        where = "nothing" if registered is None else \
            f"{registered.__module__}.{registered.__qualname__}"
        raise RuntimeError(f"the predictor registered as '{ref['name']}' is {where}, not the "
                           f"described {ref['module']}.{ref['qualname']}; a module re-pointed "
                           "the name")
    return registered


def _save_by_op(estimator, blind: pl.DataFrame, gpu, rows: int, out: Path, facts: dict) -> None:
    """The predictor's per-op split of its step predictions, if it offers one: one row per part
    in ``by_op.npy``, the part names in ``facts["by_op_names"]``. It is a diagnostic beside the
    score: a failing or misshapen split is noted, the score stands."""
    try:
        parts = estimator.predict_by_op(blind, gpu)
        if parts:
            arrays = [np.asarray(v, dtype=np.float64) for v in parts.values()]
            bad = sorted(k for k, v in zip(parts, arrays, strict=True) if v.shape != (rows,))
            if bad:
                raise ValueError(f"parts {bad} are not one value per cell ({rows})")
            np.save(out / "by_op.npy", np.stack(arrays), allow_pickle=False)
            facts["by_op_names"] = [str(k) for k in parts]
    except Exception as exc:  # noqa: BLE001 - reported, never fatal to the run
        facts["by_op_error"] = f"{type(exc).__name__}: {exc}"


def _explain(estimator, blind: pl.DataFrame, gpu, cell_ids: list[str]) -> dict:
    """Per cell asked for (and still scored): the predictor's ``explain`` tables, its per-op
    split and its prediction, as plain JSON for the harness to set beside the measurements."""
    explained = {}
    for cell_id in cell_ids:
        cell = blind.filter(pl.col("cell_id") == cell_id)
        if cell.is_empty():
            continue
        split = estimator.predict_by_op(cell, gpu) or {}
        explained[cell_id] = json.loads(json.dumps({
            "tables": list(estimator.explain(cell, gpu) or []),
            "by_op": {str(op): float(np.asarray(ms)[0]) for op, ms in split.items()},
            "pred": float(np.asarray(estimator.predict(cell, gpu))[0])}, default=str))
    return explained


def _failure(exc: Exception) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {exc} (at {Path(last.filename).name}:{last.lineno})"


def answer_steps(estimator, gpu, inputs: Path, out: Path, ask: Callable[[dict], dict]) -> None:
    """Serving: the replay runs in the parent, which schedules every step; this side only
    prices the steps it is sent (``in/<name>`` as Arrow), writing ``out/<name>.npy``, until the
    parent says ``end``."""
    request = ask({"replay": True})
    while "steps" in request:
        name = request["steps"]
        started = time.perf_counter()
        try:
            ms = np.asarray(estimator.predict(read_frame(inputs / name), gpu), dtype=np.float64)
        except NotSupported as exc:
            request = ask({"not_supported": str(exc)})
            continue
        except Exception as exc:  # noqa: BLE001 - the parent makes the run INVALID
            request = ask({"error": _failure(exc)})
            continue
        np.save(out / f"{name}.npy", ms, allow_pickle=False)
        request = ask({"seconds": time.perf_counter() - started})


def _fitted(estimator, home, kept: Path | None, facts: dict):
    """``estimator`` fitted on ``home``, or the fit an earlier run of the same predictor code,
    parameters and harness kept at ``kept`` from the same home bundle (the folder is that fit
    input's own, ``sandbox.predictor_cache``, so no other home's fit is ever read back). A
    family's targets share their home, so its fit is paid once; readings come after and stay
    per target. The fit is kept only when it pickles within ``MAX_KEPT_FIT`` (a predictor that
    keeps its own, larger fits, as the forests do, is not copied), and a fit is written whole
    or not at all. ``kept`` None: fitted here, and not kept."""
    if kept is not None and kept.is_file():
        try:
            with kept.open("rb") as f:
                stored = pickle.load(f)
            facts["fit_seconds"], facts["fit_reused"] = stored["fit_seconds"], True
            return stored["estimator"]
        except Exception:  # noqa: BLE001 - an unreadable keep is fitted again
            kept.unlink(missing_ok=True)
    started = time.perf_counter()
    fitted = estimator.fit(home)
    facts["fit_seconds"] = time.perf_counter() - started
    if fitted is not estimator:
        facts["invalid_reasons"].append("fit did not return self")
        return estimator
    if kept is None:
        return estimator
    too_large = kept.with_suffix(".too-large")
    if too_large.exists():
        return estimator
    for old in kept.parent.glob("fitted-*"):  # fits of other code are never read again
        old.unlink(missing_ok=True)
    partial = kept.with_name(f".{kept.name}.partial")
    try:
        with partial.open("wb") as f:
            pickle.dump({"estimator": estimator, "fit_seconds": facts["fit_seconds"]},
                        _Capped(f, MAX_KEPT_FIT), protocol=pickle.HIGHEST_PROTOCOL)
        partial.replace(kept)
    except _TooLarge:
        too_large.touch()
    except Exception:  # noqa: BLE001 - an estimator that does not pickle is fitted every run
        pass
    finally:
        partial.unlink(missing_ok=True)
    return estimator


MAX_KEPT_FIT = 64 << 20


class _TooLarge(Exception):
    pass


class _Capped:
    """A file that refuses to grow past ``limit`` bytes, so a huge fit stops pickling early."""

    def __init__(self, file, limit: int):
        self.file, self.left = file, limit

    def write(self, data) -> int:
        self.left -= len(data)
        if self.left < 0:
            raise _TooLarge
        return self.file.write(data)


def run(job: dict, folder: Path, ask: Callable[[dict], dict], tell: Callable[[dict], None]
        ) -> dict:
    """Construct, fit, read, predict: everything the predictor does, as facts for the parent,
    which ``tell`` keeps informed of the stage (each has its own wall-time limit there)."""
    guard.seal_process("the sandboxed fit and predict")
    progress.show(job["progress"])  # the child draws on the parent's terminal, if it may
    facts = {"fit_seconds": None, "predict_seconds": None, "invalid_reasons": [],
             "home_profiled_rows": 0}
    inputs, out = folder / "in", folder / "out"
    try:
        estimator = _resolve(job)(**job["params"])
        home, blind = read_home(inputs / "home"), read_frame(inputs / "blind.arrow")
        gpu = gpu_of(json.loads((inputs / "gpu.json").read_text()))
        tell({"stage": "fit"})
        estimator = _fitted(estimator, home, job["fitted"] and Path(job["fitted"]), facts)
        facts["home_profiled_rows"] = int(getattr(estimator, "profiled_rows_", 0))
        if job["level"] == "serving":
            answer_steps(estimator, gpu, inputs, out, ask)
            return facts
        request = (estimator.request_reading(blind, gpu, job["budget"])
                   if job["level"] in ("step", "explain") else None)
        if request is not None and request.size:
            answer = ask({"cells": list(request.cells), "op_points": list(request.op_points)})
            if "refused" in answer:
                return facts
            estimator.take_reading(read_reading(inputs / "reading"), gpu)
            blind = blind.filter(~pl.col("cell_id").is_in(answer["unscored"]))
        if job["level"] == "explain":
            facts["explained"] = _explain(estimator, blind, gpu, job["explain"])
            return facts
        predict = estimator.predict_ops if job["level"] == "op" else estimator.predict
        tell({"stage": "predict"})
        predict(blind.head(8), gpu)  # warm caches, so the timing below is throughput
        started = time.perf_counter()
        pred = np.asarray(predict(blind, gpu), dtype=np.float64)
        facts["predict_seconds"] = time.perf_counter() - started
        np.save(out / "pred.npy", pred, allow_pickle=False)
        if job["level"] == "step":
            _save_by_op(estimator, blind, gpu, len(pred), out, facts)
    except NotSupported as exc:  # a stated limit of the predictor, reported as such on serving
        facts["not_supported"] = str(exc)
        facts["invalid_reasons"].append(f"NotSupported: {exc}")
    except Exception as exc:  # noqa: BLE001 - any failure of a predictor makes the run INVALID
        facts["invalid_reasons"].append(_failure(exc))
    return facts
