"""Held-out campaigns (issue 30, `analysis.campaigns`): validation campaigns read by no fit, errors
quoted on campaigns a model never saw, the campaign variation carried into every interval, and
the coverage scored nested (a campaign never sets its own interval's width)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest

from pdexporter.analysis.campaigns import (
    CAMPAIGN_FILE,
    HeldOutPoint,
    campaign_draws,
    campaign_order,
    carry_variation,
    check_fit_inputs,
    coverage_summary,
    find_campaigns,
    fold_variation,
    inside_log_band,
    load_campaign,
    variation_from,
)
from pdexporter.analysis.decision_eval import evaluate_decision, held_out_text
from pdexporter.analysis.job import load_joined, validate_campaigns
from pdexporter.errors import RecordError

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "results"


def campaign_dir(tmp: Path, name: str, cid: str, role: str = "fit") -> Path:
    d = tmp / name
    d.mkdir(parents=True)
    (d / CAMPAIGN_FILE).write_text(f"id: {cid}\ndate: 2026-12-03\nrole: {role}\nnote: test\n")
    return d


# ---------------------------------------------------------------------------------------------
# Validation campaigns are read by no fit


def test_a_validation_campaign_is_refused_as_the_input_of_a_joined_fit(tmp_path: Path) -> None:
    fit = campaign_dir(tmp_path, "a", "c1")
    val = campaign_dir(tmp_path, "v", "c9", role="validation")
    assert check_fit_inputs([fit]) == ["c1"]
    assert check_fit_inputs([val]) == ["c9"]  # its own table, alone, is not a fit of the models others use
    with pytest.raises(RecordError, match="validation campaign .*no fit reads it"):
        check_fit_inputs([fit, val])
    with pytest.raises(RecordError, match="no fit reads it"):
        load_joined([fit, val], pool=True)


def test_a_campaign_file_names_id_date_and_a_known_role(tmp_path: Path) -> None:
    d = tmp_path / "x"
    d.mkdir()
    assert load_campaign(d) is None
    (d / CAMPAIGN_FILE).write_text("id: c1\nrole: fit\n")
    with pytest.raises(RecordError, match="date: missing"):
        load_campaign(d)
    (d / CAMPAIGN_FILE).write_text("id: c1\ndate: 2026-12-03\nrole: training\n")
    with pytest.raises(RecordError, match="role: 'training' is not one of fit, validation"):
        load_campaign(d)
    (d / CAMPAIGN_FILE).write_text("id: c1\ndate: 2026-12-03\nrole: fit\n")
    assert load_campaign(d) == {"id": "c1", "date": "2026-12-03", "role": "fit", "note": ""}


def test_committed_validation_campaigns_are_read_by_no_committed_fit() -> None:
    """Every committed decision document rests on fit campaigns only: none names a validation
    campaign among its campaigns or a validation campaign's directory among its sources, but a
    validation campaign's own table (under its directory, or fitted on its directories alone: a
    passive run's event model beside its records)."""
    campaign_of = {p.parent.relative_to(ROOT).as_posix(): load_campaign(p.parent)["id"]  # type: ignore[index]
                   for p in RESULTS.rglob(CAMPAIGN_FILE) if load_campaign(p.parent)["role"] == "validation"}  # type: ignore[index]
    validation_dirs = set(campaign_of)
    validation_ids = set(campaign_of.values())
    assert validation_dirs, "the committed validation campaign has its campaign.yaml"

    def is_validation(source: str) -> bool:  # a whole directory, not a prefix of another's name
        return any(Path(source) == Path(d) or Path(source).is_relative_to(d) for d in validation_dirs)

    checked = 0
    own: list[str] = []
    for path in RESULTS.rglob("decision.json"):
        if any(path.is_relative_to(ROOT / d) for d in validation_dirs):
            continue  # a validation campaign's own table
        doc = json.loads(path.read_text())
        sources = [s for field in (doc.get("source"), (doc.get("two_arm") or {}).get("source")) if field
                   for s in str(field).split(" + ")]
        if sources and all(s in validation_dirs for s in sources) and len({campaign_of[s] for s in sources}) == 1:
            own.append(path.parent.relative_to(RESULTS).as_posix())
            continue  # fitted on one validation campaign's records alone: its own table
        assert not set(doc.get("campaigns") or []) & validation_ids, path
        assert not any(is_validation(s) for s in sources), path
        checked += 1
    # the passive runs' event models of the validation campaigns (three runs), beside their records
    assert sorted(own) == ["h100-vllm0.22-qwen3-coder-30b-a3b-passive-spread-1rps/passive-table",
                           "h100-vllm0.22-qwen3-coder-30b-a3b-passive-spread/passive-table",
                           "h200-vllm0.22-qwen3-coder-30b-a3b-validation-passive/passive-table"]
    assert checked >= 5
    script = (ROOT / "scripts" / "results.sh").read_text()
    for line in script.splitlines():
        if "export-table" in line and "--campaign-variation" not in line:
            assert "validation" not in line, line


