"""``check_predictor(cls)``: the contract every predictor keeps, checked on synthetic data, in the
manner of scikit-learn's ``check_estimator``.

It needs no store: the home and the target are a handful of made-up steps of a configured model
(prefill, decode and mixed, at TP 1 and 2) timed by a made-up law, on the A100 and H100
datasheets of ``conf/gpu``. Checked: every hyper-parameter has a default and is stored as given;
``fit`` returns ``self``, learns only state ending in ``_`` and leaves the hyper-parameters as
they were; ``predict`` returns one finite positive float per cell, leaves its input unchanged,
gives the same answer twice and for any subset the same as the subset of the whole. A predictor
that cannot work from what the synthetic home holds (measured op points, published fits) must
say so with ``NotSupported``; any other exception fails the check. Every broken rule raises
``ContractError`` (an ``AssertionError``, raised explicitly: ``python -O`` checks the same).
``python -m leaderboard.check predictor=NAME`` runs it sealed, as a run's child runs, so that a
predictor that reaches for the measurements fails too.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from leaderboard_core.contract import GROUND_TRUTH_COLUMNS, Home, NotSupported
from leaderboard_core.specs import load_gpu_specs

MODEL = "llama-3-8b"
STEPS = ([([q], [0]) for q in (64, 512, 2048)] + [([1] * n, [ctx] * n) for n in (1, 8, 64)
                                                    for ctx in (256, 2048)]
         + [([256, 1, 1], [0, 512, 1024])])


def synthetic_cells(sku: str, seed: int = 0) -> pl.DataFrame:
    """Made-up steps with the columns of real cells; ``gt_ms`` grows with tokens and context."""
    rng = np.random.default_rng(seed)
    rows = []
    for tp in (1, 2):
        for i, (q, ctx) in enumerate(STEPS):
            decode = [c for n, c in zip(q, ctx, strict=True) if n == 1 and c > 0]
            phase = "decode" if len(decode) == len(q) else "prefill" if not decode else "mixed"
            gt = (0.5 + 0.002 * sum(q) + 1e-4 * sum(decode)) / tp * rng.uniform(0.95, 1.05)
            rows.append({"dataset": f"synthetic_{sku}", "cell_id": f"{sku}-tp{tp}-{i}",
                         "workload_id": f"w{i}", "sku": sku, "model": MODEL, "tp": tp,
                         "phase": phase, "q_lens": q, "ctx_lens": ctx, "num_requests": len(q),
                         "num_prefill": len(q) - len(decode), "num_decode": len(decode),
                         "total_tokens": sum(q), "prefill_tokens": sum(q) - len(decode),
                         "decode_ctx_sum": sum(decode), "gt_ms": gt, "gt_kind": "gpu_block",
                         "gt_spread_ms": 0.0, "composed": phase == "mixed", "warm_share": 0.0,
                         "weight": 1})
    return pl.DataFrame(rows)


def synthetic_home() -> tuple[Home, pl.DataFrame, object]:
    """(the home on the A100, the blind target cells, the target H100's datasheet)."""
    gpus = load_gpu_specs()
    home = Home(sku="a100_sxm", gpu=gpus["a100_sxm"], dataset="synthetic_a100_sxm",
                cells=synthetic_cells("a100_sxm"))
    blind = synthetic_cells("h100_sxm", seed=1).drop(GROUND_TRUTH_COLUMNS)
    return home, blind, gpus["h100_sxm"]


class ContractError(AssertionError):
    """A broken rule of the predictor contract, raised explicitly (so ``python -O``, which drops
    ``assert`` statements, checks just the same); the message names the rule, the expected
    shape and the offending cells."""


def _require(ok, message: str) -> None:
    if not ok:
        raise ContractError(message)


def check_predictor(cls: type) -> list[str]:
    """Raise ``ContractError`` naming the broken rule, or return the checks that passed (the
    last says if the predictor stated a ``NotSupported`` for the synthetic data)."""
    done = []
    defaults = cls.default_params()
    missing = sorted(set(cls.param_names()) - set(defaults))
    _require(not missing, f"{cls.__name__}: every hyper-parameter needs a default: {missing}")
    estimator = cls()
    _require(estimator.get_params() == defaults,
             f"{cls.__name__} must store its parameters as given: {estimator.get_params()} after "
             f"construction, {defaults} declared")
    _require(cls(**estimator.get_params()).get_params() == defaults,
             f"{cls.__name__}: a clone must equal the original")
    done.append("parameters")
    home, blind, gpu = synthetic_home()
    before = set(vars(estimator))
    try:
        fitted = estimator.fit(home)
        _require(fitted is estimator, f"{cls.__name__}.fit must return self, returned "
                                      f"{type(fitted).__name__}")
        learned = sorted(set(vars(estimator)) - before)
        _require(all(a.endswith("_") for a in learned),
                 f"{cls.__name__}: learned state must end in _: {learned}")
        _require(estimator.get_params() == defaults,
                 f"{cls.__name__}.fit must not change hyper-parameters")
        done.append("fit")
        _check_predict(estimator, blind, gpu)
    except NotSupported as exc:
        _require(str(exc), f"{cls.__name__}: NotSupported must say what is not supported")
        return [*done, f"NotSupported: {exc}"]
    return [*done, "predict"]


def _cells(blind: pl.DataFrame, bad: np.ndarray, values: np.ndarray) -> str:
    """The first offending cells, by id, with their value and what they are."""
    rows = blind.with_columns(value=pl.Series(values)).filter(pl.Series(bad))
    shown = [f"{r['cell_id']} ({r['phase']}, {r['num_requests']} requests, "
             f"{r['total_tokens']} tokens): {r['value']}" for r in rows.head(3).iter_rows(named=True)]
    return f"{int(bad.sum())} of {len(blind)} cells, first {'; '.join(shown)}"


def _check_predict(estimator, blind: pl.DataFrame, gpu) -> None:
    name = type(estimator).__name__
    kept = blind.clone()
    pred = estimator.predict(blind, gpu)
    _require(isinstance(pred, np.ndarray) and pred.shape == (len(blind),),
             f"{name}.predict must return a numpy array of one value per cell, shape "
             f"({len(blind)},); got {getattr(pred, 'shape', type(pred).__name__)}")
    _require(np.issubdtype(pred.dtype, np.floating),
             f"{name}.predict must return floats (ms), got {pred.dtype}")
    bad = ~(np.isfinite(pred) & (pred > 0))
    _require(not bad.any(), f"{name}: predictions must be finite and positive (ms): "
                            f"{_cells(blind, bad, pred) if bad.any() else ''}")
    _require(blind.equals(kept), f"{name}.predict must not modify its input")
    again = estimator.predict(blind, gpu)
    differs = again != pred
    _require(not differs.any(), f"{name}.predict must repeat: "
                                f"{_cells(blind, differs, again) if differs.any() else ''}")
    subset = np.arange(len(blind))[::3]
    part = estimator.predict(blind[subset], gpu)
    off = ~np.isclose(part, pred[subset], rtol=1e-9)
    _require(not off.any(), f"{name}: a subset's predictions must equal the subset of all: "
                            f"{_cells(blind[subset], off, part) if off.any() else ''}")
    parts = estimator.predict_by_op(blind, gpu)
    if parts:  # None or empty: the prediction is not split
        shapes = {k: np.shape(v) for k, v in parts.items() if np.shape(v) != (len(blind),)}
        _require(not shapes, f"{name}.predict_by_op must give one value per cell "
                             f"({len(blind)},) for every part; got {shapes}")
        total = sum(np.asarray(v, dtype=float) for v in parts.values())
        off = ~np.isclose(total, pred, rtol=1e-9)
        _require(not off.any(), f"{name}.predict_by_op's parts must sum to predict: "
                                f"{_cells(blind, off, total) if off.any() else ''}")
