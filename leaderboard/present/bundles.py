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

What a bundle says of itself (its hashes, ``rankable``, its numbers) is a claim: nothing in a
file proves which code made it. So the report never takes the suite's own predictors from a
bundle, and verifies the others by rerunning (``verify_by_rerun``): the bundle carries its
predictor's source (``code/``), which must hash to the claimed code hash, and a sample of its
runs, rerun sealed from that code, must give the same numbers; else the whole bundle is
refused.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from leaderboard.score import results
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


MAX_BUNDLE = 4 << 30  # bytes a bundle may unpack to: a rerun's every run many times over


def _members(tar: tarfile.TarFile) -> dict[str, bytes]:
    """Every regular file of the bundle by name (``runs/`` and ``code/`` members and the
    manifest), refusing what no bundle of ours holds: more than ``MAX_BUNDLE`` bytes unpacked,
    a member over ``MAX_MEMBER``. Links, devices and paths that climb out are passed over."""
    members = [m for m in tar.getmembers() if m.isfile() and ".." not in m.name.split("/")
               and not m.name.startswith("/")]
    if sum(m.size for m in members) > MAX_BUNDLE:
        raise ValueError(f"it unpacks to more than {MAX_BUNDLE:,} bytes")
    found = {}
    for member in members:
        parts = member.name.split("/")
        if member.size > MAX_MEMBER:
            raise ValueError(f"{member.name} is {member.size:,} bytes, over {MAX_MEMBER:,}")
        if member.name == MANIFEST or (len(parts) == 3 and parts[0] == "runs"
                                       and parts[2] in RUN_FILES) or (
                len(parts) > 1 and parts[0] == "code" and member.name.endswith(".py")):
            found[member.name] = tar.extractfile(member).read()
    return found


def merge(bundles: list[Path], into: Path, versions: dict[str, str],
          own_code: dict[str, str], runs_dir: Path | None = None,
          verify: Callable[[dict[str, bytes], list[dict]], str | None] | None = None) -> Merged:
    """The runs of ``bundles`` that may join the report, copied into ``into``. ``versions``:
    the store's dataset versions; ``own_code``: the suite's own predictors (never taken from a
    bundle: the suite reruns them itself, and a bundle could otherwise replace their numbers);
    ``runs_dir``: the local runs (a bundled run may not reuse one of their ids); ``verify``:
    given the bundle's files and the runs about to merge, why they do not reproduce, or None
    (``verify_by_rerun``)."""
    merged = Merged(into)
    into.mkdir(parents=True, exist_ok=True)
    for path in bundles:
        taken, refused = [], []
        try:
            with tarfile.open(path, "r:gz") as tar:
                files = _members(tar)
            manifest = json.loads(files[MANIFEST])
            if manifest.get("harness_hash") != harness_hash():
                raise ValueError(f"made by harness {manifest.get('harness_hash')}, not today's "
                                 f"{harness_hash()}: rerun it with this harness")
            claimed = manifest.get("predictors", {})
            if own := sorted(set(claimed) & set(own_code)):
                raise ValueError(f"it claims the suite's own predictor(s) {own}, whose runs the "
                                 "suite makes itself")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, tarfile.TarError) as exc:
            merged.notes.append(f"refused {path}: {exc}")
            continue
        for run_id in sorted({name.split("/")[1] for name in files if name.startswith("runs/")}):
            why = _refusal(files, run_id, claimed, versions, into, runs_dir)
            if why:
                refused.append(f"{run_id}: {why}")
            else:
                taken.append(run_id)
        runs = [json.loads(files[f"runs/{r}/metrics.json"]) for r in taken]
        if taken and verify is not None and (why := verify(files, runs)):
            merged.notes.append(f"refused {path}: its runs do not reproduce ({why})")
            continue
        for run_id in taken:
            folder = into / run_id
            folder.mkdir()
            for name in RUN_FILES:
                (folder / name).write_bytes(files[f"runs/{run_id}/{name}"])
        merged.code.update({n: p["code_hash"] for n, p in claimed.items()})
        merged.notes.append(f"merged {len(taken)} run(s) of {', '.join(sorted(claimed))} from "
                            f"{path}" + (f"; refused {len(refused)} ({'; '.join(refused[:3])})"
                                         if refused else ""))
    return merged


