"""The forests of Vidur's random-forest predictor (``predictors.rf``): its search over a
hyperparameter grid (baselines.md §2.3) and each fitted forest tabulated on Vidur's lookup grid
(§2.4), so that a step's ops are looked up, not re-predicted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import RandomForestRegressor
from sklearn.metrics import get_scorer
from sklearn.model_selection import GridSearchCV, ParameterGrid

# Vidur's 27-configuration grid, and a one-configuration default: a full search runs 10-fold CV
# over 27 forests for each of ~35 regressors, too slow here. On these small, exact tables
# (~20-100 rows per regressor) the least regularized point of Vidur's grid with its fewest trees.
GRIDS = {"full": {"n_estimators": [250, 500, 750], "max_depth": [8, 16, 32],
                  "min_samples_split": [2, 5, 10]},
         "reduced": {"n_estimators": [250], "max_depth": [32], "min_samples_split": [2]},
         # Not Vidur's: no bootstrap, so every tree holds every measured point and reproduces
         # it exactly (the trees are then alike: one is enough). rf_exact, labelled as such.
         "exact": {"n_estimators": [1], "max_depth": [32], "min_samples_split": [2],
                   "bootstrap": [False]}}
TOKEN_ROUNDING, KV_GRANULARITY = 8, 64
# Where each forest is tabulated once at fit, like Vidur's lookup grid (§2.4) widened to this
# data's range (8192 tokens, 192 decode requests, contexts to 8191); values outside it are
# computed from the forest on demand, so a table changes speed, never a prediction.
MAX_TOKENS, MAX_DECODE_BATCH, MAX_KV, MAX_CHUNK = LOOKUP_BOUNDS = 8192, 256, 8192, 8192


def round_up(x: np.ndarray, multiple: int) -> np.ndarray:
    return np.ceil(np.asarray(x, dtype=np.float64) / multiple) * multiple


def _encode(features: np.ndarray) -> np.ndarray:
    """One int64 per row of 1 or 2 non-negative integer features, for sorted lookups."""
    f = np.asarray(features, dtype=np.int64)
    return f[:, 0] if f.shape[1] == 1 else (f[:, 0] << 32) | f[:, 1]


def _decode(keys: np.ndarray, width: int) -> np.ndarray:
    return keys[:, None] if width == 1 else np.stack([keys >> 32, keys & 0xFFFFFFFF], axis=1)


@dataclass
class OpForest:
    """A fitted forest and its values on the fit-time grid; evaluates only distinct features."""

    forest: RandomForestRegressor
    width: int
    grid_keys: np.ndarray  # sorted
    grid_values: np.ndarray

    def __call__(self, features: np.ndarray) -> np.ndarray:
        keys, inverse = np.unique(_encode(features), return_inverse=True)
        at = np.minimum(np.searchsorted(self.grid_keys, keys), len(self.grid_keys) - 1)
        hit = self.grid_keys[at] == keys
        values = np.where(hit, self.grid_values[at], 0.0)
        if not hit.all():
            values[~hit] = self.forest.predict(_decode(keys[~hit], self.width).astype(np.float64))
        return values[inverse]


def lookup_grid(op: str) -> np.ndarray:
    if op == "attn_decode":
        batch, kv = np.meshgrid(np.arange(1, MAX_DECODE_BATCH + 1),
                                np.arange(KV_GRANULARITY, MAX_KV + 1, KV_GRANULARITY))
        return np.stack([batch.ravel(), kv.ravel()], axis=1)
    if op == "attn_prefill":  # kv 0: the only cache size the home measured prefill at
        chunk = np.arange(1, MAX_CHUNK + 1)
        return np.stack([np.zeros_like(chunk), chunk**2], axis=1)
    return np.arange(TOKEN_ROUNDING, MAX_TOKENS + 1, TOKEN_ROUNDING)[:, None]


def fit_forest(x: np.ndarray, y: np.ndarray, grid: str, random_state: int,
               on_fold: Callable[[int, int], None] = lambda done, total: None) -> RandomForestRegressor:
    """Vidur's search (§2.3): GridSearchCV on −MAPE, unshuffled 10-fold CV (2 below 10 rows),
    the best refit on all rows. One candidate needs no search: the refit is the result.
    ``on_fold(done, total)`` hears of each scored fold, so a long search can show progress."""
    candidates = GRIDS[grid]
    if all(len(v) == 1 for v in candidates.values()):
        params = {k: v[0] for k, v in candidates.items()}
        return RandomForestRegressor(**params, random_state=random_state).fit(x, y)
    folds = 10 if len(y) >= 10 else 2
    total, done = len(ParameterGrid(candidates)) * folds, 0
    neg_mape = get_scorer("neg_mean_absolute_percentage_error")

    def scored(estimator, x_fold, y_fold) -> float:  # the same score, counted
        nonlocal done
        done += 1
        on_fold(done, total)
        return neg_mape(estimator, x_fold, y_fold)

    search = GridSearchCV(RandomForestRegressor(random_state=random_state), candidates,
                          scoring=scored, cv=folds)
    return search.fit(x, y).best_estimator_


def tabulated(forest: RandomForestRegressor, op: str, width: int) -> OpForest:
    """``forest`` with its values on ``op``'s lookup grid, computed once."""
    grid = lookup_grid(op)
    order = np.argsort(_encode(grid))
    return OpForest(forest, width, _encode(grid)[order], forest.predict(grid[order].astype(np.float64)))
