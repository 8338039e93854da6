"""The seal's walls, route by route, as the review that found them tried them: each probe
predictor (``seal_probes``) tries one route around Landlock; a sealed harness answers with a
refusal, an INVALID run, or a blind score, never a VALID run near 0 % MAPE."""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import socket
import sys
import sysconfig
import threading
from pathlib import Path

import numpy as np
import pytest
import seal_probes
from conftest import SHARED, requires_shared

from leaderboard.run.evaluate import RunSpec, run
from leaderboard.seal import predictor_index, sandbox, scan
from leaderboard.seal import walls as seal_walls
from leaderboard_core import paths
from predictors import registry

needs_namespaces = pytest.mark.skipif(not seal_walls.namespaces_available(),
                                      reason="bubblewrap cannot make the namespaces here")


@pytest.fixture
def seal_probe_runs(monkeypatch, store_home, tmp_path):
    registry.discover()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    for name, cls in seal_probes.PROBES.items():
        registry.register(name)(cls)

    def go(predictor, dataset="h200_vidur", **params):
        return run(RunSpec(predictor, dataset, params, runs_dir=tmp_path / "runs"))
    return go


def _not_a_cheat(result):
    m = result.metrics
    assert not (m["valid"] and m["phases"]["all"]["mape"] < 2), m


# ------------------------------------------------------------------------- fast: the rules


def test_a_folder_of_measurements_inside_a_read_root_is_refused(tmp_path):
    root = tmp_path / "prefix"
    (root / "home").mkdir(parents=True)
    with pytest.raises(seal_walls.SealRefused, match=r"home.*inside .*prefix"):
        seal_walls.check_readable([str(root)], [str(root / "home")])
    seal_walls.check_readable([str(root / "lib")], [str(root / "home")])  # beside it: fine


def test_an_installed_package_that_bundles_measurements_is_refused(tmp_path, monkeypatch):
    dist = tmp_path / "site" / "aiconfigurator_core-0.5.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: aiconfigurator-core\n"
                                   "Version: 0.5.0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    seal_walls.bundling_distributions.cache_clear()  # read once per process: read it again
    try:
        with pytest.raises(seal_walls.SealRefused, match=r"aiconfigurator-core.*pip uninstall"):
            seal_walls.check_readable([str(tmp_path / "empty")], [])
    finally:
        seal_walls.bundling_distributions.cache_clear()


@requires_shared
def test_a_copy_of_a_pinned_measurement_in_a_read_root_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("LEADERBOARD_HOME", str(tmp_path / "home"))
    pin = next(p for p in predictor_index.sandbox.sources.load_pins()
               if p.path.endswith(".csv") and p.bytes < 200_000)
    bundle = tmp_path / "wheel" / "pkg" / "data"
    bundle.mkdir(parents=True)
    (bundle / "renamed.bin").write_bytes((SHARED / pin.rel).read_bytes())
    with pytest.raises(seal_walls.SealRefused, match="byte-identical .*renamed.bin"):
        seal_walls.check_readable([str(tmp_path / "wheel")], [])
    other = tmp_path / "other-wheel"
    other.mkdir()
    (other / "renamed.bin").write_bytes(b"x" * pin.bytes)  # same size, other bytes
    seal_walls.check_readable([str(other)], [])
    (other / "copy.csv").write_bytes((SHARED / pin.rel).read_bytes())  # added later: seen
    with pytest.raises(seal_walls.SealRefused, match="copy.csv"):
        scan.measurement_copies.cache_clear()
        seal_walls.check_readable([str(other)], [])


def test_the_read_rules_ignore_what_a_child_reports(tmp_path):
    """The describing child's answer (its ``file``) no longer widens what a run's child reads."""
    job = sandbox.job({"module": "m", "qualname": "q", "name": "n", "file": "/x.py"}, {}, "step",
                      0, tmp_path / "job", tmp_path / "cache", predictor_dirs=[str(tmp_path / "p")])
    assert "/" not in job["read"] and str(tmp_path / "p") in job["read"]


def test_the_child_starts_without_site_processing_inside_namespaces():
    command = seal_walls.child_command(["-m", "x"], ["/tmp"])
    python = command.index(sys.executable)
    assert command[python + 1] == "-S"
    if seal_walls.namespaces_available():
        walls = command[:python]
        assert walls[1:1 + len(seal_walls.NAMESPACE_FLAGS)] == list(seal_walls.NAMESPACE_FLAGS)
        assert walls[-3:] == ["--bind", "/tmp", "/tmp"]  # the only writable folder


