"""Pinned upstream files: the committed pin list, and where each file is read from.

Resolution order, per file: an explicit root (config ``sources.root`` or ``$LEADERBOARD_SOURCES``),
then ``../shared/data/upstream``, then the download cache, then a download of the pinned file from
the public repository at its commit, verified by sha256. Every local copy is verified too.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from leaderboard_core import paths

PINS_FILE = paths.DATASETS_DIR / "upstream_pins.json"
DEFAULT_BASE_URL = "https://raw.githubusercontent.com"
PROBE_TIMEOUT_S = 3.0
DOWNLOAD_TIMEOUT_S = 30.0


class SourceError(RuntimeError):
    """A source file is missing, unreachable or corrupt. The message says which and what to do."""


@dataclass(frozen=True)
class Pin:
    repo: str
    commit: str
    path: str
    sha256: str
    bytes: int
    license: str

    @property
    def rel(self) -> str:
        """The file's place under a sources root: ``<owner>__<repo>/<path>``."""
        return f"{self.repo.replace('/', '__')}/{self.path}"


@dataclass(frozen=True)
class SourceFile:
    """One file the build reads, pinned or found locally, with its verified sha256."""

    rel: str
    path: Path
    sha256: str
    pinned: bool
    repo: str
    commit: str | None
    license: str | None


def load_pins(pins_file: Path = PINS_FILE) -> list[Pin]:
    return [Pin(**entry) for entry in json.loads(pins_file.read_text())]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def explicit_root(configured: str | os.PathLike | None = None) -> Path | None:
    value = configured or os.environ.get("LEADERBOARD_SOURCES")
    return Path(value).expanduser().resolve() if value else None


def local_roots(configured: str | os.PathLike | None = None) -> list[Path]:
    """Roots searched for local copies, in resolution order (the download cache last). An
    explicit root that is not a folder is an error, not a silent fall-through to the others."""
    explicit = explicit_root(configured)
    if explicit is not None and not explicit.is_dir():
        origin = "sources.root" if configured else "LEADERBOARD_SOURCES"
        raise SourceError(f"{origin}={configured or os.environ['LEADERBOARD_SOURCES']}: no such "
                          "folder. Point it at a folder laid out as ../shared/data/upstream "
                          "(<owner>__<repo>/<path>), or unset it.")
    roots = [explicit, paths.SHARED_UPSTREAM, paths.source_cache()]
    return [r for r in roots if r is not None and r.is_dir()]


def base_url() -> str:
    return os.environ.get("LEADERBOARD_SOURCES_URL", DEFAULT_BASE_URL).rstrip("/")


def pin_url(pin: Pin) -> str:
    return f"{base_url()}/{pin.repo}/{pin.commit}/{urllib.parse.quote(pin.path)}"


def _verified(pin: Pin, path: Path) -> SourceFile:
    actual = sha256_of(path)
    if actual != pin.sha256:
        raise SourceError(
            f"{path}: sha256 mismatch for pinned file {pin.rel} (expected {pin.sha256[:12]}…, "
            f"got {actual[:12]}…). The file is corrupt or not the pinned version: replace it with "
            f"{pin.repo}@{pin.commit[:7]}:{pin.path}, or delete it to download it again."
        )
    return SourceFile(pin.rel, path, actual, True, pin.repo, pin.commit, pin.license)


def _reachable(url: str) -> bool:
    parsed = urllib.parse.urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _download(pin: Pin) -> Path:
    target = paths.source_cache() / pin.rel
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(
            pin_url(pin), timeout=DOWNLOAD_TIMEOUT_S
        ) as response:
            out.write(response.read())
        if sha256_of(Path(tmp)) != pin.sha256:
            raise SourceError(f"{pin_url(pin)}: downloaded file does not match its pinned sha256")
        os.replace(tmp, target)
    except (urllib.error.URLError, OSError) as exc:
        raise SourceError(f"{pin_url(pin)}: download failed ({exc})") from exc
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def _missing_message(missing: list[Pin], reason: str) -> str:
    shown = "\n".join(f"  - {p.rel}" for p in missing[:15])
    more = f"\n  … and {len(missing) - 15} more" if len(missing) > 15 else ""
    return (
        f"{len(missing)} pinned upstream file(s) are not available locally and {reason}:\n"
        f"{shown}{more}\n"
        "Provide them in one of these ways:\n"
        "  - point LEADERBOARD_SOURCES (or the config key sources.root) at a directory laid out "
        "as <owner>__<repo>/<path>, e.g. a copy of ../shared/data/upstream;\n"
        f"  - place the project's shared folder at {paths.SHARED_UPSTREAM};\n"
        f"  - or go online once: files are downloaded into {paths.source_cache()}."
    )


def resolve(pins: list[Pin], configured_root: str | os.PathLike | None = None) -> list[SourceFile]:
    """Find and verify every pinned file, downloading what no local root has."""
    roots = local_roots(configured_root)
    found, missing = [], []
    for pin in pins:
        local = next((r / pin.rel for r in roots if (r / pin.rel).is_file()), None)
        if local is None:
            missing.append(pin)
        else:
            found.append(_verified(pin, local))
    if missing:
        if not _reachable(base_url()):
            raise SourceError(_missing_message(missing, f"{base_url()} cannot be reached"))
        try:
            found.extend(_verified(pin, _download(pin)) for pin in missing)
        except SourceError as exc:
            raise SourceError(f"{exc}\n\n" + _missing_message(missing, "the download failed")) from exc
    return found


def discover_unpinned(
    patterns: list[str], pinned_rels: set[str], configured_root: str | os.PathLike | None = None
) -> list[SourceFile]:
    """Files matching an ingest pattern under a local root that are not in the pin list.

    They are ingested as local sources, with their sha256 recorded and ``pinned = False``.
    """
    seen: dict[str, SourceFile] = {}
    for root in local_roots(configured_root):
        if root == paths.source_cache():
            continue
        for pattern in patterns:
            for path in sorted(root.glob(pattern)):
                rel = path.relative_to(root).as_posix()
                if rel in pinned_rels or rel in seen or not path.is_file():
                    continue
                repo = rel.split("/", 1)[0].replace("__", "/", 1)
                seen[rel] = SourceFile(rel, path, sha256_of(path), False, repo, None, None)
    return list(seen.values())
