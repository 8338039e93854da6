"""The snapping figures a ``_vidur*`` card states, recomputed here from the store: the distortion
table (median, P90 and max of the relative token-count and mean-decode-context distortion and of
the requests dropped, over kept steps; the phase mix of kept steps; the kept share) and the
counts of workloads dropped on a GPU as too big for its memory or lacking a measured point.

The rule is written here from its description (``datasets/cards/vidur.md``, "Workloads and
snapping"; ``docs/design.md``, "Snap the whole step"), never through
``leaderboard.cells.snapping``, ``distortion`` or ``vidur_method``. Its inputs: the grids as the
store's gemm, attention, collective and moe tables hold them (by SQL), the steps of the traces
replayed through the schedulers (``replayed_steps``, as the replay test of ``test_cards`` does),
the model yamls and the GPU specs. Figures are compared at the card's precision (three
significant digits, 0.1 %).

Taken as given, not recomputed: what the card leaves open and the builder decides, namely which
candidate has "the least distortion" (the least sum of the |log2| moves of the token count, the
decode count and the prompt count; on a tie the larger token count), the key of the "hash
order" the uniform filler is sampled in, and the replayed means rounded to whole tokens (the
token-count distortion is against the decodes plus the prompt count times that mean); and which
GPUs have a dataset of a family at which vLLM version, read from the store's ``datasets``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from fractions import Fraction
from functools import cache
from itertools import product
from typing import NamedTuple

import duckdb
import pytest
import yaml
from test_cards import _card, _lens, _memory_need, _model, _number

from leaderboard.cells.traces import replayed_steps
from leaderboard_core import paths
from leaderboard_core.specs import load_gpu_specs

CFG = yaml.safe_load((paths.CONF_DIR / "cells" / "vidur.yaml").read_text())
MIN_PROMPT = 16  # "a neighbouring measured prompt length (at least 16 tokens)"
UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization, the limit docs/design.md states
PHASES = ("prefill", "decode", "mixed")
pytestmark = pytest.mark.long  # the module fixture replays every trace (about 85 s)
FAMILIES = ["vidur", "vidur19", "vidur_fp8", "vidur_moe", "vidur_moe_powerlaw"]
_shapes = cache(_model)  # each model yaml read once; the tests only read the dicts


class Replayed(NamedTuple):
    """A replayed step as snapping reads it: its decodes' count and mean context, its prompts'
    count and mean length (means rounded to whole tokens), and whether a prompt is a chunk with
    prior context."""

    n_decode: int
    mean_ctx: int
    n_prefill: int
    mean_len: int
    prefix: bool

    @property
    def tokens(self) -> int:
        return self.n_decode + self.n_prefill * self.mean_len


class Step(NamedTuple):
    """A workload: one decode batch at one context and one prompt batch of one length."""

    n_decode: int
    ctx: int
    n_prefill: int
    length: int

    @property
    def tokens(self) -> int:
        return self.n_decode + self.n_prefill * self.length

    @property
    def phase(self) -> str:
        return _phase(self.n_decode, self.n_prefill)

    @property
    def lens(self) -> tuple[list[int], list[int]]:
        """(q_lens, ctx_lens): the prompts from an empty cache, then the decodes."""
        return ([self.length] * self.n_prefill + [1] * self.n_decode,
                [0] * self.n_prefill + [self.ctx] * self.n_decode)


def _phase(n_decode: int, n_prefill: int) -> str:
    return "mixed" if n_decode and n_prefill else "decode" if n_decode else "prefill"


class Measured(NamedTuple):
    """Every point one GPU measured at one vLLM version, as sets of key tuples."""

    gemm: set  # (m, n, k)
    prefill: set  # (batch, prompt length, heads, KV heads), empty cache
    decode: set  # (batch, KV length, heads, KV heads)
    allreduce: set  # (GPUs, message bytes)
    moe: set  # (tokens, hidden, per-expert intermediate, top-k, experts, TP)


class Family(NamedTuple):
    datasets: dict  # dataset name -> (sku, the points of its GPU)
    tally: list  # (phase, replayed count, Replayed, Step or None) per configuration and shape
    workloads: set  # (model, TP, Step) the family samples


def _measured(con, sku: str, version: str, fam: dict) -> Measured:
    """The points a cell may read: aiconfigurator's GEMMs of the family's precision (per-tensor
    ``fp8`` for the FP8 family), bf16 head_dim-128 attention without a window on a bf16 KV
    cache, vLLM's graph-mode bf16 all-reduce, bf16 MoE layers without EP at the family's
    routing."""
    where = f"source = 'aiconfigurator' AND sku = '{sku}' AND backend_version = '{version}'"
    gemm_dtype = {"bf16": "bfloat16", "fp8": "fp8"}[fam.get("gemm_dtype", "bf16")]
    attention = ("SELECT batch, {}, num_heads, num_kv_heads FROM attention WHERE " + where +
                 " AND dtype = 'bfloat16' AND kv_dtype = 'bfloat16' AND head_dim = 128 "
                 "AND coalesce(window_size, 0) = 0 AND phase = ")

    def keys(query: str) -> set:
        return set(con.execute(query).fetchall())

    return Measured(
        keys(f"SELECT m, n, k FROM gemm WHERE {where} AND dtype = '{gemm_dtype}'"),
        keys(attention.format("q_len") + "'prefill' AND kv_len = 0"),
        keys(attention.format("kv_len") + "'decode'"),
        keys(f"SELECT num_gpus, message_bytes FROM collective WHERE {where} AND backend = "
             "'vllm_graph' AND collective = 'all_reduce' AND dtype = 'bfloat16'"),
        keys(f"SELECT num_tokens, hidden_size, inter_size, topk, num_experts, moe_tp FROM moe "
             f"WHERE {where} AND dtype = 'bfloat16' AND moe_ep = 1 "
             f"AND distribution = '{fam.get('moe_distribution')}'"))


def _axes(members: list[Measured]) -> dict[str, list[int]]:
    """The values of each grid axis every member GPU measured: what steps are snapped onto."""
    axes = {}
    for axis, table, at in (("m", "gemm", 0), ("isl", "prefill", 1), ("prefill_batch", "prefill", 0),
                            ("kv", "decode", 1), ("decode_batch", "decode", 0),
                            ("allreduce_bytes", "allreduce", 1), ("moe_tokens", "moe", 0)):
        axes[axis] = sorted(set.intersection(*({key[at] for key in getattr(m, table)}
                                               for m in members)))
    return axes


def _token_counts(model: dict, tp: int, axes: dict) -> set[int]:
    """The token counts a configuration may take: a measured GEMM m, under TP a measured
    all-reduce of tokens x hidden bf16 elements, for an MoE model a measured MoE layer."""
    return {t for t in axes["m"]
            if (tp == 1 or t * model["hidden_size"] * 2 in axes["allreduce_bytes"])
            and ("num_experts" not in model or t in axes["moe_tokens"])}


def _neighbours(value: int, grid: list[int]) -> list[int]:
    """The measured values next below and next above ``value``, or ``value`` when measured."""
    if value in grid:
        return [value]
    below, above = [g for g in grid if g < value], [g for g in grid if g > value]
    return [max(below)] * bool(below) + [min(above)] * bool(above)


def _log_move(new: int, old: int) -> float:
    return abs(math.log2(new / old)) if old else 0.0


def _snap(step: Replayed, axes: dict, tokens: set[int]) -> Step | None:
    """The replayed step moved as a whole onto the grid, or None when it is dropped."""
    if step.prefix:  # prefill was measured from an empty cache only
        return None
    decodes = _neighbours(step.n_decode, axes["decode_batch"]) if step.n_decode else [0]
    # the mean context to the nearest KV length on a log2 scale (a tie to the longer)
    ctx = min(axes["kv"], key=lambda kv: (abs(math.log2(kv / step.mean_ctx)), -kv)
              ) if step.n_decode else 0
    prompts = _neighbours(step.n_prefill, axes["prefill_batch"]) if step.n_prefill else [0]
    lengths = _neighbours(max(step.mean_len, MIN_PROMPT),
                          [q for q in axes["isl"] if q >= MIN_PROMPT]) if step.n_prefill else [0]
    candidates = [s for d, p, q in product(decodes, prompts, lengths)
                  if (s := Step(d, ctx, p, q)).tokens in tokens
                  and _log_move(s.tokens, step.tokens) <= 1]  # halving or doubling at most
    return min(candidates, default=None, key=lambda s: (
        _log_move(s.tokens, step.tokens) + _log_move(s.n_decode, step.n_decode)
        + _log_move(s.n_prefill, step.n_prefill), -s.tokens))


def _uniform(axes: dict, tokens: set[int]):
    """The measured uniform batches: a prompt batch, a decode batch at one context, or one of
    each, at a token count the configuration may take."""
    prompts = [(0, 0), *product(axes["prefill_batch"], [q for q in axes["isl"] if q >= MIN_PROMPT])]
    decodes = [(0, 0), *product(axes["decode_batch"], axes["kv"])]
    for (p, q), (d, c) in product(prompts, decodes):
        if (p or d) and Step(d, c, p, q).tokens in tokens:
            yield Step(d, c, p, q)


def _composes(points: Measured, m: dict, tp: int, step: Step) -> bool:
    """Whether a GPU measured every point of the workload: the QKV, O (and, on dense layers,
    gate/up and down) GEMMs at m = its tokens with n and k sharded by TP, an MoE model's
    fused-MoE layer, one attention kernel per kind, the all-reduce under TP."""
    t, h, d = step.tokens, m["hidden_size"], m["head_dim"]
    heads, kv_heads = m["num_heads"] // tp, m["num_kv_heads"] // tp
    gemms = [((m["num_heads"] + 2 * m["num_kv_heads"]) * d // tp, h), (h, m["num_heads"] * d // tp)]
    if m.get("dense_layers", m["num_layers"]):
        f = m["intermediate_size"]
        gemms += [((2 if m["gated_mlp"] else 1) * f // tp, h), (h, f // tp)]
    return (all((t, n, k) in points.gemm for n, k in gemms)
            and ("num_experts" not in m or (t, h, m["moe_intermediate_size"], m["experts_per_token"],
                                            m["num_experts"], tp) in points.moe)
            and (not step.n_decode or (step.n_decode, step.ctx, heads, kv_heads) in points.decode)
            and (not step.n_prefill or (step.n_prefill, step.length, heads, kv_heads) in points.prefill)
            and (tp == 1 or (tp, t * h * 2) in points.allreduce))


@pytest.fixture(scope="module")
def replayed(real_store) -> Counter:
    """How often each replayed step shape occurs, over every trace, load and scheduler."""
    shapes = Counter()
    with duckdb.connect(str(real_store.path), read_only=True) as con:
        for _, _, slots in replayed_steps(con, CFG):
            ctx = [s.ctx for s in slots if s.decode]
            prompts = [s for s in slots if not s.decode]
            shapes[Replayed(len(ctx), round(sum(ctx) / len(ctx)) if ctx else 0, len(prompts),
                            round(sum(s.q for s in prompts) / len(prompts)) if prompts else 0,
                            any(s.ctx > 0 for s in prompts))] += 1
    return shapes


def _sampled(model_name: str, tp: int, found: Counter, members: list[Measured]) -> list[Step]:
    """Up to ``cells_per_phase`` workloads per phase that some member GPU measured every point
    of: the replayed steps first, then the uniform batches, each in the builder's hash order."""
    def order(item):
        step, weight = item
        key = (f"{model_name}|{tp}|Snapped(n_decode={step.n_decode}, ctx={step.ctx}, "
               f"n_prefill={step.n_prefill}, length={step.length})")
        return weight == 0, hashlib.sha256(key.encode()).hexdigest()

    m, taken, out = _shapes(model_name), Counter(), []
    for step, _ in sorted(found.items(), key=order):
        if taken[step.phase] < CFG["cells_per_phase"] and any(
                _composes(points, m, tp, step) for points in members):
            taken[step.phase] += 1
            out.append(step)
    return out


