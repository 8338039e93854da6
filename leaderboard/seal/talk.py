"""The parent's side of a run's child: the pipes, the serving replay it runs for the child, and
the predictor cache's snapshot around a reading. ``leaderboard.seal.sandbox`` starts it all."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard.seal import child_files, walls
from leaderboard.seal.bundle import write_frame, write_reading
from leaderboard.serving.scoring import home_times_host, replay_priced
from leaderboard_core.contract import Home, NotSupported, ReadingRefused, ReadingRequest
from leaderboard_core.specs import GpuSpec

UNSNAPSHOTTED = "unsnapshotted"
MAX_MESSAGE = 1 << 20  # bytes; a reading request of every cell fits many times over
# How long the harness waits on a silent child before Python may run a signal handler: Ctrl-C
# that the kernel hands to another of its threads is only acted on between these waits.
WAKE_SECONDS = 0.25


class ChildGone(RuntimeError):
    """The child closed its pipe while the harness waited for an answer."""


class TimedOut(RuntimeError):
    """The child said nothing within its stage's wall-time limit."""


class PipeLines:
    """Lines (bytes, ending in a newline unless cut at ``limit`` or by the end of the pipe) from
    a pipe's read end, waited for in slices of ``WAKE_SECONDS``, so that Ctrl-C stops the run
    during a long silent fit."""

    def __init__(self, fd: int):
        self.fd, self.pending = fd, bytearray()
        self.ready = select.poll()  # not select.select, which refuses descriptors from 1024 on
        self.ready.register(fd, select.POLLIN)
        self.deadline: float | None = None  # time.monotonic() past which ``TimedOut``

    def readline(self, limit: int) -> bytes:
        while (end := self.pending.find(b"\n", 0, limit)) < 0 and len(self.pending) < limit:
            if not self.ready.poll(WAKE_SECONDS * 1000):
                if self.deadline is not None and time.monotonic() > self.deadline:
                    raise TimedOut
                continue
            if not (chunk := os.read(self.fd, 1 << 16)):
                break
            self.pending += chunk
        cut = end + 1 if end >= 0 else min(limit, len(self.pending))
        line = bytes(self.pending[:cut])
        del self.pending[:cut]
        return line

    def close(self) -> None:
        os.close(self.fd)


class Channel:
    """This process's side of the child's pipes: ``inbox`` has ``readline(limit)`` returning
    bytes (``PipeLines``), ``outbox`` is an unbuffered binary writer, so nothing is left to
    flush into a pipe the child closed. Attempts are taken as they arrive, so nothing the child
    does to its own memory erases them; the child's last message is ``done``. A message longer
    than ``MAX_MESSAGE`` or not a JSON object ends the conversation."""

    def __init__(self, inbox, outbox, stage_seconds: float | None = None):
        self.inbox, self.outbox = inbox, outbox
        self.attempts: list[str] = []
        self.problems: list[str] = []
        self.done = False
        self.stage_seconds = stage_seconds
        self.start_stage("start")

    def start_stage(self, stage: str) -> None:
        """Each stage (start, fit, predict, each serving answer) gets ``stage_seconds`` anew."""
        self.stage = stage
        if self.stage_seconds is not None:
            self.inbox.deadline = time.monotonic() + self.stage_seconds

    def receive(self) -> dict | None:
        """The next message that is not an attempt or a stage; None once the pipe closed, said
        done, broke the protocol or was silent past its stage's limit."""
        while raw := self._line():
            if not raw.endswith(b"\n") and len(raw) >= MAX_MESSAGE:
                self.problems.append(f"the predictor sent a message over {MAX_MESSAGE:,} "
                                     "bytes on the harness pipe")
                return None
            line = raw.decode(errors="replace")
            try:
                message = json.loads(line)
            except Exception:  # noqa: BLE001 - ValueError, or RecursionError on deep nesting
                message = None
            if not isinstance(message, dict):
                self.problems.append(f"the predictor sent a malformed message on the harness "
                                     f"pipe: {line[:80]!r}")
                return None
            if "attempt" in message:
                self.attempts.append(str(message["attempt"]))
            elif isinstance(message.get("stage"), str) and len(message) == 1:
                self.start_stage(message["stage"][:40])
            elif message.get("done"):
                self.done = True
                return None
            else:
                return message
        return None

    def _line(self) -> bytes:
        try:
            return self.inbox.readline(MAX_MESSAGE)
        except TimedOut:
            self.problems.append(f"timed out in {self.stage} after {self.stage_seconds:g} s "
                                 "(seal.stage_seconds)")
            return b""

    def send(self, message: dict) -> None:
        data = memoryview((json.dumps(message) + "\n").encode())
        try:
            while data:  # a raw write to a pipe may take part of it
                data = data[self.outbox.write(data):]
        except (BrokenPipeError, ValueError):
            pass  # the child is gone; the missing "done" says so

    def ask(self, message: dict) -> dict:
        self.start_stage("a serving answer")
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
            ms = child_files.load_array(result, len(cells)).astype(np.float64, copy=False)
            seconds = float(answer.get("seconds", 0.0))
            result.unlink()
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"the predictor's step times for {name} are unreadable: "
                             f"{type(exc).__name__}: {exc}") from exc
        return ms, seconds

    host_in_steps = home_times_host(home.cells)
    try:
        served["pred"] = np.stack(replay_priced(blind, home.models, gpu, price, served,
                                                host_in_steps))
    except NotSupported as exc:
        served["not_supported"] = str(exc)
        served["invalid_reasons"] = [f"NotSupported: {exc}"]
    except (ValueError, ChildGone) as exc:
        served["invalid_reasons"] = [str(exc)]
    channel.send({"end": True})


