"""What the serving replay's unknowns were measured to give its oracle, from the benchmarks'
JSON: the closed loop's length (``benchmarks/closed_loop_waves.py``), the launch flags no
record states (``benchmarks/engine_choices.py``), the light kernels no table holds
(``benchmarks/light_kernels.py``, read through ``report_light``) and the KV-cache write the later
attention tables omit (``benchmarks/kv_cache_write.py``, through ``report_kv_write``)."""

from __future__ import annotations

import json
from pathlib import Path

from leaderboard.cells.common import schedulers_conf
from leaderboard.present import sections
from leaderboard.present.serving_kv_write import KV_WRITE_JSON, kv_write_measured
from leaderboard.present.serving_light import LIGHT_JSON, light_kernels_measured
from leaderboard_core import paths
from leaderboard_core.report_tables import fmt, table

# The replay's goal (docs/design.md, "Serving replay and its oracle"), MAPE %.
TARGETS = {"ttft": 12.0, "tpot": 7.0}
WAVES_JSON = paths.REPO_ROOT / "benchmarks" / "closed_loop_waves.json"
CHOICES_JSON = paths.REPO_ROOT / "benchmarks" / "engine_choices.json"


def _length(waves: int, dropped: int) -> str:
    return f"{waves} waves" + (f", first {dropped} dropped" if dropped else "")


def closed_loop_table(bench: dict) -> list[str]:
    """The oracle's TTFT / TPOT MAPE per serving set and backend, for each closed-loop length
    ``benchmarks/closed_loop_waves.py`` replayed (the script prints it too)."""
    combos = [(w, d) for w in bench["waves"] for d in bench["dropped"]]
    cells = {(r["dataset"], r["backend"], r["waves"], r["dropped"]): r for r in bench["rows"]}
    counts = {(r["dataset"], r["backend"]): r["n"] for r in bench["rows"]}
    keys = sorted(counts, key=lambda k: (k[0], k[1] != "all", k[1]))
    body = [[dataset, backend, str(counts[(dataset, backend)]),
             *(f"{fmt(c['ttft_mape'])} / {fmt(c['tpot_mape'])}"
               if (c := cells.get((dataset, backend, w, d))) else "—" for w, d in combos)]
            for dataset, backend in keys]
    return table(["dataset", "backend", "n", *(_length(w, d) for w, d in combos)], body,
                 "llr" + "r" * len(combos))


def best_lengths_by_set(bench: dict) -> dict[str, dict]:
    """Per serving set (every backend together), the benchmark's row of the length with the
    lowest TTFT MAPE."""
    best: dict[str, dict] = {}
    for r in bench["rows"]:
        # the first of equal lengths (to rounding) is the shorter loop, the rows' order
        if r["backend"] == "all" and (r["dataset"] not in best
                                      or r["ttft_mape"] < best[r["dataset"]]["ttft_mape"] - 1e-9):
            best[r["dataset"]] = r
    return best


def _best_lengths(bench: dict) -> list[str]:
    """Per serving set, the best length and whether it meets the goal."""
    best = best_lengths_by_set(bench)
    return [f"- `{d}`: at best {fmt(r['ttft_mape'])} % TTFT, {fmt(r['tpot_mape'])} % TPOT "
            f"({_length(r['waves'], r['dropped'])}), "
            f"{'within' if r['ttft_mape'] <= TARGETS['ttft'] else 'outside'} the "
            f"{TARGETS['ttft']:.0f} % TTFT goal." for d, r in sorted(best.items())]


def closed_loop_lengths(path: Path = WAVES_JSON) -> list[str]:
    """Whether the closed loop's length (requests sent, warm-up left out) is what keeps the
    oracle from its goal, from ``benchmarks/closed_loop_waves.py``'s JSON."""
    bench, command = sections.benchmark_json(path, "closed_loop_waves")
    if bench is None:
        return [f"No closed-loop length benchmark yet ({command}).", ""]
    dropped = " or ".join(str(d) for d in bench["dropped"] if d)
    return sections.benchmark_section(
            f"How long a loop the replay runs ({command}). No record states how many "
            "requests a `_silicon` run sent. The "
            f"replay's headline runs {schedulers_conf()['simulation']['waves']} waves of "
            "`concurrency` requests. aiconfigurator's own benchmark template sends 50 (unless "
            "its environment sets another count) after a warm-up of 2, and AIPerf waits for "
            "every warm-up response before it profiles, so the profiled waves also start from "
            "an idle engine; public GenAI-Perf benchmark scripts often send 10. The oracle's "
            "TTFT / TPOT MAPE % for each length, each a replay of its own, over every wave or "
            f"without the first {dropped} (a warm-up that did not drain):",
            [*closed_loop_table(bench), "", *_best_lengths(bench)], bench)


