"""The Hydra config: predictor nodes from the predictor index, and composing it outside ``@hydra.main``."""

from __future__ import annotations

import sys

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from leaderboard.run.inputs import InputError, check_config
from leaderboard.seal import predictor_index
from leaderboard_core import paths
from leaderboard_core.naming import suggestion

# ``${in_repo:PATH}`` in conf: PATH taken from the repository root (an absolute PATH stays as it
# is), so relative places are the same from any folder.
OmegaConf.register_new_resolver("in_repo", lambda path: str(paths.REPO_ROOT / str(path)),
                                replace=True)
# ``${from_user:PATH}``: PATH taken from the working folder, as every path a user types is.
OmegaConf.register_new_resolver("from_user", lambda path: str(paths.from_user(str(path))),
                                replace=True)
# ``${predictor_names:}`` in the --help template: the registered names, folded.
OmegaConf.register_new_resolver(
    "predictor_names", lambda: ", ".join(predictor_index.names()), replace=True)

# The config groups (conf/<group>/*.yaml): ``group=choice`` picks a node, it is not a key.
GROUPS = ("predictor", "dataset", "split")


# What a command line may hand Hydra: these flags and, of Hydra's own keys, these. Everything
# else is refused by name, not by a list of doors: Hydra's flags take abbreviations
# (``--config-d``) and include ways to load code (``--experimental-rerun`` unpickles a file in
# the process that holds the ground truth), and its keys can set the environment
# (``hydra.job.env_set``), add config folders, callbacks or a ``_target_``.
FLAGS = ("-m", "--multirun", "-h", "--help", "--hydra-help", "--cfg=job", "--cfg=hydra",
         "--cfg=all", "--resolve")
HYDRA_KEYS = ("hydra/launcher", "hydra.launcher.", "hydra.sweep.dir", "hydra.run.dir")


def refuse_config_doors(argv) -> None:
    """Raise ``InputError`` for a flag or a Hydra key outside ``FLAGS`` and ``HYDRA_KEYS``,
    and for any ``_target_`` override: the harness composes only the suite's own configs and
    runs no code it was handed."""
    for arg in argv:
        key = arg.partition("=")[0]
        bare = key.lstrip("+~")
        if arg.startswith("-") and arg not in FLAGS:
            door = arg
        elif bare.startswith("hydra") and not bare.startswith(HYDRA_KEYS) or "_target_" in bare:
            door = key
        else:
            continue
        raise InputError(f"{door} is not taken: the harness composes only the suite's own configs "
                         f"(conf/) and runs no code it was handed (flags: {', '.join(FLAGS)}; "
                         "Hydra keys: hydra/launcher=local|slurm, hydra.launcher.<field>, "
                         "hydra.sweep.dir, hydra.run.dir); put a predictor in a folder and pass "
                         "predictors_path=DIR")


def include_predictors(overrides) -> None:
    """Register the predictors of ``predictors_path=DIR`` (a folder outside the repo) before
    Hydra composes, so that ``predictor=<name>`` finds their nodes."""
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key == "predictors_path" and value not in ("", "null"):
            predictor_index.include(value)


def register_predictor_nodes(overrides=()) -> None:
    """One ``predictor/<name>`` node per registered predictor (those of ``predictors_path``
    included), its keys the constructor's."""
    include_predictors(overrides)
    store = ConfigStore.instance()
    for name, described in predictor_index.index().items():
        store.store(group="predictor", name=name, node={"name": name, **described["defaults"]})


def dataset_names() -> list[str]:
    return sorted(p.stem for p in (paths.CONF_DIR / "dataset").glob("*.yaml"))


def stored_dataset_names() -> list[str]:
    from leaderboard.store.catalog import StoreCatalog

    with StoreCatalog() as catalog:
        return sorted(catalog.datasets())