@pytest.fixture(scope="module")
def family_of(real_store, replayed):
    """The family of a ``conf/cells/vidur.yaml`` entry, recomputed once per module: its
    datasets (which GPUs have one, and at which vLLM version, as the store lists them), every
    (configuration, replayed shape) snapped onto the members' common axes, and its workloads."""
    @cache
    def family(suffix: str) -> Family:
        fam = CFG["families"][suffix]
        rows = real_store.sql(f"SELECT name, sku, backend_versions FROM datasets "
                              f"WHERE regexp_matches(name, '^[a-z0-9]+_{suffix}$')")
        with duckdb.connect(str(real_store.path), read_only=True) as con:
            datasets = {name: (sku, _measured(con, sku, json.loads(versions)[0], fam))
                        for name, sku, versions in rows}
        members = [points for sku, points in datasets.values() if sku in fam["gpus"]]
        axes = _axes(members)
        tally, workloads = [], set()
        for entry in fam.get("configs", CFG["configs"]):
            tokens = _token_counts(_shapes(entry["model"]), entry["tp"], axes)
            found = Counter()  # workload -> replayed steps snapped onto it
            for shape, count in replayed.items():
                snapped = _snap(shape, axes, tokens)
                tally.append((_phase(shape.n_decode, shape.n_prefill), count, shape, snapped))
                if snapped:
                    found[snapped] += count
            for step in _uniform(axes, tokens):
                found.setdefault(step, 0)
            workloads |= {(entry["model"], entry["tp"], step)
                          for step in _sampled(entry["model"], entry["tp"], found, members)}
        return Family(datasets, tally, workloads)

    return family


