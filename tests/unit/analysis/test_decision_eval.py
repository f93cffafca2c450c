"""The two-arm verdict and the router thresholds (`analysis.decision_eval`, `analysis.arms`): the
physics of each term, the user's terms, the SLO rules, intervals from the replicates, the seed's
rule as a mode, and the standard-library-only promise."""

from __future__ import annotations

import ast
import copy
import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pdexporter.analysis import DECISION_SCHEMA, decision_eval
from pdexporter.analysis.decision_eval import (
    chunk_context,
    colocated_cost,
    evaluate_arms,
    evaluate_decision,
    extrapolation,
    feature,
    offload_threshold,
    offload_thresholds,
)
from pdexporter.analysis.thresholds import compute_thresholds, llmd_snippet

ROOT = Path(__file__).resolve().parents[3]
VLLM_RULE = {"engine": "vllm", "decodes_take_budget": True, "decodes_in_chunk_step": True, "graph_max_tokens": 512}


def lin(**coefficients: float) -> dict:
    return {"features": list(coefficients), "coefficients": dict(coefficients),
            "range": {"decode_batch_size": [1, 12], "new_prefill_tokens": [64, 32768], "chunk_sizes": [8192]}}


def context_model(**overrides: float) -> dict:
    k = {"alpha0_ms": 45.0, "alpha1_ms_per_decode": -0.5, "compute0_ms": 3.0, "gamma_ms_per_token": 0.005,
         "beta_ms_per_token_pair": 1.5e-6, "kappa_graph_ms_per_token": 0.03, "sigma0_ms": 2.0,
         "sigma1_ms_per_token": 0.001, "decode0_ms": 4.0, "decode1_ms_per_decode": 0.4, "catchup_steps": 1.0}
    k.update(overrides)
    return {"name": "context_aware", "coefficients": k}


def make_doc(per_chunk_ms: float = 150.0, offloaded_per_stream_ms: float = 0.0, colocated_ttft_ms: float = 100.0,
             decode_side_ms: float = 40.0, transfer_gb_s: float = 0.0, latency_ms: float = 0.0,
             tpot_off: float = 10.0, model: dict | None = None) -> dict:
    """A decision document whose numbers are known by construction (B = 8192): the seed's
    per-chunk model unless `model` is given, constant terms."""
    transfer = ({"source": "measured", "latency_ms": latency_ms, "gb_per_s": transfer_gb_s, "bytes_per_token": 98304.0}
                if transfer_gb_s else {"source": "seed-constant"})
    return {
        "schema": DECISION_SCHEMA,
        "chunk_rule": dict(VLLM_RULE),
        "transfer_ms_default": 50.0,
        "model": model or {"name": "seed_per_chunk", "penalty_per_chunk_ms": {
            "8192": {"decode_batch_size": [1, 16], "penalty_ms": [per_chunk_ms, per_chunk_ms]}}},
        "valid_range": {"decode_batch_size": [1, 12], "new_prefill_tokens": [64, 32768], "chunk_size": [8192, 8192],
                        "chunk_sizes": [8192]},
        "two_arm": {
            "measured_chunk_sizes": [8192],
            "terms": {
                "offloaded_loss": lin(**{"1": offloaded_per_stream_ms}),
                "colocated_ttft": lin(**{"1": colocated_ttft_ms}),
                "decode_side": lin(**{"1": decode_side_ms}),
                "offloaded_tpot": lin(**{"1": tpot_off}),
                "transfer": transfer,
            },
        },
    }


