"""Whether a run may be ranked: only the default run of its (predictor, dataset) is.

A run that changes the rules (raised reading caps, another split, home or home points,
non-default predictor parameters), that ran without the seal's walls, or that scored rows other
than the store's own is still written, and the report lists it apart. Each reason starts with
the part of the run it names (``reading:``, ``home:``...), so that a protocol table (two homes,
leave one GPU out, held-out shapes) can take the runs that differ from the default only by
their protocol (``PROTOCOL_PARTS``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl

from leaderboard.run import readings
from leaderboard.run.run_inputs import RunInputs, RunSpec, load_inputs, rows_digest
from leaderboard.run.split import default_split
from leaderboard_core import paths

# What a protocol run may change and still be scored in its protocol's table
PROTOCOL_PARTS = ("home", "home_points", "split")


def _as_store(frame: pl.DataFrame, like: pl.DataFrame) -> pl.DataFrame | None:
    """``frame`` cast to ``like``'s schema, or None where their columns differ."""
    if set(frame.columns) != set(like.columns):
        return None
    try:
        return frame.select([pl.col(c).cast(t) for c, t in like.schema.items()])
    except Exception:  # noqa: BLE001 - a column that does not cast is not the store's
        return None


def hub_matches_store(spec: RunSpec, inputs: RunInputs) -> str | None:
    """Why the hub rows a run read are not the store's own (None when every frame is): an
    export anyone can edit is ranked only when it holds exactly what the pinned build holds."""
    try:
        local = load_inputs(dataclasses.replace(spec, hub_repo=None, hub_revision=None))
    except Exception as exc:  # noqa: BLE001 - no store here, or it lacks the dataset
        return f"no local store to check the hub rows against ({type(exc).__name__}: {exc})"
    pairs = [("target", inputs.target, local.target), ("home cells", inputs.home.cells,
                                                       local.home.cells)]
    pairs += [(f"home {op} points", frame, local.home.ops.get(op, pl.DataFrame()))
              for op, frame in inputs.home.ops.items()]
    for what, hub, store in pairs:
        cast = _as_store(hub, store)
        if cast is None or rows_digest(cast) != rows_digest(store):
            return f"the hub's {what} rows differ from the store's"
    return None


def reasons(spec: RunSpec, inputs: RunInputs, params: dict, defaults: dict,
            sealed: bool, sandbox: str) -> list[str]:
    """Why the run is not the default run of its (predictor, dataset), on the store's data and
    sealed; empty when it is rankable."""
    found = []
    if not sealed:
        found.append(f"unsealed: sandbox {sandbox}, not namespaces and Landlock")
    caps = (spec.reading_max_points, spec.reading_max_fraction)
    if caps != (readings.MAX_POINTS, readings.MAX_FRACTION):
        found.append(f"reading: caps max_points={caps[0]}, max_fraction={caps[1]} (default "
                     f"{readings.MAX_POINTS}, {readings.MAX_FRACTION})")
    split = default_split()
    if (spec.seed, spec.test_fraction) != (split["seed"], split["test_fraction"]):
        found.append(f"split: seed {spec.seed}, test fraction {spec.test_fraction} (default "
                     f"{split['seed']}, {split['test_fraction']})")
    if spec.home_points != split["home_points"]:
        found.append(f"home_points: {spec.home_points} (default {split['home_points']})")
    used = [r["name"] for r in inputs.home_rows]
    if used != inputs.default_homes:
        found.append(f"home: {'+'.join(used)} (default {'+'.join(inputs.default_homes)})")
    changed = {k: v for k, v in params.items() if defaults.get(k) != v}
    if changed:
        found.append(f"params: {', '.join(f'{k}={v!r}' for k, v in sorted(changed.items()))} "
                     "(not the predictor's defaults; a variant is registered under its own name)")
    own_specs = (paths.CONF_DIR / "gpu").resolve()
    for gpu in (inputs.gpu, *inputs.home.gpus.values()):
        if not Path(gpu.path).resolve().is_relative_to(own_specs):
            found.append(f"gpu_specs: {gpu.sku}'s datasheet is {gpu.path}, not conf/gpu's")
            break
    if spec.hub_repo and (why := hub_matches_store(spec, inputs)):
        found.append(f"data: {spec.hub_repo}: {why}")
    return found


# A score no honest predictor reaches on a GPU it never saw: the best rankable one on an unseen
# GPU today is 5.3 % all-phase MAPE (ours, l40s_vidur_moe, at 4801d2e), the best phase of ten
# rows or more 3.05 % (its traffic-weighted decode), and repeated GPU kernel
# timings spread by about as much as this. The measurements of the visible GPUs are public, so a
# predictor can carry them in its own files; below this floor a run says it did, and it is held
# unranked until it is scored on GPUs kept out of this repository. A review rule, not a
# physical constant: a cheat that adds noise to land above it is caught only by those GPUs.
MIN_PLAUSIBLE_MAPE = 2.0
# A phase of a few targets can land under the floor by chance (liminal's TPOT on gb200_silicon,
# two targets, 1.55 %); from ten rows on, no honest phase is under 3 % today.
MIN_PHASE_N = 10


def implausible(split: str, phases: dict) -> list[str]:
    """``implausible:`` when any phase of at least ``MIN_PHASE_N`` scored rows (all-phase,
    prefill, decode, an op family, TTFT, TPOT...) of a GPU the predictor never saw, or of a
    dataset of a home GPU it was not fitted on (a serving set on its home GPU: the best honest
    one is 4.1 %, the oracle's), is under ``MIN_PLAUSIBLE_MAPE``: the per-phase tables rank
    each phase. A home's own held-out cells are exempt: a profiled lookup is in-sample there."""
    if split not in ("unseen", "home_gpu"):
        return []
    low = {k: v["mape"] for k, v in phases.items()
           if isinstance(v, dict) and v.get("mape") is not None
           and (v.get("n") or 0) >= MIN_PHASE_N and v["mape"] < MIN_PLAUSIBLE_MAPE}
    if not low:
        return []
    shown = ", ".join(f"{k} {v:.2f} %" for k, v in sorted(low.items()))
    return [f"implausible: {shown} MAPE on a GPU it never saw, under the {MIN_PLAUSIBLE_MAPE:g} % "
            "floor no honest predictor reaches; held until scored on GPUs outside the repo"]


def protocol_only(because: list[str] | None) -> bool:
    """Whether a run differs from the default only by its protocol (home, home points, split):
    sealed, on the store's data, at default caps and parameters."""
    return all(reason.partition(":")[0] in PROTOCOL_PARTS for reason in because or [])
