"""The card of a ``<sku>_vidur*`` dataset: what its cells hold and leave out, with every figure
computed from the cells, the model shapes and the store (``datasets/cards/<template>.md``)."""

from __future__ import annotations

import statistics
from collections import Counter

from leaderboard.cells import families, fp8_check, memory
from leaderboard.cells.common import PHASES, family_configs, phase_counts, render_card, source_lines
from leaderboard.cells.distortion import Tally
from leaderboard.cells.grid import Grid
from leaderboard_core import paths, yaml_io
from leaderboard_core.layer_work import light_kernel_elements, routed_experts
from leaderboard_core.specs import GpuSpec, is_moe, kv_heads_per_gpu, moe_shapes, tp_shapes
from leaderboard_core.versioning import release


def render(con, name, grid: Grid, cells: list[dict], cfg, fam, tally: Tally, missing: int,
          too_big: int, models: dict, gpus: dict[str, GpuSpec]) -> str:
    gpu = gpus[grid.sku]
    counts = phase_counts(cells)
    replayed = sum(c["weight"] for c in cells)
    warm = [c for c in cells if c["warm_share"] > 0]
    gt = sum(c["gt_ms"] for c in cells) or 1.0
    return render_card(
        fam.get("card", "vidur"), name=name, gemm_dtype=fam.get("gemm_dtype", "bf16"),
        by_config=_by_config(cells), sku=grid.sku, version=grid.version, cells=len(cells),
        **counts,
        configs=", ".join(f"{c['model']} TP{c['tp']}" for c in family_configs(cfg, fam)),
        family=", ".join(fam["gpus"]), member="yes" if grid.sku in fam["gpus"] else "no",
        missing=missing, composed=sum(c["composed"] for c in cells), distortion=tally.table(),
        per_phase=cfg["cells_per_phase"],
        load_scales=_load_phrase(cfg.get("load_scales", [1])),
        origin=_origin(cells),
        replayed_share=f"{replayed / max(sum(tally.steps.values()), 1):.1%}",
        warm_cells=len(warm), warm_mean=f"{sum(c['warm_share'] for c in cells) / max(len(cells), 1):.1%}",
        warm_gt=f"{sum(c['gt_ms'] * c['warm_share'] for c in cells) / gt:.1%}",
        files=source_lines(con, grid.files),
        fp8_checks=_fp8_checks(con) if fam.get("gemm_dtype") == "fp8" else None,
        too_big=too_big, memory_limit=f"{memory.UTILIZATION:.0%} of {gpu['mem_gb']} GiB",
        lm_head=_lm_head(family_configs(cfg, fam), models, fam.get("gemm_dtype", "bf16")),
        light_kernels=light_kernel_table(cells, models, fam.get("gemm_dtype", "bf16")),
        distribution=fam.get("moe_distribution"), home=families.of(name).home,
        **_placement(fam.get("expert_parallel", False)),
    )


def _placement(expert_parallel: bool) -> dict[str, str]:
    """How the MoE card describes the experts' placement over the TP group
    (``datasets/cards/moe_placement.yaml``)."""
    text = (paths.DATASETS_DIR / "cards" / "moe_placement.yaml").read_text()
    return yaml_io.safe_load(text)["expert_parallel" if expert_parallel else "tensor_parallel"]


def _load_phrase(scales: list[float]) -> str:
    """How the traces were offered, from ``load_scales`` (``leaderboard.cells.traces``)."""
    faster = " and ".join(f"{x:g}x" for x in scales if x != 1)
    own = "at its own arrival times" if 1 in scales else ""
    if not faster:
        return own
    return f"{own} and again {faster} faster" if own else f"{faster} faster than its arrival times"


def _lm_head(configs: list[dict], models: dict, dtype: str) -> str:
    """Markdown: per configuration, the LM head's weight bytes against all its layers' linear
    weights (what a memory-bound decode step streams), from the model shapes."""
    rows = ["| model | TP | LM head / layers' linear weights |", "|---|---|---|"]
    for entry in configs:
        model, tp = models[entry["model"]], entry["tp"]
        share = memory.lm_head_bytes(model, tp) / (
            model["num_layers"] * memory.layer_weight_bytes(model, tp, dtype))
        rows.append(f"| {entry['model']} | {tp} | {share:.1%} |")
    return "\n".join(rows)


