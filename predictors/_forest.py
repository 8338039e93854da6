"""The forests of Vidur's random-forest predictor (``predictors.rf``): its search over a
hyperparameter grid (baselines.md §2.3) and each fitted forest tabulated on Vidur's lookup grid
(§2.4), so that a step's ops are looked up, not re-predicted."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sklearn.ensemble import RandomForestRegressor

# Vidur's 27-configuration grid (searched by ``cv_scores``' shortcut: about 4 s a regressor, 35 s
# for decode attention's two features), and the default, one configuration of it: the least
# regularized point with the fewest trees. Measured on the A100 home and the five unseen GPUs the
# search moves no MAPE by more than 0.1 point (docs/baselines.md), and the rerun's 15 home
# bundles would take it hours.
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
    """A fitted forest and its values on the fit-time grid; evaluates only distinct features.
    The forest is kept as its trees' node arrays (``_StackedTrees``), which answer a point off
    the grid as ``RandomForestRegressor.predict`` does, to the bit, without scikit-learn (whose
    import is about 1.5 s of a forest run)."""

    trees: _StackedTrees
    width: int
    grid_keys: np.ndarray  # sorted
    grid_values: np.ndarray

    def __call__(self, features: np.ndarray) -> np.ndarray:
        keys, inverse = np.unique(_encode(features), return_inverse=True)
        at = np.minimum(np.searchsorted(self.grid_keys, keys), len(self.grid_keys) - 1)
        hit = self.grid_keys[at] == keys
        values = np.where(hit, self.grid_values[at], 0.0)
        if not hit.all():
            # through float64, as scikit-learn takes them, then its float32
            values[~hit] = self.trees.predict(
                _decode(keys[~hit], self.width).astype(np.float64).astype(np.float32))
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
    ``on_fold(done, total)`` hears of each fitted fold, so a long search can show progress."""
    from sklearn.ensemble import RandomForestRegressor  # noqa: PLC0415 - see OpForest

    candidates = GRIDS[grid]
    if all(len(v) == 1 for v in candidates.values()):
        params = {k: v[0] for k, v in candidates.items()}
        return RandomForestRegressor(**params, random_state=random_state).fit(x, y)
    best = searched_params(x, y, candidates, random_state, on_fold)
    return RandomForestRegressor(**best, random_state=random_state).fit(x, y)


