"""One threshold computation (`analysis.thresholds`, issue 31): `pdexporter thresholds`, the report
and decision.json give the same numbers for one decision.json, with the transfer budget they
charged, marks where a threshold lies outside the measured prompt lengths, and the verdict beside a
measured point in the transfer regime that point ran in. On the committed H200 documents."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pdexporter.analysis import decision_eval, report
from pdexporter.analysis.decision_eval import evaluate_decision, offload_thresholds
from pdexporter.analysis.thresholds import compute_thresholds
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[3]
ONE_ARM = ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b" / "decision.json"
TWO_ARM = ROOT / "results" / "h200x2-arms" / "decision.json"


def _doc(path: Path) -> dict:
    return json.loads(path.read_text())


def _cli(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    return run_cli(capsys, *argv)



def test_report_and_thresholds_give_one_answer_for_one_decision(capsys: pytest.CaptureFixture[str]) -> None:
    """The audit: report said D=3 35 and D=7-12 1 token, thresholds >= 64, for one decision.json."""
    doc = _doc(ONE_ARM)
    result = compute_thresholds(doc, chunk_sizes=[8192], replicates=20)
    page = report._decision(SimpleNamespace(decision=doc))  # type: ignore[arg-type]  # a double: the decision alone
    row = re.search(r"<td class=\"text\">B=8192</td>(.*?)</tr>", page)
    assert row, page
    cells = re.findall(r"<td class=\"\">(.*?)</td>", row.group(1))
    full = compute_thresholds(doc)  # the report's own call, the CLI's defaults
    assert cells == [t.cell(full.measured_p, short=True).replace("<", "&lt;") for t in full.by_chunk_size(8192)]
    code, out, err = _cli(capsys, "thresholds", "--model", str(ONE_ARM), "-B", "8192")
    assert code == 0, err
    for t in full.by_chunk_size(8192):
        assert f"  D={t.decode_batch_size}: {t.text(full.step, full.p_max, full.measured_p)}" in out.splitlines()
    assert all(t.threshold is None or t.threshold % 64 == 0 for t in result.records)
    # decision.json's seed-rule field is the same computation's central value
    fresh = compute_thresholds(doc, mode="seed", replicates=0, chunk_sizes=[8192])
    assert {t.decode_batch_size: t.threshold for t in fresh.records} == {
        t.decode_batch_size: t.threshold for t in full.by_chunk_size(8192)}


def test_the_budget_is_printed_and_in_the_json_and_transfer_ms_sets_it(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "thresholds", "--model", str(ONE_ARM), "-B", "8192", "--replicates", "10")
    assert code == 0, err
    assert out.splitlines()[0].startswith("seed verdict, transfer budget 50 ms (the seed's constant")
    code, out, err = _cli(capsys, "thresholds", "--model", str(ONE_ARM), "-B", "8192", "--replicates", "10",
                          "--transfer-ms", "120", "--out", str(tmp_path))
    assert code == 0, err
    written = json.loads((tmp_path / "offload_thresholds.json").read_text())
    assert written["transfer"] == {"source": "given", "ms": 120.0, "regime": "nominal"}
    at_50 = compute_thresholds(_doc(ONE_ARM), chunk_sizes=[8192], replicates=0).at(8192, 1)
    entry = written["chunk_sizes"]["8192"]["by_decode_batch_size"]["1"]
    assert at_50 is not None and at_50.threshold is not None and entry["threshold"] > at_50.threshold
    assert entry["transfer_ms"] == 120.0
    assert "transfer budget 120 ms (--transfer-ms)" in (tmp_path / "llm-d-pd-decider.yaml").read_text()
    two = compute_thresholds(_doc(TWO_ARM), chunk_sizes=[8192], decode_batch_sizes=[4], replicates=0)
    assert two.budget.source == "measured" and two.budget.text().startswith(
        "transfer budget measured: 4.1 ms + P x 96 KiB at 350 GB/s")
    assert two.to_dict()["transfer"]["model"]["gb_per_s"] == pytest.approx(349.827)


def test_thresholds_outside_the_measured_prompts_are_marked() -> None:
    one = compute_thresholds(_doc(ONE_ARM), chunk_sizes=[8192], decode_batch_sizes=[1, 12], replicates=10)
    assert one.measured_p == (512, 32768)
    floor = one.at(8192, 12)
    assert floor is not None and floor.at_floor and floor.outside == "below" and floor.threshold == 64
    # the replicates widened as the verdict's are at P < 512 (3 doublings below the fitted range: x4),
    # so the interval is no longer the bare bootstrap's 64..64 (and, the replicates centred on the fit since
    # session 30, some of them keep a prompt of 128 local: undecided)
    assert floor.cell(one.measured_p) == "undecided: <= 64 (64..192) [every P scanned offloads; below the measured " \
                                         "P 512..32768: extrapolated]"
    two = compute_thresholds(_doc(TWO_ARM), chunk_sizes=[8192], decode_batch_sizes=[1], replicates=0)
    assert two.measured_p == (2048, 32768)  # the pair measured P >= 2048: below it the offloaded terms extrapolate
    entry = two.at(8192, 1)
    assert entry is not None and entry.threshold == 512 and entry.outside == "below"
    assert "below the measured P 2048..32768: extrapolated" in entry.text(64, 131072, two.measured_p)


def test_single_arm_decide_is_undecided_when_its_interval_holds_the_budget(
        capsys: pytest.CaptureFixture[str]) -> None:
    v = evaluate_decision(_doc(ONE_ARM), 1, 448, 8192)
    low, high = v["intervals"]["colocated_cost_ms"]
    assert v["mode"] == "seed" and low < 50.0 < high and not v["decided"]
    assert v["verdict"].startswith("undecided (the seed's rule, leaning keep local: the interval holds the transfer)")
    code, out, err = _cli(capsys, "decide", "-D", "1", "-P", "448", "-B", "8192", "--model", str(ONE_ARM))
    assert code == 0 and out.startswith(f"UNDECIDED (leaning keep local): interference {v['cost_ms']:.1f} ms"), \
        out + err
    clear = evaluate_decision(_doc(ONE_ARM), 1, 4096, 8192)
    assert clear["intervals"]["colocated_cost_ms"][0] > 50.0 and clear["decided"]
    code, out, err = _cli(capsys, "decide", "-D", "1", "-P", "4096", "-B", "8192", "--model", str(ONE_ARM))
    assert out.startswith("OFFLOAD: interference"), out  # its interval clear of 50 ms


def test_a_measured_point_is_set_beside_the_verdict_of_its_transfer_regime() -> None:
    """The audit: the report paired a measured "saved -310.6 ms" with "saves 850 ms" (B=8192 D=8 P=8192
    of the 1P1D pair, whose transfer took 191 ms: the degraded regime, not the nominal 7 ms)."""
    doc = _doc(TWO_ARM)
    ran_degraded = SimpleNamespace(decode_batch_size=8, new_prefill_tokens=8192, chunk_size=8192,  # a row double
                                   kv_transfer_ms=191.3)
    verdict = report._row_verdict(doc, ran_degraded)
    head, _, rest = verdict.partition(":")  # "keep local", or "undecided (leaning keep local, ...)"
    assert "keep local" in head and rest.startswith(" offloading costs the 8 running decodes") and "degraded" in verdict
    ran_nominal = SimpleNamespace(decode_batch_size=8, new_prefill_tokens=8192, chunk_size=8192, kv_transfer_ms=7.3)
    assert report._row_verdict(doc, ran_nominal).startswith("offload: saves the 8 running decodes")


ARRAY_DOCS = [TWO_ARM, ROOT / "results" / "h200-arms-decodebench" / "decision.json",
              ROOT / "results" / "h200-sglang0.5.15-mixed-qwen3-coder-30b-a3b" / "decision.json", ONE_ARM]


@pytest.mark.parametrize("path", ARRAY_DOCS, ids=lambda p: p.parent.name)
def test_the_replicates_judged_as_arrays_give_the_thresholds_judged_one_by_one(path: Path) -> None:
    """`offload_thresholds(stack=numpy.asarray)` (what `compute_thresholds` uses) judges every replicate at a P in one
    pass: the same arithmetic element by element, so the same thresholds, the SLOs, the seed's rule and the degraded
    transfer included. The SGLang mixed document has its gamma vary by replicate with delta beside it: an in-place
    `gamma += ...` there once changed the stacked coefficients under the next P's verdicts."""
    np = pytest.importorskip("numpy")
    doc = _doc(path)
    reps: list[int | None] = [None, *range(40)]
    assert decision_eval._replicate_arrays(doc, list(range(40)), np.asarray) is not None  # the array path runs
    rng = doc["valid_range"]
    d_lo, d_hi = rng["decode_batch_size"]
    variants: list[dict[str, Any]] = [{}, {"mode": "seed"}, {"tpot_slo_ms": 40.0, "ttft_slo_ms": 300.0}]
    if doc.get("two_arm"):
        variants.append({"regime": "degraded"})
    else:
        variants = variants[:2]
    for b in sorted({int(x) for x in rng["chunk_sizes"]})[:2]:
        for d in sorted({max(1, d_lo), d_hi}):
            for kw in variants:
                one_by_one = offload_thresholds(doc, d, b, reps, **kw)
                assert offload_thresholds(doc, d, b, reps, stack=np.asarray, **kw) == one_by_one, (b, d, kw)