def test_committed_campaigns_group_by_id() -> None:
    pairs = [(p.parent, "colocated") for p in RESULTS.rglob(CAMPAIGN_FILE) if "decodebench" not in str(p)]
    found = {c.id: c for c in find_campaigns(pairs)}
    assert {"s1-h200", "s3-h200x2", "s4-h200", "s5-h200"} <= set(found)
    assert found["s3-h200x2"].role == "fit" and len(found["s3-h200x2"].colocated) == 3


# ---------------------------------------------------------------------------------------------
# The campaign variation carried into every interval


def test_campaign_draws_are_fixed_standard_normal_and_independent_between_the_arms() -> None:
    draws = campaign_draws(200)
    assert draws == campaign_draws(200)
    col = [d["colocated"] for d in draws]
    off = [d["offloaded"] for d in draws]
    assert abs(statistics.fmean(col)) < 1e-9 and 0.95 < statistics.pstdev(col) < 1.0
    assert sorted(col) == sorted(off) and col != off
    assert abs(statistics.correlation(col, off)) < 0.2
    share_inside = sum(abs(z) <= 1.645 for z in col) / len(col)
    assert share_inside == pytest.approx(0.90, abs=0.01)


def test_carry_variation_multiplies_replicate_r_by_exp_s_z_r_as_decision_documents_do() -> None:
    from pdexporter.analysis.decision_eval import campaign_log_sd, evaluate_arms

    doc = fold_variation(one_arm_doc(), {"colocated": {"log_sd": 0.2, "by_regime": {"launch": 0.25}}})
    reps = [evaluate_arms(doc, 4, 2048, 8192, replicate=i, campaign=False)["colocated_cost_ms"] for i in range(200)]
    with_var = [evaluate_arms(doc, 4, 2048, 8192, replicate=i)["colocated_cost_ms"] for i in range(200)]
    s = campaign_log_sd(doc["campaign_variation"], "colocated", "launch")
    assert s == 0.25 and campaign_log_sd(doc["campaign_variation"], "colocated", "graph") == 0.2
    assert campaign_log_sd({}, "offloaded", "graph") == 0.0
    assert carry_variation(reps, s).tolist() == pytest.approx(with_var, rel=1e-12)
    grid = carry_variation([[1.0, 2.0]] * 200, [0.0, 0.5])  # one s per column
    assert grid[:, 0].tolist() == [1.0] * 200 and grid[:, 1].tolist() == pytest.approx(
        [2.0 * math.exp(0.5 * z["colocated"]) for z in campaign_draws(200)])


def one_arm_doc(n_reps: int = 200) -> dict:
    """A colocated cost model whose bootstrap replicates all agree (no estimation spread), so any
    width of an interval is the campaign variation's."""
    k = {"alpha0_ms": 40.0, "alpha1_ms_per_decode": 0.0, "compute0_ms": 0.0, "gamma_ms_per_token": 0.01,
         "beta_ms_per_token_pair": 0.0, "kappa_graph_ms_per_token": 0.02, "graph0_ms": 5.0}
    return {"model": {"name": "context_aware", "coefficients": dict(k)},
            "chunk_rule": {"decodes_take_budget": True, "decodes_in_chunk_step": True, "graph_max_tokens": 512},
            "replicates": {"model": [dict(k) for _ in range(n_reps)]}, "transfer_ms_default": 50.0}


