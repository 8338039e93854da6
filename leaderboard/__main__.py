"""``python -m leaderboard [key=value ...]``: the suite's main job.

Until predictors are registered, the main job builds the store when needed and lists what it
holds; with predictors it becomes the default leaderboard run.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig
from rich.console import Console

from leaderboard.data import list_datasets, print_table
from leaderboard.ingest import BuildError
from leaderboard.sources import SourceError
from leaderboard.specs import SpecError


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        rows = list_datasets(sources_root=cfg.sources.root, gpu_specs=cfg.gpu_specs)
    except (SourceError, SpecError, BuildError) as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    print_table(rows)


if __name__ == "__main__":
    main()
