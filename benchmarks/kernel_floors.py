"""Kernel floors by GPU and vLLM version, measured, against the floors ``ours`` prices.

Why ``ours`` misses its decode targets on unseen GPUs (issue 12) is a question about the
smallest kernels: a decode step is mostly kernels that run near their fixed floor. This reads,
from the store, two such kernels on every GPU of the ``_vidur`` family at every vLLM version
aiconfigurator measured, and sets ``ours``'s price of the same kernel beside each:

- decode attention, one request of 63 cached tokens (32 query heads, 8 KV heads, head size
  128, bf16): the kernel's floor;
- the TP2 all-reduce of 4 KiB under CUDA graphs (vLLM's custom all-reduce): its floor.

``ours`` sees the datasheet and the home's fit, not the vLLM version, so where a floor moves
between versions on one GPU, or across GPUs against the clock, no constant of it can follow.
Prints a markdown table; ``--json PATH`` also writes the rows, which the report shows:

    .venv/bin/python benchmarks/kernel_floors.py --json benchmarks/kernel_floors.json
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from leaderboard import store
from leaderboard_core.report_tables import fmt, table
from leaderboard_core.specs import load_gpu_specs
from leaderboard_core.versioning import code_version
from predictors.ours import ops
from predictors.ours.config import Device, load_constants

# The GPUs of the _vidur family, by the dataset's short name.
FAMILY = {"a100": "a100_sxm", "h100": "h100_sxm", "h200": "h200_sxm", "l40s": "l40s",
          "b200": "b200_sxm", "gb200": "gb200"}
ATTENTION = {"batch": 1, "kv_len": 63, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128}
ALLREDUCE = {"num_gpus": 2, "message_bytes": 4096}

ATTENTION_SQL = """
    SELECT backend_version AS version, median(latency_ms) * 1e3 AS us FROM attention
    WHERE source = 'aiconfigurator' AND backend = 'vllm' AND sku = ? AND phase = 'decode'
      AND dtype = 'bfloat16' AND kv_dtype = 'bfloat16' AND window_size = 0 AND batch = ?
      AND kv_len = ? AND num_heads = ? AND num_kv_heads = ? AND head_dim = ?
    GROUP BY 1"""
ALLREDUCE_SQL = """
    SELECT backend_version AS version, median(latency_ms) * 1e3 AS us FROM collective
    WHERE source = 'aiconfigurator' AND backend = 'vllm_graph' AND sku = ?
      AND collective = 'all_reduce' AND num_gpus = ? AND message_bytes = ?
    GROUP BY 1"""
# The vLLM version each _vidur dataset's decode attention comes from (its lineage keys).
DATASET_VERSION_SQL = """
    SELECT DISTINCT json_extract_string(key, '$.backend_version') FROM cell_lineage
    WHERE dataset = ? AND op = 'attn_decode'"""


def ours_floors(sku: str) -> tuple[float, float]:
    """``ours``'s price (µs) of the two kernels on ``sku``, from its datasheet."""
    constants = load_constants()
    dev = Device.of(load_gpu_specs()[sku], constants)
    one = np.ones(1)
    attention = ops.decode_attention(
        ATTENTION["batch"] * one, ATTENTION["kv_len"] * one, ATTENTION["num_heads"] * one,
        ATTENTION["num_kv_heads"] * one, ATTENTION["head_dim"] * one, dev, constants,
        ops.Switches())
    allreduce = ops.allreduce(ALLREDUCE["message_bytes"] * one, ALLREDUCE["num_gpus"] * one, dev,
                              constants, ops.Switches())
    return float(attention["seconds"][0] * 1e6), float(allreduce["seconds"][0] * 1e6)


def measure(con) -> list[dict]:
    """One row per (GPU, vLLM version) with a measured floor of either kernel."""
    rows = []
    for short, sku in FAMILY.items():
        attention = dict(con.execute(ATTENTION_SQL, [sku, *ATTENTION.values()]).fetchall())
        allreduce = dict(con.execute(ALLREDUCE_SQL, [sku, *ALLREDUCE.values()]).fetchall())
        scored = {v for (v,) in con.execute(DATASET_VERSION_SQL, [f"{short}_vidur"]).fetchall()}
        ours_attention, ours_allreduce = ours_floors(sku)
        for version in sorted(attention.keys() | allreduce.keys(),
                              key=lambda v: tuple(int(p) for p in v.split("."))):
            rows.append({"gpu": sku, "vllm": version, "in_vidur": version in scored,
                         "attention_us": attention.get(version),
                         "ours_attention_us": ours_attention,
                         "allreduce_us": allreduce.get(version),
                         "ours_allreduce_us": ours_allreduce})
    return rows


def markdown(rows: list[dict]) -> str:
    return "\n".join(table(
        ["GPU", "vLLM", "in _vidur", "decode attention µs", "ours µs", "TP2 all-reduce µs",
         "ours µs"],
        [[r["gpu"], r["vllm"], "yes" if r["in_vidur"] else "",
          *(fmt(r[k]) for k in ("attention_us", "ours_attention_us", "allreduce_us",
                                "ours_allreduce_us"))] for r in rows], "lllrrrr"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    with store.connect() as con:
        rows = measure(con)
    print(markdown(rows))
    if args.json:
        meta = {"attention": ATTENTION, "allreduce": ALLREDUCE, "code_version": code_version(),
                "date": datetime.now(UTC).isoformat(timespec="seconds")}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