def test_replicates_that_do_not_line_up_are_judged_one_by_one() -> None:
    np = pytest.importorskip("numpy")
    doc = copy.deepcopy(_doc(TWO_ARM))
    del doc["replicates"]["model"][3]["catchup_steps"]  # one replicate without a coefficient the others have
    assert decision_eval._replicate_arrays(doc, list(range(10)), np.asarray) is None
    reps: list[int | None] = [None, *range(10)]
    assert offload_thresholds(doc, 4, 8192, reps, stack=np.asarray) == offload_thresholds(doc, 4, 8192, reps)


def test_the_two_arm_rule_on_arrays_is_the_rule_element_by_element() -> None:
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(7)
    n = 64
    numbers: Any = {"saved_ms": rng.normal(0, 10, n), "ttft_cost_ms": rng.normal(0, 10, n)}
    flags = {"TPOT": (rng.random(n) < 0.5, rng.random(n) < 0.5), "TTFT": (rng.random(n) < 0.5, rng.random(n) < 0.5)}
    for held in ({}, {"TPOT": flags["TPOT"]}, flags):
        many, _ = decision_eval._choose(numbers, held)
        for i in range(n):
            one: Any = {k: float(v[i]) for k, v in numbers.items()}
            held_i = {k: (bool(c[i]), bool(o[i])) for k, (c, o) in held.items()}
            assert bool(many[i]) == decision_eval._choose(one, held_i)[0]


