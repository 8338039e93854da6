"""Reading what a predictor's child left behind without trusting it.

Everything under a child's output folder and its predictor cache was written by predictor code,
so the harness reads it as a hostile input: never through a link (each entry is opened relative
to its folder's descriptor with ``O_NOFOLLOW``), regular files only (a FIFO would block it),
in bounded pieces (a sparse file of terabytes, a tree of a million folders or one nested a
thousand deep must not exhaust the harness's memory, descriptors or stack). Past a bound the
walk stops with ``TooLarge``.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np

MAX_ENTRIES = 200_000
MAX_DEPTH = 64
MAX_BYTES = 16 << 30  # the bytes a cache may hold and still be snapshotted and compared
MAX_OUTPUT_FILE = 4 << 30  # one output file (predictions, per-op split, facts)
CHUNK = 1 << 20
FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class TooLarge(OSError):
    """A tree or file beyond the bounds above."""


def read_file(path: Path, limit: int = MAX_OUTPUT_FILE) -> bytes | None:
    """The bytes of a regular file the child wrote, or None (missing, a link, a FIFO, too big)."""
    try:
        fd = os.open(path, FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return b"".join(_Budget().chunks(fd))
    finally:
        os.close(fd)


NPY_HEADER = 4096  # bytes: a .npy header with room to spare


def load_array(path: Path, values: int | None = None) -> np.ndarray:
    """A ``.npy`` the child wrote; raises (any error) where it is missing, not a regular file,
    too big (more than ``values`` float64 and a header, where given: what the run needs),
    malformed, or claims a shape it does not hold."""
    data = read_file(path, MAX_OUTPUT_FILE if values is None else values * 8 + NPY_HEADER)
    if data is None:
        raise FileNotFoundError(f"{path.name} is missing, not a regular file or too big")
    return np.load(io.BytesIO(data), allow_pickle=False)


class _Budget:
    """The bytes read so far over a whole walk; past ``MAX_BYTES`` a read raises ``TooLarge``."""

    def __init__(self):
        self.total = 0

    def chunks(self, fd: int) -> Iterator[bytes]:
        while chunk := os.read(fd, CHUNK):
            self.total += len(chunk)
            if self.total > MAX_BYTES:
                raise TooLarge(f"more than {MAX_BYTES >> 30} GiB")
            yield chunk


def walk(root: Path) -> Iterator[tuple[Path, os.stat_result, int | None]]:
    """(relative path, lstat, an open descriptor of a regular file or None) for everything under
    ``root``, never through a link; at most ``MAX_DEPTH`` folders are open at once. The caller
    closes nothing: each descriptor is closed when the next entry is asked for."""
    try:
        top = os.open(root, FLAGS | os.O_DIRECTORY)
    except OSError:
        return
    stack = [(top, Path(), iter(sorted(os.listdir(top))))]
    seen = 0
    try:
        while stack:
            dir_fd, rel, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(stack.pop()[0])
                continue
            seen += 1
            if seen > MAX_ENTRIES:
                raise TooLarge(f"more than {MAX_ENTRIES:,} entries")
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue  # gone since the listing
            if stat.S_ISDIR(info.st_mode):
                if len(stack) >= MAX_DEPTH:
                    raise TooLarge(f"folders nested deeper than {MAX_DEPTH}")
                try:
                    sub = os.open(name, FLAGS | os.O_DIRECTORY, dir_fd=dir_fd)
                except OSError:
                    continue  # swapped for a link or gone: not entered
                yield rel / name, info, None
                stack.append((sub, rel / name, iter(sorted(os.listdir(sub)))))
                continue
            fd = None
            if stat.S_ISREG(info.st_mode):
                try:
                    fd = os.open(name, FLAGS, dir_fd=dir_fd)
                except OSError:
                    fd = None  # swapped for a link (ELOOP) or gone: neither read nor copied
            try:
                yield rel / name, info, fd
            finally:
                if fd is not None:
                    os.close(fd)
    finally:
        for dir_fd, _, _ in stack:
            os.close(dir_fd)


def state(folder: Path) -> str:
    """A digest of everything under ``folder`` that could carry data to a later run: each
    entry's name, kind, mode and modification time, its extended attributes, a file's bytes, a
    link's target. Raises ``TooLarge`` past the bounds."""
    digest, budget = hashlib.sha256(), _Budget()
    for rel, info, fd in walk(folder):
        digest.update(f"{rel}\0{info.st_mode}\0{info.st_mtime_ns}\0".encode())
        where = fd if fd is not None else os.path.join(folder, rel)
        follow = {} if fd is not None else {"follow_symlinks": False}
        for name in sorted(_safe(os.listxattr, where, **follow) or []):
            digest.update(name.encode() + b"=" + (_safe(os.getxattr, where, name, **follow) or b""))
        if fd is not None:
            for chunk in budget.chunks(fd):
                digest.update(chunk)
        elif stat.S_ISLNK(info.st_mode):
            digest.update((_safe(os.readlink, os.path.join(folder, rel)) or "").encode())
    return digest.hexdigest()


def copy(source: Path, target: Path) -> list[str]:
    """Copy ``source``'s folders, regular files and links into ``target`` (a new folder), never
    following a link; anything else (a FIFO, a socket, a device) is left out, with a reason.
    Raises ``TooLarge`` past the bounds."""
    reasons, budget = [], _Budget()
    target.mkdir(parents=True)
    for rel, info, fd in walk(source):
        dest = target / rel
        if stat.S_ISDIR(info.st_mode):
            dest.mkdir(exist_ok=True)
        elif stat.S_ISREG(info.st_mode) and fd is not None:
            with open(dest, "wb") as out:
                for chunk in budget.chunks(fd):
                    out.write(chunk)
        elif stat.S_ISLNK(info.st_mode):
            link = _safe(os.readlink, source / rel)
            if link is not None:
                os.symlink(link, dest)
        elif not stat.S_ISREG(info.st_mode):
            reasons.append(f"the predictor cache holds {rel}, which is not a file, folder or "
                           "link; it is left out")
    return reasons


def _safe(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except OSError:
        return None
