"""Probe predictors for the seal's walls (``test_seal_routes.py``): each tries one route around
Landlock, as a determined cheat would, and predicts the truth only if the route works."""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
import time

import numpy as np
from probe_predictors import ReadsPrefill

from leaderboard.store import database
from leaderboard_core import guard, paths
from leaderboard_core.contract import PredictorCard
from predictors.base import Predictor

CARD = PredictorCard("analytical", "test", "seal probe", False)
IPC_CREAT = 0o1000


def _libc():
    return ctypes.CDLL(None, use_errno=True)


class Networked(Predictor):
    """Asks a server on the host's loopback, then a registry host, for the truth; 1 ms if both
    are refused, an error naming what answered otherwise."""

    card = CARD

    def __init__(self, port: int = 0):
        self.port = port

    def predict(self, cells, gpu):
        reached = []
        for host, port in (("127.0.0.1", self.port), ("pypi.org", 443)):
            try:
                socket.create_connection((host, port), timeout=3).close()
                reached.append(host)
            except OSError:
                pass
        if reached:
            raise AssertionError(f"the child reached {reached}")
        return np.full(len(cells), 1.0)


class Lingers(Networked):
    """Leaves a session leader behind that serves on an abstract unix socket, for a later run."""

    def __init__(self, name: str = "lb-probe"):
        self.name = name

    def predict(self, cells, gpu):
        if getattr(self, "started_", False):  # predict runs twice (a warm-up first)
            return np.full(len(cells), 1.0)
        self.started_ = True
        code = (f"import socket, time; s = socket.socket(socket.AF_UNIX); "
                f"s.bind('\\0{self.name}'); s.listen(1); time.sleep(120)")
        subprocess.Popen([sys.executable, "-S", "-c", code], start_new_session=True)
        time.sleep(1.0)
        return np.full(len(cells), 1.0)


class SharesMemory(Networked):
    """Writes a SysV shared-memory segment that outlives any process, for a later run."""

    def __init__(self, key: int = 0):
        self.key = key

    def predict(self, cells, gpu):
        if _libc().shmget(ctypes.c_int(self.key), ctypes.c_size_t(4096),
                          ctypes.c_int(IPC_CREAT | 0o600)) < 0:
            raise OSError(ctypes.get_errno(), "shmget")
        return np.full(len(cells), 1.0)


class NamesInCache(ReadsPrefill):
    """Keeps its reading as folder names in its predictor cache (no file bytes at all)."""

    def __init__(self, rows: int = 2):
        self.rows = rows

    def take_reading(self, reading, gpu):
        for cell, ms in reading.cells.select("cell_id", "gt_ms").iter_rows():
            (paths.home() / "kept" / f"{cell}={ms}").mkdir(parents=True, exist_ok=True)

    def predict(self, cells, gpu):
        return np.full(len(cells), 1.0)


class ErasesRecord(Networked):
    """Tries the store, swallows the refusal and clears the record in its own memory."""

    def predict(self, cells, gpu):
        try:
            with database.connect():
                pass
        except Exception:  # noqa: BLE001, S110 - the point: a refusal swallowed
            pass
        guard._attempts.clear()
        return np.full(len(cells), 1.0)


class ReplacesReplay(Networked):
    """Replaces the serving replay in its own process; every step it prices takes 2 ms."""

    def fit(self, home):
        from leaderboard.serving import scoring, simulate

        def fake(targets, *args, **kwargs):
            return np.full(len(targets), 1.0), np.full(len(targets), 1.0)

        simulate.predict_targets = scoring.predict_targets = fake
        return self

    def predict(self, cells, gpu):
        return np.full(len(cells), 2.0)


PROBES = {"networked": Networked, "lingers": Lingers, "shares_memory": SharesMemory,
          "names_in_cache": NamesInCache, "erases_record": ErasesRecord,
          "replaces_replay": ReplacesReplay}


class MarksReadRoots(Networked):
    """Leaves a note in the metadata of a file it may read (an xattr, a mode): readable roots
    are mounted read-only, so both are refused; 1 ms if refused, an error if either worked."""

    def __init__(self, target: str = ""):
        self.target = target

    def predict(self, cells, gpu):
        worked = []
        for name, act in (("xattr", lambda: os.setxattr(self.target, "user.lb", b"1")),
                          ("chmod", lambda: os.chmod(self.target, 0o600)),
                          ("utime", lambda: os.utime(self.target, (0, 0)))):
            try:
                act()
                worked.append(name)
            except OSError:
                pass
        if worked:
            raise AssertionError(f"changed {self.target}: {worked}")
        return np.full(len(cells), 1.0)


class StashesInXattr(ReadsPrefill):
    """Keeps its reading in an extended attribute of a file its fit left in the cache."""

    def __init__(self, rows: int = 2):
        self.rows = rows

    def fit(self, home):
        (paths.home() / "slot").parent.mkdir(parents=True, exist_ok=True)
        (paths.home() / "slot").write_bytes(b"")
        return self

    def take_reading(self, reading, gpu):
        kept = reading.cells.select("cell_id", "gt_ms").rows()
        os.setxattr(paths.home() / "slot", "user.r", repr(kept).encode())

    def predict(self, cells, gpu):
        return np.full(len(cells), 1.0)


class SkipsReplay(Networked):
    """Replaces the child's answer loop so the harness's replay never runs, and writes its own
    TTFT/TPOT and timings into the facts."""

    def fit(self, home):
        from leaderboard.seal import job

        def answer_nothing(estimator, gpu, inputs, out, ask):
            frame = sys._getframe(1)
            frame.f_locals["facts"].update(pred=[[123.0], [4.5]], steps=1e9, predict_seconds=1e-3)

        job.answer_steps = answer_nothing
        return self


class BreaksThePipe(ReadsPrefill):
    """Sends the harness what it does not expect, after a reading it kept in its cache:
    ``mode`` picks the message."""

    def __init__(self, mode: str = "replay"):
        self.mode = mode
        self.rows = 1

    def take_reading(self, reading, gpu):
        (paths.home() / "kept.arrow").parent.mkdir(parents=True, exist_ok=True)
        reading.cells.write_ipc(paths.home() / "kept.arrow")
        message = {"replay": '{"replay": true}\n', "cells": '{"cells": [[1, 2]]}\n',
                   "points": '{"op_points": [5]}\n', "long": "x" * (2 << 20)}[self.mode]
        os.write(int(sys.argv[3]), message.encode())

    def predict(self, cells, gpu):
        return np.full(len(cells), 1.0)


PROBES.update({"marks_read_roots": MarksReadRoots, "stashes_in_xattr": StashesInXattr,
               "skips_replay": SkipsReplay, "breaks_the_pipe": BreaksThePipe})
