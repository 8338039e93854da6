"""Shared fixtures: environment isolation, the real store (built once), tiny synthetic sources.

Every test runs with its own ``LEADERBOARD_HOME``, no ``LEADERBOARD_SOURCES`` or
``LEADERBOARD_GPU_SPECS``, and ``LEADERBOARD_SOURCES_URL`` pointing at a closed local port, so
nothing reads the developer's cache or reaches the internet by accident; ``network_guard`` fails
any test that connects outside the loopback.

The real upstream files are read from ``../shared/data/upstream``; a clone without it may point
``LEADERBOARD_SOURCES`` at a copy laid out the same way (with its ``MANIFEST.json``), which then
stands in for ``../shared`` in every test.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl
import pytest
from network_guard import outbound_guard  # noqa: F401  (autouse: tests reach the loopback only)

from leaderboard.ingest import sources
from leaderboard.ingest.aiconfigurator import ROOT as AIC_ROOT
from leaderboard.run import run_inputs
from leaderboard.serving import replay
from leaderboard.store import database
from leaderboard_core import paths

pytest_plugins = ["pytester"]
ENV_VARS = ("LEADERBOARD_HOME", "LEADERBOARD_SOURCES", "LEADERBOARD_GPU_SPECS",
            "LEADERBOARD_SOURCES_URL")
if not (paths.SHARED_UPSTREAM / "MANIFEST.json").is_file() and os.environ.get("LEADERBOARD_SOURCES"):
    paths.SHARED_UPSTREAM = Path(os.environ["LEADERBOARD_SOURCES"]).expanduser().resolve()
SHARED = paths.SHARED_UPSTREAM
HAS_SHARED = (SHARED / "MANIFEST.json").is_file()
requires_shared = pytest.mark.skipif(not HAS_SHARED, reason=f"no shared upstream data at {SHARED}")


def load_benchmark(name: str):
    """The script ``benchmarks/<name>.py`` as a module. benchmarks/ is on sys.path only while
    it loads (a script imports its siblings as a script would): left there, it would reach
    every sandboxed child of the session."""
    folder = paths.REPO_ROOT / "benchmarks"
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def closed_url() -> str:
    return f"http://127.0.0.1:{_closed_port()}"


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch, tmp_path, closed_url):
    monkeypatch.setenv("LEADERBOARD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LEADERBOARD_SOURCES", raising=False)
    monkeypatch.delenv("LEADERBOARD_GPU_SPECS", raising=False)
    monkeypatch.setenv("LEADERBOARD_SOURCES_URL", closed_url)
    monkeypatch.setattr(run_inputs, "_HOMES", {})  # no home kept from another test's store
    monkeypatch.setattr(replay, "_kept_cells", replay._KeptCells(replay._kept_cells.limit))


@dataclass
class RealStore:
    home: Path
    path: Path
    report: database.BuildReport

    def sql(self, query: str) -> list[tuple]:
        with duckdb.connect(str(self.path), read_only=True) as con:
            return con.execute(query).fetchall()


@pytest.fixture(scope="session")
def real_store(tmp_path_factory, closed_url) -> RealStore:
    """The full store built once per session from ../shared, under its own LEADERBOARD_HOME."""
    if not HAS_SHARED:
        pytest.skip(f"no shared upstream data at {SHARED}")
    home = tmp_path_factory.mktemp("real-home")
    saved = {k: os.environ.get(k) for k in ENV_VARS}
    try:
        for k in ENV_VARS:
            os.environ.pop(k, None)
        os.environ["LEADERBOARD_HOME"] = str(home)
        os.environ["LEADERBOARD_SOURCES_URL"] = closed_url
        report = database.build(quiet=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return RealStore(home, report.path, report)


@pytest.fixture
def store_home(real_store, monkeypatch) -> RealStore:
    """Point this test's LEADERBOARD_HOME at the session's real store."""
    monkeypatch.setenv("LEADERBOARD_HOME", str(real_store.home))
    return real_store


class TinySources:
    """A small sources root in tmp_path; the pin list and ../shared are hidden from the build."""

    def __init__(self, root: Path):
        self.root = root

    def aic(self, sku: str, family: str, name: str, df: pl.DataFrame,
            version: str = "0.14.0") -> Path:
        """Write an aiconfigurator-format table: ``<sku>/<family>/vllm/<version>/<name>``."""
        path = self.root / AIC_ROOT / sku / family / "vllm" / version / name
        path.parent.mkdir(parents=True, exist_ok=True)
        df.write_parquet(path)
        return path

    def gemm(self, rows: list[dict], sku: str = "h100_sxm") -> Path:
        df = pl.DataFrame(rows, schema={"m": pl.Int64, "n": pl.Int64, "k": pl.Int64,
                                        "gemm_dtype": pl.String, "latency": pl.Float64})
        return self.aic(sku, "gemm", "gemm_perf.parquet", df)

    def context_attention(self, rows: list[dict], sku: str = "h100_sxm") -> Path:
        base = {"head_dim": 128, "step": 0, "attn_dtype": "bfloat16",
                "kv_cache_dtype": "bfloat16"}
        df = pl.DataFrame([{**base, **r} for r in rows])
        return self.aic(sku, "attention", "context_attention_perf.parquet", df)

    def write(self, rel: str, text: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def build(self, only: list[str] | None = None) -> database.BuildReport:
        return database.build(only=only, quiet=True)

    @staticmethod
    def sql(query: str) -> list[tuple]:
        with duckdb.connect(str(paths.store_path()), read_only=True) as con:
            return con.execute(query).fetchall()


@pytest.fixture
def tiny(tmp_path, monkeypatch) -> TinySources:
    root = tmp_path / "sources"
    root.mkdir()
    monkeypatch.setattr(paths, "SHARED_UPSTREAM", tmp_path / "no-shared")
    monkeypatch.setattr(sources, "load_pins", lambda *args, **kwargs: [])
    monkeypatch.setenv("LEADERBOARD_SOURCES", str(root))
    return TinySources(root)


@dataclass
class RealHome:
    home: object  # predictors.base.Home of a100_vidur's training split
    target: pl.DataFrame  # h200_vidur cells, ground truth included
    gpu: object  # the h200_sxm GpuSpec


@pytest.fixture(scope="session")
def real_home(real_store) -> RealHome:
    """The a100_vidur home (default split) and the h200_vidur target, read from the real store."""
    from leaderboard.run import homes
    from leaderboard.run.split import split
    from leaderboard.store.catalog import StoreCatalog
    from leaderboard_core.specs import load_gpu_specs, load_models

    saved = os.environ.get("LEADERBOARD_HOME")
    os.environ["LEADERBOARD_HOME"] = str(real_store.home)
    try:
        with StoreCatalog() as catalog:
            rows = catalog.datasets()
            gpus = load_gpu_specs()
            train, _ = split(catalog.cells("a100_vidur"), "workload_id", 0, 0.3)
            home = homes.build_home(catalog, rows["a100_vidur"], train, gpus["a100_sxm"],
                                    load_models())
            target = catalog.cells("h200_vidur")
    finally:
        os.environ["LEADERBOARD_HOME"] = saved or ""
    return RealHome(home, target, gpus["h200_sxm"])


def pytest_collection_modifyitems(items):
    """Every test that builds or reads the full store, or launches a multirun, is ``slow``:
    ``pytest -m "not slow"`` is the fast path. ``make test`` runs every test but those marked
    ``long`` (over about 15 s each), which ``make test-long`` and CI run."""
    for item in items:
        uses_store = {"real_store", "store_home", "real_home"} & set(
            getattr(item, "fixturenames", ()))
        if uses_store or item.path.name == "test_multirun.py":
            item.add_marker(pytest.mark.slow)