def check_names(argv: list[str]) -> None:
    """Raise ``InputError`` for a ``predictor=`` or ``dataset=`` choice that names nothing, with
    the valid names and the closest one.

    A dataset the store holds without a ``conf/dataset`` file (a GPU added through a sources
    directory, e.g. ``<short_name>_vidur`` of a new aiconfigurator SKU) gets a node here; its
    home is its family's default (``homes.resolve``).
    """
    configured = dataset_names()
    stored: list[str] = []  # read from the store only when a name is not configured
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in ("predictor", "dataset") or not value:
            continue
        for choice in value.split(","):
            if key == "predictor":
                valid = predictor_index.names()
            elif choice in configured:
                continue
            else:
                stored = stored or stored_dataset_names()
                valid = sorted(set(configured) | set(stored))
                if choice in valid:
                    ConfigStore.instance().store(group="dataset", name=choice,
                                                 node={"name": choice, "home": None})
                    continue
            if choice not in valid:
                raise InputError(f"unknown {key} '{choice}'; {suggestion(choice, valid)}")


def unknown_key(overrides: list[str]) -> str | None:
    """The error for the first override whose key the config lacks (``dataset.hom=x``), with
    the keys beside it and the closest; None when every key exists. Hydra's own answer would
    suggest ``+dataset.hom=x``, which adds a key nothing reads. ``+``/``~`` overrides, Hydra's
    keys and flags, and ``predictor.<field>`` (checked against the predictor) are left alone."""
    chosen = (*GROUPS, "predictors_path")  # they decide which nodes, and so which keys, exist
    choices = [f"{k}={v.split(',')[0]}" for k, _, v in (a.partition("=") for a in overrides)
               if k in chosen and v]
    config = None
    for arg in overrides:
        key = arg.partition("=")[0]
        if key.startswith(("+", "~", "-", "hydra.", "hydra/", "predictor.")) or key in chosen:
            continue
        config = config if config is not None else load_config(choices)
        if message := _missing_part(config, key):
            return message
    return None


def _missing_part(config: DictConfig, key: str) -> str | None:
    """Walk ``key`` down the config; the error at the first part that is not there."""
    node, path = config, []
    for part in key.split("."):
        where = f"'{'.'.join(path)}'" if path else "the config"
        if not isinstance(node, DictConfig):
            return f"unknown key '{key}': {where} takes a value, not keys"
        if part not in node.keys():  # keys(), not `in`: a mandatory ``???`` value is a key
            return (f"unknown key '{key}': {where} has no '{part}'; "
                    f"{suggestion(part, sorted(node.keys()))}")
        node = None if OmegaConf.is_missing(node, part) else node[part]
        path.append(part)
    return None


def load_config(overrides: list[str] | None = None, with_hydra: bool = False) -> DictConfig:
    register_predictor_nodes(overrides or [])
    with initialize_config_dir(config_dir=str(paths.CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [],
                       return_hydra_config=with_hydra)


def command_config(argv: list[str], prog: str, doc: str, section: str,
                   old_flags: dict[str, str]) -> DictConfig:
    """The composed config of a ``python -m leaderboard.<command> key=value ...`` call.

    ``--help`` prints ``doc`` and the ``section`` keys with their defaults, then exits. A flag of
    ``old_flags`` (``"--out": "report.out"``; a flag mapped to ``"key=value"`` takes no value) is
    turned into its override with a one-line deprecation notice; kept for one release.
    """
    if {"-h", "--help"} & set(argv):
        print(f"usage: {prog} [key=value ...]\n\n{doc.strip()}\n\noverrides ({section}.*):\n"
              + OmegaConf.to_yaml(load_config()[section]).rstrip())
        raise SystemExit(0)
    overrides, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        flag, _, value = arg.partition("=")
        if flag not in old_flags:
            overrides.append(arg)
            continue
        key = old_flags[flag]
        override = key if "=" in key else f"{key}={value or (rest.pop(0) if rest else '')}"
        print(f"{prog}: {flag} is deprecated and goes in the next release; use {override}",
              file=sys.stderr)
        overrides.append(override)
    flags = [a for a in overrides if a.startswith("-")]
    if flags:
        raise InputError(f"unknown flag {flags[0]}: {prog} takes key=value overrides only "
                         f"(--help lists them)")
    refuse_config_doors(overrides)
    try:  # before the names are checked: a predictor of the folder is one of them
        include_predictors(overrides)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    check_names(overrides)
    if message := unknown_key(overrides):
        raise InputError(message)
    cfg = load_config(overrides)
    check_config(cfg)
    return cfg
