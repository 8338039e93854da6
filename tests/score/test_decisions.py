"""Decisions scored from measured outcomes, worked by hand on small synthetic sets."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from leaderboard.score import decisions

BATCHES = [1, 2, 4, 8]
MEASURED = [1.0, 1.5, 2.5, 5.0]  # ms: throughputs 1, 1.33, 1.6, 1.6 requests per ms


def _cells(predictor: str, predicted: list[float]) -> pl.DataFrame:
    return pl.DataFrame({"predictor": predictor, "dataset": "x_vidur", "model": "m", "tp": 1,
                         "phase": "decode", "num_requests": BATCHES, "num_decode": BATCHES,
                         "decode_ctx_sum": [512 * b for b in BATCHES], "gt_ms": MEASURED,
                         "pred_ms": predicted})


def _choices(predicted: list[float]) -> pl.DataFrame:
    return decisions.capacity_choices(_cells("p", predicted)).sort("slo_ms")


def test_a_perfect_predictor_picks_the_largest_batch_that_fits_and_regrets_nothing():
    choices = _choices(MEASURED)
    assert choices["slo_ms"].to_list() == MEASURED  # one SLO per measured step
    assert choices["pick"].to_list() == [1, 2, 4, 8]
    assert not choices["violation"].any() and choices["regret"].max() == pytest.approx(0)


def test_a_predictor_20_percent_slow_picks_smaller_batches_and_says_no_once():
    choices = _choices([1.2 * t for t in MEASURED])
    # SLO 1 ms: 1.2 ms predicted for batch 1, nothing fits: no pick, regret 1, counted
    assert choices["pick"].to_list() == [None, 1, 2, 4]
    expected = [1.0, 1 - 1 / (2 / 1.5), 1 - (2 / 1.5) / 1.6, 0.0]
    assert choices["regret"].to_list() == pytest.approx(expected)
    scores = decisions.budget_scores(choices).row(0, named=True)
    assert scores["no_pick"] == 1 and scores["violation_pct"] == 0
    assert scores["regret_pct"] == pytest.approx(np.mean(expected) * 100)


def test_a_wrong_slope_violates_where_it_promises_the_big_batch():
    # under 20 % off on three batches, but batch 8 predicted at 2.4 ms (measured 5)
    choices = _choices([1.1, 1.6, 2.0, 2.4])
    at = {r["slo_ms"]: r for r in choices.iter_rows(named=True)}
    assert at[2.5]["pick"] == 8 and at[2.5]["violation"] and at[2.5]["best"] == 4
    assert at[1.0]["pick"] is None and at[1.5]["pick"] == 1  # 1.1 > 1.0; 1.1 <= 1.5 < 1.6
    assert at[2.5]["regret"] == 1.0  # the violating pick serves nothing within the SLO
    scores = decisions.budget_scores(choices).row(0, named=True)
    assert scores["violation_pct"] == pytest.approx(25.0)
    # SLO 1: no pick (1); 1.5: batch 1 against 2 (0.25); 2.5: violation (1); 5: batch 8 (0)
    assert scores["regret_pct"] == pytest.approx((1 + 0.25 + 1 + 0) / 4 * 100)


def test_groups_with_too_few_batches_are_left_out():
    two = _cells("p", MEASURED).head(2)
    assert decisions.capacity_choices(two).is_empty()


def test_gpu_choice_a_biased_order_keeping_predictor_picks_perfectly():
    measured = {("w1", "a"): 1.0, ("w1", "b"): 2.0, ("w2", "a"): 3.0, ("w2", "b"): 2.0}
    rows = [{"predictor": p, "workload_id": w, "sku": s, "tp": 1, "gt_ms": t,
             "pred_ms": t * 1.2 if p == "biased" else (5.0 if s == "a" else 1.0)}
            for p in ("biased", "wrong") for (w, s), t in measured.items()]
    choices = decisions.gpu_choices(pl.DataFrame(rows))
    scores = {r["predictor"]: r for r in decisions.gpu_scores(choices).iter_rows(named=True)}
    assert scores["biased"]["regret_pct"] == 0 and scores["biased"]["right_pct"] == 100
    # "wrong" always picks b: w1 at 2 ms against 1 (regret 1), w2 right
    assert scores["wrong"]["regret_pct"] == pytest.approx(50.0)
    assert scores["wrong"]["right_pct"] == pytest.approx(50.0)


def test_kendall_tau_b_counts_a_tie_neither_way():
    assert decisions.kendall_tau({"a": 1, "b": 2, "c": 3}, {"a": 5, "b": 6, "c": 9}) == 1.0
    assert decisions.kendall_tau({"a": 1, "b": 2, "c": 3}, {"a": 9, "b": 6, "c": 5}) == -1.0
    assert decisions.kendall_tau({"a": 1}, {"a": 1, "b": 2}) is None  # one name in common
    assert decisions.kendall_tau({"a": 1, "b": 1}, {"a": 1, "b": 2}) is None  # all tied
    # Four names, b and c tied in the second score (within 1e-9). Pairs by hand: (a,b) +1,
    # (a,c) +1, (a,d) +1, (b,c) tie, (b,d) -1, (c,d) -1: concordant minus discordant 1, untied
    # pairs 6 and 5, tau-b 1 / sqrt(30) (SciPy's kendalltau gives the same). The names' order
    # plays no part: renamed, the same.
    first, second = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, {"a": 0.0, "b": 5.0,
                                                               "c": 5.0 + 1e-12, "d": 4.0}
    assert decisions.kendall_tau(first, second) == pytest.approx(1 / 30 ** 0.5)
    renamed = {"a": "z", "b": "c", "c": "b", "d": "a"}
    assert decisions.kendall_tau({renamed[k]: v for k, v in first.items()},
                                 {renamed[k]: v for k, v in second.items()}) == pytest.approx(
        1 / 30 ** 0.5)


CHUNKS, CHUNK_MS = [16, 64, 256, 1024], [2.0, 3.0, 6.0, 20.0]  # tokens/ms: 8, 21.3, 42.7, 51.2


def _prefill(predicted: list[float], composed: bool = False) -> pl.DataFrame:
    return pl.DataFrame({"predictor": "p", "dataset": "x_vidur", "model": "m", "tp": 1,
                         "phase": "prefill", "num_requests": 1, "num_decode": 0,
                         "total_tokens": CHUNKS, "decode_ctx_sum": 0, "gt_ms": CHUNK_MS,
                         "pred_ms": predicted, "composed": composed})


def test_chunk_budget_an_optimist_takes_the_largest_chunk_and_violates_below_it():
    perfect = decisions.chunk_choices(_prefill(CHUNK_MS)).sort("slo_ms")
    assert perfect["pick"].to_list() == CHUNKS and perfect["regret"].max() == pytest.approx(0)
    optimist = decisions.chunk_choices(_prefill([1.0] * 4)).sort("slo_ms")
    assert optimist["pick"].to_list() == [1024] * 4
    assert optimist["violation"].to_list() == [True, True, True, False]
    scores = decisions.budget_scores(optimist).row(0, named=True)
    assert scores["violation_pct"] == pytest.approx(75.0)
    assert scores["regret_pct"] == pytest.approx(75.0)  # three violations at 1, one right


def test_composed_cells_decide_nothing():
    assert decisions.chunk_choices(_prefill(CHUNK_MS, composed=True)).is_empty()


def test_gpu_choice_at_a_price_the_fastest_gpu_can_be_the_wrong_buy():
    # w1: a 1 ms at $1/h, b 0.5 ms at $4/h -> costs 1 and 2: a is the buy, b the fastest
    rows = [{"predictor": "perfect", "workload_id": "w1", "sku": s, "tp": 2, "gt_ms": t,
             "pred_ms": t} for s, t in (("a", 1.0), ("b", 0.5))]
    frame = pl.DataFrame(rows)
    cost = decisions.gpu_choices(frame, {"a": 1.0, "b": 4.0}).row(0, named=True)
    assert cost["pick"] == "a" and cost["regret"] == pytest.approx(0)
    fastest = decisions.gpu_choices(frame).row(0, named=True)
    assert fastest["pick"] == "b" and fastest["regret"] == pytest.approx(0)
    # a predictor that thinks a is 4x slower than measured buys b: cost 2 against 1
    wrong = frame.with_columns(pl.when(pl.col("sku") == "a").then(4.0).otherwise(0.5)
                               .alias("pred_ms"))
    assert decisions.gpu_choices(wrong, {"a": 1.0, "b": 4.0})["regret"].to_list() == [
        pytest.approx(1.0)]
    assert decisions.gpu_choices(frame, {"a": 1.0}).is_empty()  # one priced GPU: no choice
    # a predictor with no run on b chooses nothing, rather than "choosing" among a alone
    partial = pl.concat([frame, frame.filter(pl.col("sku") == "a").with_columns(
        predictor=pl.lit("partial"))])
    assert set(decisions.gpu_choices(partial)["predictor"]) == {"perfect"}


def test_decisive_pairs_drop_close_pairs_and_weigh_the_rest_by_the_gap():
    measured = {("w1", "a"): 1.0, ("w1", "b"): 1.05, ("w2", "a"): 1.0, ("w2", "b"): 1.5,
                ("w3", "a"): 1.0, ("w3", "b"): 3.0}
    # right on w2 (gap 0.5), wrong on w3 (gap 2.0); w1's 5 % gap is not decisive
    predicted = {("w1", "a"): 2.0, ("w2", "a"): 1.0, ("w3", "a"): 4.0}
    rows = [{"predictor": "p", "workload_id": w, "sku": s, "gt_ms": t,
             "pred_ms": predicted.get((w, s), 1.2)} for (w, s), t in measured.items()]
    row = decisions.decisive_pairs(pl.DataFrame(rows)).row(0, named=True)
    assert row["pairs"] == 2
    assert row["weighted_right_pct"] == pytest.approx(0.5 / 2.5 * 100)


def test_a_run_carries_its_own_capacity_decisions():
    cells = _cells("p", [1.1, 1.6, 2.0, 2.4]).drop("predictor", "dataset")
    own = decisions.run_capacity(cells)
    assert own["n"] == 4 and own["groups"] == 1
    assert own["violation_pct"] == pytest.approx(25.0)
    assert own["regret_pct"] == pytest.approx((1 + 0.25 + 1 + 0) / 4 * 100)
    assert decisions.run_capacity(cells.head(2)) is None


def test_serving_configuration_by_hand():
    from leaderboard.present import decisions_section

    # (TP, concurrency, measured TPOT ms): 800, 1600 and 1280 output tokens/s per GPU
    configs = [(1, 8, 10.0), (1, 32, 20.0), (2, 64, 25.0)]

    def rows(predictor: str, factor: float) -> list[dict]:
        return [{"predictor": predictor, "dataset": "x_silicon", "model": "m", "backend": "vllm",
                 "isl": 1024, "osl": 128, "tp": tp, "concurrency": c, "phase": "tpot",
                 "gt_ms": t, "pred_ms": t * factor} for tp, c, t in configs]

    choices = decisions_section.serving_choices(
        pl.DataFrame(rows("perfect", 1.0) + rows("optimist", 0.5))).sort("predictor", "slo_ms")
    perfect = choices.filter(pl.col("predictor") == "perfect")
    assert perfect["regret"].to_list() == [0.0, 0.0, 0.0] and not perfect["violation"].any()
    assert perfect["gap"].to_list() == [None, pytest.approx(1.0), pytest.approx(0.25)]
    # half the TPOT promised: at a 10 ms SLO it takes concurrency 32 (measured 20 ms): violation
    optimist = choices.filter(pl.col("predictor") == "optimist")
    assert optimist["violation"].to_list() == [True, False, False]
    assert optimist["regret"].to_list() == [1.0, 0.0, 0.0]


def test_tied_picks_name_the_choices_the_prediction_did_not_make():
    from leaderboard.present import decisions_section

    rows = [{"predictor": p, "workload_id": w, "sku": s, "tp": 1, "gt_ms": 1.0,
             "pred_ms": 2.0 if p == "flat" else {"a": 1.0, "b": 2.0}[s]}
            for p in ("flat", "sloped") for w in ("w1", "w2") for s in ("a", "b")]
    tied = decisions_section.tied_picks(pl.DataFrame(rows))
    assert tied == {"flat": 100.0, "sloped": 0.0}
    # at a price that makes b's cost equal a's, the sloped predictor ties too
    assert decisions_section.tied_picks(pl.DataFrame(rows), {"a": 2.0, "b": 1.0})["sloped"] == 100


def _many_groups(seed: int) -> pl.DataFrame:
    """Two predictors, two models, several contexts, each (group, batch) measured twice; one
    group with two batch sizes only (left out)."""
    rng = np.random.default_rng(seed)
    rows = []
    for predictor in ("a", "b"):
        for model, ctx, batches in (("m1", 256, [1, 2, 4, 8]), ("m1", 1024, [1, 4, 16]),
                                    ("m2", 256, [2, 8, 32, 64, 128]), ("m2", 512, [1, 2])):
            for batch in batches:
                for _ in range(2):
                    gt = 1.0 + batch * ctx / 4096 + rng.uniform(0, 0.2)
                    rows.append({"predictor": predictor, "dataset": "x_vidur", "model": model,
                                 "tp": 1, "phase": "decode", "num_requests": batch,
                                 "num_decode": batch, "decode_ctx_sum": ctx * batch,
                                 "gt_ms": gt, "pred_ms": gt * rng.uniform(0.7, 1.3)})
    return pl.DataFrame(rows)


def _by_hand(cells: pl.DataFrame) -> list[tuple]:
    """The capacity decisions worked out with dicts and plain Python, no frame grouping."""
    groups: dict[tuple, dict[int, list]] = {}
    for r in cells.iter_rows(named=True):
        key = (r["predictor"], r["dataset"], r["model"], r["tp"],
               r["decode_ctx_sum"] // r["num_decode"])
        groups.setdefault(key, {}).setdefault(r["num_requests"], []).append(r)
    out = []
    for key, sizes in groups.items():
        if len(sizes) < decisions.MIN_BATCHES:
            continue
        med = {b: (float(np.median([r["gt_ms"] for r in rs])),
                   float(np.median([r["pred_ms"] for r in rs]))) for b, rs in sizes.items()}
        for slo in sorted({gt for gt, _ in med.values()}):
            fitting = [b for b, (gt, _) in med.items() if gt <= slo]
            best = max(fitting, key=lambda b: b / med[b][0])
            promised = [b for b, (_, pred) in med.items() if pred <= slo]
            label = f"model {key[2]} tp {key[3]} ctx {key[4]}"
            if not promised:
                out.append((*key[:2], label, slo, None, best, False, 1.0))
                continue
            pick = max(promised)
            violation = med[pick][0] > slo
            regret = 1.0 if violation else max(0.0, 1 - (pick / med[pick][0]) / (best / med[best][0]))
            out.append((*key[:2], label, slo, float(pick), float(best), violation, regret))
    return sorted(out, key=lambda t: t[:4])


def test_many_groups_decide_as_worked_by_hand_in_key_order_whatever_the_row_order():
    cells = _many_groups(0)
    choices = decisions.capacity_choices(cells)
    got = sorted(choices.select("predictor", "dataset", "group", "slo_ms", "pick", "best",
                                "violation", "regret").iter_rows(), key=lambda t: t[:4])
    expected = _by_hand(cells)
    assert len(got) == len(expected) == 2 * (4 + 3 + 5)  # the two-batch group left out
    for row, want in zip(got, expected, strict=True):
        assert row[:3] == want[:3] and row[4:7] == want[4:7]
        assert row[3] == pytest.approx(want[3]) and row[7] == pytest.approx(want[7])
    # the same rows in another order give the same frame, row for row (sums over it are equal)
    shuffled = cells.sample(fraction=1.0, shuffle=True, seed=3)
    assert decisions.capacity_choices(shuffled).equals(choices)
    assert choices["group"].to_list()[0] == "model m1 tp 1 ctx 256"