def talk(folder: Path, cache: Path, env: dict, writable: list[str], supply, serve,
         stage_seconds: float | None = None) -> tuple[list[str], list[str]]:
    """Run the child, answering its reading requests and, on serving, running the replay for it
    (``serve``, None on other levels); the cells taken out, and the reasons the run is INVALID:
    an attempt on sealed data, a refused or malformed request, a pipe closed before the child
    was done. The predictor cache outlives the run, so before the first reading is answered it
    is copied (files and folders only, never through a link), and when the child has exited it
    is put back as it was: nothing written after target rows were seen reaches another run."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    command = walls.child_command(["-m", "leaderboard.seal.child", str(folder),
                                        str(to_child_r), str(from_child_w)], writable)
    # stdout and stderr are inherited, so a long fit's progress reaches the user's terminal.
    # a session of its own: a timed-out child is killed with every process it started
    child = subprocess.Popen(command, env=env, cwd=folder / "out",
                             pass_fds=(to_child_r, from_child_w), start_new_session=True)
    os.close(to_child_r)
    os.close(from_child_w)
    unscored, reasons, before = [], [], None
    snapshot = folder / "cache-before-reading"
    try:
        with (contextlib.closing(PipeLines(from_child_r)) as inbox,
              os.fdopen(to_child_w, "wb", buffering=0) as outbox):
            channel = Channel(inbox, outbox, stage_seconds)
            while (message := channel.receive()) is not None:
                if message.get("replay") and serve is not None:
                    serve(channel)
                    continue
                if before is None:
                    before = _snapshot(cache, snapshot, reasons)
                if before == UNSNAPSHOTTED:
                    channel.send({"refused": "the predictor cache could not be snapshotted"})
                    continue
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
            kill_group(child)
        child.wait()
        if before not in (None, UNSNAPSHOTTED):
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


def kill_group(child: subprocess.Popen) -> None:
    """``child`` and every process of its session (it was started as their leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        child.kill()


def read_answer(fd: int, limit: int, seconds: float, child: subprocess.Popen
                ) -> tuple[str, str | None]:
    """A one-shot child's answer on ``fd`` (its whole output), within ``limit`` bytes and
    ``seconds``; past either the child's session is killed and the second value says why."""
    lines, why = PipeLines(fd), None
    lines.deadline = time.monotonic() + seconds
    data = bytearray()
    try:
        while len(data) <= limit and (chunk := lines.readline(limit + 1 - len(data))):
            data += chunk
        if len(data) > limit:
            why = f"answered more than {limit:,} bytes"
    except TimedOut:
        why = f"timed out after {seconds:g} s"
    finally:
        lines.close()
        if why:
            kill_group(child)
        child.wait()
    return data.decode(errors="replace"), why


def _snapshot(cache: Path, snapshot: Path, reasons: list[str]) -> str:
    """The cache's state, copied to ``snapshot``; ``UNSNAPSHOTTED`` (with a reason: the run's
    readings are then refused) if it cannot be."""
    try:
        before = child_files.state(cache)
        reasons += child_files.copy(cache, snapshot)
        return before
    except Exception as exc:  # noqa: BLE001 - a cache the child built to break this
        shutil.rmtree(snapshot, ignore_errors=True)
        reasons.append(f"the predictor cache could not be snapshotted before its reading "
                       f"({type(exc).__name__}: {exc}); the reading is refused")
        return UNSNAPSHOTTED


def put_back(cache: Path, snapshot: Path, before: str) -> list[str]:
    """The cache as it was before the first reading was answered, whatever the child did to it
    since (the changed tree is renamed away first, which cannot fail on a tree built to break a
    walk, then removed as far as it can be); the reason if it had changed anything."""
    try:
        changed = child_files.state(cache) != before
    except Exception:  # noqa: BLE001 - too large or too deep to compare: changed
        changed = True
    trash = cache.with_name(f".{cache.name}-{uuid.uuid4().hex[:8]}.trash")
    if cache.exists() or cache.is_symlink():
        os.rename(cache, trash)
    shutil.move(str(snapshot), str(cache))
    try:
        shutil.rmtree(trash, ignore_errors=True)
    except Exception:  # noqa: BLE001, S110 - a hidden name no run uses; left for the disk
        pass
    return ["the predictor wrote to its cache after it asked for target rows; the cache is put "
            "back as it was before the reading"] if changed else []


def _answer_reading(message: dict, supply, folder: Path) -> list[str]:
    if set(message) - {"cells", "op_points"}:
        raise ValueError(f"unknown message fields {sorted(set(message) - {'cells', 'op_points'})}")
    reading = supply(ReadingRequest(cells=tuple(message.get("cells", ())),
                                    op_points=tuple(message.get("op_points", ()))))
    write_reading(reading, folder / "in" / "reading")
    return list(supply.unscored)
