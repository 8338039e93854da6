"""Content hashes for versions, and the code version results carry."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from functools import cache

from leaderboard_core import paths


def content_hash(*parts: object, length: int = 16) -> str:
    """A short stable hash of JSON-serializable parts."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def release(version: str | None) -> tuple[int, ...] | None:
    """An engine version's release as numbers, to order versions: ``0.14.1`` -> (0, 14, 1),
    ``0.19.0rc1`` -> (0, 19, 0); None where the version does not start with dotted numbers
    (``unknown``, a commit hash such as ``82831f1``), which no comparison accepts."""
    found = re.match(r"(\d+(?:\.\d+)+)", version or "")
    return tuple(int(x) for x in found.group(1).split(".")) if found else None


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


# A module that presents or moves results but never changes a run's numbers says so with this
# line at module level; editing it must not make every stored run stale.
PRESENTATION_MARKER = "PRESENTATION = True"


def is_presentation(text: str) -> bool:
    return any(line.rstrip() == PRESENTATION_MARKER for line in text.splitlines())


@cache
def code_hash() -> str:
    """A hash of the code and configs that decide a run's numbers (Python and YAML under
    the code packages and conf/, less the modules marked ``PRESENTATION = True``). Runs
    with another hash are stale, as in asv; edits to docs, tests or the report leave it unchanged."""
    files = sorted(p for d in (*paths.CODE_PACKAGES, "conf") for p in (paths.REPO_ROOT / d)
                   .rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts)
    texts = [(str(p.relative_to(paths.REPO_ROOT)), p.read_text()) for p in files]
    return content_hash([(rel, text) for rel, text in texts
                         if not (rel.endswith(".py") and is_presentation(text))])
