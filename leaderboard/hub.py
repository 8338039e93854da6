"""The datasets as a Hugging Face dataset: export the store to a folder, read one back.

``python -m leaderboard.hub hub.export=PATH [hub.only=[NAME,...]] [hub.overwrite=true]`` writes
every cell, op and serving dataset of the store (``hub.only``: those named, plus each one's
home) as a dataset folder:

    PATH/README.md                         the card; its YAML ``configs:`` lists every config
    PATH/catalog/catalog.parquet           config ``catalog``: name, kind, sku, version per dataset
    PATH/<name>/cells.parquet              config ``<name>``, split ``cells``
    PATH/<name>/lineage.parquet            config ``<name>_lineage``, split ``lineage``
    PATH/<sku>_ops/points.parquet          config ``<sku>_ops``, split ``points``
    PATH/<sku>_ops/collectives.parquet     config ``<sku>_collectives``: its all-reduce points
    PATH/<name>/targets.parquet            config ``<name>``, split ``targets``: a serving set
    PATH/coefficients/coefficients.parquet config ``coefficients``
    PATH/<name>/card.md                    the store's card of each dataset

Pushing it needs a write token (``hf auth login`` or ``HF_TOKEN``); the suite never pushes:

    hf upload <owner>/<name> PATH . --repo-type dataset
    # or: HfApi().upload_folder(repo_id="<owner>/<name>", folder_path=PATH, repo_type="dataset")

``hub_catalog.HubCatalog(repo, revision)`` reads such a folder, or a hub id, back.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console

from leaderboard_core import paths

PUSH_COMMAND = "hf upload <owner>/<name> {path} . --repo-type dataset"

stderr = Console(stderr=True)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def legacy_overrides(argv: list[str]) -> list[str]:
    """``export PATH [--only NAME ...] [--overwrite] [k=v ...]`` (the old form) as overrides."""
    path, rest = argv[1], argv[2:]
    out, only = [f"hub.export={path}"], []
    while rest:
        arg = rest.pop(0)
        if arg == "--overwrite":
            out.append("hub.overwrite=true")
        elif arg == "--only":
            while rest and not rest[0].startswith("-") and "=" not in rest[0]:
                only.append(rest.pop(0))
        else:
            out.append(arg)
    new = out + ([f"hub.only=[{','.join(only)}]"] if only else [])
    print(f"python -m leaderboard.hub: 'export PATH --only/--overwrite' is deprecated and goes in "
          f"the next release; use {' '.join(new)}", file=sys.stderr)
    return new


def main(argv: list[str] | None = None) -> int:
    from leaderboard.ingest import BuildError
    from leaderboard.ingest.sources import SourceError
    from leaderboard.present.hub_export import export
    from leaderboard.run.config import command_config
    from leaderboard_core.specs import SpecError

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"] and len(argv) > 1:
        argv = legacy_overrides(argv)
    cfg = command_config(argv, "python -m leaderboard.hub", __doc__, "hub",
                         {"--overwrite": "hub.overwrite=true"})
    if not cfg.hub.export:
        stderr.print("[bold red]error:[/] name the folder to export to: hub.export=PATH",
                     highlight=False)
        return 2
    path = Path(cfg.hub.export)
    started = time.perf_counter()
    try:
        rows = export(path, only=list(cfg.hub.only) if cfg.hub.only else None,
                      overwrite=cfg.hub.overwrite, sources_root=cfg.sources.root,
                      gpu_specs=cfg.gpu_specs, runs_dir=paths.from_user(cfg.runs_dir))
    except (SourceError, SpecError, BuildError, ValueError, FileExistsError) as exc:
        stderr.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    stderr.print(f"[bold]exported[/] {len(rows)} configs, {sum(rows.values()):,} rows, "
                 f"{folder_bytes(path) / 2**20:.1f} MiB to {path} in "
                 f"{time.perf_counter() - started:.1f} s. Push it with:\n  "
                 + PUSH_COMMAND.format(path=path), highlight=False, soft_wrap=True)
    return 0


if __name__ == "__main__":
    from leaderboard.run.inputs import guarded

    sys.exit(guarded(main, "python -m leaderboard.hub")())