@pytest.mark.parametrize("path", ARRAY_DOCS, ids=lambda p: p.parent.name)
def test_replicate_costs_as_arrays_are_each_replicates_own(path: Path) -> None:
    """`replicate_costs(stack=numpy.asarray)` (what `pdexporter validate` widens each held-out point by) gives every
    replicate's arm cost as `evaluate_arms(replicate=i, campaign=False)` does, bit for bit, one-chunk, several-chunk
    and graph prompts alike; without a stack the same list, one by one."""
    np = pytest.importorskip("numpy")
    doc = _doc(path)
    n = len(doc["replicates"]["model"])
    assert decision_eval._replicate_arrays(doc, list(range(n)), np.asarray) is not None  # the array path runs
    keys = ["colocated_cost_ms", *(["offloaded_cost_ms"] if doc.get("two_arm") else [])]
    b = sorted(int(x) for x in doc["valid_range"]["chunk_sizes"])[-1]
    points = [(d, p, b, None) for d in (1, 4, 12) for p in (64, 512, 3000, b + 100, 3 * b)]
    for key in keys:
        one_by_one = [[decision_eval.evaluate_arms(doc, d, p, b, replicate=i, campaign=False)[key]  # type: ignore[literal-required]
                       for i in range(n)] for d, p, b, _ in points]
        assert decision_eval.replicate_costs(doc, key, points, stack=np.asarray) == one_by_one, key
        assert decision_eval.replicate_costs(doc, key, points) == one_by_one
