"""Kernel floors by GPU and vLLM version, measured, against the floors ``ours`` prices.

Part of why ``ours`` misses its decode targets on unseen GPUs (issue 12): many decode kernels
run near their fixed floor, and ``ours`` prices each floor from the datasheet and the A100
home's fit, without the software version. This reads, from the store, two such kernels on every
GPU of the ``_vidur`` family at every vLLM version aiconfigurator measured, and sets ``ours``'s
price beside each:

- decode attention of one request over 63 cached tokens, in the head shape the ``_vidur``
  cells use most (bf16, no sliding window): the kernel's floor;
- the TP2 all-reduce of 4 KiB under CUDA graphs (vLLM's custom all-reduce), bf16: its floor.

Rows are picked as the ``_vidur`` cells pick theirs (aiconfigurator, ``vllm`` attention,
``vllm_graph`` all-reduce); a version measured twice takes the median. Prints a markdown
table; ``--json PATH`` also writes the rows, which the report shows:

    .venv/bin/python benchmarks/kernel_floors.py --json benchmarks/kernel_floors.json
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from leaderboard.present import sections
from leaderboard.store import database
from leaderboard_core.specs import DEFAULT_KV_DTYPE, load_gpu_specs
from leaderboard_core.versioning import code_version
from predictors.ours import ops
from predictors.ours.config import Device, load_constants

FLOOR = {"batch": 1, "kv_len": 63}
ALLREDUCE = {"num_gpus": 2, "message_bytes": 4096}

FAMILY_SQL = r"SELECT name, sku FROM datasets WHERE name LIKE '%\_vidur' ESCAPE '\' ORDER BY sku"
# The head shape of the family's decode-attention points, the most used one.
SHAPE_SQL = r"""
    SELECT json_extract(key, '$.num_heads')::INT, json_extract(key, '$.num_kv_heads')::INT,
           json_extract(key, '$.head_dim')::INT, count(*) AS n
    FROM cell_lineage WHERE dataset LIKE '%\_vidur' ESCAPE '\' AND op = 'attn_decode'
    GROUP BY ALL ORDER BY n DESC, 1, 2, 3 LIMIT 1"""
ATTENTION_SQL = f"""
    SELECT backend_version AS version, median(latency_ms) * 1e3 AS us FROM attention
    WHERE source = 'aiconfigurator' AND backend = 'vllm' AND sku = ? AND phase = 'decode'
      AND dtype = 'bfloat16' AND kv_dtype = '{DEFAULT_KV_DTYPE}' AND coalesce(window_size, 0) = 0
      AND batch = ? AND kv_len = ? AND num_heads = ? AND num_kv_heads = ? AND head_dim = ?
    GROUP BY 1"""
ALLREDUCE_SQL = """
    SELECT backend_version AS version, median(latency_ms) * 1e3 AS us FROM collective
    WHERE source = 'aiconfigurator' AND backend = 'vllm_graph' AND sku = ? AND dtype = 'bfloat16'
      AND collective = 'all_reduce' AND num_gpus = ? AND message_bytes = ?
    GROUP BY 1"""
# The vLLM version each _vidur dataset's cells come from (every op of a dataset takes one).
DATASET_VERSION_SQL = """
    SELECT DISTINCT json_extract_string(key, '$.backend_version') FROM cell_lineage
    WHERE dataset = ? AND op = 'attn_decode'"""


def _version_key(version: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in version.split("."))


def ours_floors(sku: str, shape: dict) -> tuple[float, float]:
    """``ours``'s price (µs) of the two kernels on ``sku``, from its datasheet."""
    constants = load_constants()
    dev = Device.of(load_gpu_specs()[sku], constants)
    one = np.ones(1)
    attention = ops.decode_attention(
        shape["batch"] * one, shape["kv_len"] * one, shape["num_heads"] * one,
        shape["num_kv_heads"] * one, shape["head_dim"] * one, dev, constants, ops.Switches())
    allreduce = ops.allreduce(ALLREDUCE["message_bytes"] * one, ALLREDUCE["num_gpus"] * one, dev,
                              constants, ops.Switches())
    return float(attention["seconds"][0] * 1e6), float(allreduce["seconds"][0] * 1e6)


def attention_shape(con) -> dict:
    heads, kv_heads, head_dim, _ = con.execute(SHAPE_SQL).fetchone()
    return {**FLOOR, "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}


def measure(con) -> tuple[dict, list[dict]]:
    """(the attention shape, one row per (GPU, vLLM version) with a measured floor of either
    kernel)."""
    shape, rows = attention_shape(con), []
    for dataset, sku in con.execute(FAMILY_SQL).fetchall():
        attention = dict(con.execute(ATTENTION_SQL, [sku, *shape.values()]).fetchall())
        allreduce = dict(con.execute(ALLREDUCE_SQL, [sku, *ALLREDUCE.values()]).fetchall())
        scored = {v for (v,) in con.execute(DATASET_VERSION_SQL, [dataset]).fetchall()}
        ours_attention, ours_allreduce = ours_floors(sku, shape)
        for version in sorted(attention.keys() | allreduce.keys(), key=_version_key):
            rows.append({"gpu": sku, "vllm": version, "in_vidur": version in scored,
                         "attention_us": attention.get(version),
                         "ours_attention_us": ours_attention,
                         "allreduce_us": allreduce.get(version),
                         "ours_allreduce_us": ours_allreduce})
    return shape, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    with database.connect() as con:
        shape, rows = measure(con)
    print("\n".join(sections.floor_table(rows, ALLREDUCE)))
    if args.json:
        meta = {"attention": shape, "allreduce": ALLREDUCE, "code_version": code_version(),
                "date": datetime.now(UTC).isoformat(timespec="seconds")}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