def test_the_evaluator_imports_nothing_beyond_the_standard_library() -> None:
    tree = ast.parse(Path(decision_eval.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= {"math", "typing", "collections"}  # the standard library only (typing: its records)
    assert decision_eval.SCHEMA == DECISION_SCHEMA


def test_the_verdict_in_the_users_terms() -> None:
    # 8 decodes lose 150 ms each colocated (one chunk), nothing offloaded: 1.2 s saved; the request
    # pays prefill alone 100 + no transfer measured (the seed's 50 ms) + 40 - 100 = +90 ms TTFT
    v = evaluate_decision(make_doc(), 8, 4096, 8192, ttft_slo_ms=200)
    assert v["mode"] == "two-arm" and v["offload"] is True and v["decided"]
    assert v["saved_ms"] == pytest.approx(1200.0) and v["ttft_cost_ms"] == pytest.approx(90.0)
    assert v["offloaded_ttft_split_ms"] == pytest.approx({"prefill": 100.0, "transfer": 50.0, "decode_side": 40.0})
    assert v["verdict"] == "offload: saves the 8 running decodes 1.2 s, costs this request 90 ms of TTFT, TTFT SLO held"
    assert v["slos"] == {"TTFT": {"colocated": True, "offloaded": True}}


def test_keep_local_when_the_ttft_paid_exceeds_the_decode_time_saved() -> None:
    doc = make_doc(per_chunk_ms=10.0, decode_side_ms=400.0)  # 2 decodes x 10 ms saved vs +450 ms TTFT
    v = evaluate_decision(doc, 2, 4096, 8192)
    assert v["offload"] is False and v["saved_ms"] == pytest.approx(20.0) and v["ttft_cost_ms"] == pytest.approx(450.0)
    assert v["verdict"].startswith("keep local: offloading saves the 2 running decodes 20 ms but costs")


def test_an_arm_that_alone_holds_the_slos_wins() -> None:
    doc = make_doc(per_chunk_ms=10.0, decode_side_ms=400.0, model=context_model())  # efficiency says keep local
    v = evaluate_decision(doc, 2, 4096, 8192, tpot_slo_ms=30)  # ... but only offloading keeps TPOT <= 30 ms
    assert v["colocated_tpot_ms"] > 30 >= v["offloaded_tpot_ms"]
    assert v["offload"] is True and v["reason"] == "only offloading holds the SLOs"
    doc = make_doc()  # efficiency says offload, but the offloaded TTFT (190 ms) misses a 120 ms SLO
    v = evaluate_decision(doc, 8, 4096, 8192, ttft_slo_ms=120)
    assert v["offload"] is False and v["reason"] == "only keeping it local holds the SLOs"


def test_the_transfer_is_latency_plus_bytes_over_bandwidth() -> None:
    doc = make_doc(transfer_gb_s=100.0, latency_ms=4.0)  # 96 KiB per token: 3.2 GB at 32K, 32.2 ms at 100 GB/s
    v = evaluate_decision(doc, 4, 32768, 8192)
    assert v["transfer_source"] == "measured"
    assert v["transfer_ms"] == pytest.approx(4.0 + 32768 * 98304 / 100e9 * 1e3)
    assert v["offloaded_ttft_split_ms"]["transfer"] == pytest.approx(v["transfer_ms"])
    assert v["offloaded_ttft_ms"] == pytest.approx(100.0 + v["transfer_ms"] + 40.0)


def test_a_degraded_transfer_regime_slows_the_transfer_and_stalls_the_decode_instance() -> None:
    doc = make_doc(transfer_gb_s=300.0, latency_ms=4.0)
    doc["two_arm"]["terms"]["transfer"]["degraded"] = {"gb_per_s": 4.0, "share_of_windows": 0.5, "windows": 10,
                                                       "stall_share": 0.9}
    nominal = evaluate_arms(doc, 4, 8192, 8192)
    slow = evaluate_arms(doc, 4, 8192, 8192, regime="degraded")
    assert slow["transfer_ms"] == pytest.approx(4.0 + 8192 * 98304 / 4e9 * 1e3)
    assert slow["offloaded_cost_ms"] == pytest.approx(nominal["offloaded_cost_ms"] + 4 * 0.9 * slow["transfer_ms"])
    assert slow["saved_ms"] < nominal["saved_ms"] and slow["ttft_cost_ms"] > nominal["ttft_cost_ms"]


def test_the_seeds_rule_stays_available_and_says_it_is_the_seeds() -> None:
    doc = make_doc()
    v = evaluate_decision(doc, 4, 4096, 8192, mode="seed")
    assert v["mode"] == "seed" and v["cost_ms"] == pytest.approx(600.0)
    one_arm = {k: val for k, val in copy.deepcopy(doc).items() if k != "two_arm"}
    v = evaluate_decision(one_arm, 4, 4096, 8192)
    assert v["mode"] == "seed" and v["transfer_ms"] == 50.0 and v["transfer_source"] == "seed-constant"
    assert "the seed's rule" in v["verdict"] and v["offload"] is True
    with pytest.raises(ValueError, match="two-arm mode needs"):
        evaluate_decision(one_arm, 4, 4096, 8192, mode="two-arm")


def test_chunks_follow_the_engines_rule() -> None:
    assert feature("chunks", 4, 16384, 8192) == 3  # vLLM: ceil(16384 / 8188)
    assert feature("chunk", 4, 2048, 8192) == pytest.approx(2.048)
    assert feature("chunk", 4, 16384, 8192) == pytest.approx(8.188)
    sglang = {"chunk_rule": {"decodes_take_budget": False, "decodes_in_chunk_step": False, "graph_max_tokens": 0}}
    assert chunk_context(sglang, 4, 16384, 8192)["n"] == 2  # the decodes pause: chunks of B
    assert chunk_context(sglang, 4, 16384, 8192)["eager_chunks"] == 2
    # vLLM 0.22: a step of chunk + D <= 512 tokens replays a CUDA graph
    ctx = chunk_context({"chunk_rule": VLLM_RULE}, 12, 500, 8192)
    assert (ctx["n"], ctx["eager_chunks"], ctx["graph_tokens"]) == (1, 0, 500)
    assert chunk_context({"chunk_rule": VLLM_RULE}, 12, 501, 8192)["eager_chunks"] == 1
    tail = chunk_context({"chunk_rule": VLLM_RULE}, 4, 8200, 8192)  # 8188 + a 12-token tail
    assert (tail["n"], tail["eager_chunks"], tail["graph_tokens"]) == (2, 1, 12)
    with pytest.raises(ValueError, match="unknown feature"):
        feature("nonsense", 1, 1, 8192)
    with pytest.raises(ValueError, match="no room"):
        chunk_context({}, 8192, 100, 8192)


@settings(max_examples=200, deadline=None)
@given(d=st.integers(1, 16), p=st.integers(1, 70_000), b=st.sampled_from([512, 1024, 2048, 4096, 8192, 16384]),
       kappa=st.sampled_from([None, 0.03]), graph=st.sampled_from([0, 512, 2064]), graph0=st.sampled_from([0.0, 6.0]),
       large=st.sampled_from([None, 0.01]))
def test_the_closed_form_cost_is_the_sum_over_the_chunks(d: int, p: int, b: int, kappa: float | None,
                                                         graph: int, graph0: float, large: float | None) -> None:
    """colocated_cost's closed form (launch-bound chunks first, then GPU-bound) equals the sum of
    max(launch, compute) chunk by chunk; a graph step costs kappa per token to the hinge (512), and past it
    kappa_large a token (absent: kappa) and its attention pairs as an eager step's; it pays graph0 when it admits
    the request."""
    model = context_model(kappa_graph_ms_per_token=kappa, graph0_ms=graph0)
    if large is not None:
        model["coefficients"]["kappa_graph_large_ms_per_token"] = large
    doc = {"model": model, "chunk_rule": dict(VLLM_RULE, graph_max_tokens=graph)}
    k = model["coefficients"]
    budget = b - d
    prefix, total, weighted = 0, 0.0, 0.0
    while prefix < p:
        c = min(budget, p - prefix)
        pairs = c * prefix + c * (c + 1) / 2
        if graph and c + d <= graph and kappa is not None:
            if c <= 512:
                tokens = kappa * c
            else:
                tokens = kappa * 512 + (kappa if large is None else large) * (c - 512) \
                    + k["beta_ms_per_token_pair"] * pairs
            pi = tokens + (graph0 if prefix == 0 else 0.0)
        else:
            pi = max(k["alpha0_ms"] + k["alpha1_ms_per_decode"] * d,
                     k["compute0_ms"] + k["gamma_ms_per_token"] * c + k["beta_ms_per_token_pair"] * pairs)
        total += pi
        weighted += pi * c
        prefix += c
    eager = any(not (graph and min(budget, p - s) + d <= graph and kappa is not None) for s in range(0, p, budget))
    total += k["sigma0_ms"] + k["sigma1_ms_per_token"] * p - (k["catchup_steps"] * (4.0 + 0.4 * d) if eager else 0.0)
    cost, mean_extra = colocated_cost(doc, chunk_context(doc, d, p, b))
    assert cost == pytest.approx(d * max(total, 0.0), rel=1e-9, abs=1e-6)
    assert mean_extra == pytest.approx(weighted / p, rel=1e-9, abs=1e-9)


def test_small_prompts_that_fit_a_graph_cost_the_decodes_little() -> None:
    doc = make_doc(model=context_model())
    graph = evaluate_arms(doc, 12, 64, 8192)["colocated_cost_ms"]  # 76 tokens: a CUDA-graph step
    eager = evaluate_arms(doc, 12, 1024, 8192)["colocated_cost_ms"]  # launched eagerly: the launch floor
    assert graph == pytest.approx(12 * (0.03 * 64 + 2.0 + 0.001 * 64))
    assert eager > 5 * graph


def _committed_decisions() -> list[Path]:
    return sorted(ROOT.glob("results/*/decision.json"))


@pytest.mark.parametrize("path", _committed_decisions(), ids=lambda p: p.parent.name)
def test_no_negative_or_impossible_time_from_any_committed_model(path: Path) -> None:
    doc = json.loads(path.read_text())
    for d in (1, 2, 4, 6, 8, 10, 12):
        for p in (64, 100, 256, 511, 1024, 3000, 8192, 16000, 32768):
            for b in (2048, 8192, 16384):
                if d >= b:
                    continue
                v = evaluate_decision(doc, d, p, b)
                times = [v["cost_ms"], v["transfer_ms"]]
                if v["mode"] == "two-arm":
                    times += [v["colocated_cost_ms"], v["offloaded_cost_ms"], v["colocated_ttft_ms"],
                              v["offloaded_ttft_ms"], *v["offloaded_ttft_split_ms"].values()]
                    times += [x for x in (v["colocated_tpot_ms"], v["offloaded_tpot_ms"]) if x is not None]
                assert all(math.isfinite(t) and t >= 0 for t in times), (path, d, p, b, times)
                for key, iv in v["intervals"].items():
                    if iv is not None and key not in ("saved_ms", "ttft_cost_ms"):
                        assert iv[0] >= -1e-9, (path, key, d, p, b, iv)


def test_intervals_come_from_the_replicates_and_widen_beyond_the_fitted_range() -> None:
    doc = make_doc(model=context_model())
    doc["replicates"] = {"model": [context_model(alpha0_ms=a)["coefficients"] for a in (40.0, 45.0, 50.0)],
                         "two_arm": [{}, {}, {}]}
    v = evaluate_decision(doc, 4, 2048, 8192)
    lo, hi = v["intervals"]["colocated_cost_ms"]
    assert lo < v["colocated_cost_ms"] < hi
    assert v["in_fitted_range"] and v["interval_widening"] == 1.0
    far = evaluate_decision(doc, 4, 131072, 8192)  # two doublings beyond 32768
    assert not far["in_fitted_range"] and far["interval_widening"] == pytest.approx(3.0)
    assert any("P=131072" in x for x in far["extrapolated"])
    # replicates that disagree about the verdict make it undecided
    split = make_doc(per_chunk_ms=150.0)
    split["replicates"] = {
        "model": [{}] * 4,
        "two_arm": [{"decode_side": {"1": x}} for x in (40.0, 40.0, 900.0, 900.0)],
    }
    v = evaluate_decision(split, 2, 4096, 8192)
    assert v["agreement"] == pytest.approx(0.5) and not v["decided"] and v["verdict"].startswith("undecided")


def test_only_the_numbers_resting_on_an_extrapolated_term_are_widened() -> None:
    """The pair measured its arm from P = 2048, the colocated arm from P = 64: at P = 256 the
    offloaded numbers are extrapolated three doublings, the colocated loss is measured. Its
    interval stays the replicates' (it was widened x4 with the rest, 0..106 ms at D = 4 on the H200)."""
    doc = make_doc(model=context_model(graph0_ms=6.0))
    doc["two_arm"]["terms"]["offloaded_loss"]["range"]["new_prefill_tokens"] = [2048, 32768]
    doc["replicates"] = {"model": [context_model(graph0_ms=g)["coefficients"] for g in (4.0, 6.0, 8.0)],
                         "two_arm": [{}, {}, {}]}
    v = evaluate_decision(doc, 4, 256, 8192)
    assert not v["in_fitted_range"] and v["interval_widening"] == pytest.approx(4.0)
    by = v["interval_widening_by"]
    assert by["colocated_cost_ms"] == 1.0 and by["colocated_ttft_ms"] == 1.0
    assert by["offloaded_cost_ms"] == pytest.approx(4.0) and by["saved_ms"] == pytest.approx(4.0)
    costs = sorted(4 * (g + 0.03 * 256 + 2.0 + 0.001 * 256) for g in (4.0, 6.0, 8.0))
    lo, hi = v["intervals"]["colocated_cost_ms"]
    assert costs[0] <= lo <= hi <= costs[-1]


def test_extrapolation_names_each_term_outside_its_range() -> None:
    doc = make_doc(model=context_model())
    doc["model"]["coefficients"]["kappa_graph_ms_per_token"] = None
    found, factor = extrapolation(doc, 16, 64, 16384)
    text = " ".join(what for _, what, _ in found)
    assert "D=16" in text and "B=16384" in text and "CUDA-graph step" in text
    assert factor > 1


def test_threshold_is_where_the_saving_overtakes_the_ttft_cost() -> None:
    # 2 decodes lose 100 ms per chunk colocated; offloading costs a constant 250 ms of TTFT (the
    # transfer is the seed's 50 ms): it wins once the prefill needs a 2nd chunk (2 x 100 x 2 = 400 > 250)
    doc = make_doc(per_chunk_ms=100.0, decode_side_ms=200.0, colocated_ttft_ms=0.0)
    assert offload_threshold(doc, 2, 8192, p_max=16384, step=64) == 8192
    assert not evaluate_decision(doc, 2, 8190, 8192)["offload"] and evaluate_decision(doc, 2, 8191, 8192)["offload"]
    assert offload_threshold(doc, 3, 8192, p_max=16384, step=64) == 64  # 300 ms > 250 ms from the first P
    doc["two_arm"]["terms"]["decode_side"] = lin(**{"1": 0.0, "p": 1000.0})  # 1 ms per token: never wins
    assert offload_threshold(doc, 2, 8192, p_max=8000, step=64) is None


def test_thresholds_for_routers_with_intervals_and_the_llm_d_snippet() -> None:
    doc = make_doc(per_chunk_ms=100.0, decode_side_ms=200.0, colocated_ttft_ms=0.0)
    doc["replicates"] = {"model": [{}] * 3, "two_arm": [{"decode_side": {"1": x}} for x in (200.0, 100.0, 260.0)]}
    computed = compute_thresholds(doc, p_max=16000, step=64)
    result = computed.to_dict()
    per = result["chunk_sizes"]["8192"]["by_decode_batch_size"]
    assert per["1"]["threshold"] is None and per["1"]["status"] == "never"
    assert per["3"]["threshold"] == 64 and per["3"]["interval"] == [64, 8192]  # one resample pays 310 ms of TTFT
    assert per["4"]["threshold"] == 64 and per["4"]["interval"] == [64, 64] and per["4"]["status"] == "decided"
    assert per["2"]["threshold"] == 8192 and per["2"]["interval"] == [64, 8192] and per["2"]["status"] == "undecided"
    assert not result["chunk_sizes"]["8192"]["modelled"] and result["rises_with_d"] == []
    assert per["4"]["at_floor"] and per["4"]["safe"] == 64 and per["2"]["safe"] == 8192
    snippet = llmd_snippet(computed, 8192, 4)
    parsed = yaml.safe_load(snippet)
    decider = next(p for p in parsed["plugins"] if p["type"] == "prefix-based-pd-decider")
    assert decider["parameters"]["nonCachedTokens"] == 63  # llm-d disaggregates when non-cached > this
    assert "prepareDataPlugins" in parsed["featureGates"]
    undecided = yaml.safe_load(llmd_snippet(computed, 8192, 2))  # its interval's upper end: offload only where sure
    assert next(p for p in undecided["plugins"] if p["type"] == "prefix-based-pd-decider")["parameters"][
        "nonCachedTokens"] == 8191
    never = yaml.safe_load(llmd_snippet(computed, 8192, 1))
    assert next(p for p in never["plugins"] if p["type"] == "prefix-based-pd-decider")["parameters"][
        "nonCachedTokens"] == 2**31 - 1


def _sigma_doc(sigma1: float, sigmas: tuple[float, ...], fitted_p: tuple[int, int]) -> dict:
    """Colocated cost D x sigma1 x P exactly (every other coefficient 0), TTFT cost the seed's 50 ms
    plus a 78 ms decode side (128 ms); one model replicate per sigma in `sigmas`; every model
    fitted on P in `fitted_p`."""
    zero = {k: 0.0 for k in ("alpha0_ms", "alpha1_ms_per_decode", "compute0_ms", "gamma_ms_per_token",
                             "beta_ms_per_token_pair", "kappa_graph_ms_per_token", "sigma0_ms", "catchup_steps")}
    doc = make_doc(decode_side_ms=78.0, model=context_model(**zero, sigma1_ms_per_token=sigma1))
    doc["valid_range"]["new_prefill_tokens"] = list(fitted_p)
    for term in doc["two_arm"]["terms"].values():
        if "range" in term:
            term["range"]["new_prefill_tokens"] = list(fitted_p)
    doc["replicates"] = {"model": [context_model(**zero, sigma1_ms_per_token=s)["coefficients"] for s in sigmas],
                         "two_arm": [{} for _ in sigmas]}
    return doc


def test_threshold_intervals_widen_where_the_terms_are_extrapolated_as_the_verdicts_do() -> None:
    """Two decodes lose 2 x sigma1 x P colocated, offloading costs 128 ms of TTFT: the central
    threshold is the first multiple of 64 above 64 / sigma1. Replicates at sigma1 -/+ 10 %. Beyond
    the fitted P (here 32768) each replicate's saving is widened at that P as `evaluate_decision`'s
    agreement widens it (x (1 + log2(P / 32768))), so its crossing moves away from the central one:
    the interval widens, the central threshold does not move. Inside the fitted range nothing
    changes."""
    sigmas = (0.0009, 0.001, 0.0011)
    far = _sigma_doc(0.001, sigmas, (64, 32768))  # crossing at P ~ 64000: two arms' terms extrapolated
    measured_everywhere = _sigma_doc(0.001, sigmas, (64, 131072))  # the same numbers, nothing extrapolated
    reps = (None, 0, 1, 2)
    bare = offload_thresholds(measured_everywhere, 2, 8192, reps)
    widened = offload_thresholds(far, 2, 8192, reps)
    assert bare == [64064, 71168, 64064, 58240]  # 128 / (2 sigma1): the bootstrap's spread alone
    assert widened[0] == widened[2] == 64064  # the central threshold and the central replicate stay
    assert widened[1] > 71168 + 4096 and widened[3] < 58240 - 2048  # the others move ~ x2 as far
    # each replicate's threshold is where its widened verdict flips: the verdict with that replicate
    # alone agrees with the central "offload" from the threshold on, not just below it
    slow = copy.deepcopy(far)
    slow["replicates"] = {"model": [far["replicates"]["model"][0]], "two_arm": [{}]}
    assert evaluate_decision(slow, 2, widened[1] - 64, 8192)["agreement"] == 0.0
    assert evaluate_decision(slow, 2, widened[1], 8192)["agreement"] == 1.0
    result = compute_thresholds(far, chunk_sizes=[8192], decode_batch_sizes=[2], replicates=3)
    entry = result.at(8192, 2)
    assert entry is not None and entry.threshold == 64064 and entry.outside == "above"
    assert (entry.low, entry.high) == (widened[3], widened[1])
    # inside the fitted range (crossing at P ~ 8000: sigma1 x 8) the widening is 1: nothing moves
    inside = _sigma_doc(0.008, tuple(8 * s for s in sigmas), (64, 32768))
    inside_bare = _sigma_doc(0.008, tuple(8 * s for s in sigmas), (64, 131072))
    assert offload_thresholds(inside, 2, 8192, reps) == offload_thresholds(inside_bare, 2, 8192, reps)
    assert offload_thresholds(inside, 2, 8192, reps)[0] == 8064
    # the seed's rule (cost 2 x sigma1 x P against its 50 ms) alike: models fitted up to P = 8192,
    # crossing at ~25000, the replicates' cost widened x (1 + log2(P / 8192)) as the seed verdict's
    seed_far = _sigma_doc(0.001, sigmas, (64, 8192))
    assert offload_thresholds(measured_everywhere, 2, 8192, reps, mode="seed") == [25024, 27840, 25024, 22784]
    seed = offload_thresholds(seed_far, 2, 8192, reps, mode="seed")
    assert seed[0] == seed[2] == 25024 and seed[1] > 27840 + 4096 and seed[3] < 22784 - 1024
    assert evaluate_decision(seed_far, 2, 28000, 8192, mode="seed")["agreement"] == pytest.approx(2 / 3)


def test_thresholds_where_the_offloaded_arm_was_not_measured_are_modelled() -> None:
    doc = make_doc(per_chunk_ms=100.0, decode_side_ms=200.0, colocated_ttft_ms=0.0)
    doc["model"]["penalty_per_chunk_ms"]["2048"] = doc["model"]["penalty_per_chunk_ms"]["8192"]
    doc["valid_range"]["chunk_sizes"] = [2048, 8192]
    computed = compute_thresholds(doc, p_max=16000, step=64)
    result = computed.to_dict()
    assert result["chunk_sizes"]["2048"]["modelled"] and not result["chunk_sizes"]["8192"]["modelled"]
    assert "MODELLED: the offloaded arm was not measured at B=2048" in llmd_snippet(computed, 2048, 3)


def test_the_stall_stops_growing_at_its_saturation_and_documents_without_one_stay_linear() -> None:
    linear = {"model": context_model(), "chunk_rule": dict(VLLM_RULE)}
    saturated = {"model": context_model(sigma_saturation_tokens=8192.0), "chunk_rule": dict(VLLM_RULE)}
    for p in (1024, 8192):  # up to P_sat the two are the same
        ctx = chunk_context(linear, 4, p, 8192)
        assert colocated_cost(saturated, ctx)[0] == pytest.approx(colocated_cost(linear, ctx)[0], rel=1e-12)
    ctx = chunk_context(linear, 4, 32768, 8192)
    # beyond it each stream's stall is sigma1 x 8192, not sigma1 x 32768
    assert colocated_cost(linear, ctx)[0] - colocated_cost(saturated, ctx)[0] == pytest.approx(
        4 * 0.001 * (32768 - 8192), rel=1e-9)


def test_the_verdict_is_what_its_record_declares() -> None:
    """`Verdict` and `ArmNumbers` (issue 34: the verdict typed) name every key the evaluator
    returns, in both modes, and the keys they require are there."""
    from typing import get_type_hints

    from pdexporter.analysis.decision_eval import ArmNumbers, Verdict, evaluate_arms

    declared = set(get_type_hints(Verdict))
    for mode in ("two-arm", "seed"):
        v = evaluate_decision(make_doc(), 8, 4096, 8192, ttft_slo_ms=200, mode=mode)
        assert set(v) <= declared and Verdict.__required_keys__ <= set(v), (mode, set(v) ^ declared)
    numbers = evaluate_arms(make_doc(), 8, 4096, 8192)
    assert set(numbers) == set(get_type_hints(ArmNumbers))
