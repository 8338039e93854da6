"""Content hashes for versions, and the code version results carry."""

from __future__ import annotations

import hashlib
import json
import subprocess
from functools import cache

from leaderboard_core import paths


def content_hash(*parts: object, length: int = 16) -> str:
    """A short stable hash of JSON-serializable parts."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


@cache
def code_version() -> str:
    """The git commit of the working tree, with ``-dirty`` when it has uncommitted changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=paths.REPO_ROOT, capture_output=True,
                             text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=paths.REPO_ROOT, capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


# Modules that present or move results but never change a run's numbers: editing them must not
# make every stored run stale.
PRESENTATION = {*(f"leaderboard/{name}" for name in (
    "report.py", "report_sections.py", "atlas.py", "ranking.py", "results.py", "rerun.py",
    "explain.py", "hub_export.py", "data.py", "cli.py", "__main__.py", "calibrate.py")),
    "leaderboard_core/report_tables.py", "predictors/ours/report.py", "predictors/ours/explain.py"}


@cache
def code_hash() -> str:
    """A hash of the code and configs that decide a run's numbers (Python and YAML under
    the code packages and conf/, less the presentation modules). Runs with another hash are
    stale, as in asv; edits to docs, tests or the report leave it unchanged."""
    files = sorted(p for d in (*paths.CODE_PACKAGES, "conf") for p in (paths.REPO_ROOT / d)
                   .rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
                   and p.relative_to(paths.REPO_ROOT).as_posix() not in PRESENTATION)
    return content_hash([(str(p.relative_to(paths.REPO_ROOT)), p.read_text()) for p in files])