# ---------------------------------------------------------------------- slow: the routes run


@needs_namespaces
def test_the_child_has_no_network(seal_probe_runs):
    """A server on the host's loopback and a registry host: both refused from the child."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    try:
        result = seal_probe_runs("networked", port=server.getsockname()[1])
    finally:
        server.close()
    assert result.metrics["valid"], result.metrics["invalid_reasons"]
    assert result.predictions["pred_ms"].unique().to_list() == [1.0]


@needs_namespaces
def test_a_process_left_behind_is_invalid_and_dies_with_the_run(seal_probe_runs):
    name = f"lb-probe-{secrets.token_hex(4)}"
    result = seal_probe_runs("lingers", name=name)
    assert not result.metrics["valid"]
    assert any("left 1 process(es) running" in r for r in result.metrics["invalid_reasons"])
    with socket.socket(socket.AF_UNIX) as s, pytest.raises(OSError):
        s.connect(f"\0{name}")  # what it served is gone with its namespace


@needs_namespaces
def test_shared_memory_does_not_outlive_the_run(seal_probe_runs):
    key = secrets.randbelow(1 << 30) + 1
    result = seal_probe_runs("shares_memory", key=key)
    assert result.metrics["valid"], result.metrics["invalid_reasons"]
    libc = ctypes.CDLL(None, use_errno=True)
    found = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(0), ctypes.c_int(0))
    if found >= 0:
        libc.shmctl(found, 0, None)  # IPC_RMID, so a failing test leaves nothing behind
    assert found < 0, "the child's shared-memory segment is visible outside its run"


def test_a_reading_kept_as_folder_names_is_removed(seal_probe_runs, store_home):
    for _ in range(2):
        result = seal_probe_runs("names_in_cache")
        assert not result.metrics["valid"] and result.metrics["profiled_rows"] == 2
        kept = list((store_home.home / "predictor-cache").glob("names_in_cache-*/**/kept/*"))
        assert kept == [], "a reading outlived its run in the predictor cache"


def test_clearing_the_record_in_the_child_erases_nothing(seal_probe_runs):
    result = seal_probe_runs("erases_record")
    assert not result.metrics["valid"]
    assert any("reached for sealed data" in r for r in result.metrics["invalid_reasons"])


def test_the_replay_runs_in_the_harness(seal_probe_runs):
    """A predictor that replaces the replay in its own process changes nothing: its 2 ms steps
    give the TTFT/TPOT the harness's replay gives 2 ms steps."""
    cheat = seal_probe_runs("replaces_replay", "gb200_silicon")
    honest = run(RunSpec("two_ms_steps", "gb200_silicon", {}, runs_dir=cheat.folder.parent)
                 ) if "two_ms_steps" in registry.names() else None
    assert cheat.metrics["valid"], cheat.metrics["invalid_reasons"]
    assert (cheat.predictions["pred_ms"] != 1.0).all()
    if honest is not None:
        assert np.allclose(cheat.predictions["pred_ms"], honest.predictions["pred_ms"])


@needs_namespaces
def test_a_rewritten_module_file_does_not_widen_the_reads(store_home, tmp_path):
    """Two files in a predictors_path: the second rewrites the first's ``__file__`` to ``/x.py``
    in the describing child. The run's child may still read only what the parent named."""
    folder = tmp_path / "two"
    folder.mkdir()
    store = store_home.home / "store" / "leaderboard.duckdb"
    (folder / "a_reader.py").write_text(f'''
import duckdb
from leaderboard_core.contract import PredictorCard
from predictors.base import Predictor
from predictors.registry import register


@register("file_rewrite_store")
class Reader(Predictor):
    card = PredictorCard("analytical", "test", "reads the store", False)

    def predict(self, cells, gpu):
        with duckdb.connect({str(store)!r}, read_only=True) as con:
            truth = con.execute("SELECT cell_id, gt_ms FROM cells WHERE dataset = 'h200_vidur'").pl()
        return cells.select("cell_id").join(truth, on="cell_id", how="left")["gt_ms"].to_numpy()
''')
    (folder / "b_rewriter.py").write_text("import sys\nimport a_reader\n"
                                          "a_reader.__file__ = '/x.py'\n")
    predictor_index.include(folder)
    try:
        result = run(RunSpec("file_rewrite_store", "h200_vidur", {}, runs_dir=tmp_path / "runs"))
    finally:
        predictor_index._FOLDERS.remove(str(folder))
        predictor_index._described.cache_clear()
    _not_a_cheat(result)
    assert not result.metrics["valid"]


