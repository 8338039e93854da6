"""Results bundles: a predictor's runs in one file someone can send in, and the report's merge.

A bundle is a ``.tar.gz`` holding ``bundle.json`` (the predictors, their code hashes and folder
name, the harness hash, the dataset versions) and ``runs/<run_id>/{metrics.json,
predictions.parquet}``. MTEB's path: a model author runs one command and sends the result files;
the leaderboard reads them without rerunning anything.

The report merges a bundle's run only when it was made by today's harness (``harness_hash``),
on the store's dataset versions, sealed and rankable, and does not claim a name the suite's
own predictors hold with other code. Anything else is refused, with the reason, and the rest of
the bundle still merges. A bundle is a hostile file: members are read only as regular files
under ``runs/``, never extracted by path.

What a bundle says of itself (its hashes, ``rankable``, its errors) is a claim: nothing in a
file proves which code made it. The bundle carries its predictor's source (``code/``) so that
the maintainer who merges it can read it and rerun it (``python -m leaderboard.rerun
predictor=NAME predictors_path=<the code>``) before publishing; the report's merge checks
consistency, not authenticity.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from leaderboard import results
from leaderboard_core.versioning import harness_hash

MANIFEST = "bundle.json"
MAX_MEMBER = 256 << 20  # bytes: the largest predictions.parquet of a run, many times over
RUN_FILES = results.RUN_FILES


@dataclass
class Merged:
    """What the report takes from bundles: run folders (in ``folder``), the code hash each
    bundled predictor's runs carry, and a line per bundle on what merged and what did not."""

    folder: Path
    code: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def write(run_folders: list[Path], out: Path, predictors: dict[str, dict],
          code: list[Path] = (), code_root: Path | None = None) -> Path:
    """A bundle of ``run_folders`` at ``out`` (written under a temporary name, then renamed);
    ``predictors`` maps each name to its card, code hash and folder name. ``code``: the files
    the predictor's module imports from its folder (``code_root``), carried as ``code/<path>``
    so that whoever merges the bundle can read the code and rerun it to check its numbers."""
    versions = {}
    for folder in run_folders:
        metrics = json.loads((folder / "metrics.json").read_text())
        versions[metrics["dataset"]] = metrics["dataset_version"]
    manifest = {"predictors": predictors, "harness_hash": harness_hash(),
                "dataset_versions": versions, "runs": len(run_folders),
                "created_at": datetime.now(UTC).isoformat(timespec="seconds")}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    with tarfile.open(partial, "w:gz") as tar:
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for folder in run_folders:
            for name in RUN_FILES:
                tar.add(folder / name, arcname=f"runs/{folder.name}/{name}")
        for path in code:
            tar.add(path, arcname=f"code/{path.relative_to(code_root).as_posix()}")
    partial.replace(out)
    return out


def _members(tar: tarfile.TarFile) -> dict[str, bytes]:
    """Every regular file of the bundle by name, refusing what no bundle of ours holds."""
    found = {}
    for member in tar.getmembers():
        parts = member.name.split("/")
        if not member.isfile() or ".." in parts or member.name.startswith("/"):
            continue
        if member.size > MAX_MEMBER:
            raise ValueError(f"{member.name} is {member.size:,} bytes, over {MAX_MEMBER:,}")
        if member.name == MANIFEST or (len(parts) == 3 and parts[0] == "runs"
                                       and parts[2] in RUN_FILES):
            found[member.name] = tar.extractfile(member).read()
    return found


def merge(bundles: list[Path], into: Path, versions: dict[str, str],
          own_code: dict[str, str]) -> Merged:
    """The runs of ``bundles`` that may join the report, copied into ``into``. ``versions``:
    the store's dataset versions; ``own_code``: the code hash of each predictor this suite
    holds (a bundle cannot bring another implementation under one of those names)."""
    merged = Merged(into)
    into.mkdir(parents=True, exist_ok=True)
    for path in bundles:
        taken, refused = 0, []
        try:
            with tarfile.open(path, "r:gz") as tar:
                files = _members(tar)
            manifest = json.loads(files[MANIFEST])
            if manifest.get("harness_hash") != harness_hash():
                raise ValueError(f"made by harness {manifest.get('harness_hash')}, not today's "
                                 f"{harness_hash()}: rerun it with this harness")
        except (OSError, ValueError, KeyError, tarfile.TarError) as exc:
            merged.notes.append(f"refused {path}: {exc}")
            continue
        claimed = manifest.get("predictors", {})
        for run_id in sorted({name.split("/")[1] for name in files if name.startswith("runs/")}):
            why = _refusal(files, run_id, claimed, versions, own_code, into)
            if why:
                refused.append(f"{run_id}: {why}")
                continue
            folder = into / run_id
            folder.mkdir()
            for name in RUN_FILES:
                (folder / name).write_bytes(files[f"runs/{run_id}/{name}"])
            taken += 1
        merged.code.update({n: p["code_hash"] for n, p in claimed.items() if n not in own_code})
        merged.notes.append(f"merged {taken} run(s) of {', '.join(sorted(claimed))} from {path}"
                            + (f"; refused {len(refused)} ({'; '.join(refused[:3])})"
                               if refused else ""))
    return merged


def _refusal(files: dict[str, bytes], run_id: str, claimed: dict, versions: dict[str, str],
             own_code: dict[str, str], into: Path) -> str | None:
    """Why one bundled run may not join the report, or None."""
    if any(f"runs/{run_id}/{name}" not in files for name in RUN_FILES):
        return "incomplete"
    if (into / run_id).exists():
        return "a run of that id is already merged"
    try:
        metrics = json.loads(files[f"runs/{run_id}/metrics.json"])
        name = metrics["predictor"]
    except (ValueError, KeyError, TypeError):
        return "metrics.json does not read"
    if name not in claimed or metrics.get("code_hash") != claimed[name].get("code_hash"):
        return f"predictor {name!r} or its code hash is not the bundle's"
    if name in own_code and own_code[name] != metrics.get("code_hash"):
        return f"{name!r} is a predictor of the suite's own, at other code"
    if metrics.get("harness_hash") != harness_hash():
        return "made by another harness"
    if versions.get(metrics.get("dataset")) != metrics.get("dataset_version"):
        return f"{metrics.get('dataset')} at another dataset version"
    if metrics.get("rankable") is not True:
        return f"not rankable ({'; '.join(metrics.get('unrankable_because') or ['unrecorded'])})"
    return None


def scratch(parent: Path) -> Path:
    """A fresh folder for merged runs under ``parent`` (emptied first)."""
    folder = parent / ".merged-bundles"
    shutil.rmtree(folder, ignore_errors=True)
    return folder

# Moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
