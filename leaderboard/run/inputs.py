"""Every value a user sets, checked before any work, and every command's way of stopping.

A command-line entry point wraps its ``main`` in ``guarded``: a bad input (``InputError``, a
Hydra override that does not parse or names no config) is one line and exit status 2, Ctrl-C is
one line and 130, never a traceback. ``check_config`` checks the root keys a user may set
(``ROOT``) and ``check_predictor`` the predictor's fields, from its annotations, ``param_choices``
and ``param_bounds``, both before the store is opened or a fit starts.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from leaderboard.run.home_grid import HOME_POINTS

HYDRA_INPUT_ERRORS = (OverrideParseException, MissingConfigException, ConfigCompositionException,
                      OmegaConfBaseException)


class InputError(ValueError):
    """A value the user set is not one the command takes; the message names it and the fix."""


def _number(kind: type, low: float | None = None, high: float | None = None,
            low_open: bool = False) -> Callable[[object], str | None]:
    """A check that the value is a ``kind`` (a bool is not a number) within [low, high]."""
    def check(value):
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            return f"must be {'a number' if kind is float else 'a whole number'}"
        if isinstance(value, float) and not math.isfinite(value):
            return "must be finite"
        if low is not None and (value <= low if low_open else value < low):
            return f"must be {'above' if low_open else 'at least'} {low}"
        if high is not None and value > high:
            return f"must be at most {high}"
        return None
    return check


def _one_of(*choices) -> Callable[[object], str | None]:
    return lambda value: None if value in choices else f"must be one of {', '.join(map(str, choices))}"


def _flag(value) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


# The root keys a user sets on the command line, each with its check. Keys left out here
# (``sources.root``, ``output.json``, ``hub.export``) are paths checked where they are used.
ROOT: dict[str, Callable[[object], str | None]] = {
    "reading.max_points": _number(int, 0),
    "reading.max_fraction": _number(float, 0, 1),
    "seal.stage_seconds": _number(float, 1, low_open=False),
    "split.seed": _number(int, 0),
    "split.test_fraction": _number(float, 0, 1, low_open=True),
    "split.home_points": _one_of(*HOME_POINTS),
    "report.rerun": _flag,
    "rerun.all": _flag,
    "rerun.dry_run": _flag,
    "report.jobs": _number(int, 1),
    "report.partial": _one_of("keep", "replace"),
    "hub.overwrite": _flag,
    "explain.worst": _number(int, 1),
}


def check_config(cfg: DictConfig) -> None:
    """Raise ``InputError`` for the first root value that fails its check."""
    for key, check in ROOT.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and (problem := check(value)):
            raise InputError(f"{key}={value!r} is not allowed: it {problem}")


def check_run_inputs(cfg: DictConfig) -> None:
    """Everything a leaderboard run takes from its config: the root values and the predictor's
    fields (its ``runs_dir`` was checked before Hydra started, ``cli.check_choices``)."""
    check_config(cfg)
    check_predictor(cfg)


def check_writable_folder(folder: Path, key: str) -> None:
    """Raise unless ``folder`` is, or can be made, a folder this process may write in: the
    nearest part of it that exists must be a writable directory."""
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{key}={folder} cannot be a folder: {existing} is a file, not a "
                         "directory; pass a directory path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{key}={folder}: {existing} is not writable; pass a folder you can "
                         "write in")


def check_predictor(cfg: DictConfig) -> None:
    """Raise ``InputError`` if a field of the chosen predictor has a value it does not take."""
    from leaderboard.seal import predictor_index
    from predictors.registry import check_fields

    values = {k: v for k, v in OmegaConf.to_container(cfg.predictor).items() if k != "name"}
    try:
        check_fields(predictor_index.get(cfg.predictor.name), values)
    except (KeyError, ValueError) as exc:
        raise InputError(str(exc)) from None


def fail(message: str, prog: str = "error") -> None:
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(2)


def guarded(main: Callable, prog: str) -> Callable:
    """``main`` with a bad input as one line and status 2, Ctrl-C as one line and 130."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print(f"\n{prog}: interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        except InputError as exc:
            fail(str(exc), prog)
        except HYDRA_INPUT_ERRORS as exc:
            fail(first_line(exc), prog)
    return wrapper


def first_line(exc: BaseException) -> str:
    """Hydra's message without its search-path listing and grammar link."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

# Checks inputs and stops commands, never changes a run's numbers: code_hash skips this file.
PRESENTATION = True