def test_intervals_and_verdicts_carry_the_campaign_variation_per_regime() -> None:
    doc = one_arm_doc()
    variation = {"colocated": {"log_sd": 0.2, "by_regime": {"graph": 0.3, "launch": 0.2, "compute": 0.1}}}
    folded = fold_variation(doc, variation, {"colocated": {"leave_one_campaign_out": {
        "mape_pct": 17.0, "coverage": 0.9, "campaigns": ["a", "b"]}}})
    for p, s in ((256, 0.3), (2048, 0.2), (16384, 0.1)):  # graph, one eager launch-bound step, compute
        before = evaluate_decision(doc, 4, p, 8192, mode="seed")
        after = evaluate_decision(folded, 4, p, 8192, mode="seed")
        assert after["cost_ms"] == before["cost_ms"]  # the central number does not move
        lo, hi = before["intervals"]["colocated_cost_ms"]
        assert hi - lo < 1e-6 * before["cost_ms"]  # no bootstrap spread by construction
        lo, hi = after["intervals"]["colocated_cost_ms"]
        assert math.log(hi / after["cost_ms"]) == pytest.approx(1.645 * s, rel=0.03), p
        assert math.log(after["cost_ms"] / lo) == pytest.approx(1.645 * s, rel=0.03), p
    # a verdict whose central margin is inside the variation is no longer decided
    cost = evaluate_decision(doc, 4, 2048, 8192, mode="seed")["cost_ms"]
    assert evaluate_decision(doc, 4, 2048, 8192, transfer_ms=cost * 0.9, mode="seed")["decided"]
    assert not evaluate_decision(folded, 4, 2048, 8192, transfer_ms=cost * 0.9, mode="seed")["decided"]
    assert "17 % MAPE" in held_out_text(folded) and "a, b" in held_out_text(folded)
    assert "no campaign variation carried" in held_out_text(doc)
    assert evaluate_decision(folded, 4, 2048, 8192, mode="seed")["held_out"]["intervals_carry_campaign_variation"]


# ---------------------------------------------------------------------------------------------
# Coverage, nested


def point(cid: str, ratio: float, regime: str = "compute", role: str = "fit") -> HeldOutPoint:
    return HeldOutPoint(cid, role, "colocated", 8192, 4, 1024, regime, 100.0 * ratio, 100.0, ("x",),
                        [100.0] * 200)


def test_variation_is_the_rms_of_held_out_log_errors_and_coverage_is_nested() -> None:
    ratios = {"a": [1.1, 0.9, 1.2, 0.85] * 3, "b": [1.15, 0.88, 1.05, 0.95] * 3, "c": [2.5] * 12}
    points = [point(cid, r) for cid, rs in ratios.items() for r in rs]
    points += [point("v", 1.1, role="validation") for _ in range(10)]
    var = variation_from(points)["colocated"]
    logs = [math.log(r) for rs in ratios.values() for r in rs] + [math.log(1.1)] * 10
    assert var["log_sd"] == pytest.approx(math.sqrt(statistics.fmean([x * x for x in logs])), abs=1e-4)
    # a validation campaign's residuals (of models that never read it) count like a left-out fit campaign's
    assert var["campaigns"] == ["a", "b", "c", "v"] and var["points"] == 46
    without_c = variation_from(points, exclude="c")["colocated"]
    assert without_c["campaigns"] == ["a", "b", "v"]
    summary = coverage_summary(points)["arms"]["colocated"]["campaigns"]
    # bootstrap alone (no spread here) covers nothing; with the variation a and b are covered...
    assert summary["a"]["coverage_bootstrap_only"] == 0.0
    assert summary["a"]["coverage"] == 1.0 and summary["b"]["coverage"] == 1.0
    # ...but c, far off, is scored with the variation of a and b alone: it does not widen its own interval
    assert summary["c"]["coverage"] == 0.0
    assert summary["c"]["mape_pct"] == pytest.approx(60.0)  # |100 - 250| / 250: the error of the prediction
    assert summary["v"]["role"] == "validation" and summary["v"]["coverage"] == 1.0


def test_a_regime_with_few_points_takes_the_arms_pooled_variation() -> None:
    points = [point("a", 1.2) for _ in range(10)] + [point("b", 0.8) for _ in range(10)]
    points += [point("a", 2.0, regime="graph") for _ in range(3)]
    var = variation_from(points)["colocated"]
    assert var["by_regime"]["graph"] == var["log_sd"] and var["points_by_regime"]["graph"] == 3
    assert var["by_regime"]["compute"] == pytest.approx(math.sqrt(statistics.fmean(
        [math.log(1.2) ** 2, math.log(0.8) ** 2])), abs=1e-4)


# ---------------------------------------------------------------------------------------------
# End to end on committed H200 records (a few points of three campaigns)