def engine_choices_tables(bench: dict) -> list[str]:
    """The oracle's error per serving set under each engine choice of
    ``benchmarks/engine_choices.py``, then the targets a choice moves, one by one."""
    choices = bench["choices"]
    lines = table(["dataset", "engine choice", "n", "TTFT MAPE %", "TPOT MAPE %", "targets moved",
                   "closer / further", "their TTFT MAPE %", "the same targets, headline %"], [
        [r["dataset"], r["choice"], str(r["n"]), fmt(r["ttft_mape"]), fmt(r["tpot_mape"]),
         str(r["moved"]), f"{r['closer']} / {r['moved'] - r['closer']}" if r["moved"] else "—",
         fmt(r["moved_ttft_mape"]), fmt(r["moved_headline_ttft_mape"])]
        for r in bench["rows"]], "llrrrrrrr")
    if not bench["moved"]:
        return lines
    return lines + ["", "The moved targets (TTFT, ms):", "", *table(
        ["dataset", "backend", "TP", "isl", "osl", "concurrency", "measured", *choices],
        [[m["dataset"], m["backend"], str(m["tp"]), str(m["isl"]), str(m["osl"]),
          str(m["concurrency"]), f"{m['gt_ttft_ms']:,.0f}",
          *(f"{m[f'{c}_ttft_ms']:,.0f}" for c in choices)] for m in bench["moved"]],
        "llrrrrr" + "r" * len(choices))]


def engine_choices(path: Path = CHOICES_JSON) -> list[str]:
    """What the oracle's error owes to the launch flags no record states, from
    ``benchmarks/engine_choices.py``'s JSON."""
    bench, command = sections.benchmark_json(path, "engine_choices")
    if bench is None:
        return [f"No engine-choice benchmark yet ({command}).", ""]
    return sections.benchmark_section(
            f"Engine choices no record states ({command}). The `_silicon` CSV holds no launch "
            "flags. The headline replays every backend with a BF16 KV cache (vLLM's "
            "`--kv-cache-dtype auto` for a BF16 or online-FP8 model) and vLLM with prefix "
            "caching on (V1's default, which aiconfigurator's generator keeps unless asked). "
            "`fp8_kv` halves a token's KV bytes in every backend's cache and reads each step's "
            "attention from the GPU's FP8-KV tables (at the version of the step set the oracle "
            "fits on, beside the BF16 ones it reads); `fp8_kv_capacity` takes the capacity "
            "alone, attention still at BF16 KV, so the two rows part the loads FP8 KV lets in "
            "at once from its faster attention. FP8 KV is likelier on the `_silicon_moe` sets: "
            "their checkpoints (MiniMax-M2.5, Qwen3-235B-A22B-FP8) are published in FP8, for "
            "which aiconfigurator's SDK infers an FP8 KV cache, and a search result names it to "
            "the launch generator (`conf/serving/schedulers.yaml` gives the sources). "
            "`no_prefix_cache` makes a preempted vLLM "
            "request recompute its whole prompt. It and `fp8_kv_capacity` move only KV-bound "
            "loads. "
            "`launch_rule` gives every vLLM and TRT-LLM closed loop, of an unrecorded version "
            "too, the token budget of aiconfigurator's benchmark rule, `concurrency + isl + "
            "1500`, which the headline gives only vLLM from 0.14.1, whose launch template "
            "passes the flag (the unrecorded vLLM runs replayed, the dense FP8 campaign, are "
            "dated 2025-10-29, a month before aiconfigurator's public generator gained its "
            "vLLM templates and its budget rule in its PR 144, so that generator had no vLLM "
            "rule then, and their budget is unrecorded; TRT-LLM's "
            "templates pass one at every version, but the generator's deployment rule sets a "
            "budget from 512 requests, so which one a run had is unknown; SGLang's rule caps a "
            "prefill batch, which the replay does not model). `trtllm_no_overlap` turns "
            "TRT-LLM's overlap scheduler off, as aiconfigurator's launch templates do by default "
            "(its generator's rules turn it on for an aggregated worker, and the headline keeps "
            "it on): each TRT-LLM step then pays vLLM's measured host time, as none of "
            "TRT-LLM's is measured. `burst_together` runs the requests sent in one instant to "
            "an idle engine (a closed loop's first wave, and the resends of a wave that ends in "
            "one step) in one step, where the headline runs the first alone and the rest in the "
            "next (TRT-LLM's idle executor takes one request; for vLLM and SGLang how many make "
            "the first step is a race no record times, of which these are the two ends). "
            "`aiconfigurator_bench` is aiconfigurator's benchmark as a whole: `launch_rule` "
            "with its template's request count, 50 waves, all scored (its warm-up is a phase "
            "of its own that drains before profiling; the headline's 4 waves assume no "
            "template). Each choice is a replay of its own "
            "with the oracle's step timer; a moved target is closer when "
            "its TTFT error shrinks. A choice that helped one GPU's runs and hurt another's "
            "would be a per-GPU fit to the measurements, so the headline keeps what the "
            "sources support. The targets `fp8_kv_capacity` and `no_prefix_cache` move are "
            "listed after the table:", engine_choices_tables(bench), bench)


