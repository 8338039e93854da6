"""The pin list, the download path against a local HTTP server, and the offline error."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import SHARED, requires_shared

from leaderboard import data
from leaderboard.ingest import ADAPTERS, sources
from leaderboard.ingest.sources import SourceError
from leaderboard_core import paths

PIN_FIELDS = ("repo", "commit", "path", "sha256", "bytes", "license")


@requires_shared
def test_pins_match_shared_manifest():
    manifest = json.loads((SHARED / "MANIFEST.json").read_text())
    pins = json.loads(sources.PINS_FILE.read_text())
    assert len(pins) == len(manifest)
    as_rows = lambda entries: sorted(tuple(e[f] for f in PIN_FIELDS) for e in entries)  # noqa: E731
    assert as_rows(pins) == as_rows(manifest)
    assert len({(p["repo"], p["path"]) for p in pins}) == len(pins), "a file is pinned twice"
    loaded = sources.load_pins()
    assert len(loaded) == len(pins)
    assert all(len(p.sha256) == 64 and len(p.commit) == 40 and p.bytes > 0 for p in loaded)


def test_datasets_dir_holds_no_python():
    found = [p for p in paths.DATASETS_DIR.rglob("*") if p.suffix == ".py"
             or p.name == "__init__.py"]
    assert found == []
    assert sources.PINS_FILE.is_file()


# ------------------------------------------------------------------------------ download path


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture
def http_root(tmp_path, monkeypatch):
    """A local HTTP server on 127.0.0.1 laid out as <repo>/<commit>/<path>, like pin_url."""
    root = tmp_path / "www"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=partial(server.serve_forever, poll_interval=0.05), daemon=True)
    thread.start()
    monkeypatch.setenv("LEADERBOARD_SOURCES_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(paths, "SHARED_UPSTREAM", tmp_path / "no-shared")
    try:
        yield root, server
    finally:
        server.shutdown()
        server.server_close()


def _serve(root: Path, pin: sources.Pin, content: bytes) -> None:
    target = root / pin.repo / pin.commit / pin.path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)


def _small_pins(n: int) -> list[sources.Pin]:
    pins = sorted((p for p in sources.load_pins() if p.bytes < 20_000), key=lambda p: p.rel)
    # distinct repos first, so the URL scheme is exercised on more than one repository
    by_repo: dict[str, sources.Pin] = {}
    for p in pins:
        by_repo.setdefault(p.repo, p)
    chosen = list(by_repo.values())[:n]
    assert len(chosen) == n
    return chosen


def _cache_files() -> list[Path]:
    cache = paths.source_cache()
    return [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []


@requires_shared
def test_download_verifies_and_caches(http_root, monkeypatch, closed_url):
    root, server = http_root
    pins = _small_pins(3)
    for pin in pins:
        _serve(root, pin, (SHARED / pin.rel).read_bytes())
    assert sources.local_roots() == []

    files = sources.resolve(pins)
    cache = paths.source_cache()
    assert [f.rel for f in files] == [p.rel for p in pins]
    for f, pin in zip(files, pins, strict=True):
        assert f.path == cache / pin.rel
        assert f.pinned and f.sha256 == pin.sha256 == sources.sha256_of(f.path)
        assert f.path.read_bytes() == (SHARED / pin.rel).read_bytes()
    assert sorted(_cache_files()) == sorted(cache / p.rel for p in pins)  # no partial files left

    # Second resolve: the cache alone, with the server gone and the URL unreachable.
    server.shutdown()
    monkeypatch.setenv("LEADERBOARD_SOURCES_URL", closed_url)
    again = sources.resolve(pins)
    assert [(f.path, f.sha256) for f in again] == [(f.path, f.sha256) for f in files]


@requires_shared
def test_download_with_wrong_content_fails_and_caches_nothing(http_root):
    root, _ = http_root
    pin = _small_pins(1)[0]
    good = (SHARED / pin.rel).read_bytes()
    _serve(root, pin, good[:-1] + bytes([good[-1] ^ 0xFF]))  # same size, one byte flipped

    with pytest.raises(SourceError) as err:
        sources.resolve([pin])
    message = str(err.value)
    assert pin.path in message
    assert "does not match its pinned sha256" in message
    assert _cache_files() == []


def test_download_of_missing_file_fails_clearly(http_root):
    pin = sources.Pin("owner/repo", "a" * 40, "data/absent.csv", "0" * 64, 10, "MIT")
    with pytest.raises(SourceError) as err:
        sources.resolve([pin])
    message = str(err.value)
    assert "download failed" in message and "owner__repo/data/absent.csv" in message
    assert _cache_files() == []


# --------------------------------------------------------------------------------- offline


def _assert_offline_message(message: str, missing: list[sources.Pin]) -> None:
    assert f"{len(missing)} pinned upstream file(s) are not available locally" in message
    for pin in missing[:15]:
        assert f"  - {pin.rel}\n" in message
    if len(missing) > 15:
        assert f"… and {len(missing) - 15} more" in message
    # the three ways to provide them
    assert "LEADERBOARD_SOURCES" in message and "sources.root" in message
    assert str(paths.SHARED_UPSTREAM) in message
    assert str(paths.source_cache()) in message and "go online" in message


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "SHARED_UPSTREAM", tmp_path / "no-shared")
    return sources.load_pins()


def test_offline_closed_port_lists_missing_files(offline):
    with pytest.raises(SourceError) as err:
        sources.resolve(offline)
    _assert_offline_message(str(err.value), offline)
    assert "cannot be reached" in str(err.value)
    assert _cache_files() == []


@pytest.fixture
def local_blackhole():
    """A 127.0.0.1 port whose accept queue is full: new connections hang, as to a dead host."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held = socket.create_connection(("127.0.0.1", port), timeout=1)  # fills the queue
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        held.close()
        server.close()