@needs_namespaces
def test_a_pth_file_runs_only_once_confined(seal_probe_runs, store_home, tmp_path):
    """A ``.pth`` line in the environment runs in every child; started with ``-S``, the child
    runs it after confining itself, so its read of the store is refused and recorded."""
    site = Path(sysconfig.get_paths()["purelib"])
    if not os.access(site, os.W_OK):
        pytest.skip(f"{site} is not writable")
    trigger, marker = tmp_path / "armed", tmp_path / "read-the-store"
    store = store_home.home / "store" / "leaderboard.duckdb"
    line = (f"import os; exec(\"try:\\n open({str(store)!r}, 'rb').read(16); "
            f"open({str(marker)!r}, 'w').write('x')\\nexcept OSError: pass\") "
            f"if os.path.exists({str(trigger)!r}) else None\n")
    pth = site / f"zz_leaderboard_probe_{secrets.token_hex(4)}.pth"
    predictor_index.index()  # describe first, unarmed
    pth.write_text(line)
    trigger.touch()
    try:
        result = seal_probe_runs("networked", port=1)
    finally:
        pth.unlink()
        trigger.unlink()
    assert not marker.exists(), "a .pth line read the store"
    assert not result.metrics["valid"]
    assert any(f"open {store}" in r for r in result.metrics["invalid_reasons"])


def test_an_unsealed_run_says_so_and_is_not_ranked(seal_probe_runs, monkeypatch, capsys):
    from leaderboard import cli

    monkeypatch.setattr(seal_walls, "namespaces_available", lambda: False)
    monkeypatch.setattr(seal_walls, "child_command",
                        lambda args, writable: [sys.executable, "-S", *args])
    result = seal_probe_runs("networked", port=1)
    assert result.metrics["valid"] and result.metrics["sealed"] is False
    assert result.metrics["sandbox"] in ("landlock", "process")
    assert cli.verdict(result.metrics) == "UNSEALED"
    on_disk = json.loads((result.folder / "metrics.json").read_text())
    assert on_disk["sealed"] is False
    shutil.rmtree(result.folder)


# ------------------------------------------------------- the review's routes around seal v2


def test_a_cache_is_copied_without_following_links_or_opening_fifos(tmp_path):
    from leaderboard.seal import child_files

    secret, cache = tmp_path / "secret.bin", tmp_path / "cache"
    secret.write_bytes(b"ground truth")
    (cache / "sub").mkdir(parents=True)
    (cache / "sub" / "forest.bin").write_bytes(b"trees")
    (cache / "loot").symlink_to(secret)
    (cache / "subdir-link").symlink_to(tmp_path)
    os.mkfifo(cache / "pipe")
    reasons = child_files.copy(cache, tmp_path / "copy")
    copied = {str(p.relative_to(tmp_path / "copy")): p for p in (tmp_path / "copy").rglob("*")}
    assert sorted(copied) == ["loot", "sub", "sub/forest.bin", "subdir-link"]
    assert copied["loot"].is_symlink() and os.readlink(copied["loot"]) == str(secret)
    assert (tmp_path / "copy" / "sub" / "forest.bin").read_bytes() == b"trees"
    assert len(reasons) == 1 and "pipe" in reasons[0]
    state = child_files.state(cache)
    os.setxattr(cache / "sub" / "forest.bin", "user.r", b"16 readings")
    assert child_files.state(cache) != state, "an xattr must change the cache's state"