def _weighted(values: list[tuple[float, int]], share: Fraction) -> float:
    """The smallest value at or below which ``share`` of the weight lies."""
    total, below = sum(w for _, w in values), 0
    for value, weight in sorted(values):
        below += weight
        if below >= share * total:
            return value
    raise AssertionError("no values")


@pytest.mark.parametrize("suffix", FAMILIES)
def test_the_distortion_table_is_recomputed_from_the_grid_and_the_traces(family_of, real_store,
                                                                        suffix):
    """Every replayed step shape, once per configuration and weighted by how often the traces
    replay it, snapped here onto the family's common grid: the median, P90 and max of the
    relative token-count distortion, the relative mean-context distortion (steps with decodes)
    and the requests dropped, over kept steps; each phase's share of the kept steps; and the
    kept share of all (configuration, step) pairs, on every card of the family."""
    family = family_of(suffix)
    kept = [(phase, count, shape, s) for phase, count, shape, s in family.tally if s]
    columns = {
        "token count, relative": [(abs(s.tokens - shape.tokens) / shape.tokens, count)
                                  for _, count, shape, s in kept],
        "mean decode context, relative": [(abs(s.ctx - shape.mean_ctx) / shape.mean_ctx, count)
                                          for _, count, shape, s in kept if shape.n_decode],
        "requests dropped": [(max(shape.n_decode + shape.n_prefill - s.n_decode - s.n_prefill, 0),
                              count) for _, count, shape, s in kept],
    }
    figures = {label: [_weighted(values, Fraction(1, 2)), _weighted(values, Fraction(9, 10)),
                       max(v for v, _ in values)] for label, values in columns.items()}
    total, n_kept = sum(c for _, c, _, _ in family.tally), sum(c for _, c, _, _ in kept)
    by_phase = Counter()
    for phase, count, _, _ in kept:
        by_phase[phase] += count
    assert 0 < n_kept < total and all(by_phase[p] for p in PHASES)  # every row has something to say
    for name in family.datasets:
        card = _card(real_store, name)
        for label, by_hand in figures.items():
            stated = re.search(rf"\| {label} \| ([^|]+) \| ([^|]+) \| ([^|]+) \|", card)
            assert stated, (name, label)
            for text, value in zip(stated.groups(), by_hand, strict=True):
                assert float(text) == pytest.approx(value, rel=5e-3), (name, label)
        shares = re.findall(r"\| (prefill|decode|mixed) \| [\d.]+% \| ([\d.]+)% \|", card)
        assert [phase for phase, _ in shares] == list(PHASES), name
        for phase, share in shares:
            assert float(share) == pytest.approx(100 * by_phase[phase] / n_kept, abs=0.05), name
        found = re.search(r"([\d.]+)% of ([\d,]+) replayed \(configuration, step\) pairs", card)
        assert found and int(found.group(2).replace(",", "")) == total, name
        assert float(found.group(1)) == pytest.approx(100 * n_kept / total, abs=0.05), name