def unknowns_measured(dataset: str, bracket: tuple[int, float, float] | None,
                      waves: Path = WAVES_JSON, choices: Path = CHOICES_JSON,
                      light: Path = LIGHT_JSON, kv_write: Path = KV_WRITE_JSON) -> str:
    """What the oracle of ``dataset`` gives under each reading of what no record states: the
    clients' drift (``bracket``: loads, % inside, mean % off), the request count, the launch
    flags, the light kernels and the KV-cache write, each benchmark's figure beside its own
    headline replay's."""
    said = []
    if bracket is not None:
        n, share, off = bracket
        said.append(f"the measured TTFT lies inside the closed loop's bracket for {share:.0f} % "
                    f"of {n} loads and {off:.1f} % off it on average (the TTFT error left if "
                    "the clients' drift were granted)")
    if waves.exists():
        bench, sim = json.loads(waves.read_text()), schedulers_conf()["simulation"]
        headline = next((r for r in bench["rows"] if r["dataset"] == dataset
                         and r["backend"] == "all" and r["waves"] == sim["waves"]
                         and r["dropped"] == sim["warmup_waves"]), None)
        if (best := best_lengths_by_set(bench).get(dataset)) and headline:
            said.append(f"the best closed-loop length (`benchmarks/closed_loop_waves.py`) gives "
                        f"{fmt(best['ttft_mape'])} % TTFT ({_length(best['waves'], best['dropped'])}"
                        f") against {fmt(headline['ttft_mape'])} % at the headline's length")
    if choices.exists():
        rows = [r for r in json.loads(choices.read_text())["rows"] if r["dataset"] == dataset]
        headline = next((r for r in rows if r["choice"] == "headline"), None)
        said += [f"`{r['choice']}` (`benchmarks/engine_choices.py`) gives {fmt(r['ttft_mape'])} % "
                 f"TTFT and {fmt(r['tpot_mape'])} % TPOT against {fmt(headline['ttft_mape'])} % "
                 f"and {fmt(headline['tpot_mape'])} % in the same benchmark, "
                 + (f"{r['closer']} of the {r['moved']} loads it moves closer" if r["moved"]
                    else "moving no load")
                 for r in rows if headline and r["choice"] != "headline"]
    said += [clause for clause in (light_kernels_measured(dataset, light),
                                   kv_write_measured(dataset, kv_write)) if clause is not None]
    return " Measured: " + "; ".join(said) + "." if said else ""


# Presents results, never changes a run's numbers: versioning.code_hash skips this file.
PRESENTATION = True
