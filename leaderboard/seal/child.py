"""``python -m leaderboard.seal.child JOB_FOLDER IN_FD OUT_FD``: the sealed side of a run;
``python -m leaderboard.seal.child --describe REQUEST OUT_FD``: the predictors described.

Started by ``leaderboard.seal.sandbox`` and ``leaderboard.seal.predictor_index`` only, as ``python -S``
inside the namespaces of ``leaderboard.seal.walls``. It confines itself before importing
anything that starts a thread (Landlock binds the threads created after it) and before any site
folder is added (so a ``.pth`` line only ever runs confined), has every open inside the watched
folders recorded (``guard.watch_opens``) and sent to the parent as it happens, then runs the
predictor (``leaderboard.seal.job``) and writes ``out/facts.json``. Messages to the parent go
as JSON lines over the pipe ``OUT_FD``, the last one ``{"done": true}``; answers come back over
``IN_FD``.
"""

from __future__ import annotations

import json
import site
import sys
import threading
from pathlib import Path

from leaderboard.seal import landlock
from leaderboard_core import guard


def _watch(request: dict) -> None:
    guard.watch_opens(guard.watch_roots(request["watch"], [*request["read"], *request["write"]],
                                        request["quiet"]))


def _add_site_folders(request: dict) -> None:
    """The parent's import path, once confined; ``addsitedir`` runs each folder's ``.pth``
    files as site processing would have, but now inside the walls."""
    for folder in request["sys_path"]:
        if folder not in sys.path:
            site.addsitedir(folder)


def describe(request: dict, answer_fd: int) -> None:
    """Register every predictor (those of ``request["folders"]`` too) once confined, sealed and
    watched as a run's child is, and write their descriptions, or the error that stopped it (a
    module that reached for sealed data when imported among them), as one JSON object to
    ``answer_fd``."""
    landlock.confine(request["read"], request["write"], request["list"])
    guard.seal_process("the import of the predictor modules")
    _watch(request)
    _add_site_folders(request)
    from predictors import registry  # noqa: PLC0415 - only once confined

    try:
        registry.discover()  # the suite's names first: a folder's module cannot take one
        for folder in request["folders"]:
            registry.include(folder)
        answer = {"predictors": {name: registry.describe(name, registry.get(name))
                                 for name in registry.names()}}
    except Exception as exc:  # noqa: BLE001 - a broken predictor module, told to the parent
        answer = {"error": f"registering the predictors failed: {type(exc).__name__}: {exc}"}
    if "check" in request and "error" not in answer:
        answer["check"] = _check(registry, request["check"])
    if "sections_of" in request and "error" not in answer:
        try:
            answer["sections"] = _sections(registry, request["sections_of"])
        except Exception as exc:  # noqa: BLE001 - a predictor's hook, told to the parent
            answer = {"error": f"a predictor's report_sections failed: {type(exc).__name__}: "
                               f"{exc}"}
    if tried := guard.attempts():
        answer = {"error": f"a predictor module reached for sealed data when imported (or "
                           f"checked, or asked for its report sections; first: {tried[0]}); no "
                           "predictor runs until that code is removed"}
    with open(answer_fd, "w") as out:
        out.write(json.dumps(answer, default=str))


def _check(registry, name: str) -> dict:
    """``predictors.checks.check_predictor`` of the predictor ``name``: the checks passed, or
    the rule it broke (any exception of its code too)."""
    from predictors.checks import check_predictor  # noqa: PLC0415 - only once confined

    try:
        return {"passed": check_predictor(registry.get(name))}
    except Exception as exc:  # noqa: BLE001 - the broken rule, told to the parent
        return {"failed": f"{type(exc).__name__}: {exc}"}


def _sections(registry, runs_file: str) -> list[str]:
    """Each distinct ``report_sections`` hook's lines (the ladder rungs of ``ours`` share
    theirs, so it is called once), from the runs the report wrote to ``runs_file``."""
    import polars as pl  # noqa: PLC0415 - only once confined

    from predictors.base import Predictor  # noqa: PLC0415

    runs, seen, lines = pl.read_ipc(runs_file), {Predictor}, []
    for name in registry.names():
        owner = next(k for k in registry.get(name).__mro__ if "report_sections" in vars(k))
        if owner not in seen:
            seen.add(owner)
            lines += [str(line) for line in registry.get(name).report_sections(runs)]
    return lines


def main(argv: list[str]) -> None:
    if argv[1] == "--describe":
        describe(json.loads(argv[2]), int(argv[3]))
        return
    folder, inbox_fd, outbox_fd = Path(argv[1]), int(argv[2]), int(argv[3])
    job = json.loads((folder / "in" / "job.json").read_text())
    confined = landlock.confine(job["read"], job["write"], job["list"])
    with open(inbox_fd) as inbox, open(outbox_fd, "w") as outbox:
        lock = threading.Lock()

        def send(message: dict) -> None:
            with lock:
                outbox.write(json.dumps(message) + "\n")
                outbox.flush()

        def ask(request: dict) -> dict:
            send(request)
            return json.loads(inbox.readline())

        guard.report_attempts(lambda attempt: send({"attempt": attempt}))
        _watch(job)
        _add_site_folders(job)
        from leaderboard.seal import job as sandbox_job
        from leaderboard.seal import walls

        facts = sandbox_job.run(job, folder, ask, send)
        if left := walls.leftover_processes():
            facts["invalid_reasons"].append(
                f"the predictor left {len(left)} process(es) running after it finished (they "
                f"are killed with its namespace); a run's processes end with the run")
        facts["sandbox"] = "landlock" if confined else "process"
        (folder / "out" / "facts.json").write_text(json.dumps(facts))
        send({"done": True})


if __name__ == "__main__":
    main(sys.argv)
