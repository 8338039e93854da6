"""Silicon rows no replay can explain, found from the rows themselves.

In one TRT-LLM campaign (Llama-3.1-8B on H100) a group's mean TTFT *falls* as the closed loop's
concurrency c grows, at every output length, and is close to ``a + b (osl - 1) TPOT / (c - 1)``:
the first token waits for a share b of one other request's whole decode, as if one of the c
slots were unusable. A step-time replay cannot produce that: more clients in flight never
shorten the wait for a first token there. Such a group's rows are left out, with the fit that
describes them, and the serving card lists each group.

The test is the impossibility itself: at every output length TTFT at the group's largest
c <= ``MAX_CONCURRENCY`` is below TTFT at its smallest c > 1, over at least two output lengths
and two concurrencies each, and the fitted b is above ``MIN_SLOPE`` (half of a decode: a wait
that long cannot be scheduling noise). A group's c = 1 row (no other request to wait for) and
its rows above ``MAX_CONCURRENCY`` stay in: the campaign's own later rows are erratic, not
explained by the slope, and the card says so.
"""

from __future__ import annotations

import numpy as np
import polars as pl

GROUP = ("sku", "model_path", "backend", "backend_version", "precision", "tp", "isl")
MAX_CONCURRENCY = 32
MIN_SLOPE = 0.5
REASON = (f"TTFT falls as concurrency grows (c <= {MAX_CONCURRENCY}, every output length) and "
          f"follows a + b (osl - 1) TPOT / (c - 1) with b > {MIN_SLOPE}: a closed-loop artefact "
          "no step replay produces")


def slope_fit(osl: np.ndarray, tpot: np.ndarray, c: np.ndarray, ttft: np.ndarray
              ) -> tuple[float, float, float]:
    """Least squares of TTFT on x = (osl - 1) TPOT / (c - 1): (a, b, R²)."""
    x = (osl - 1) * tpot / (c - 1)
    design = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, ttft, rcond=None)
    residual = ttft - design @ np.array([a, b])
    spread = ((ttft - ttft.mean()) ** 2).sum()
    return float(a), float(b), float(1 - (residual**2).sum() / spread) if spread else 0.0


def _falls_with_load(group: pl.DataFrame) -> bool:
    by_osl = [g.sort("c") for _, g in group.group_by("osl") if g["c"].n_unique() >= 2]
    return len(by_osl) >= 2 and all(g["ttft_ms"][-1] < g["ttft_ms"][0] for g in by_osl)


def slope_artefacts(runs: pl.DataFrame) -> dict[int, tuple[float, float, float]]:
    """Row number -> the group's fit (a, b, R²), for every row at 1 < c <= ``MAX_CONCURRENCY``
    of a group whose TTFT falls with load and follows the slope. Only rows not already left
    out (``why`` null) are read."""
    load = pl.coalesce("concurrency", "batch_size")
    candidates = runs.filter(pl.col("why").is_null() & (load > 1) & (load <= MAX_CONCURRENCY)
                             & pl.col("ttft_ms").is_not_null() & pl.col("tpot_ms").is_not_null())
    out = {}
    for _, group in candidates.with_columns(c=load).group_by(GROUP, maintain_order=True):
        if not _falls_with_load(group):
            continue
        a, b, r2 = slope_fit(*(group[k].to_numpy().astype(float)
                               for k in ("osl", "tpot_ms", "c", "ttft_ms")))
        if b > MIN_SLOPE:
            out.update(dict.fromkeys(group["row"].to_list(), (a, b, r2)))
    return out


def fit_table(runs: pl.DataFrame, fits: dict[int, tuple[float, float, float]]) -> str:
    """Markdown: each flagged group's fit."""
    rows = ["| GPU | model | backend | TP | isl | rows | a ms | b | R² |",
            "|---|---|---|---|---|---|---|---|---|"]
    flagged = runs.filter(pl.col("row").is_in(list(fits)))
    for key, group in flagged.group_by(GROUP, maintain_order=True):
        sku, model, backend, version, _, tp, isl = key
        a, b, r2 = fits[group["row"][0]]
        rows.append(f"| {sku} | {model} | {backend} {version} | {tp} | {isl} | {len(group)} | "
                    f"{a:.0f} | {b:.2f} | {r2:.3f} |")
    return "\n".join(rows) if flagged.height else "None."