def subset(tmp: Path, source: str, name: str, cid: str, keys: list[str], role: str = "fit") -> Path:
    d = campaign_dir(tmp, name, cid, role)
    (d / "8192").mkdir()
    for key in keys:
        shutil.copy(RESULTS / source / "8192" / f"{key}.json", d / "8192" / f"{key}.json")
    return d


def test_validate_leaves_each_campaign_out_on_real_records(tmp_path: Path) -> None:
    keys = [f"D{d}_P{p}" for d in (1, 4, 12) for p in (512, 1024, 2048, 4096)] + ["D0_P1024"]
    a = subset(tmp_path, "h200-vllm0.22-qwen3-coder-30b-a3b", "a", "s1", keys + [
        f"D{d}_P{p}" for d in (2, 8) for p in (8192, 16384)])
    b = subset(tmp_path, "h200-vllm0.22-qwen3-coder-30b-a3b-small-p", "b", "s4", keys + [
        f"D{d}_P{p}" for d in (2, 8) for p in (768, 1536)])
    v = subset(tmp_path, "h200x2-vllm0.22-qwen3-coder-30b-a3b", "v", "s3", keys, role="validation")
    result = validate_campaigns([a, b, v])
    by = result["summary"]["arms"]["colocated"]["campaigns"]
    assert by["s1"]["fitted_on"] == ["s4"] and by["s4"]["fitted_on"] == ["s1"]
    assert by["s3"]["fitted_on"] == ["s1", "s4"] and by["s3"]["role"] == "validation"
    assert by["s3"]["points"] == 12
    # the width rests on every campaign's held-out residuals, the validation campaign's included
    assert result["variation"]["colocated"]["campaigns"] == ["s1", "s3", "s4"]
    for v_ in by.values():
        assert 0 <= v_["coverage_bootstrap_only"] <= v_["coverage"] <= 1
        assert v_["mape_pct"] > 0
    headline = result["headline"]["colocated"]
    assert headline["leave_one_campaign_out"]["campaigns"] == ["s1", "s4"]
    assert set(headline["validation"]) == {"s3"}


def test_campaigns_are_listed_in_the_order_of_their_numbers() -> None:
    points = [point(cid, 1.1, role="validation" if cid != "s1-h200" else "fit") for cid in
              ("s11-host", "s1-h200", "s9-1gpu", "s10-x") for _ in range(3)]
    assert variation_from(points)["colocated"]["campaigns"] == ["s1-h200", "s9-1gpu", "s10-x", "s11-host"]
    assert list(coverage_summary(points)["arms"]["colocated"]["campaigns"]) == ["s1-h200", "s9-1gpu", "s10-x",
                                                                              "s11-host"]
    assert sorted(["b2", "a10", "a9"], key=campaign_order) == ["a9", "a10", "b2"]


def test_each_campaign_is_also_scored_by_regime() -> None:
    points = [point("a", 1.1) for _ in range(10)] + [point("b", 0.9) for _ in range(10)]
    points += [point("b", 2.0, regime="launch") for _ in range(4)]
    b = coverage_summary(points)["arms"]["colocated"]["campaigns"]["b"]
    assert set(b["by_regime"]) == {"compute", "launch"}
    assert b["by_regime"]["compute"]["points"] == 10 and b["by_regime"]["launch"]["points"] == 4
    assert b["by_regime"]["launch"]["mape_pct"] == pytest.approx(50.0)  # |100 - 200| / 200
    assert b["by_regime"]["compute"]["mape_pct"] == pytest.approx(100 / 9, abs=0.01)  # |100 - 90| / 90
    # the launch points lie beyond a's width (log 2 against s = log 1.1): outside, the compute ones inside
    assert b["by_regime"]["launch"]["coverage"] == 0.0 and b["by_regime"]["compute"]["coverage"] == 1.0
    assert b["points"] == 14


def test_a_prediction_without_replicates_is_scored_in_its_log_band() -> None:
    """x exp(+-1.6449 s) around the prediction, symmetric in the log (the embedded engine's and a
    projection's coverage, scripts/sim_coverage.py and scripts/projection_coverage.py)."""
    s = 0.39  # the launch-bound regime's s: a band of x/÷ 1.8995
    assert inside_log_band(189.9, 100.0, s) and inside_log_band(100.0, 189.9, s)
    assert not inside_log_band(190.0, 100.0, s) and not inside_log_band(100.0, 190.0, s)
    assert inside_log_band(100.0, 100.0, 0.0) and not inside_log_band(100.1, 100.0, 0.0)