def test_offline_error_is_fast(offline, monkeypatch, local_blackhole):
    """A host that never answers (a full accept queue on the loopback, which hangs everywhere):
    the reachability probe times out and the error comes within 10 s."""
    monkeypatch.setenv("LEADERBOARD_SOURCES_URL", local_blackhole)
    started = time.monotonic()
    with pytest.raises(SourceError) as err:
        sources.resolve(offline)
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"offline error took {elapsed:.1f} s"
    _assert_offline_message(str(err.value), offline)
    assert f"{local_blackhole} cannot be reached" in str(err.value)
    assert _cache_files() == []


def test_cli_offline_prints_one_error_and_exits_2(offline, capsys):
    assert data.main(["build"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("error:") == 1 and "Traceback" not in err
    assert err.startswith("error: ")
    missing = [p for p in offline if any(a.matches(p.rel) for a in ADAPTERS.values())]
    _assert_offline_message(err, missing)  # every listed path printed whole, on one line


def test_cli_offline_subprocess(tmp_path, closed_url):
    """``python -m leaderboard.data build`` in a child process, with ../shared hidden."""
    script = textwrap.dedent("""
        import runpy, sys
        from pathlib import Path
        import leaderboard_core.paths
        leaderboard_core.paths.SHARED_UPSTREAM = Path(sys.argv[1])
        sys.argv = ["leaderboard.data", "build"]
        runpy.run_module("leaderboard.data", run_name="__main__", alter_sys=True)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEADERBOARD_")}
    env |= {"LEADERBOARD_HOME": str(tmp_path / "home"), "LEADERBOARD_SOURCES_URL": closed_url}
    # a bound against a hang, not a speed claim: the child's imports alone took over 10 s on
    # this 2-core machine while a rerun ran beside the tests
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "no-shared")], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr
    assert "pinned upstream file(s) are not available locally" in done.stderr
    assert "Provide them in one of these ways" in done.stderr
    assert not (tmp_path / "home" / "store" / "leaderboard.duckdb").exists()


def test_local_copy_wins_over_download(tmp_path, monkeypatch):
    """An explicit root is read first and verified; a corrupt local copy is an error."""
    root = tmp_path / "root"
    content = b"a,b\n1,2\n"
    path = root / "owner__repo" / "x.csv"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    pin = sources.Pin("owner/repo", "b" * 40, "x.csv", sources.sha256_of(path), len(content), "MIT")
    monkeypatch.setattr(paths, "SHARED_UPSTREAM", tmp_path / "no-shared")
    (found,) = sources.resolve([pin], configured_root=root)
    assert found.path == path and found.pinned

    monkeypatch.setenv("LEADERBOARD_SOURCES", str(root))
    assert sources.resolve([pin])[0].path == path

    path.write_bytes(b"a,b\n1,3\n")
    with pytest.raises(SourceError, match="sha256 mismatch for pinned file owner__repo/x.csv"):
        sources.resolve([pin])
