"""``python -m leaderboard.site [site.out=DIR] [runs_dir=DIR]``: the leaderboard as a static site.

Built from the stored runs as RESULTS.md is (the current, rankable runs; HELM's and asv's way: a
folder of pages from per-run JSON). No server, no CDN: it opens from ``file://`` with the network
off; its one script (``site.js``: sortable and filterable tables) and style sheet are local and
small. Pages: the landing page, one per family, predictor and dataset, methodology, and the
downloads (one tidy results table, run x phase x metric, as CSV and parquet). Pictures are the
report's atlases and, per predictor and GPU, predicted against measured (log-log).
"""

from __future__ import annotations

import html
import shutil
import sys
import time
from pathlib import Path

from leaderboard.present import site_pages
from leaderboard.present.results_table import current_runs, tidy
from leaderboard.run.inputs import InputError, guarded
from leaderboard_core import paths

ASSETS = Path(__file__).with_name("site_assets")


def build(runs_dir: Path, out: Path, versions: dict[str, str] | None = None,
          atlas_dir: Path | None = None) -> list[Path]:
    """Write the site into ``out`` (built in a fresh folder beside it, then swapped in: a
    failed build leaves the previous site whole); returns the pages written."""
    runs = current_runs(runs_dir, versions)
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for asset in ASSETS.iterdir():
        shutil.copy(asset, partial / asset.name)
    table = tidy(runs)
    table.write_csv(partial / "results.csv")
    table.write_parquet(partial / "results.parquet")
    pages = site_pages.write_all(partial, runs, table, atlas_dir)
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        partial.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        partial.rename(out)
    return [out / p.name for p in pages]


def _arguments(argv: list[str]) -> tuple[Path, Path]:
    wanted = {"site.out": "site", "runs_dir": str(paths.REPO_ROOT / "results" / "runs")}
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        if key not in wanted or not value:
            raise InputError(f"unknown argument {arg!r}: python -m leaderboard.site takes "
                             "site.out=DIR and runs_dir=DIR")
        wanted[key] = value
    return paths.from_user(wanted["site.out"]), paths.from_user(wanted["runs_dir"])


def main(argv: list[str]) -> None:
    out, runs_dir = _arguments(argv)
    started = time.perf_counter()
    pages = build(runs_dir, out, atlas_dir=paths.REPO_ROOT / "results" / "atlas")
    print(f"wrote {len(pages)} pages to {out} in {time.perf_counter() - started:.0f} s; open "
          f"{html.escape(str(out / 'index.html'))}")


if __name__ == "__main__":
    guarded(main, "python -m leaderboard.site")(sys.argv[1:])

# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
