"""Probe predictors for the seal's walls (``test_seal_routes.py``): each tries one route around
Landlock, as a determined cheat would, and predicts the truth only if the route works."""

from __future__ import annotations

import ctypes
import socket
import subprocess
import sys
import time

import numpy as np
from probe_predictors import ReadsPrefill

from leaderboard import store
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
            with store.connect():
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