def light_kernel_share(model: dict, tp: int, q_lens: list[int], ctx_lens: list[int],
                       dtype: str) -> float:
    """The light kernels' share of one step's DRAM traffic per layer, from the shapes: their
    bytes (``light_kernel_elements``, bf16) against those plus the heavy kernels' (the linear
    weights the step reads, of an MoE layer only the experts some token routes to; each GEMM's
    bf16 input and output; attention's Q and O; the KV cache)."""
    s, tokens, layers = tp_shapes(model, tp), sum(q_lens), model["num_layers"]
    kv_width = kv_heads_per_gpu(model, tp) * model["head_dim"]
    q_width = model["num_heads"] * model["head_dim"] / tp
    attention = [s["qkv"], s["o"]]
    dense = [s["gate_up"], s["down"]]
    ffn_weights, ffn_acts = sum(n * k for n, k in dense), tokens * sum(n + k for n, k in dense)
    act_width = s["down"][1]
    if is_moe(model):  # the experts' activation runs inside the measured fused-MoE kernel
        e = moe_shapes(model, tp)
        rows, touched = routed_experts(tokens, e["topk"], e["experts"])
        ffn_weights = (e["dense_layers"] * ffn_weights
                       + e["moe_layers"] * touched * 3 * e["hidden"] * e["inter"]) / layers
        ffn_acts = (e["dense_layers"] * ffn_acts
                    + e["moe_layers"] * rows * (2 * e["hidden"] + 3 * e["inter"])) / layers
        act_width = e["dense_layers"] * act_width / layers
    weights = (sum(n * k for n, k in attention) + ffn_weights) * memory.GEMM_BYTES[dtype]
    activations = memory.BF16_BYTES * (tokens * sum(n + k for n, k in attention) + ffn_acts
                                       + 2 * tokens * q_width)
    kv = memory.kv_bytes(model, tp, q_lens, ctx_lens) / layers
    light = memory.BF16_BYTES * light_kernel_elements(
        tokens, model["hidden_size"], act_width, q_width, kv_width)
    return light / (light + weights + activations + kv)


def light_kernel_table(cells: list[dict], models: dict, dtype: str) -> str:
    """Markdown: per configuration and phase, the median light-kernel share of the cells'
    DRAM traffic (``light_kernel_share``)."""
    rows = ["| model | TP | prefill cells | decode cells |", "|---|---|---|---|"]
    for name, tp in sorted({(c["model"], c["tp"]) for c in cells}):
        shares = [
            (f"{statistics.median(v):.1%}" if (v := [
                light_kernel_share(models[name], tp, c["q_lens"], c["ctx_lens"], dtype)
                for c in cells if (c["model"], c["tp"], c["phase"]) == (name, tp, phase)]) else "—")
            for phase in ("prefill", "decode")]
        rows.append(f"| {name} | {tp} | {shares[0]} | {shares[1]} |")
    return "\n".join(rows)


def _fp8_checks(con) -> str:
    """Markdown: every FP8 table the build checked (``fp8_check``, kept in the store as it was
    checked), kept or quarantined."""
    checks = con.sql(f"SELECT * FROM {fp8_check.TABLE}").pl()
    rows = sorted(((r["sku"], r["backend_version"], "kept" if r["passes"] else "quarantined",
                    fp8_check.detail(r)) for r in checks.iter_rows(named=True)),
                  key=lambda r: (r[0], release(r[1])))
    return "\n".join(["| GPU | vLLM | verdict | measured |", "|---|---|---|---|",
                      *(f"| {sku} | {v} | {verdict} | {what} |" for sku, v, verdict, what in rows)])


def _origin(cells: list[dict]) -> str:
    """Markdown: per phase, cells from replayed steps, uniform cells, and the replayed weight."""
    total = sum(c["weight"] for c in cells) or 1
    rows = ["| phase | cells from replayed steps | uniform cells | share of replayed weight |",
            "|---|---|---|---|"]
    for phase in PHASES:
        mine = [c for c in cells if c["phase"] == phase]
        replayed = [c for c in mine if c["weight"]]
        rows.append(f"| {phase} | {len(replayed)} | {len(mine) - len(replayed)} | "
                    f"{sum(c['weight'] for c in replayed) / total:.1%} |")
    return "\n".join(rows)


def _by_config(cells: list[dict]) -> str:
    """Markdown: cells per phase and model x TP."""
    rows = ["| model | TP | prefill | decode | mixed |", "|---|---|---|---|---|"]
    for model, tp in sorted({(c["model"], c["tp"]) for c in cells}):
        mine = Counter(c["phase"] for c in cells if (c["model"], c["tp"]) == (model, tp))
        rows.append(f"| {model} | {tp} | " + " | ".join(str(mine[p]) for p in PHASES) + " |")
    return "\n".join(rows)
