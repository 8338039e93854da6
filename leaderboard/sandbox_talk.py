"""The parent's side of a run's child: the pipes, the serving replay it runs for the child, and
the predictor cache's snapshot around a reading. ``leaderboard.sandbox`` starts it all."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard import seal_walls
from leaderboard.readings import ReadingRefused
from leaderboard.sandbox_bundle import write_frame, write_reading
from leaderboard.serving.scoring import replay_priced
from leaderboard_core.contract import Home, NotSupported, ReadingRequest
from leaderboard_core.specs import GpuSpec

MAX_MESSAGE = 1 << 20  # characters; a reading request of every cell fits many times over


class ChildGone(RuntimeError):
    """The child closed its pipe while the harness waited for an answer."""


class Channel:
    """This process's side of the child's pipes. Attempts are taken as they arrive, so nothing
    the child does to its own memory erases them; the child's last message is ``done``. A
    message longer than ``MAX_MESSAGE`` or not a JSON object ends the conversation."""

    def __init__(self, inbox, outbox):
        self.inbox, self.outbox = inbox, outbox
        self.attempts: list[str] = []
        self.problems: list[str] = []
        self.done = False

    def receive(self) -> dict | None:
        """The next message that is not an attempt; None once the pipe closed, said done or
        broke the protocol."""
        while line := self.inbox.readline(MAX_MESSAGE):
            if not line.endswith("\n") and len(line) >= MAX_MESSAGE:
                self.problems.append(f"the predictor sent a message over {MAX_MESSAGE:,} "
                                     "characters on the harness pipe")
                return None
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if not isinstance(message, dict):
                self.problems.append(f"the predictor sent a malformed message on the harness "
                                     f"pipe: {line[:80]!r}")
                return None
            if "attempt" in message:
                self.attempts.append(str(message["attempt"]))
            elif message.get("done"):
                self.done = True
                return None
            else:
                return message
        return None

    def send(self, message: dict) -> None:
        try:
            self.outbox.write(json.dumps(message) + "\n")
            self.outbox.flush()
        except (BrokenPipeError, ValueError):
            pass  # the child is gone; the missing "done" says so

    def ask(self, message: dict) -> dict:
        self.send(message)
        answer = self.receive()
        if answer is None:
            raise ChildGone("the predictor's process stopped answering the replay")
        return answer


def serve(channel: Channel, folder: Path, blind: pl.DataFrame, home: Home, gpu: GpuSpec,
           served: dict) -> None:
    """The serving replay, here in the harness: each batch of scheduled steps goes to the child
    as ``in/steps-<k>.arrow``; its answer is the step times, nothing more."""
    batches = itertools.count()

    def price(cells: pl.DataFrame) -> tuple[np.ndarray, float]:
        name = f"steps-{next(batches)}.arrow"
        write_frame(cells, folder / "in" / name)
        answer = channel.ask({"steps": name})
        (folder / "in" / name).unlink()
        if "not_supported" in answer:
            raise NotSupported(answer["not_supported"])
        if "error" in answer:
            raise ValueError(answer["error"])
        result = folder / "out" / f"{name}.npy"
        try:  # the child's output: whatever it wrote, the harness does not crash on it
            ms = np.load(result, allow_pickle=False).astype(np.float64, copy=False)
            seconds = float(answer.get("seconds", 0.0))
            result.unlink()
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"the predictor's step times for {name} are unreadable: "
                             f"{type(exc).__name__}: {exc}") from exc
        return ms, seconds

    try:
        served["pred"] = np.stack(replay_priced(blind, home.models, gpu, price, served))
    except NotSupported as exc:
        served["not_supported"] = str(exc)
        served["invalid_reasons"] = [f"NotSupported: {exc}"]
    except (ValueError, ChildGone) as exc:
        served["invalid_reasons"] = [str(exc)]
    channel.send({"end": True})


def talk(folder: Path, cache: Path, env: dict, writable: list[str], supply, serve
         ) -> tuple[list[str], list[str]]:
    """Run the child, answering its reading requests and, on serving, running the replay for it
    (``serve``, None on other levels); the cells taken out, and the reasons the run is INVALID:
    an attempt on sealed data, a refused or malformed request, a pipe closed before the child
    was done. The predictor cache outlives the run, so before the first reading is answered it
    is copied (files and folders only, never through a link), and when the child has exited it
    is put back as it was: nothing written after target rows were seen reaches another run."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    command = seal_walls.child_command(["-m", "leaderboard.sandbox_child", str(folder),
                                        str(to_child_r), str(from_child_w)], writable)
    # stdout and stderr are inherited, so a long fit's progress reaches the user's terminal.
    child = subprocess.Popen(command, env=env, cwd=folder / "out",
                             pass_fds=(to_child_r, from_child_w))
    os.close(to_child_r)
    os.close(from_child_w)
    unscored, reasons, before = [], [], None
    snapshot = folder / "cache-before-reading"
    try:
        with os.fdopen(from_child_r) as inbox, os.fdopen(to_child_w, "w") as outbox:
            channel = Channel(inbox, outbox)
            while (message := channel.receive()) is not None:
                if message.get("replay") and serve is not None:
                    serve(channel)
                    continue
                if before is None:
                    before = cache_state(cache)
                    reasons += copy_tree(cache, snapshot)
                try:
                    unscored = _answer_reading(message, supply, folder)
                    channel.send({"unscored": unscored})
                except Exception as exc:  # noqa: BLE001 - whatever the child sent, no crash here
                    reasons.append(str(exc) if isinstance(exc, ReadingRefused) else
                                   f"the predictor's request {str(message)[:120]} was not one the "
                                   f"harness answers ({type(exc).__name__}: {exc})")
                    channel.send({"refused": str(exc)})
    finally:
        if channel_open := child.poll() is None:
            child.kill()
        child.wait()
        if before is not None:
            reasons += put_back(cache, snapshot, before)
    reasons += channel.problems
    if channel.attempts:
        tried = list(dict.fromkeys(channel.attempts))
        reasons.append(f"the predictor reached for sealed data ({len(tried)} attempt(s); first: "
                       f"{tried[0]}); a run that tries is INVALID, whether or not it caught the "
                       "refusal")
    if not channel.done:
        reasons.append(f"the predictor's process closed its pipe to the harness before it was "
                       f"done (exit {child.returncode}{', killed' if channel_open else ''})")
    return unscored, reasons


