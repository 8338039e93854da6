"""The parent's side of a run's child: the pipes, the serving replay it runs for the child, and
the predictor cache's snapshot around a reading. ``leaderboard.sandbox`` starts it all."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl

from leaderboard import seal_walls
from leaderboard.readings import ReadingRefused
from leaderboard.sandbox_bundle import tree_digest, write_frame, write_reading
from leaderboard.serving.scoring import replay_priced
from leaderboard_core.contract import Home, NotSupported, ReadingRequest
from leaderboard_core.specs import GpuSpec


class ChildGone(RuntimeError):
    """The child closed its pipe while the harness waited for an answer."""


class Channel:
    """This process's side of the child's pipes. Attempts are taken as they arrive, so nothing
    the child does to its own memory erases them; the child's last message is ``done``."""

    def __init__(self, inbox, outbox):
        self.inbox, self.outbox = inbox, outbox
        self.attempts: list[str] = []
        self.done = False

    def receive(self) -> dict | None:
        """The next message that is not an attempt; None once the pipe closed or said done."""
        for line in self.inbox:
            try:
                message = json.loads(line)
            except ValueError:
                self.attempts.append(f"a malformed message on the harness pipe: {line[:80]!r}")
                continue
            if not isinstance(message, dict):
                continue
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


def talk(folder: Path, cache: Path, env: dict, supply, serve) -> tuple[list[str], list[str]]:
    """Run the child, answering its reading requests and, on serving, running the replay for it
    (``serve``); the cells taken out, and the reasons the run is INVALID: an attempt on sealed
    data, a refused reading, a pipe closed before the child was done. The predictor cache
    outlives the run, so it is snapshotted before the first reading is answered and restored
    when the child exits: nothing written after target rows were seen reaches another run."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    command = seal_walls.child_command(["-m", "leaderboard.sandbox_child", str(folder),
                                        str(to_child_r), str(from_child_w)])
    # stdout and stderr are inherited, so a long fit's progress reaches the user's terminal.
    child = subprocess.Popen(command, env=env, cwd=folder / "out",
                             pass_fds=(to_child_r, from_child_w),
                             preexec_fn=seal_walls.die_with_parent)
    os.close(to_child_r)
    os.close(from_child_w)
    unscored, reasons, snapshot = [], [], None
    with os.fdopen(from_child_r) as inbox, os.fdopen(to_child_w, "w") as outbox:
        channel = Channel(inbox, outbox)
        while (message := channel.receive()) is not None:
            if message.get("replay"):
                serve(channel)
                continue
            if snapshot is None:
                snapshot = _snapshot(cache, folder / "cache-before-reading")
            try:
                request = ReadingRequest(cells=message.get("cells", []),
                                         op_points=message.get("op_points", []))
                reading = supply(request)
                write_reading(reading, folder / "in" / "reading")
                unscored = list(supply.unscored)
                channel.send({"unscored": unscored})
            except (ReadingRefused, TypeError) as exc:
                reasons.append(str(exc))
                channel.send({"refused": str(exc)})
    child.wait()
    if snapshot is not None and _restore(cache, snapshot):
        reasons.append("the predictor wrote to its cache after it asked for target rows; the "
                       "cache is restored to what it held before (what fit derives from the "
                       "home, never a reading)")
    if channel.attempts:
        tried = list(dict.fromkeys(channel.attempts))
        reasons.append(f"the predictor reached for sealed data ({len(tried)} attempt(s); first: "
                       f"{tried[0]}); a run that tries is INVALID, whether or not it caught the "
                       "refusal")
    if not channel.done:
        reasons.append(f"the predictor's process closed its pipe to the harness before it was "
                       f"done (exit {child.returncode})")
    return unscored, reasons


def _snapshot(cache: Path, where: Path) -> Path:
    shutil.copytree(cache, where, symlinks=True)
    return where


def _restore(cache: Path, snapshot: Path) -> bool:
    """Put the cache back as it was at ``snapshot`` if the child changed it (names, folders or
    bytes); whether it had."""
    changed = tree_digest(cache) != tree_digest(snapshot)
    if changed:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.move(str(snapshot), str(cache))
    else:
        shutil.rmtree(snapshot, ignore_errors=True)
    return changed
