"""The serving targets from the silicon rows: each row read or named, and the rows no replay can
explain (a TTFT that falls with load, a TPOT under its decode floor) left out with the reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from leaderboard.ingest.base import IngestContext
from leaderboard.ingest.silicon import MalformedRow, ingest, parse_row
from leaderboard.ingest.sources import SourceFile
from leaderboard_core.specs import load_gpu_specs, load_models, model_by_alias

GOOD = {"id": "run-a", "silicon_data_source": "x; silicon_concurrency=8", "backend": "vllm",
        "backend_version": "0.12.0", "model_path": "Qwen/Qwen3-32B", "system": "h100_sxm",
        "precision": "", "mode": "agg", "gemm_quant_mode": "", "isl": "1024", "osl": "128",
        "batch_size": "8", "tp_size": "2", "pp_size": "1", "attention_dp_size": "",
        "moe_ep_size": "1", "moe_tp_size": "2", "silicon_ttft_ms": "300.5",
        "silicon_tpot_ms": "12.5"}


def test_a_good_silicon_row_is_read_as_bf16_with_its_load():
    rec = parse_row(GOOD, 7, "silicon.csv", model_by_alias(load_models()))
    assert (rec["model"], rec["precision"], rec["concurrency"], rec["tp"]) == ("qwen3-32b", "bf16", 8, 2)
    assert (rec["ttft_ms"], rec["tpot_ms"], rec["row"]) == (300.5, 12.5, 7)


@pytest.mark.parametrize("field, value, says", [
    ("silicon_tpot_ms", "abc", "'silicon_tpot_ms' is 'abc', not a number"),
    ("silicon_ttft_ms", "-3", "must be finite and > 0"),
    ("isl", "10.5", "not a whole number"),
    ("batch_size", "", "'batch_size' is empty"),
    ("mode", "split", "expected 'agg' or 'disagg'"),
])
def test_a_malformed_silicon_row_names_the_row(tmp_path, field, value, says):
    header = list(GOOD)
    rows = [GOOD, {**GOOD, "id": "run-bad", field: value}]
    path = tmp_path / "silicon_sample.csv"
    path.write_text("\n".join([",".join(header)] + [",".join(r[h] for h in header) for r in rows]) + "\n")
    file = SourceFile("x/silicon_sample.csv", path, "0" * 64, False, "x", None, None)
    with pytest.raises(MalformedRow, match=rf"line 3 \(id run-bad\).*{says}"):
        ingest([file], IngestContext(load_gpu_specs(), load_models()))


def test_every_silicon_row_is_accounted_for(real_store):
    (total,) = real_store.sql("SELECT count(*) FROM serving_runs")[0]
    (card,) = real_store.sql("SELECT card FROM datasets WHERE name = 'h100_silicon'")[0]
    coverage = card[card.index("## Coverage"):card.index("**Rows no replay")]
    table = [line.split("|") for line in coverage.splitlines() if line.startswith("| ")][1:]
    assert sum(int(cells[5]) for cells in table) == total == 5221
    usable = sum(int(c[5]) for c in table if c[6].strip() == "usable")
    (targets,) = real_store.sql("SELECT count(*) FROM serving_targets WHERE load = 'closed'")[0]
    assert usable == targets > 0


def test_the_slope_artefact_is_a_ttft_that_falls_with_load_and_a_growing_one_is_not():
    import polars as pl

    from leaderboard.cells import serving_artefacts

    def group(tp: int, b: float, growth: float = 0.0, osls=(128, 256, 512)) -> list[dict]:
        return [{"row": 100 * tp + i, "sku": "h100_sxm", "model_path": "m", "backend": "trtllm",
                 "backend_version": "1", "precision": "bf16", "tp": tp, "isl": 1024, "osl": osl,
                 "concurrency": c, "batch_size": c, "tpot_ms": 8.0 + c / 8,
                 "ttft_ms": 60 + growth * c + (b * (osl - 1) * (8.0 + c / 8) / (c - 1)
                                               if c > 1 else 0.0),
                 "why": None}
                for i, (osl, c) in enumerate((o, c) for o in osls for c in (1, 8, 16, 32, 64))]

    runs = pl.DataFrame(group(1, 0.85)  # falls with load: the artefact
                        + group(2, 0.02, growth=4.0)  # TTFT grows with load: replayable
                        + group(3, 0.85, osls=(512,))  # one output length: no evidence
                        + group(5, 0.3, growth=-0.5)  # falls, but b too small to be a wait
                        + [{**r, "why": "left out already"} for r in group(4, 0.85)])
    found = serving_artefacts.slope_artefacts(runs)
    # the TP1 group's rows at 1 < c <= 32 only: i = osl index * 5 + c index
    assert sorted(found) == [100 + 5 * o + k for o in range(3) for k in (1, 2, 3)]
    a, b, r2 = found[101]
    assert b == pytest.approx(0.85, abs=0.01) and a == pytest.approx(60, abs=1) and r2 > 0.99


def test_the_slope_rows_left_out_of_h100_silicon_are_the_llama_8b_trtllm_campaign(real_store):

    rows = real_store.sql("SELECT tp, isl, osl, coalesce(concurrency, batch_size), ttft_ms, "
                          "tpot_ms FROM serving_runs WHERE sku = 'h100_sxm' AND backend = "
                          "'trtllm' AND model_path LIKE '%Llama-3.1-8B%' AND mode = 'agg'")
    flagged = 0
    for tp, isl in {(r[0], r[1]) for r in rows}:
        g = np.array([r[2:] for r in rows if (r[0], r[1]) == (tp, isl) and 1 < r[3] <= 32], float)
        falls = all(g[(g[:, 0] == osl) & (g[:, 1] == g[g[:, 0] == osl, 1].max()), 2][0]
                    < g[(g[:, 0] == osl) & (g[:, 1] == g[g[:, 0] == osl, 1].min()), 2][0]
                    for osl in set(g[:, 0]))
        x = (g[:, 0] - 1) * g[:, 3] / (g[:, 1] - 1)
        slope, _ = np.polyfit(x, g[:, 2], 1)
        flagged += len(g) if falls and slope > 0.5 else 0
    card = real_store.sql("SELECT card FROM datasets WHERE name = 'h100_silicon'")[0][0]
    assert f"explain ({flagged}," in card and flagged == 63  # 7 of the campaign's 12 groups
    (total,) = real_store.sql("SELECT count(*) FROM serving_targets WHERE dataset = "
                              "'h100_silicon' AND backend = 'trtllm' AND model = 'llama-3.1-8b'")[0]
    assert total == 177 - flagged  # its other rows stay


TOY_MODEL = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
             "head_dim": 16, "intermediate_size": 128, "gated_mlp": True, "vocab_size": 1000,
             "tied_embeddings": False}


def test_a_decode_floor_is_the_bytes_a_step_reads_over_the_datasheet_bandwidth():
    """A small dense model, its floor recomputed from the shapes by hand, at TP 2 and at TP 4
    (fewer KV heads than GPUs: each GPU keeps one); the premise is the full length's KV."""
    from leaderboard.cells import serving_artefacts
    from leaderboard_core.specs import GpuSpec

    gpu = GpuSpec("toy", {"mem_bw_gbs": 1.0, "mem_gb": 1}, Path("toy.yaml"))
    # per GPU at TP 2, FP8 GEMM weights (1 byte): qkv (4 + 2 x 2) x 16 / 2 x 64, o 64 x 32,
    # gate_up 128 x 64, down 64 x 64; the LM head 1000 x 64 / 2 at 2 bytes
    weights = 2 * (64 * 64 + 64 * 32 + 128 * 64 + 64 * 64) + 1000 * 64 // 2 * 2
    # 3 requests at 100 + 40 / 2 tokens; per token 2 layers x K and V x 1 head x 16 x 2 bytes
    kv = 3 * (100 + 20) * 2 * 2 * 1 * 16 * 2
    floor = serving_artefacts.decode_floor_ms(TOY_MODEL, 2, "fp8", 3, 100, 40, gpu)
    assert floor == pytest.approx((weights + kv) / 1e9 * 1e3)
    # TP 4: qkv (4 / 4 + 2 x 1) x 16 x 64 (each GPU keeps one of the 2 KV heads whole, as
    # vLLM's QKV projection does), the others a quarter, LM head 1000 x 64 / 4 x 2; the KV the
    # same, one head per GPU
    quarter = 2 * (64 * 48 + 64 * 16 + 64 * 64 + 64 * 32) + 1000 * 64 // 4 * 2
    assert serving_artefacts.decode_floor_ms(TOY_MODEL, 4, "fp8", 3, 100, 40, gpu) == pytest.approx(
        (quarter + kv) / 1e6)
    # 0.9 GiB less weights (layers, LM head and embedding) holds N tokens of 128 bytes; the
    # premise counts isl + osl, so a load whose mean context fits and whose full one does not
    # gets no verdict
    tokens = (0.9 * 2**30 - (weights + 1000 * 64 // 2 * 2)) // 128
    assert serving_artefacts.decode_floor_ms(TOY_MODEL, 2, "fp8", 1, int(tokens) - 100, 99, gpu)
    assert serving_artefacts.decode_floor_ms(TOY_MODEL, 2, "fp8", 1, int(tokens) - 60, 99, gpu) is None


def test_runs_well_below_their_floor_take_their_campaign_out():
    """A TPOT under 95 % of its floor is found, one at 96 % is not, a load with no room gets
    no verdict, and a row left out already is not read; the campaign of a found row (its GPU,
    checkpoint, backend version and precision) goes with it, whatever its own TPOT."""
    from leaderboard.cells import serving_artefacts
    from leaderboard_core.specs import GpuSpec

    gpu = GpuSpec("toy", {"mem_bw_gbs": 1.0, "mem_gb": 1}, Path("toy.yaml"))
    floor = serving_artefacts.decode_floor_ms(TOY_MODEL, 2, "fp8", 3, 100, 40, gpu)

    def row(n: int, tpot: float, isl: int = 100, why: str | None = None,
            version: str = "1") -> dict:
        return {"row": n, "model": "toy", "model_path": "org/toy", "tp": 2, "precision": "fp8",
                "batch_size": 3, "isl": isl, "osl": 40, "sku": "toy", "backend": "vllm",
                "backend_version": version, "moe_ep": None, "tpot_ms": tpot, "why": why}

    runs = pl.DataFrame([row(1, 0.94 * floor), row(2, 0.96 * floor), row(3, 1e-6, isl=10**7),
                         row(4, 0.5 * floor, why="left out already"),
                         row(5, 2 * floor, version="2"), row(6, 0.0, version="3")])
    found = serving_artefacts.below_decode_floor(runs, {"toy": gpu}, {"toy": TOY_MODEL})
    assert list(found) == [1] and found[1] == pytest.approx(floor)  # a TPOT of 0 records none
    assert sorted(serving_artefacts.campaign_rows(runs, list(found))) == [1, 2, 3]


def test_an_moe_floor_counts_the_top_k_experts_only_where_every_gpu_holds_them():
    from leaderboard.cells import serving_artefacts

    models = load_models()
    dense, moe = models["qwen3-32b"], next(m for m in models.values() if "num_experts" in m)
    # Qwen3-32B at TP 1 in FP8: 64 x (10240 x 5120 + 5120 x 8192 + 51200 x 5120 + 5120 x 25600)
    # weight bytes and a BF16 LM head of 151936 x 5120
    expected = 64 * (10240 * 5120 + 5120 * 8192 + 51200 * 5120 + 5120 * 25600) \
        + 151936 * 5120 * 2
    assert serving_artefacts.streamed_weight_bytes(dense, 1, "fp8") == expected
    h, hd, tp = moe["hidden_size"], moe["head_dim"], 2
    two_dense = {**moe, "dense_layers": 2, "intermediate_size": 1024, "gated_mlp": True}
    attention = ((moe["num_heads"] + 2 * moe["num_kv_heads"]) * hd * h + h * moe["num_heads"] * hd) / tp
    ffn = (2 * 1024 * h + h * 1024) / tp
    experts = (moe["experts_per_token"] + moe["shared_experts"]) * 3 * h * (
        moe["moe_intermediate_size"] // tp)
    head = moe["vocab_size"] * h * 2 / tp
    layers = moe["num_layers"]
    assert serving_artefacts.streamed_weight_bytes(two_dense, tp, "bf16") == pytest.approx(
        2 * (layers * attention + 2 * ffn + (layers - 2) * experts) + head)
    # experts spread whole over the GPUs: none counted
    assert serving_artefacts.streamed_weight_bytes(two_dense, tp, "bf16", moe_ep=2) == pytest.approx(
        2 * (layers * attention + 2 * ffn) + head)


def test_the_campaign_below_the_decode_floor_is_left_out_of_its_set(real_store):
    """Every usable silicon run's floor, recomputed from its row and the model's shapes: the
    runs below it are the two Qwen3-32B FP8 runs of vLLM 0.12.0 on the H100 (TP1 c = 24, TP2
    c = 48), and no target holds any run of their campaign."""
    import duckdb

    from leaderboard.cells import serving_targets

    gpus, models = load_gpu_specs(), load_models()
    with duckdb.connect(str(real_store.path), read_only=True) as con:
        rows = con.sql("SELECT * FROM serving_runs").pl().to_dicts()
    targets = {r[0] for r in real_store.sql("SELECT target_id FROM serving_targets")}
    below = []
    for r in rows:
        if serving_targets.exclusion(r, gpus, models) is not None or not r["tpot_ms"] or r["osl"] < 2:
            continue
        m, gpu, c, tp = models[r["model"]], gpus[r["sku"]], r["batch_size"], r["tp"]
        if "num_experts" in m:
            continue  # MoE floors are further from every measured TPOT than any dense one
        width = 2 * m["intermediate_size"] if m["gated_mlp"] else m["intermediate_size"]
        per_layer = ((m["num_heads"] + 2 * m["num_kv_heads"]) * m["head_dim"] * m["hidden_size"]
                     + m["hidden_size"] * m["num_heads"] * m["head_dim"]
                     + (width + m["intermediate_size"]) * m["hidden_size"]) / tp
        gemm_bytes = {"bf16": 2, "fp8": 1}[r["precision"]]
        head = m["vocab_size"] * m["hidden_size"] * 2 / tp
        per_token = m["num_layers"] * 2 * max(m["num_kv_heads"] // tp, 1) * m["head_dim"] * 2
        held = (m["num_layers"] * per_layer * gemm_bytes
                + (1 if m.get("tied_embeddings") else 2) * head + c * (r["isl"] + r["osl"]) * per_token)
        if held > 0.9 * gpu["mem_gb"] * 2**30:
            continue
        floor = (m["num_layers"] * per_layer * gemm_bytes + head
                 + c * (r["isl"] + r["osl"] / 2) * per_token) / (gpu["mem_bw_gbs"] * 1e6)
        if r["tpot_ms"] < 0.95 * floor:
            below.append(r)
    assert sorted((r["sku"], r["model"], r["backend_version"], r["tp"], r["batch_size"])
                  for r in below) == [("h100_sxm", "qwen3-32b", "0.12.0", 1, 24),
                                      ("h100_sxm", "qwen3-32b", "0.12.0", 2, 48)]
    campaign = [r["run_id"] for r in rows if r["mode"] == "agg" and (
        r["sku"], r["model_path"], r["backend_version"], r["precision"]) == (
        "h100_sxm", "Qwen/Qwen3-32B", "0.12.0", "fp8")]
    assert len(campaign) == 3 and not set(campaign) & targets
    card = real_store.sql("SELECT card FROM datasets WHERE name = 'h100_silicon_fp8'")[0][0]
    assert "decode step (3 rows, in the coverage" in card
