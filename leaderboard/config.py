"""Composing the Hydra config outside ``@hydra.main`` (for the data and report commands)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from leaderboard import paths


def load_config(overrides: list[str] | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=str(paths.CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [])