def _step_of(q_lens: list[int], ctx_lens: list[int]) -> Step:
    """A cell's workload as one decode batch and one prompt batch (each must be uniform)."""
    decodes = [c for q, c in zip(q_lens, ctx_lens, strict=True) if q == 1 and c > 0]
    prompts = [(q, c) for q, c in zip(q_lens, ctx_lens, strict=True) if not (q == 1 and c > 0)]
    assert len(set(decodes)) <= 1 and len(set(prompts)) <= 1 and not any(c for _, c in prompts)
    return Step(len(decodes), decodes[0] if decodes else 0, len(prompts),
                prompts[0][0] if prompts else 0)


@pytest.mark.parametrize("suffix", FAMILIES)
def test_the_workloads_a_gpu_drops_as_too_big_or_lacks_are_recomputed(family_of, real_store,
                                                                      suffix):
    """The family's workloads sampled here (per configuration and phase up to
    ``cells_per_phase`` of the snapped replayed steps, then of the measured uniform batches,
    each measured on some member GPU), then per GPU of the family: the count whose weights plus
    KV cache (by hand, from the model yamls) need more than 90 % of its memory, the count it
    lacks a measured point of, and the workloads of its cells, which must be the rest."""
    family = family_of(suffix)
    gpus = load_gpu_specs()
    dtype = CFG["families"][suffix].get("gemm_dtype", "bf16")
    assert len(family.workloads) > 500
    dropped = []
    for name, (sku, points) in family.datasets.items():
        limit = UTILIZATION * gpus[sku]["mem_gb"] * 2**30
        too_big = {(model, tp, s) for model, tp, s in family.workloads
                   if _memory_need(_shapes(model), tp, *s.lens, dtype) > limit}
        lacks = {(model, tp, s) for model, tp, s in family.workloads - too_big
                 if not _composes(points, _shapes(model), tp, s)}
        card = _card(real_store, name)
        assert _number(card, r"Dropped as impossible:\**\s+(\d+) workloads") == len(too_big), name
        assert re.search(rf"more\s+than\s+90% of {gpus[sku]['mem_gb']} GiB", card), name
        assert _number(card, r"this GPU\s+lacks:\s+(\d+)") == len(lacks), name
        cells = {(model, tp, _step_of(*_lens(q, c))) for model, tp, q, c in real_store.sql(
            f"SELECT model, tp, q_lens, ctx_lens FROM cells WHERE dataset = '{name}'")}
        assert cells == family.workloads - too_big - lacks, name
        dropped.append((len(too_big), len(lacks)))
    assert all(map(any, zip(*dropped, strict=True)))  # some GPU drops some of each kind