def searched_params(x: np.ndarray, y: np.ndarray, candidates: dict, random_state: int,
                    on_fold: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """The parameters ``GridSearchCV(RandomForestRegressor(random_state), candidates,
    scoring="neg_mean_absolute_percentage_error", cv=k)`` picks: the first best mean score in
    ``ParameterGrid`` order, GridSearchCV's tie rule."""
    order, means = cv_scores(x, y, candidates, random_state, on_fold)
    return order[int(np.argmax(means))]


def cv_scores(x: np.ndarray, y: np.ndarray, candidates: dict, random_state: int,
              on_fold: Callable[[int, int], None] = lambda done, total: None
              ) -> tuple[list[dict], np.ndarray]:
    """Each candidate (in ``ParameterGrid`` order) and its mean −MAPE over the unshuffled folds,
    GridSearchCV's ``mean_test_score``, computed with fewer forests fitted:

    - a forest's i-th tree does not depend on ``n_estimators`` (the per-tree seeds are drawn in
      sequence from ``random_state``), so one forest of the largest size scores every size by the
      running mean of its trees' predictions;
    - with one feature that varies (every op but decode attention), a tree's split at a node
      depends only on the node's samples, so the tree grown deepest and with the smallest split
      size holds the trees of every other depth and split size: stop where those would have.
      With two varying features the per-tree random feature order breaks ties, so each (depth,
      split size) is grown on its own.
    ``tests/predictors/test_rf.py`` checks the choice and the scores against GridSearchCV itself."""
    from sklearn.ensemble import RandomForestRegressor  # noqa: PLC0415 - see OpForest
    from sklearn.metrics import mean_absolute_percentage_error  # noqa: PLC0415
    from sklearn.model_selection import KFold, ParameterGrid  # noqa: PLC0415

    x = np.asarray(x, dtype=np.float64)
    folds = 10 if len(y) >= 10 else 2
    grown_by = ("n_estimators", "max_depth", "min_samples_split")
    whole = [v for k in grown_by for v in candidates.get(k, []) if v is not None or k != "max_depth"]
    if (set(candidates) - set(grown_by) or not all(isinstance(v, numbers.Integral) for v in whole)
            or not isinstance(random_state, numbers.Integral) or not np.isfinite(x).all()):
        raise ValueError(f"the search takes whole-number {grown_by} (max_depth may be None), an "
                         f"integer random_state and finite features; got {candidates}, "
                         f"random_state={random_state!r}")
    one_feature = int((np.ptp(x, axis=0) > 0).sum()) <= 1
    depths = candidates.get("max_depth", [None])
    splits = candidates.get("min_samples_split", [2])
    grown = ([(None if None in depths else max(depths), min(splits))] if one_feature
             else [(d, s) for d in depths for s in splits])
    size = max(candidates.get("n_estimators", [100]))
    scores: dict[tuple, list[float]] = {}
    splitter, total, done = KFold(folds), folds * len(grown), 0
    for train, test in splitter.split(x):
        x_test32 = x[test].astype(np.float32)
        for depth, split in grown:
            trees = _StackedTrees(RandomForestRegressor(
                n_estimators=size, max_depth=depth, min_samples_split=split,
                random_state=random_state).fit(x[train], y[train]))
            for d, s in ([(d, s) for d in depths for s in splits] if one_feature else [(depth, split)]):
                running = np.cumsum(trees.predictions(x_test32, d, s), axis=0)
                for n in candidates.get("n_estimators", [100]):
                    score = -mean_absolute_percentage_error(y[test], running[n - 1] / n)
                    scores.setdefault((d, s, n), []).append(score)
            done += 1
            on_fold(done, total)
    order = list(ParameterGrid(candidates))
    return order, np.array([np.average(scores[(p.get("max_depth"), p.get("min_samples_split", 2),
                                               p.get("n_estimators", 100))]) for p in order])


class _StackedTrees:
    """A fitted forest's trees as one set of node arrays, so that every tree is walked at once."""

    def __init__(self, forest: RandomForestRegressor):
        if forest.n_outputs_ != 1:
            raise ValueError("the stacked trees hold a forest of one output only")
        trees = [estimator.tree_ for estimator in forest.estimators_]
        counts = [tree.node_count for tree in trees]
        self.roots = np.cumsum([0, *counts[:-1]])
        offset = np.repeat(self.roots, counts)
        left = np.concatenate([tree.children_left for tree in trees])
        self.leaf = left < 0
        self.left = np.where(self.leaf, -1, left + offset)
        self.right = np.where(self.leaf, -1, np.concatenate([t.children_right for t in trees]) + offset)
        self.feature = np.maximum(np.concatenate([tree.feature for tree in trees]), 0)
        self.threshold = np.concatenate([tree.threshold for tree in trees])
        self.value = np.concatenate([tree.value[:, 0, 0] for tree in trees])
        self.samples = np.concatenate([tree.n_node_samples for tree in trees])
        self.depth = np.zeros(len(left), dtype=np.int64)
        frontier, level = self.roots, 0
        while frontier.size:
            self.depth[frontier] = level
            inner = frontier[~self.leaf[frontier]]
            frontier, level = np.concatenate([self.left[inner], self.right[inner]]), level + 1

    def predictions(self, x32: np.ndarray, max_depth: int | None, min_split: int) -> np.ndarray:
        """Each tree's prediction (trees × rows) had it stopped growing at ``max_depth`` and
        below ``min_split`` samples, sklearn's leaf rule: the value of the first node on each
        path that would have been a leaf. Features are float32 against float64 thresholds, as in
        sklearn's ``apply``."""
        stop = self.leaf | (self.samples < min_split) | (self.depth >= (max_depth or np.iinfo(np.int64).max))
        at = np.repeat(self.roots[:, None], len(x32), axis=1)
        rows = np.broadcast_to(np.arange(len(x32)), at.shape)
        while (moving := ~stop[at]).any():
            node, row = at[moving], rows[moving]
            go_left = x32[row, self.feature[node]] <= self.threshold[node]
            at[moving] = np.where(go_left, self.left[node], self.right[node])
        return self.value[at]

    def predict(self, x32: np.ndarray) -> np.ndarray:
        """The forest's prediction: each tree's leaf value added in tree order, then divided
        by the number of trees, the order and arithmetic of ``RandomForestRegressor.predict``
        with one job (``tests/predictors/test_rf.py`` checks equality). Rows go in chunks, so
        the walk's trees x rows arrays stay small; rows do not depend on one another."""
        mean = np.zeros(len(x32))
        for start in range(0, len(x32), PREDICT_CHUNK):
            part = mean[start:start + PREDICT_CHUNK]
            # a grown tree splits no node of under 2 samples: every path ends at a leaf
            for tree in self.predictions(x32[start:start + PREDICT_CHUNK], None, 2):
                part += tree
        return mean / len(self.roots)


PREDICT_CHUNK = 4096


def tabulated(forest: RandomForestRegressor, op: str, width: int) -> OpForest:
    """``forest`` with its values on ``op``'s lookup grid, computed once."""
    grid = lookup_grid(op)
    order = np.argsort(_encode(grid))
    return OpForest(_StackedTrees(forest), width, _encode(grid)[order],
                    forest.predict(grid[order].astype(np.float64)))