def _refusal(files: dict[str, bytes], run_id: str, claimed: dict, versions: dict[str, str],
             into: Path, runs_dir: Path | None) -> str | None:
    """Why one bundled run may not join the report, or None."""
    if any(f"runs/{run_id}/{name}" not in files for name in RUN_FILES):
        return "incomplete"
    if (into / run_id).exists() or (runs_dir is not None and (Path(runs_dir) / run_id).exists()):
        return "a run of that id is already in the report"
    try:
        metrics = json.loads(files[f"runs/{run_id}/metrics.json"])
        name = metrics["predictor"]
    except (ValueError, KeyError, TypeError):
        return "metrics.json does not read"
    if metrics.get("run_id") != run_id:
        return f"its metrics.json names run {metrics.get('run_id')!r}"
    if name not in claimed or metrics.get("code_hash") != claimed[name].get("code_hash"):
        return f"predictor {name!r} or its code hash is not the bundle's"
    if metrics.get("harness_hash") != harness_hash():
        return "made by another harness"
    if versions.get(metrics.get("dataset")) != metrics.get("dataset_version"):
        return f"{metrics.get('dataset')} at another dataset version"
    if metrics.get("rankable") is not True or metrics.get("valid") is not True:
        return f"not a rankable VALID run ({'; '.join(metrics.get('unrankable_because') or [])})"
    return None


def verify_by_rerun(files: dict[str, bytes], runs: list[dict], scratch: Path,
                    sample: int) -> str | None:
    """Rerun ``sample`` of the bundle's ``runs`` (chosen by run id, so the choice is the same
    each time) from the bundle's own code, sealed as any run, and hold each against what the
    bundle says: the code must hash to the claimed code hash and every phase must come out the
    same. Why not, or None."""
    try:
        return _rerun_differs(files, runs, scratch, sample)
    except Exception as exc:  # noqa: BLE001 - a bundle's code that does not load or run
        return f"its code does not rerun: {type(exc).__name__}: {exc}"


def _rerun_differs(files: dict[str, bytes], runs: list[dict], scratch: Path,
                   sample: int) -> str | None:
    from leaderboard.seal import predictor_index

    code = scratch / "code"
    shutil.rmtree(code, ignore_errors=True)
    for name, data in files.items():
        if name.startswith("code/"):
            (code / name[5:]).parent.mkdir(parents=True, exist_ok=True)
            (code / name[5:]).write_bytes(data)
    if not code.is_dir():
        return "the bundle carries no code to rerun"
    # The bundle's code alone is registered while it reruns: the merger's own predictors_path
    # folders may hold the same module (the author merging their own bundle), which would
    # shadow it, and the scratch folder must not stay registered once it is removed.
    # predictor_index offers no way to take a folder out again, hence its list, restored.
    given = list(predictor_index._FOLDERS)
    predictor_index._FOLDERS[:] = []
    try:
        predictor_index.include(code)
        return _reruns_differ(runs, code, scratch, sample)
    finally:
        predictor_index._FOLDERS[:] = given


def _reruns_differ(runs: list[dict], code: Path, scratch: Path, sample: int) -> str | None:
    from leaderboard.run.evaluate import RunSpec, run
    from leaderboard.seal import predictor_index
    from leaderboard.store import database
    from leaderboard_core.versioning import predictor_code_hash

    database.ensure()  # the reruns read it; a run never builds it
    for claimed in sorted(runs, key=lambda m: m["run_id"])[:sample]:
        described = predictor_index.get(claimed["predictor"])
        if predictor_code_hash(described["module"], str(code)) != claimed["code_hash"]:
            return f"its code does not hash to {claimed['predictor']}'s {claimed['code_hash']}"
        again = run(RunSpec(claimed["predictor"], claimed["dataset"], {},
                            runs_dir=scratch / "verify-runs")).metrics
        if json.dumps(again["phases"], sort_keys=True) != json.dumps(claimed["phases"],
                                                                     sort_keys=True):
            return (f"{claimed['predictor']} on {claimed['dataset']}: all-phase MAPE "
                    f"{again['phases'].get('all', {}).get('mape')} on rerun, "
                    f"{claimed['phases'].get('all', {}).get('mape')} in the bundle")
    return None


def scratch(parent: Path) -> Path:
    """A fresh folder for merged runs under ``parent`` (emptied first)."""
    folder = parent / ".merged-bundles"
    shutil.rmtree(folder, ignore_errors=True)
    return folder

# Moves results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
