"""``python -m leaderboard.reference``: aiconfigurator's own TTFT and TPOT estimate of every
closed-loop serving target on a GPU it has tables for, written to
``results/aiconfigurator-reference.json`` for the report's serving section.

aiconfigurator bundles measured kernel tables of the very GPUs it is asked about, so the seal
refuses any environment that holds it: this command installs the pinned release
(``aiconfigurator_section.VERSION``) into a virtualenv of its own under the suite's home
(``$LEADERBOARD_HOME/venvs/aiconfigurator-<version>``, made once, from the package registry),
and asks it from there (``present/aiconfigurator_worker.py``, which imports nothing of the
suite). Its answers are an in-sample reference: shown beside the replay's oracle, never ranked.
About 1 s a target on one core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import venv
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from leaderboard.present import aiconfigurator_section as reference
from leaderboard.store import database
from leaderboard.store.catalog import StoreCatalog
from leaderboard_core import paths
from leaderboard_core.specs import load_models
from leaderboard_core.versioning import code_version

WORKER = Path(reference.__file__).with_name("aiconfigurator_worker.py")
stderr = Console(stderr=True)


def environment() -> Path:
    """The python of aiconfigurator's own virtualenv, made and filled first where missing."""
    folder = paths.home() / "venvs" / f"aiconfigurator-{reference.VERSION}"
    python = folder / "bin" / "python"
    if python.is_file() and subprocess.run([python, "-c", "import aiconfigurator"],
                                           capture_output=True).returncode == 0:
        return python
    stderr.print(f"reference: installing aiconfigurator=={reference.VERSION} into {folder} "
                 "(once; about 120 MB)", highlight=False)
    venv.create(folder, with_pip=True, clear=True)
    done = subprocess.run([python, "-m", "pip", "install", "-q",
                           f"aiconfigurator=={reference.VERSION}"], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"pip could not install aiconfigurator=={reference.VERSION} into "
                           f"{folder} (no package registry reachable?): "
                           f"{done.stderr.strip().splitlines()[-1] if done.stderr else done.returncode}")
    return python


def estimate(python: Path, asked: list[dict]) -> list[dict]:
    """The worker's answers to ``asked``, run in aiconfigurator's environment with nothing of
    this one's (no PYTHONPATH, no user site)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LEADERBOARD"))}
    with tempfile.TemporaryDirectory() as scratch:
        requests, answers = Path(scratch) / "requests.json", Path(scratch) / "estimates.json"
        requests.write_text(json.dumps(asked))
        subprocess.run([python, "-I", WORKER, requests, answers], env=env, check=True,
                       cwd=scratch)
        return json.loads(answers.read_text())


def main(argv: list[str]) -> int:
    from leaderboard.run.config import command_config  # noqa: PLC0415

    cfg = command_config(argv, "python -m leaderboard.reference", __doc__, "report", {})
    database.ensure(cfg.sources.root, cfg.gpu_specs)
    with StoreCatalog(cfg.sources.root, cfg.gpu_specs) as catalog:
        targets = [catalog.serving_targets(name) for name, row in catalog.datasets().items()
                   if row["kind"] == "serving"]
    import polars as pl  # noqa: PLC0415

    asked = reference.requests(pl.concat(targets, how="diagonal_relaxed"), load_models())
    python = environment()
    stderr.print(f"reference: {len(asked)} closed-loop targets on "
                 f"{', '.join(sorted({a['system'] for a in asked}))}", highlight=False)
    answers = estimate(python, asked)
    versions = {f"{a['backend']}": e["database_version"] for a, e in zip(asked, answers, strict=True)
                if "database_version" in e}
    out = {"aiconfigurator": reference.VERSION, "database_versions": versions,
           "made": datetime.now(UTC).strftime("%Y-%m-%d"), "code_version": code_version(),
           "estimates": answers}
    partial = reference.REFERENCE_FILE.with_suffix(".partial")
    partial.write_text(json.dumps(out, indent=1) + "\n")
    partial.replace(reference.REFERENCE_FILE)
    failed = sum("error" in a for a in answers)
    stderr.print(f"reference: wrote {reference.REFERENCE_FILE} ({len(answers) - failed} answered, "
                 f"{failed} not)", highlight=False)
    return 0


if __name__ == "__main__":
    from leaderboard.run.inputs import guarded

    sys.exit(guarded(main, "python -m leaderboard.reference")(sys.argv[1:]))

# Presents or moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
