"""The README's times, measured: run each example as a newcomer would and write the table.

Everything runs in a fresh temporary ``LEADERBOARD_HOME``, so the first command builds the
store and the first forest fit is uncached, as on a new machine; each example is timed once,
in README order, and a few twice (``again``) where a cache makes the second run faster.
``--make-test`` also times ``make test`` on a fresh clone of HEAD beside this checkout, its
``.venv`` made first, as CI runs it (about fifteen minutes). The result goes to
``benchmarks/readme_times.json`` and, between its markers, to the README's "Measured times"
table:

    .venv/bin/python benchmarks/readme_times.py [--make-test]

Run it on a quiet machine: the times are wall times, and anything else running inflates them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
OUT = REPO / "benchmarks" / "readme_times.json"
BEGIN, END = "<!-- BEGIN measured times: benchmarks/readme_times.py -->", "<!-- END measured times -->"

# (what it is, the command as the README shows it, how many times to run it). ``{tmp}`` is a
# scratch folder; runs land there, never in the repository.
EXAMPLES = [
    ("first command on a new machine: builds the store", "python -m leaderboard.data build", 1),
    ("list the datasets", "python -m leaderboard.data list", 1),
    ("the default run (what `make run` runs)", "python -m leaderboard runs_dir={tmp}/runs", 1),
    ("a forest baseline; again with its forests cached",
     "python -m leaderboard predictor=rf_scaled dataset=h200_vidur runs_dir={tmp}/runs", 2),
    ("the home, held-out cells only",
     "python -m leaderboard predictor=genz_calibrated dataset=a100_vidur runs_dir={tmp}/runs", 1),
    ("home points behind the training cells only",
     "python -m leaderboard predictor=rf_scaled dataset=a100_vidur "
     "split.home_points=behind_cells runs_dir={tmp}/runs", 1),
    ("the home out of sample: whole configurations and their shapes held out",
     "python -m leaderboard predictor=table_scaled dataset=a100_vidur "
     "split.home_points=held_out_shapes runs_dir={tmp}/runs", 1),
    ("two homes", "python -m leaderboard predictor=genz_calibrated dataset=h200_vidur "
                  "dataset.home=[a100_vidur,h100_vidur] runs_dir={tmp}/runs", 1),
    ("leave one GPU out (the other five are the homes)",
     "python -m leaderboard predictor=ours dataset=h100_vidur dataset.home=logo "
     "runs_dir={tmp}/runs", 1),
    ("a serving set: the replay's TTFT and TPOT",
     "python -m leaderboard predictor=ours dataset=h100_silicon runs_dir={tmp}/runs", 1),
    ("the serving oracle (the target's own kernel tables)",
     "python -m leaderboard predictor=table_scaled dataset=h100_silicon dataset.home=h100_vidur "
     "split.home_points=every_shape runs_dir={tmp}/runs", 1),
    ("mixture-of-experts steps (Mixtral-8x7B, Qwen3-30B-A3B)",
     "python -m leaderboard predictor=ours dataset=h200_vidur_moe runs_dir={tmp}/runs", 1),
    ("MoE serving (MiniMax-M2.5, Qwen3-235B-A22B, FP8)",
     "python -m leaderboard predictor=ours dataset=h200_silicon_moe runs_dir={tmp}/runs", 1),
    ("op-level scoring",
     "python -m leaderboard predictor=llm_viewer dataset=h200_sxm_ops runs_dir={tmp}/runs", 1),
    ("a sweep of 4 runs, 2 processes",
     "python -m leaderboard -m predictor=rf_scaled,ours dataset=h100_vidur,h200_vidur "
     "runs_dir={tmp}/runs", 1),
    ("one cell explained", "python -m leaderboard.explain predictor=ours dataset=h200_vidur", 1),
    ("the 3 worst cells explained",
     "python -m leaderboard.explain predictor=ours dataset=h200_vidur explain.worst=3", 1),
    ("export every dataset for the hub", "python -m leaderboard.hub hub.export={tmp}/export", 1),
    ("RESULTS.md from the runs in results/runs (written to a scratch file)",
     "python -m leaderboard.report report.out={tmp}/RESULTS.md report.atlas_dir={tmp}/atlas "
     "report.partial=replace", 1),
    ("an outside predictor (docs/predictors.md's example) scored on every leaderboard dataset",
     "python -m leaderboard.submit predictor=token_line predictors_path={tmp}/my_predictors "
     "runs_dir={tmp}/mine submit.out={tmp}/token_line.tar.gz", 1),
    ("RESULTS.md from the published runs and that bundle, as in a fresh clone (no runs)",
     "python -m leaderboard.report runs_dir={tmp}/fresh report.bundles=[{tmp}/token_line.tar.gz] "
     "predictors_path={tmp}/my_predictors report.out={tmp}/RESULTS-with-mine.md "
     "report.atlas_dir={tmp}/atlas-mine report.partial=replace", 1),
    ("the static site from those runs", "python -m leaderboard.site runs_dir={tmp}/fresh "
                                        "site.out={tmp}/site", 1),
]


def docs_example(folder: Path) -> Path:
    """docs/predictors.md's complete example, saved where its reader would save it."""
    text = (REPO / "docs" / "predictors.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "@register(" in b]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token_line.py").write_text(code)
    return folder


def timed(command: str, env: dict, cwd: Path) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(shlex.split(command), cwd=cwd, env=env, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        print(f"{command}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}",
              file=sys.stderr)
    return seconds, done.returncode


def fresh_clone_make_test(env: dict) -> tuple[float, int]:
    """``make test`` as CI runs it: on a clone of the committed HEAD, beside this checkout (so
    ``../shared`` is found as it is here), with a ``.venv`` of its own; the clone is removed."""
    clone = REPO.parent / f".{REPO.name}-readme-times-{os.getpid()}"  # ../shared as for REPO
    try:
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        return timed("make test", env, clone)
    finally:
        shutil.rmtree(clone, ignore_errors=True)


def measure(make_test: bool) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="leaderboard-times-") as tmp:
        env = {**os.environ, "LEADERBOARD_HOME": str(Path(tmp) / "home")}
        bin_dir = str(Path(sys.executable).parent)  # `python` is this interpreter
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
        docs_example(Path(tmp) / "my_predictors")
        for what, command, repeats in EXAMPLES:
            times = []
            for _ in range(repeats):
                seconds, rc = timed(command.format(tmp=tmp), env, REPO)
                times.append(round(seconds, 1))
                print(f"{seconds:7.1f} s  rc {rc}  {command}", file=sys.stderr)
            rows.append({"what": what, "command": command.replace(" runs_dir={tmp}/runs", "")
                         .replace("{tmp}", "/tmp"), "seconds": times, "rc": rc})
        if make_test:
            seconds, rc = fresh_clone_make_test(env)
            rows.append({"what": "the whole test suite on a fresh clone (its .venv made first)",
                         "command": "make test", "seconds": [round(seconds, 1)], "rc": rc})
            print(f"{seconds:7.1f} s  rc {rc}  make test", file=sys.stderr)
    return {"rows": rows, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.release()}, "
                       f"Python {platform.python_version()}",
            "load_average_1min": os.getloadavg()[0]}


def markdown(result: dict) -> str:
    lines = [BEGIN, "", f"Measured by `python benchmarks/readme_times.py --make-test` on "
             f"{result['date']} ({result['machine']}), in a fresh `LEADERBOARD_HOME`, in this "
             "order: wall seconds, a second number for the same command run again.", "",
             "| what | command | wall time |", "| --- | --- | ---: |"]
    for row in result["rows"]:
        shown = " / ".join(f"{s:.0f} s" for s in row["seconds"])
        failed = "" if row["rc"] == 0 else f" (exit {row['rc']})"
        lines.append(f"| {row['what']} | `{row['command']}` | {shown}{failed} |")
    return "\n".join([*lines, "", END])


def write_readme(result: dict, path: Path = README) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{path} has no {BEGIN} ... {END} block to fill")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: markdown(result), text))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--make-test", action="store_true", help="also time `make test`")
    parser.add_argument("--from-json", action="store_true",
                        help="rewrite the README from benchmarks/readme_times.json, measuring nothing")
    args = parser.parse_args()
    result = json.loads(OUT.read_text()) if args.from_json else measure(args.make_test)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    write_readme(result)
    return 0 if all(r["rc"] == 0 for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