def test_a_cache_name_is_a_plain_name_and_never_a_link(tmp_path, monkeypatch):
    monkeypatch.setenv("LEADERBOARD_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "in").mkdir()
    for name in ("a/b", "../x", "/abs", ".hidden"):
        with pytest.raises(ValueError, match="not a plain name"):
            sandbox.predictor_cache(name, {}, tmp_path / "home" / "in")
    cache = sandbox.predictor_cache("ok", {}, tmp_path / "home" / "in")
    cache.rmdir()
    cache.symlink_to(tmp_path)
    with pytest.raises(ValueError, match="is a link"):
        sandbox.predictor_cache("ok", {}, tmp_path / "home" / "in")


@needs_namespaces
def test_readable_files_cannot_carry_a_note(seal_probe_runs):
    """xattr, mode and times of a file in a read root (here the suite's conf) are refused."""
    result = seal_probe_runs("marks_read_roots", target=str(paths.CONF_DIR / "config.yaml"))
    assert result.metrics["valid"], result.metrics["invalid_reasons"]


def test_a_reading_kept_in_an_xattr_is_undone(seal_probe_runs, store_home):
    for _ in range(2):
        result = seal_probe_runs("stashes_in_xattr")
        assert not result.metrics["valid"]
        assert any("wrote to its cache after it asked" in r
                   for r in result.metrics["invalid_reasons"])
        slots = list((store_home.home / "predictor-cache").glob("stashes_in_xattr-*/**/slot"))
        assert slots and all(os.listxattr(s) == [] for s in slots)


def test_a_serving_run_that_skips_the_replay_is_invalid(seal_probe_runs):
    result = seal_probe_runs("skips_replay", "gb200_silicon")
    assert not result.metrics["valid"]
    assert any("never let the harness replay" in r for r in result.metrics["invalid_reasons"])
    assert result.metrics["predict_cells_per_s"] != 1e12  # its own timings are not taken


@pytest.mark.parametrize("mode", ["replay", "cells", "points", "long"])
def test_a_message_the_harness_does_not_expect_is_invalid_and_undoes_the_cache(
        seal_probe_runs, store_home, mode):
    result = seal_probe_runs("breaks_the_pipe", mode=mode)
    assert not result.metrics["valid"]
    kept = list((store_home.home / "predictor-cache").glob("breaks_the_pipe-*/**/kept.arrow"))
    assert kept == [], "a reading outlived the run"


def test_a_cache_built_to_break_the_walk_is_still_put_back(tmp_path, monkeypatch):
    """Too many entries, or folders nested too deep: the comparison gives up (changed), the
    cache is renamed away and the snapshot put back; no traceback, no descriptor left open."""
    from leaderboard.seal import child_files, talk

    monkeypatch.setattr(child_files, "MAX_ENTRIES", 50)
    cache, snapshot = tmp_path / "cache", tmp_path / "snap"
    cache.mkdir()
    (cache / "forest.bin").write_bytes(b"trees")
    before = child_files.state(cache)
    child_files.copy(cache, snapshot)
    for i in range(60):
        (cache / "bomb" / str(i)).mkdir(parents=True)
    deep = cache / "deep"
    for _ in range(child_files.MAX_DEPTH + 5):
        deep = deep / "d"
    deep.mkdir(parents=True)
    open_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(child_files.TooLarge):
        child_files.state(cache)
    assert len(os.listdir("/proc/self/fd")) == open_before
    reasons = talk.put_back(cache, snapshot, before)
    assert reasons and "put back" in reasons[0]
    assert sorted(p.name for p in cache.iterdir()) == ["forest.bin"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".trash")]


def test_child_outputs_that_would_hang_or_exhaust_the_harness_are_refused(tmp_path):
    from leaderboard.seal import child_files, talk

    os.mkfifo(tmp_path / "pred.npy")  # np.load would block on it forever
    with pytest.raises(FileNotFoundError):
        child_files.load_array(tmp_path / "pred.npy")
    header = b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }"
    (tmp_path / "huge.npy").write_bytes(header.ljust(128 - 1) + b"\n")
    with pytest.raises(Exception):  # noqa: B017 - any error, never an allocation of 8 TiB
        child_files.load_array(tmp_path / "huge.npy")
    assert child_files.read_file(tmp_path / "missing") is None
    import io
    channel = talk.Channel(io.BytesIO(b"[" * 200_000 + b"\n"), io.BytesIO())
    assert channel.receive() is None and "malformed" in channel.problems[0]


@pytest.mark.parametrize("field, value", [("card", 5), ("defaults", []), ("name", None)])
def test_a_malformed_description_is_a_clear_error(field, value):
    registry.discover()
    entry = registry.describe("ours", registry.get("ours"))
    with pytest.raises(ValueError, match=f"description of predictor 'ours' is malformed .*{field}"):
        predictor_index._checked({"ours": {**entry, field: value}})
    assert predictor_index._checked({"ours": entry}) == {"ours": entry}
