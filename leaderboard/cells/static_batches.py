"""The ``e2e`` family: one serving target per LLM-Inference-Bench vLLM run (a static batch).

A target is one row of ``e2e_runs``: ``concurrency`` prompts of ``isl`` tokens, each generating
``osl``, timed end to end (``gt_e2e_ms``), or with ``osl`` = 1 the batch's time to first token
(``gt_ttft_ms``, from ``Fig_21``). The replay is ``leaderboard.serving.static_batch``. Every vLLM
row is accounted for in the card's coverage table: a target, or the reason it is not.
"""

from __future__ import annotations

import polars as pl

from leaderboard.cells import memory
from leaderboard.cells.common import SCHEDULERS, coverage_table, render_card, schedulers_conf, source_lines
from leaderboard_core.specs import GpuSpec, is_moe, load_models

FAMILY = "e2e"
# ROCm shows each of an MI250's two dies as a GPU, and one "AMD MI250 GPU" of the rows holds
# Mixtral-8x7B's 93 GB of fp16 weights, more than a die's 64 GB: a device of the rows is the
# module, a TP group of two dies per device (docs/datasets/e2e.md).
DIES_PER_DEVICE = {"mi250_gcd": 2}
UNLABELLED = {"Intel PVC GPU": "the 'Intel PVC GPU' rows run about 9x slower than the 'Intel "
                               "Max 1550' rows of the same models at batch 1, with no vLLM "
                               "version stated: another setup, not labelled here"}


def offline_models() -> set[str]:
    """The models whose vLLM offline defaults the replay knows (``offline_v0.max_model_len``)."""
    return set(schedulers_conf()["backends"]["vllm"]["offline_v0"]["max_model_len"])


def exclusion(row: dict, gpus: dict[str, GpuSpec], models: dict[str, dict],
              known: set[str]) -> str | None:
    """Why a vLLM row of ``e2e_runs`` cannot be a target here, or None when it can (``known``:
    ``offline_models()``)."""
    if row["model"] is None:
        return f"no shape in conf/model for {row['model_path']}"
    if row["model"] not in known:
        return (f"no max_model_len for {row['model']} in {SCHEDULERS.name} "
                "(backends.vllm.offline_v0): its prefill budget is unknown")
    if row["sku"] is None or row["sku"] not in gpus:
        return UNLABELLED.get(row["hardware"], "no conf/gpu spec for the hardware")
    model = models[row["model"]]
    if is_moe(model):
        return ("mixture-of-experts: the silicon_moe family replays MoE runs; here one MoE "
                "refusal would make a dense-only predictor NotSupported on the whole set")
    return memory.weight_misfit(model, row["devices"] * DIES_PER_DEVICE.get(row["sku"], 1),
                                "bf16", gpus[row["sku"]]["mem_gb"])


def build(con, gpus: dict[str, GpuSpec]) -> list[tuple[str, str, pl.DataFrame, str]]:
    """``(name, sku, targets, card)`` per GPU with usable vLLM rows."""
    runs = con.sql("SELECT * FROM e2e_runs WHERE framework = 'vLLM' "
                   "ORDER BY hardware, model_path, devices, batch_size, isl, osl").pl()
    if not len(runs):
        return []
    models, known = load_models(), offline_models()
    runs = runs.with_columns(why=pl.Series([exclusion(r, gpus, models, known)
                                            for r in runs.iter_rows(named=True)], dtype=pl.String))
    counts = con.sql("SELECT framework, count(*) AS n, count(*) FILTER "
                     "(statistic = 'median_of_duplicates') AS merged FROM e2e_runs "
                     "GROUP BY framework ORDER BY framework").fetchall()
    quarantined = con.sql("SELECT count(*) FROM quarantine WHERE table_name = 'e2e_runs'"
                          ).fetchall()[0][0]
    frameworks = "\n".join(f"| {f} | {n} | {m} |" for f, n, m in counts)
    coverage = coverage_table(runs, {"hardware": "hardware", "model": "model_path",
                                     "devices": "devices"}, "target")
    out = []
    for (sku,), group in runs.filter(pl.col("why").is_null()).group_by("sku", maintain_order=True):
        short = gpus[sku]["short_name"]
        tp = pl.col("devices") * DIES_PER_DEVICE.get(sku, 1)
        one_token = pl.col("osl") == 1
        targets = group.select(
            target_id=pl.format("{}-{}-tp{}-b{}-in{}-out{}", pl.lit(short), "model", tp,
                                "batch_size", "isl", "osl"),
            sku="sku", model="model", tp=tp, backend=pl.lit("vllm"),
            backend_version="backend_version", precision=pl.lit("fp16"),
            gemm_dtype=pl.lit("bf16"), load=pl.lit("static"),
            run=pl.format("{}-{}-tp{}-b{}-in{}-out{}", pl.lit(short), "model", tp,
                          "batch_size", "isl", "osl"),
            isl="isl", osl="osl", concurrency="batch_size",
            gt_ttft_ms=pl.when(one_token).then("latency_ms"),
            gt_e2e_ms=pl.when(~one_token).then("latency_ms"),
            source="source", file="file", file_sha256="file_sha256")
        name = f"{short}_{FAMILY}"
        versions = ", ".join(sorted(set(group["backend_version"])))
        card = render_card(FAMILY, name=name, sku=sku, rows=len(targets),
                           e2e_rows=int((group["osl"] > 1).sum()),
                           ttft_rows=int((group["osl"] == 1).sum()),
                           versions=versions, dies=DIES_PER_DEVICE.get(sku, 1),
                           frameworks=frameworks, quarantined=quarantined,
                           runs_total=len(runs), usable_total=int(runs["why"].is_null().sum()),
                           coverage=coverage,
                           sources=source_lines(con, group.select("file", "file_sha256")
                                                .unique().iter_rows()))
        out.append((name, sku, targets, card))
    return out
