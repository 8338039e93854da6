"""One registry of predictors: a name per class, duplicates rejected, typos answered.

``@register("name")`` on a ``Predictor`` subclass is all a new predictor needs; the CLI name and
the Hydra node ``predictor=name`` (with the constructor's defaults as keys) follow from it.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Any

from predictors.base import Predictor

_REGISTRY: dict[str, type[Predictor]] = {}


class UnknownPredictor(KeyError):
    def __str__(self) -> str:
        return self.args[0]


def register(name: str):
    def decorate(cls: type[Predictor]) -> type[Predictor]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"predictor name '{name}' is already registered by "
                             f"{_REGISTRY[name].__module__}.{_REGISTRY[name].__qualname__}; "
                             "pick another name")
        if not issubclass(cls, Predictor):
            raise TypeError(f"{cls.__qualname__} must subclass predictors.base.Predictor")
        if not hasattr(cls, "card"):
            raise TypeError(f"{cls.__qualname__} must declare a PredictorCard as `card`")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def discover() -> None:
    """Import every module of the ``predictors`` package so that each registers itself."""
    import predictors

    for info in pkgutil.iter_modules(predictors.__path__):
        if info.name not in ("base", "registry") and not info.name.startswith("_"):
            importlib.import_module(f"predictors.{info.name}")


def names() -> list[str]:
    discover()
    return sorted(_REGISTRY)


def _closest(name: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def suggestion(name: str, valid: list[str]) -> str:
    return f"valid names: {', '.join(valid)}.{_closest(name, valid)}"


def get(name: str) -> type[Predictor]:
    discover()
    if name not in _REGISTRY:
        raise UnknownPredictor(f"unknown predictor '{name}'; {suggestion(name, names())}")
    return _REGISTRY[name]


def check_params(name: str, fields) -> None:
    """Raise, naming the predictor's parameters and the closest, if a field is not one."""
    valid = get(name).param_names()
    unknown = sorted(set(fields) - set(valid))
    if unknown:
        raise ValueError(f"predictor '{name}' has no parameter(s) {', '.join(unknown)}; "
                         f"its parameters: {', '.join(valid) or 'none'}.{_closest(unknown[0], valid)}")


def build(name: str, params: dict[str, Any] | None = None) -> Predictor:
    params = dict(params or {})
    check_params(name, params)
    return get(name)(**params)
