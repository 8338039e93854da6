"""Reading the datasets back from an exported folder or a Hugging Face dataset id:
``HubCatalog(repo, revision)`` gives what ``StoreCatalog`` gives, through
``datasets.load_dataset``, so a run scores the same way whichever it reads. The folder layout is
``hub_layout``'s; ``python -m leaderboard.hub`` writes it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import polars as pl

from leaderboard.cells.ops import COLLECTIVE_SCHEMA, MOE_SCHEMA
from leaderboard.cells.ops import SCHEMA as OP_SCHEMA
from leaderboard.cells.schema import CELL_SCHEMA, LINEAGE_SCHEMA
from leaderboard.cells.serving_targets import TARGET_SCHEMA
from leaderboard.ingest.tables import TABLES
from leaderboard.store.hub_layout import CATALOG_SCHEMA, collectives_config, lineage_config
from leaderboard_core import guard, paths

# The store holds its categorical provenance columns as VARCHAR; a read gives String.
COEFFICIENT_SCHEMA = {c: pl.String if t == pl.Categorical else t
                      for c, t in TABLES["coefficients"].schema.items()}
# Without a bound the Hugging Face client retries an unreachable hub for about 20 s.
PROBE_TIMEOUT_S = 3.0


class HubError(ValueError):
    """A hub dataset cannot be read; the message names the repo, the endpoint and the fix."""


def cache_dir() -> Path:
    """Where ``load_dataset`` keeps its prepared Arrow files: under the suite's home, like all
    else it writes (hub downloads themselves stay in Hugging Face's own hub cache)."""
    return paths.home() / "hf_datasets"


def _unreachable(what: str, endpoint: str, reason: str) -> HubError:
    return HubError(
        f"cannot reach the Hugging Face Hub at {endpoint} to load {what} ({reason}). Either "
        "export the datasets to a local folder (python -m leaderboard.hub hub.export=PATH, where "
        "the store is) and pass dataset.repo=PATH, or set HF_HUB_OFFLINE=1 before starting to read a "
        "copy already in the local Hugging Face cache.")


def require_reachable(repo: str) -> None:
    """Fail within ``PROBE_TIMEOUT_S`` when the hub endpoint does not answer at all.

    Offline mode needs no probe: ``load_dataset`` then reads the local cache only and fails at
    once. Any HTTP answer, even an error status, means the endpoint is reachable.
    """
    from datasets import config as hf_config

    if hf_config.HF_HUB_OFFLINE:
        return
    request = urllib.request.Request(hf_config.HF_ENDPOINT, method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return
    except OSError as exc:  # URLError, refused, timed out, unknown host
        reason = getattr(exc, "reason", exc)
        raise _unreachable(f"'{repo}'", hf_config.HF_ENDPOINT,
                           f"{reason}; gave up after {PROBE_TIMEOUT_S:.0f} s") from exc


class HubCatalog:
    """An exported folder or a hub id, read through ``datasets.load_dataset``.

    ``revision`` pins a hub commit, branch or tag; a local folder has no revisions.
    """

    def __init__(self, repo: str, revision: str | None = None):
        guard.check("open a hub dataset")
        self.repo, self.revision = repo, revision
        folder = Path(repo).expanduser()
        if folder.is_dir():
            self.repo = str(folder.resolve())
        elif repo.startswith(("/", ".", "~")):
            raise HubError(f"no exported dataset folder at {folder}; write one with "
                           f"python -m leaderboard.hub hub.export={repo}")
        else:
            require_reachable(repo)
        self._rows: dict[str, dict] | None = None

    def __enter__(self) -> HubCatalog:
        return self

    def __exit__(self, *exc) -> None:
        pass  # load_dataset holds no connection between reads

    def _load(self, config: str, split: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        import datasets as hf_datasets  # about 1 s to import: only a hub run pays for it

        try:
            table = hf_datasets.load_dataset(self.repo, name=config, split=split,
                                             revision=self.revision, cache_dir=str(cache_dir()))
        except ConnectionError as exc:  # offline and not cached, or the hub went away mid-run
            from datasets import config as hf_config

            offline = ("HF_HUB_OFFLINE is set and it is not in the local cache"
                       if hf_config.HF_HUB_OFFLINE else str(exc))
            raise _unreachable(f"'{self.repo}' config '{config}'", hf_config.HF_ENDPOINT,
                               offline) from exc
        except FileNotFoundError as exc:  # the hub answered: no such repo, revision or file
            raise HubError(f"'{self.repo}' config '{config}' (revision {self.revision or 'main'}) "
                           f"was not found: {exc}") from exc
        frame = pl.from_arrow(table.data.table)
        return frame.select([pl.col(c).cast(t) for c, t in schema.items()])

    def datasets(self) -> dict[str, dict]:
        if self._rows is None:
            frame = self._load("catalog", "catalog", CATALOG_SCHEMA)
            self._rows = {r["name"]: {k: r[k] for k in ("name", "kind", "sku", "version",
                                                        "backend_versions")}
                          for r in frame.iter_rows(named=True)}
        return self._rows

    def _kind(self, name: str) -> str | None:
        return self.datasets().get(name, {}).get("kind")

    def cells(self, name: str) -> pl.DataFrame:
        # Like the store: a name that is not a cell dataset has no cells.
        if self._kind(name) != "cells":
            return pl.DataFrame(schema=CELL_SCHEMA)
        return self._load(name, "cells", CELL_SCHEMA)

    def lineage(self, name: str) -> pl.DataFrame:
        if self._kind(name) != "cells":
            return pl.DataFrame(schema=LINEAGE_SCHEMA)
        return self._load(lineage_config(name), "lineage", LINEAGE_SCHEMA)

    def op_points(self, name: str) -> pl.DataFrame:
        if self._kind(name) != "ops":
            raise HubError(f"'{name}' is not an op dataset of {self.repo}")
        return self._load(name, "points", OP_SCHEMA)

    def op_points_at(self, sku: str, version: str) -> pl.DataFrame:
        # An export holds each GPU's op grid at its ``_ops`` version only.
        return self.op_points(f"{sku}_ops").filter(backend_version=version)

    def profile_points_at(self, sku: str, version: str, models: dict) -> pl.DataFrame:
        raise HubError(f"{self.repo} holds no LLMServingSim profile points ({sku} at {version}); "
                       "an export carries each GPU's aiconfigurator op grid only, so read this "
                       "home from the local store, or pass split.home_points=behind_cells")

    def moe_points_at(self, sku: str, version: str) -> pl.DataFrame:
        # An export carries no fused-MoE table: a home reading one gets none, and a predictor
        # that needs experts refuses the run ("the home measured no moe points").
        return pl.DataFrame(schema=MOE_SCHEMA)

    def collective_points(self, sku: str, version: str) -> pl.DataFrame:
        if self._kind(f"{sku}_ops") != "ops":
            raise HubError(f"{self.repo} holds no {sku}_ops, so no {sku} all-reduce points for a "
                           "full-grid home; export it, or pass split.home_points=behind_cells")
        points = self._load(collectives_config(sku), "collectives", COLLECTIVE_SCHEMA)
        return points.filter(version=version)

    def serving_targets(self, name: str) -> pl.DataFrame:
        if self._kind(name) != "serving":
            raise HubError(f"'{name}' is not a serving dataset of {self.repo}")
        return self._load(name, "targets", TARGET_SCHEMA)

    def coefficients(self) -> pl.DataFrame:
        return self._load("coefficients", "coefficients", COEFFICIENT_SCHEMA)