def put_back(cache: Path, snapshot: Path, before: str) -> list[str]:
    """The cache as it was before the first reading was answered, whatever the child did to it
    since; the reason if it had changed anything."""
    changed = cache_state(cache) != before
    shutil.rmtree(cache, ignore_errors=True)
    shutil.move(str(snapshot), str(cache))
    return ["the predictor wrote to its cache after it asked for target rows; the cache is put "
            "back as it was before the reading"] if changed else []


def _answer_reading(message: dict, supply, folder: Path) -> list[str]:
    if set(message) - {"cells", "op_points"}:
        raise ValueError(f"unknown message fields {sorted(set(message) - {'cells', 'op_points'})}")
    reading = supply(ReadingRequest(cells=tuple(message.get("cells", ())),
                                    op_points=tuple(message.get("op_points", ()))))
    write_reading(reading, folder / "in" / "reading")
    return list(supply.unscored)


def cache_state(folder: Path) -> str:
    """A digest of everything under ``folder`` that could carry data to a later run: each
    entry's name, kind, mode, times and extended attributes, a file's bytes, a link's target;
    read without following any link."""
    digest = hashlib.sha256()
    for rel, entry_stat, fd in walk_no_follow(folder):
        digest.update(f"{rel}\0{entry_stat.st_mode}\0{entry_stat.st_mtime_ns}\0".encode())
        for name in sorted(_xattrs(fd, rel, folder)):
            digest.update(name.encode() + b"=" + _xattr(fd, rel, folder, name))
        if stat.S_ISREG(entry_stat.st_mode) and fd is not None:
            digest.update(_read_all(fd))
        elif stat.S_ISLNK(entry_stat.st_mode):
            digest.update(os.readlink(folder / rel).encode())
        if fd is not None:
            os.close(fd)
    return digest.hexdigest()


def copy_tree(source: Path, target: Path) -> list[str]:
    """Copy ``source``'s folders, regular files and links into ``target`` without following a
    link, each file opened with ``O_NOFOLLOW`` (a name swapped for a link while it is copied is
    refused, not followed); anything else (a FIFO, a socket, a device) is left out, with a
    reason."""
    reasons = []
    target.mkdir(parents=True)
    for rel, entry_stat, fd in walk_no_follow(source):
        dest = target / rel
        mode = entry_stat.st_mode
        if stat.S_ISDIR(mode):
            dest.mkdir(exist_ok=True)
        elif stat.S_ISREG(mode) and fd is not None:
            dest.write_bytes(_read_all(fd))
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(source / rel), dest)
        else:
            reasons.append(f"the predictor cache holds {rel}, which is not a file, folder or "
                           "link; it is left out")
        if fd is not None:
            os.close(fd)
    return reasons


def walk_no_follow(root: Path):
    """(relative path, lstat, an open fd for files and folders or None) for everything under
    ``root``, depth first, never through a link: each folder is opened relative to its parent's
    descriptor with ``O_NOFOLLOW``."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        top = os.open(root, flags | os.O_DIRECTORY)
    except OSError:
        return
    stack = [(top, Path())]
    while stack:
        dir_fd, rel = stack.pop()
        try:
            names = sorted(os.listdir(dir_fd))
            for name in names:
                entry_stat = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                fd = None
                if stat.S_ISDIR(entry_stat.st_mode):
                    sub = os.open(name, flags | os.O_DIRECTORY, dir_fd=dir_fd)
                    stack.append((sub, rel / name))
                    yield rel / name, entry_stat, None
                    continue
                if stat.S_ISREG(entry_stat.st_mode):
                    try:
                        fd = os.open(name, flags, dir_fd=dir_fd)
                    except OSError:
                        fd = None  # swapped for a link (ELOOP) or gone: not copied, not read
                yield rel / name, entry_stat, fd
        finally:
            os.close(dir_fd)


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _xattrs(fd: int | None, rel: Path, folder: Path) -> list[str]:
    try:
        return os.listxattr(fd) if fd is not None else os.listxattr(folder / rel,
                                                                   follow_symlinks=False)
    except OSError:
        return []


def _xattr(fd: int | None, rel: Path, folder: Path, name: str) -> bytes:
    try:
        return os.getxattr(fd, name) if fd is not None else os.getxattr(
            folder / rel, name, follow_symlinks=False)
    except OSError:
        return b""
