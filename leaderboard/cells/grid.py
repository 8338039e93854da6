"""The measured aiconfigurator grid of one GPU, as lookups keyed by exact shape.

Ground truth reads these lookups and nothing else: a shape that is not a key was not measured,
and the cell that needs it is not built. Only bf16 GEMMs, bf16 attention with a bf16 KV cache,
head_dim 128, no sliding window, and vLLM's graph-mode custom all-reduce are loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property

import duckdb

HOME_VERSION = "0.14.0"


@dataclass
class Point:
    table: str
    key: dict
    latency_ms: float

    def key_json(self) -> str:
        return json.dumps(self.key, sort_keys=True)


@dataclass
class Grid:
    sku: str
    version: str
    gemm: dict[tuple[int, int, int], Point] = field(default_factory=dict)
    prefill: dict[tuple[int, int, int, int], Point] = field(default_factory=dict)
    decode: dict[tuple[int, int, int, int], Point] = field(default_factory=dict)
    allreduce: dict[tuple[int, int], Point] = field(default_factory=dict)
    files: set[tuple[str, str]] = field(default_factory=set)

    @cached_property
    def prefill_batches(self) -> list[int]:
        return sorted({b for b, *_ in self.prefill})

    @cached_property
    def decode_batches(self) -> list[int]:
        return sorted({b for b, *_ in self.decode})


def vidur_version(con: duckdb.DuckDBPyConnection, sku: str) -> str | None:
    """The home's vLLM version where this GPU has it, else the nearest later one with all three
    op families (GEMM, attention, all-reduce) measured."""
    rows = con.execute(
        """SELECT backend_version FROM gemm WHERE source = 'aiconfigurator' AND sku = ?
           INTERSECT SELECT backend_version FROM attention WHERE source = 'aiconfigurator' AND sku = ?
           INTERSECT SELECT backend_version FROM collective
                     WHERE source = 'aiconfigurator' AND sku = ? AND backend = 'vllm_graph'""",
        [sku, sku, sku]).fetchall()
    versions = sorted((v for (v,) in rows), key=lambda v: tuple(int(x) for x in v.split(".")))
    later = [v for v in versions if tuple(map(int, v.split("."))) >= (0, 14, 0)]
    return later[0] if later else None


def load_grid(con: duckdb.DuckDBPyConnection, sku: str, version: str) -> Grid:
    grid = Grid(sku, version)
    where = "source = 'aiconfigurator' AND sku = ? AND backend_version = ?"
    for m, n, k, lat, f, sha in con.execute(
        f"SELECT m, n, k, latency_ms, file, file_sha256 FROM gemm WHERE {where} "
        "AND dtype = 'bfloat16'", [sku, version]).fetchall():
        grid.gemm[(m, n, k)] = Point("gemm", {"sku": sku, "version": version, "dtype": "bfloat16",
                                              "m": m, "n": n, "k": k}, lat)
        grid.files.add((f, sha))
    for phase, b, q, kv, h, hkv, lat, f, sha in con.execute(
        f"""SELECT phase, batch, q_len, kv_len, num_heads, num_kv_heads, latency_ms, file,
                   file_sha256 FROM attention WHERE {where} AND dtype = 'bfloat16'
            AND kv_dtype = 'bfloat16' AND head_dim = 128 AND coalesce(window_size, 0) = 0""",
        [sku, version]).fetchall():
        key = {"sku": sku, "version": version, "phase": phase, "batch": b, "q_len": q,
               "kv_len": kv, "num_heads": h, "num_kv_heads": hkv, "head_dim": 128}
        if phase == "prefill" and kv == 0:
            grid.prefill[(b, q, h, hkv)] = Point("attention", key, lat)
        elif phase == "decode":
            grid.decode[(b, kv, h, hkv)] = Point("attention", key, lat)
        grid.files.add((f, sha))
    for gpus, size, lat, f, sha in con.execute(
        f"SELECT num_gpus, message_bytes, latency_ms, file, file_sha256 FROM collective "
        f"WHERE {where} AND backend = 'vllm_graph' AND collective = 'all_reduce' "
        "AND dtype = 'bfloat16'", [sku, version]).fetchall():
        grid.allreduce[(gpus, size)] = Point(
            "collective", {"sku": sku, "version": version, "backend": "vllm_graph",
                           "num_gpus": gpus, "message_bytes": size}, lat)
        grid.files.add((f, sha))
    return grid


def common_axes(grids: list[Grid]) -> dict[str, list[int]]:
    """The grid values every GPU measured: the axes workloads are snapped onto."""
    def shared(values_of):
        sets = [set(values_of(g)) for g in grids]
        return sorted(set.intersection(*sets)) if sets else []

    return {
        "m": shared(lambda g: {m for m, _, _ in g.gemm}),
        "isl": shared(lambda g: {q for _, q, _, _ in g.prefill}),
        "prefill_batch": shared(lambda g: {b for b, _, _, _ in g.prefill}),
        "kv": shared(lambda g: {kv for _, kv, _, _ in g.decode}),
        "decode_batch": shared(lambda g: {b for b, _, _, _ in g.decode}),
        "allreduce_bytes": shared(lambda g: {s for _, s in g.allreduce}),
    }
