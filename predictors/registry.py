"""One registry of predictors: a name per class, duplicates rejected, typos answered.

``@register("name")`` on a ``Predictor`` subclass is all a new predictor needs; the CLI name and
the Hydra node ``predictor=name`` (with the constructor's defaults as keys) follow from it.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import sys
from pathlib import Path
from typing import Any

from leaderboard_core.naming import closest, suggestion
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
                             f"{cls.__module__}.{cls.__qualname__} cannot take it: pick another "
                             "name")
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


def add_to_path(folder: str | Path) -> Path:
    """``folder`` (a ``predictors_path``) resolved and appended to ``sys.path``: called in a
    sealed child only (the harness never puts a folder of predictors on its own path); a clear
    error if it is not a directory."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise ValueError(f"predictors_path={folder} is not a directory; pass a folder of "
                         "predictor modules (*.py files that @register a Predictor)")
    if str(folder) not in sys.path:
        sys.path.append(str(folder))  # appended: a module there never shadows an installed one
    return folder


def include(folder: str | Path) -> list[str]:
    """Register every predictor module in ``folder``, a directory outside the repository (as
    lm-eval's ``--include_path`` adds tasks): each ``*.py`` not starting with ``_`` is imported
    by its own name with ``folder`` on ``sys.path`` (``add_to_path``). Only sealed children call
    it. Returns the module names."""
    folder = add_to_path(folder)
    modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    for name in modules:
        module = importlib.import_module(name)
        if Path(getattr(module, "__file__", "") or "").resolve().parent != folder:
            raise ValueError(f"predictors_path: {folder / name}.py is shadowed by the installed "
                             f"module '{name}' ({module.__file__}); rename the file")
    return modules


def names() -> list[str]:
    discover()
    return sorted(_REGISTRY)


def get(name: str) -> type[Predictor]:
    discover()
    if name not in _REGISTRY:
        raise UnknownPredictor(f"unknown predictor '{name}'; {suggestion(name, names())}")
    return _REGISTRY[name]


# Constructor annotations (or, without one, the default's type) checked before a run, as
# written under ``from __future__ import annotations``; a bool is not taken for an int.
TYPES = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}


def imported() -> dict[str, type[Predictor]]:
    """The predictors registered by the modules this process has imported, without importing
    any other."""
    return dict(_REGISTRY)


def describe(name: str, cls: type[Predictor]) -> dict[str, Any]:
    """What the harness needs of the predictor registered as ``name``, as JSON: where its class
    lives, its parameters (defaults, annotations, allowed values), its card and whether it times
    single kernels. The harness reads this from a sealed child (``leaderboard.seal.predictor_index``) and
    never imports a predictor module itself."""
    return {"name": name, "module": cls.__module__, "qualname": cls.__qualname__,
            "defaults": cls.default_params(),
            "annotations": {p.name: _type_name(p) for p in cls._parameters()},
            "choices": {k: list(v) for k, v in cls.param_choices.items()},
            "bounds": {k: list(v) for k, v in cls.param_bounds.items()},
            "card": {"kind": cls.card.kind, "reference": cls.card.reference,
                     "needs_profiled_rows": cls.card.needs_profiled_rows,
                     "precisions": list(cls.card.precisions),
                     "layers": list(cls.card.layers)},
            "predicts_ops": callable(getattr(cls, "predict_ops", None)),
            "explains": _hook_owner(cls, "explain")}


def _hook_owner(cls: type[Predictor], hook: str) -> str:
    """The class that overrides ``hook`` for ``cls`` (``module.qualname``), or "" where it keeps
    ``Predictor``'s: predictors that share one (the ladder rungs of ``ours``) name one owner."""
    owner = next(k for k in cls.__mro__ if hook in vars(k))
    return "" if owner is Predictor else f"{owner.__module__}.{owner.__qualname__}"


def _type_name(parameter) -> str:
    """``float`` for an annotation written as the class or as text (with or without
    ``from __future__ import annotations``); the default's type without one."""
    annotation = parameter.annotation
    if annotation is parameter.empty:
        return type(parameter.default).__name__
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def check_fields(described: dict[str, Any], fields) -> None:
    """Raise, naming the predictor's parameters and the closest, if a field is not one; and,
    when ``fields`` maps names to values, naming the allowed values if a value is not one
    (the class's ``param_choices``, else its constructor annotation). ``described`` is
    ``describe``'s answer."""
    name, annotations = described["name"], described["annotations"]
    valid = list(annotations)
    unknown = sorted(set(fields) - set(valid))
    if unknown:
        raise ValueError(f"predictor '{name}' has no parameter(s) {', '.join(unknown)}; "
                         f"its parameters: {', '.join(valid) or 'none'}.{closest(unknown[0], valid)}")
    for field, value in (fields.items() if isinstance(fields, dict) else ()):
        if problem := _value_problem(described, field, value):
            raise ValueError(f"predictor '{name}': {field}={value!r} is not allowed; "
                             f"{field} must be {problem}")


def _value_problem(described: dict[str, Any], field: str, value) -> str | None:
    choices = described["choices"].get(field)
    annotation = described["annotations"][field]
    types = TYPES.get(annotation)
    if choices is not None:
        return None if value in choices else f"one of {', '.join(map(str, choices))}"
    if types and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
        return f"of type {annotation}"
    if isinstance(value, float) and not math.isfinite(value):
        return "finite"
    low, high = described.get("bounds", {}).get(field, (None, None))
    if (low is not None and value < low) or (high is not None and value > high):
        return f"in [{'-inf' if low is None else low}, {'inf' if high is None else high}]"
    return None


def check_params(name: str, fields) -> None:
    """``check_fields`` for a predictor imported in this process."""
    check_fields(describe(name, get(name)), fields)


def build(name: str, params: dict[str, Any] | None = None) -> Predictor:
    params = dict(params or {})
    check_params(name, params)
    return get(name)(**params)
