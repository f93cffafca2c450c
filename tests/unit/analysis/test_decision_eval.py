"""The two-arm verdict and the router thresholds (`analysis.decision_eval`, `analysis.arms`): the
user's terms, the SLO rules, the seed's rule as a mode, and the standard-library-only promise."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import yaml

from pdexporter.analysis import decision_eval
from pdexporter.analysis.arms import llmd_snippet, thresholds
from pdexporter.analysis.decision_eval import evaluate_decision, feature, offload_threshold


def lin(**coefficients: float) -> dict:
    return {"features": list(coefficients), "coefficients": dict(coefficients)}


def make_doc(per_chunk_ms: float = 150.0, offloaded_per_stream_ms: float = 0.0, prefill_alone_ms: float = 100.0,
             decode_side_ms: float = 40.0, colocated_ttft_ms: float = 100.0, transfer_ms_per_1k: float = 0.0,
             tpot_col: float = 60.0, tpot_off: float = 10.0) -> dict:
    """A decision document whose numbers are known by construction (B = 8192)."""
    return {
        "schema": "pdexporter.decision/v1",
        "transfer_ms_default": 50.0,
        "model": {"name": "seed_per_chunk", "penalty_per_chunk_ms": {
            "8192": {"decode_batch_size": [1, 16], "penalty_ms": [per_chunk_ms, per_chunk_ms]}}},
        "valid_range": {"decode_batch_size": [1, 12], "new_prefill_tokens": [512, 32768], "chunk_size": [8192, 8192]},
        "two_arm": {
            "offloaded_cost_per_stream": lin(**{"1": offloaded_per_stream_ms}),
            "colocated_ttft": lin(**{"1": colocated_ttft_ms}),
            "offloaded_prefill": lin(**{"1": prefill_alone_ms}),
            "offloaded_decode": lin(**{"1": decode_side_ms}),
            "decode_side_excludes_transfer": True,
            "colocated_tpot": lin(**{"1": tpot_col}),
            "offloaded_tpot": lin(**{"1": tpot_off}),
            "transfer": {"source": "measured", "fixed_ms": 0.0, "ms_per_token": transfer_ms_per_1k / 1000.0},
        },
    }


def test_the_evaluator_imports_nothing_beyond_the_standard_library() -> None:
    tree = ast.parse(Path(decision_eval.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported == {"math"}


def test_the_verdict_in_the_users_terms() -> None:
    # 8 decodes lose 150 ms each colocated (one chunk), nothing offloaded: 1.2 s saved; the request
    # pays 100 + 0 + 40 - 100 = +40 ms TTFT
    v = evaluate_decision(make_doc(), 8, 4096, 8192, tpot_slo_ms=50, ttft_slo_ms=200)
    assert v["mode"] == "two-arm" and v["offload"] is True
    assert v["saved_ms"] == pytest.approx(1200.0) and v["ttft_cost_ms"] == pytest.approx(40.0)
    assert v["verdict"] == "offload: saves the 8 running decodes 1.2 s in total, costs this request +40 ms TTFT, both SLOs held"
    assert v["slos"] == {"TPOT": {"colocated": False, "offloaded": True}, "TTFT": {"colocated": True, "offloaded": True}}


def test_keep_local_when_the_ttft_paid_exceeds_the_decode_time_saved() -> None:
    doc = make_doc(per_chunk_ms=10.0, decode_side_ms=400.0)  # 2 decodes x 10 ms saved vs +400 ms TTFT
    v = evaluate_decision(doc, 2, 4096, 8192)
    assert v["offload"] is False and v["saved_ms"] == pytest.approx(20.0) and v["ttft_cost_ms"] == pytest.approx(400.0)
    assert v["verdict"].startswith("keep local: offloading would save the 2 running decodes 20 ms")


def test_an_arm_that_alone_holds_the_slos_wins() -> None:
    doc = make_doc(per_chunk_ms=10.0, decode_side_ms=400.0)  # efficiency says keep local ...
    v = evaluate_decision(doc, 2, 4096, 8192, tpot_slo_ms=30)  # ... but only offloading keeps TPOT <= 30 ms
    assert v["offload"] is True and v["reason"] == "only offloading holds the SLOs"
    doc = make_doc()  # efficiency says offload, but the offloaded TTFT (140 ms) misses a 120 ms SLO
    v = evaluate_decision(doc, 8, 4096, 8192, ttft_slo_ms=120)
    assert v["offload"] is False and v["reason"] == "only keeping it local holds the SLOs"
    v = evaluate_decision(doc, 8, 4096, 8192, tpot_slo_ms=5, ttft_slo_ms=120)  # neither holds both
    assert v["offload"] is True and "no arm holds every SLO" in v["verdict"]


def test_the_measured_transfer_enters_the_offloaded_ttft() -> None:
    doc = make_doc(transfer_ms_per_1k=1.0)  # 1 ms per 1K tokens: 32 ms at 32K
    v = evaluate_decision(doc, 4, 32768, 8192)
    assert v["transfer_source"] == "measured" and v["transfer_ms"] == pytest.approx(32.768)
    assert v["offloaded_ttft_split_ms"] == pytest.approx({"prefill": 100.0, "transfer": 32.768, "decode_side": 40.0})
    # a pair's measured decode side holds the transfer already: it is not added twice
    doc["two_arm"]["decode_side_excludes_transfer"] = False
    assert evaluate_decision(doc, 4, 32768, 8192)["offloaded_ttft_ms"] == pytest.approx(140.0)


def test_the_seeds_rule_stays_available_and_says_it_is_the_seeds() -> None:
    doc = make_doc()
    v = evaluate_decision(doc, 4, 4096, 8192, mode="seed")
    assert v["mode"] == "seed" and v["cost_ms"] == pytest.approx(600.0)
    assert v["transfer_source"] == "measured"  # the measured model replaces the constant ...
    one_arm = {k: val for k, val in copy.deepcopy(doc).items() if k != "two_arm"}
    v = evaluate_decision(one_arm, 4, 4096, 8192)  # ... and without one the seed's 50 ms stands
    assert v["mode"] == "seed" and v["transfer_ms"] == 50.0 and v["transfer_source"] == "seed-constant"
    assert "the seed's rule" in v["verdict"] and v["offload"] is True
    with pytest.raises(ValueError, match="two-arm mode needs"):
        evaluate_decision(one_arm, 4, 4096, 8192, mode="two-arm")


def test_features_follow_the_chunk_arithmetic() -> None:
    assert feature("chunks", 4, 16384, 8192) == 3  # ceil(16384 / 8188)
    assert feature("chunk", 4, 2048, 8192) == pytest.approx(2.048)
    assert feature("chunk", 4, 16384, 8192) == pytest.approx(8.188)
    with pytest.raises(ValueError, match="unknown feature"):
        feature("q", 1, 1, 8192)


def test_threshold_is_where_the_saving_overtakes_the_ttft_cost() -> None:
    # 2 decodes lose 100 ms per chunk colocated; offloading costs a constant 250 ms of TTFT: it wins
    # once the prefill needs a 2nd chunk of B - D = 8190 tokens (2 x 100 x 2 = 400 > 250)
    doc = make_doc(per_chunk_ms=100.0, decode_side_ms=250.0, prefill_alone_ms=0.0, colocated_ttft_ms=0.0)
    assert offload_threshold(doc, 2, 8192, p_max=16384, step=64) == 8192
    assert not evaluate_decision(doc, 2, 8190, 8192)["offload"] and evaluate_decision(doc, 2, 8191, 8192)["offload"]
    assert offload_threshold(doc, 3, 8192, p_max=16384, step=64) == 64  # 300 ms > 250 ms from the first P
    # a cost growing with P faster than the saving: offloading never wins "from some P on"
    doc["two_arm"]["offloaded_decode"] = lin(**{"1": -200.0, "p": 100.0})
    assert offload_threshold(doc, 2, 8192, p_max=8000, step=64) is None


def test_thresholds_for_routers_and_the_llm_d_snippet() -> None:
    doc = make_doc(per_chunk_ms=100.0, decode_side_ms=250.0, prefill_alone_ms=0.0, colocated_ttft_ms=0.0)
    result = thresholds(doc, p_max=4096, step=64)
    per = result["min_prefill_tokens"]["8192"]
    assert per["1"] is None and per["2"] is None and per["3"] == 64  # 3 x 100 ms > 250 ms from the first P
    snippet = llmd_snippet(result, 8192, 3)
    parsed = yaml.safe_load(snippet)
    decider = next(p for p in parsed["plugins"] if p["type"] == "prefix-based-pd-decider")
    assert decider["parameters"]["nonCachedTokens"] == 63  # llm-d disaggregates when non-cached > this
    assert "prepareDataPlugins" in parsed["featureGates"]
    never = yaml.safe_load(llmd_snippet(result, 8192, 1))
    assert next(p for p in never["plugins"] if p["type"] == "prefix-based-pd-decider")["parameters"][
        "nonCachedTokens"] == 2**31 - 1
