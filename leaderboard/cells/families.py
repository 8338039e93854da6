"""Dataset families as data: one ``DatasetFamily`` per family, in a registry every part reads.

A family is the set of datasets ``<sku>_<suffix>`` built the same way (``h200_vidur`` is of the
``vidur`` family). Its entry says how it is built, what its ground truth is, which phases and
metrics apply, where a dataset of it fits by default and which protocols it joins: the store
build (``cells.build_all``), the homes (``homes.home_of``), the rerun, the report and the hub
export all read it from here. A new family is one ``register_family`` call (in its builder's
module or a test). Its ``home`` applies to every dataset of it, a GPU added later included; a
``conf/dataset/<name>.yaml`` is a config node, and names a home only to override the family's.

The builder is named by a ``"module:function"`` string and imported only when the store builds,
so reading the registry imports no builder (and no cycle through ``leaderboard.cells``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from leaderboard_core.naming import Registry

# The phases a step-level run is scored on: the groups of its cells.
PHASES = ("all", "all_cold", "replayed", "traffic", "prefill", "decode", "mixed")
# Beside "all": the cells none of whose ground truth came from an L2-warm point (warm_share 0).
COLD = "all_cold"
# Beside "all", where cells carry a replay ``weight``: the cells of "all" that replayed traces
# produced (weight > 0; the measured uniform batches that fill thin phases have weight 0), and
# those same cells counted as often as the replay produced them (the traffic a server sees).
REPLAYED, TRAFFIC = "replayed", "traffic"
# The main step family: every predictor has runs on the same unseen GPUs of it, so the site's
# pages compare like with like there, and the rerun draws run atlases for it alone.
MAIN = "vidur"
# "all" and "all_cold" leave out the cells labelled ``composed``: ground truth whose points may
# stand in for fewer calls than the engine makes (``_vidur``'s mixed steps). Their own phase
# still scores them.
# What a dataset scores: steps, single op calls, or serving metrics of a replayed load.
LEVELS = ("step", "op", "serving")


@dataclass(frozen=True)
class DatasetFamily:
    """What every dataset ``<sku>_<suffix>`` of one family shares.

    ``builder``: ``"module:function"`` (or the function itself) taking the store connection
    (and the GPU specs, with ``builder_takes_gpus``) and returning ``CellSet``s; several
    families may share one builder, which then runs once. None where the store builds the
    family elsewhere (op grids, serving targets). ``home``: the dataset a member fits on when
    its conf file names none; None means the A100 dataset of the family. ``two_homes``: the
    homes of the two-home protocol, run beside the one-home one (empty: not run).
    ``leave_one_out``: whether the leave-one-GPU-out protocol runs too. ``ranking``:
    whether its GPUs are ranked against each other per workload. ``op_grid``: whether the
    ``<sku>_ops`` grid holds every op family its cells read, so a home of it can give its whole
    grid (``full_grid``); an MoE family's experts are not in it. ``expert_tables``: whether its
    cells read aiconfigurator's fused-MoE tables under balanced routing, which ``every_shape``
    reads beside the GEMM, attention and all-reduce tables, so a home of it can give every
    shape (not the power-law variant's: ``every_shape`` reads balanced routing only).
    ``profile_grid``: whether ``every_shape`` reads the GPU's LLMServingSim vLLM profile
    instead, where a release version names it (``cells.ops.profile_points_at``).
    ``card_template``: the card of a dataset whose builder wrote none.
    """

    suffix: str
    level: str
    gt_kind: str
    title: str
    builder: str | Callable | None = None
    builder_takes_gpus: bool = False
    phases: tuple[str, ...] = PHASES
    home: str | None = None
    leaderboard: bool = True
    two_homes: tuple[str, ...] = ()
    leave_one_out: bool = False
    ranking: bool = False
    op_grid: bool = True  # the ``<sku>_ops`` grid holds every op its cells read (full_grid)
    expert_tables: bool = False
    profile_grid: bool = False
    card_template: str = "{name}: {title} dataset on the {sku}."

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"family {self.suffix}: level '{self.level}' is not one of "
                             f"{', '.join(LEVELS)}")

    def matches(self, dataset: str) -> bool:
        return dataset.endswith(f"_{self.suffix}")

    def card(self, name: str, sku: str) -> str:
        return self.card_template.format(name=name, sku=sku, title=self.title)

    def build(self, con, gpus) -> list:
        builder = self.builder
        if isinstance(builder, str):
            module, _, function = builder.partition(":")
            builder = getattr(importlib.import_module(module), function)
        return builder(con, gpus) if self.builder_takes_gpus else builder(con)


_FAMILIES: Registry[DatasetFamily] = Registry("dataset family", what="suffix")


def register_family(fam: DatasetFamily) -> DatasetFamily:
    """Add a family; a second family of the same suffix is refused."""
    return _FAMILIES.add(fam.suffix, fam)


def unregister_family(suffix: str) -> None:
    """Drop a family (tests that register a toy one undo it)."""
    _FAMILIES.drop(suffix)


def get(suffix: str) -> DatasetFamily:
    return _FAMILIES.get(suffix)


def suffix_of(dataset: str) -> str:
    """The family suffix of a dataset name (``h200_vidur19`` -> ``vidur19``): the longest
    registered suffix it ends with (``h200_vidur_fp8`` -> ``vidur_fp8``), else its last word."""
    known = [f.suffix for f in _FAMILIES if f.matches(dataset)]
    return max(known, key=len) if known else dataset.rsplit("_", 1)[-1]


def of(dataset: str) -> DatasetFamily | None:
    """The registered family of a dataset, or None (``hf`` and other one-off names)."""
    return _FAMILIES.find(suffix_of(dataset))


def where(**wanted) -> list[DatasetFamily]:
    """The families whose fields equal ``wanted`` (``where(level="step", leaderboard=True)``)."""
    return [f for f in _FAMILIES if all(getattr(f, k) == v for k, v in wanted.items())]


def suffixes(**wanted) -> tuple[str, ...]:
    return tuple(f.suffix for f in where(**wanted))


def builders() -> list[DatasetFamily]:
    """One family per distinct builder, in registration order."""
    seen: dict[str | Callable, DatasetFamily] = {}
    for fam in _FAMILIES:
        if fam.builder and fam.builder not in seen:
            seen[fam.builder] = fam
    return list(seen.values())


_VIDUR = "leaderboard.cells.vidur_method:build_vidur"
_PROFILES = "leaderboard.cells.profiles"
for _fam in (
    DatasetFamily("vidur", "step", "cells", "Vidur-composed steps over aiconfigurator's ops",
                  builder=_VIDUR, builder_takes_gpus=True, two_homes=("a100_vidur", "h100_vidur"),
                  leave_one_out=True,
                  ranking=True),
    DatasetFamily("vidur19", "step", "cells", "Vidur-composed steps at one vLLM version",
                  builder=_VIDUR, builder_takes_gpus=True, home="h100_vidur19"),
    DatasetFamily("vidur_fp8", "step", "cells", "Vidur-composed steps with FP8 GEMMs",
                  builder=_VIDUR, builder_takes_gpus=True, home="h100_vidur_fp8"),
    DatasetFamily("vidur_moe", "step", "cells", "Vidur-composed steps of mixture-of-experts models",
                  builder=_VIDUR, builder_takes_gpus=True, home="h100_vidur_moe",
                  op_grid=False, expert_tables=True),
    DatasetFamily("vidur_moe_ep", "step", "cells",
                  "Vidur-composed MoE steps, experts spread whole over the GPUs (expert parallel)",
                  builder=_VIDUR, builder_takes_gpus=True, home="h100_vidur_moe_ep",
                  op_grid=False, expert_tables=True),
    DatasetFamily("vidur_moe_powerlaw", "step", "cells",
                  "Vidur-composed MoE steps, experts timed under power-law routing",
                  builder=_VIDUR, builder_takes_gpus=True, op_grid=False),  # home: A100
    DatasetFamily("vidurprof", "step", "cells", "steps over Vidur's own profiles",
                  builder=f"{_PROFILES}:build_vidurprof"),
    DatasetFamily("splitwise", "step", "cells", "Splitwise's wall-clock steps",
                  builder="leaderboard.cells.wallclock:build_splitwise"),
    DatasetFamily("llmservingsim", "step", "cells", "steps over LLMServingSim's profiles",
                  builder=f"{_PROFILES}:build_llmservingsim", leaderboard=False, profile_grid=True,
                  home="a6000_llmservingsim"),  # the family has no A100 set
    DatasetFamily("ops", "op", "ops", "op level (`<sku>_ops`, one measured kernel per row)",
                  phases=("all", "gemm", "attn_prefill", "attn_decode")),
    DatasetFamily("silicon", "serving", "serving", "aiconfigurator's measured serving runs",
                  phases=("ttft", "tpot", "ttft_steady"), home="a100_vidur"),
    DatasetFamily("silicon_fp8", "serving", "serving", "aiconfigurator's measured FP8 serving runs",
                  phases=("ttft", "tpot", "ttft_steady"), home="h100_vidur_fp8"),  # the FP8 family's home
    DatasetFamily("silicon_moe", "serving", "serving",
                  "aiconfigurator's measured serving runs of MoE models",
                  phases=("ttft", "tpot", "ttft_steady"), home="h100_vidur_moe"),  # the MoE family's home
    DatasetFamily("serving", "serving", "serving", "recorded serving runs",
                  phases=("ttft", "tpot", "service"), home="a100_vidur"),
    # The A100 of these rows is a 40 GB SXM4 board; the family fits on the A100 80GB's step
    # set (the same GA100 chip), the step cells no e2e row can give.
    DatasetFamily("e2e", "serving", "serving",
                  "LLM-Inference-Bench's static batches, end to end across vendors",
                  phases=("e2e", "ttft"), home="a100_vidur"),
):
    register_family(_fam)


def on_leaderboard(name: str) -> bool:
    """The one definition of a leaderboard dataset: a dataset of a family registered with
    ``leaderboard=True``. ``rerun``, ``report``, ``submit`` and ``data list`` all ask here."""
    fam = of(name)
    return fam is not None and fam.leaderboard

