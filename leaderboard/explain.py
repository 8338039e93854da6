"""``python -m leaderboard.explain predictor=ours dataset=h200_vidur cell=<cell_id>``: one cell,
term by term.

Prints each op of the step (per layer, as ``ours`` times it): its FLOPs and bytes, its bound
(compute or memory), every factor's value, and its time; then the step's terms summed over the
layers against the measured time. Fitting is as in a run (the home's frozen constants; a
wall-clock target first takes its deploy reading); this command reads the store, so it is a
diagnostic, not a scored run. ``cell`` may be omitted: the dataset's first cell is explained.
"""

from __future__ import annotations

import sys

import polars as pl
from rich.console import Console
from rich.table import Table

from leaderboard import metrics
from leaderboard.evaluate import RunSpec, load_inputs
from leaderboard.readings import take_in_process
from leaderboard_core.contract import GROUND_TRUTH_COLUMNS
from predictors import registry
from predictors.ours import Ours, factors, ops
from predictors.ours.config import Device
from predictors.ours.step import decode_kernel, gemm_shapes, prefill_kernel
from predictors.steps import Steps

FACTOR_COLUMNS = ("f_clk", "eta_cl", "eta_act", "eta_duty", "eta_kernel", "eta_mem")


def load(predictor: str, dataset: str):
    inputs = load_inputs(RunSpec(predictor, dataset, {}))
    model = registry.build(predictor).fit(inputs.home)
    if not isinstance(model, Ours):
        raise SystemExit(f"explain breaks down 'ours' and its ladder rungs, not '{predictor}'")
    # as a run: the cells a deploy reading touched are not scored
    cells, _ = take_in_process(model, inputs.target, inputs.target_lineage, inputs.gpu)
    return model, cells, inputs.gpu


def op_rows(model: Ours, cell: pl.DataFrame, gpu) -> list[dict]:
    """Every op of one layer of the cell's step, with its factors."""
    s, dev = Steps.from_cells(cell), Device.of(gpu, model.constants_)
    c, sw = model.constants_, model.switches
    rows = []
    for name, (n, k) in gemm_shapes(s).items():
        rows.append((f"{name} m={s.tokens[0]:.0f} n={n[0]:.0f} k={k[0]:.0f}", 1,
                     ops.gemm(s.tokens, n, k, dev, c, sw)))
    sharded = s.sharded()
    cells, n, q, ctx = prefill_kernel(s)
    if len(cells):
        rows.append((f"attn_prefill batch={n[0]:.0f} q={q[0]:.0f} ctx={ctx[0]:.0f} (one kernel)",
                     1, ops.prefill_attention(q, ctx, sharded["heads"] * n,
                                              sharded["kv_heads"] * n, s.head_dim, dev, c, sw)))
    cells, n, ctx = decode_kernel(s)
    if len(cells):
        rows.append((f"attn_decode batch={n[0]:.0f} kv={ctx[0]:.0f} (one kernel)", 1,
                     ops.decode_attention(n, ctx, sharded["heads"], sharded["kv_heads"],
                                          s.head_dim, dev, c, sw)))
    if s.tp[0] > 1:
        size = s.tokens * s.hidden * 2.0
        custom, _ = factors.allreduce_path(size, s.tp, dev.topology,
                                           c["collectives"]["custom_max_bytes"])
        regime = ("bare ring" if not sw.collectives else "vLLM custom" if custom[0] else "NCCL")
        rows.append((f"allreduce tp={s.tp[0]:.0f} {dev.topology} {regime}", 2,
                     ops.allreduce(size, s.tp, dev, c, sw)))
    return [{"op": label, "count": count, **{k: float(v[0]) for k, v in r.items()}}
            for label, count, r in rows]


def render(model: Ours, cell: pl.DataFrame, gpu, console: Console) -> None:
    c0 = cell.row(0, named=True)
    dev = Device.of(gpu, model.constants_)
    console.print(f"[bold]{model.name}[/] on {gpu.sku} ({gpu['arch']}): cell {c0['cell_id']}, "
                  f"{c0['model']} TP{c0['tp']}, {c0['phase']}, {c0['num_requests']} requests, "
                  f"{c0['total_tokens']} tokens, ground truth {c0['gt_kind']}")
    console.print(f"device: peak {dev.peak_flops / 1e12:.0f} TFLOP/s, DRAM {dev.mem_bw / 1e9:.0f}"
                  f" GB/s, L2 {dev.l2_bytes / 2**20:.0f} MiB, {dev.sms} SMs, CTA cap "
                  f"{dev.cta_cap}, f_clk {dev.f_clk:.3f}, eta_act {dev.eta_act:.2f}, floor scale "
                  f"{dev.floor_scale:.3f} (home clock / this clock), split-KV decode floor "
                  f"{'on' if dev.split_kv else 'off'}, interconnect {dev.topology} at "
                  f"{dev.link_bytes_per_s / 1e9:.0f} GB/s a direction")
    table = Table(title="one layer, per op (x count)")
    for col in ("op", "count", "GFLOP", "MB", "bound", *FACTOR_COLUMNS, "floor us", "us"):
        table.add_column(col, justify="left" if col in ("op", "bound") else "right")
    for r in op_rows(model, cell, gpu):
        bound = ("compute" if r.get("compute_s", 0) >= r.get("memory_s", 0) else "memory") \
            if "compute_s" in r else "link"
        table.add_row(r["op"], str(r["count"]), f"{r.get('flops', 0) / 1e9:.3f}",
                      f"{r['bytes'] / 1e6:.2f}", bound,
                      *[f"{r[f]:.3f}" if f in r else "-" for f in FACTOR_COLUMNS],
                      f"{r.get('floor_s', 0) * 1e6:.1f}", f"{r['seconds'] * 1e6:.1f}")
    console.print(table)
    parts = model.components(cell.drop(GROUND_TRUTH_COLUMNS), gpu)
    terms = Table(title="step terms, summed over the layers")
    terms.add_column("term")
    terms.add_column("ms", justify="right")
    for name, value in parts.items():
        terms.add_row(name, f"{value[0] * 1e3:.4f}")
    predicted = sum(v[0] for v in parts.values()) * 1e3
    terms.add_row("[bold]predicted[/]", f"{predicted:.4f}")
    terms.add_row("[bold]measured[/]", f"{c0['gt_ms']:.4f}")
    terms.add_row("error %", f"{metrics.errors(predicted, c0['gt_ms']):+.2f}")
    console.print(terms)
    if c0["gt_kind"] == "wall_clock":
        console.print(f"alpha {model.alpha_:.3f} (home fit); S(N) = {model.host_floor_[0] * 1e3:.3f}"
                      f" + {model.host_floor_[1] * 1e3:.4f} (N-1) ms (deploy reading)")


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    model, cells, gpu = load(args.get("predictor", "ours"), args["dataset"])
    wanted = args.get("cell") or cells["cell_id"][0]
    cell = cells.filter(pl.col("cell_id") == wanted)
    if cell.is_empty():
        raise SystemExit(f"no cell '{wanted}' in {args['dataset']} (deploy-reading rows are "
                         "not explained: they are not scored)")
    render(model, cell, gpu, Console(width=200))


if __name__ == "__main__":
    main(sys.argv[1:])
