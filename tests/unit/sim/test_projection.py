"""What a projection carries from calibrated profiles to a model nobody measured (issue 36): each
step-time parameter from the references of what it prices (`pdexporter.sim.projection`)."""

from __future__ import annotations

import pytest

from pdexporter.errors import ConfigError
from pdexporter.predict.calibrate import free_for, with_values
from pdexporter.sim.modelconfig import load_config, profile_from_config, references
from pdexporter.sim.profile import load_profile
from pdexporter.sim.projection import (
    host_level,
    per_layer_costs,
    project_step_time,
    step_and_layer_costs,
    weight_efficiency,
)

MOE = "h200-qwen3-coder-30b-a3b"
LAYER_COSTS = ("fixed_ms", "launch_eager_ms", "launch_piecewise_ms")


def _project(name: str, refs, rule: str = "learned"):
    cfg, source = load_config(name)
    return profile_from_config(cfg, "H200", model_name=name, source=source, carry_from=refs, rule=rule)


@pytest.fixture(scope="module")
def moe():
    return load_profile(MOE)


@pytest.fixture(scope="module")
def dense_ref(moe):
    """A calibrated dense profile standing in for the H200 Llama-3.1-8B fit: values no rule would guess."""
    prof = _project("llama-3.1-8b-instruct", [moe], rule="carry")
    prof = with_values(prof, {"matmul_efficiency": 0.63, "bandwidth_efficiency": 0.88, "attention_efficiency": 0.6,
                              "fixed_ms": 0.9, "launch_eager_ms": 28.0, "launch_piecewise_ms": 7.0})
    return prof.model_copy(update={"calibration": "calibrated", "name": "h200-llama-test"})


def test_a_dense_model_from_the_moe_profile_alone_takes_its_weight_efficiency(moe):
    carry = _project("llama-3.1-8b-instruct", [moe], rule="carry")
    learned = _project("llama-3.1-8b-instruct", [moe])
    # the old rule: a measured GEMM's 790 of 989 TFLOPS for every dense GEMM of the model
    assert carry.step_time.matmul_efficiency == pytest.approx(790 / 989)
    # learned: the MoE data bound it, between what its GEMMs reached altogether (its dense ones at the measured
    # GEMM, its experts fitted, routing included) and the measured GEMM: the middle
    eff = weight_efficiency(moe)
    assert moe.step_time.moe_efficiency < eff < moe.step_time.matmul_efficiency
    assert learned.step_time.matmul_efficiency == pytest.approx((eff + 790 / 989) / 2)
    assert 0.65 < learned.step_time.matmul_efficiency < 0.67
    # one kind of layer among the references: the same cost per layer (the old rule), the rest carried
    for name in LAYER_COSTS:
        assert getattr(learned.step_time, name) == pytest.approx(getattr(moe.step_time, name) * 32 / 48)
        assert getattr(learned.step_time, name) == pytest.approx(getattr(carry.step_time, name))
    assert learned.step_time.bandwidth_efficiency == moe.step_time.bandwidth_efficiency
    assert learned.engine_loop == moe.engine_loop and learned.host == moe.host
    assert "HYPOTHESIS" in learned.provenance["step_time"] and "learnt from h200-qwen3-coder-30b-a3b" in \
        learned.provenance["step_time"]


def test_an_moe_model_from_the_moe_profile_is_that_profile(moe):
    prof = _project("qwen3-coder-30b-a3b", [moe])
    for name in ("moe_efficiency", "attention_efficiency", "bandwidth_efficiency", *LAYER_COSTS):
        assert getattr(prof.step_time, name) == pytest.approx(getattr(moe.step_time, name)), name


def test_with_a_calibrated_dense_reference_each_part_comes_from_its_kind(moe, dense_ref):
    refs = [moe, dense_ref]
    # the dense reference's own model projected back: what it was fitted to, but the shared attention kernel
    again = _project("llama-3.1-8b-instruct", refs)
    for name in ("matmul_efficiency", "bandwidth_efficiency", *LAYER_COSTS):
        assert getattr(again.step_time, name) == pytest.approx(getattr(dense_ref.step_time, name)), name
    assert again.step_time.attention_efficiency == pytest.approx((0.6 + moe.step_time.attention_efficiency) / 2)
    # the MoE model from both: still its own (the dense layers' costs do not leak into the MoE layers')
    moe_again = _project("qwen3-coder-30b-a3b", refs)
    for name in ("moe_efficiency", "bandwidth_efficiency", *LAYER_COSTS):
        assert getattr(moe_again.step_time, name) == pytest.approx(getattr(moe.step_time, name)), name
    # a third model, dense, 36 layers: the dense reference's efficiencies and its cost per dense layer
    third = _project("qwen3-8b", refs)
    assert third.step_time.matmul_efficiency == pytest.approx(0.63)
    assert third.step_time.bandwidth_efficiency == pytest.approx(0.88)
    assert third.step_time.launch_eager_ms == pytest.approx(28.0 * 36 / 32)
    per_dense, per_moe, _ = per_layer_costs(refs, "launch_eager_ms")
    # read at each reference's mean host level (both carry the MoE profile's host here)
    level = host_level(moe, "launch_eager_ms")
    assert level == pytest.approx(1 + moe.host.slow_fraction * (moe.host.slow_factor - 1)) and level > 1
    assert per_dense == pytest.approx(28.0 / 32 * level)
    assert per_moe == pytest.approx(moe.step_time.launch_eager_ms / 48 * level)


def test_references_calibrated_at_different_host_levels_are_compared_at_their_mean(moe, dense_ref):
    """One calibration's nominal host can be a fast episode's (the 32B's: 27.5 ms, slow x 1.82 in 5 of 6
    configurations), another's the common level: the same launches read as their mean."""
    fast = dense_ref.model_copy(update={
        "name": "h200-llama-fast",
        "step_time": dense_ref.step_time.model_copy(update={"launch_eager_ms": 14.0, "fixed_ms": 0.9}),
        "host": dense_ref.host.model_copy(update={"slow_factor": 3.0, "slow_fraction": 0.5})})
    common = dense_ref.model_copy(update={
        "name": "h200-llama-common",
        "step_time": dense_ref.step_time.model_copy(update={"launch_eager_ms": 28.0}),
        "host": dense_ref.host.model_copy(update={"slow_factor": 1.0, "slow_fraction": 0.0})})
    assert host_level(fast, "launch_eager_ms") == pytest.approx(2.0) and host_level(fast, "fixed_ms") == 1.0
    for ref in (fast, common):  # 14 ms at the fast level, half the time x 3: 28 ms on average, as `common`
        assert per_layer_costs([ref], "launch_eager_ms")[0] == pytest.approx(28.0 / 32)
        assert per_layer_costs([ref], "fixed_ms")[0] == pytest.approx(0.9 / 32)  # the GPU's: as it stands
    # the target's nominal is the host it carries (the first reference's): the mean level over its level
    third = _project("qwen3-8b", [fast, common])
    assert third.host == fast.host
    assert third.step_time.launch_eager_ms == pytest.approx(28.0 * 36 / 32 / 2.0)


def _level_host(prof, name: str, **step):
    """`prof` renamed, calibrated, its host at one level (mean host level 1), `step` its step-time values."""
    return prof.model_copy(update={
        "name": name, "calibration": "calibrated",
        "step_time": prof.step_time.model_copy(update=step),
        "host": prof.host.model_copy(update={"slow_factor": 1.0, "slow_fraction": 0.0})})


def test_a_launch_is_a_cost_per_step_and_per_layer_where_the_references_determine_both(moe, dense_ref):
    """Three dense calibrations launched 29, 38 and 46 ms at 32, 40 and 64 layers: not proportional to the
    layers. References built with a known cost per step and per layer give those costs back."""
    step, per_dense, per_moe = 12.0, 0.5, 0.9
    cfg, source = load_config("qwen2.5-32b-instruct")
    deep = profile_from_config(cfg, "H200", model_name="qwen2.5-32b-instruct", source=source, carry_from=[moe],
                               rule="carry")
    refs = [_level_host(moe, "moe", launch_eager_ms=step + per_moe * 48, launch_piecewise_ms=1.0 + 0.1 * 48,
                        fixed_ms=0.05 * 48)]
    refs += [_level_host(prof, f"dense-{n}", launch_eager_ms=step + per_dense * n, launch_piecewise_ms=1.0 + 0.05 * n,
                         fixed_ms=0.04 * n) for prof, n in ((dense_ref, 32), (deep, 64))]
    got = step_and_layer_costs(refs, "launch_eager_ms")
    assert got[:3] == pytest.approx((step, per_dense, per_moe)) and "per step" in got[3]
    target = _project("qwen3-14b", refs)  # 40 dense layers, nobody's depth among the references
    assert target.step_time.launch_eager_ms == pytest.approx(step + per_dense * 40)
    assert target.step_time.launch_piecewise_ms == pytest.approx(1.0 + 0.05 * 40)
    # the GPU's per-step overhead stays a cost per layer (a constant there took the Llama's baseline 5.7 -> 10.0 %
    # leaving one model out)
    assert target.step_time.fixed_ms == pytest.approx(per_layer_costs(refs, "fixed_ms")[0] * 40)
    assert "a cost per step" in target.provenance["step_time"]
    # two references (the shipped MoE and Llama profiles): a constant is not determined, the rule per layer
    two = step_and_layer_costs(refs[:2], "launch_eager_ms")
    assert two[0] == 0.0 and two[1:3] == pytest.approx(per_layer_costs(refs[:2], "launch_eager_ms")[:2])
    assert _project("qwen3-14b", refs[:2]).step_time.launch_eager_ms == pytest.approx((step + per_dense * 32) / 32 * 40)
    # the launches are still read at each reference's mean host level, the target's at the host it carries
    slow = refs[0].model_copy(update={"host": moe.host})
    assert _project("qwen3-14b", [slow, *refs[1:]]).step_time.launch_eager_ms == pytest.approx(
        step_and_layer_costs([slow, *refs[1:]], "launch_eager_ms")[0] / host_level(moe, "launch_eager_ms")
        + step_and_layer_costs([slow, *refs[1:]], "launch_eager_ms")[1] * 40 / host_level(moe, "launch_eager_ms"))


def test_the_engine_loops_latencies_come_from_the_references_of_the_targets_kind(moe, dense_ref):
    """The MoE profile's idle start is 9.46 ms, the dense fits' 0.30-2.41: carried to the 14B it projected
    its prefill alone at P = 512 +35 %. A dense target takes them from the dense references, an MoE one from
    the MoE references, and without a reference of its kind from the first; the CPU costs per block and
    per token, which the carried host scales, stay the first reference's."""
    loop = {"idle_start_ms": 0.5, "request_overhead_ms": 3.0, "admit_us_per_block": 1.0, "retire_us_per_token": 2.0}
    dense = dense_ref.model_copy(update={"engine_loop": dense_ref.engine_loop.model_copy(update=loop)})
    other = dense.model_copy(update={"name": "h200-other-dense", "engine_loop": dense.engine_loop.model_copy(
        update={"idle_start_ms": 1.5, "request_overhead_ms": 5.0})})
    assert moe.engine_loop.idle_start_ms > 9
    target = _project("qwen3-14b", [moe, dense, other])
    assert target.engine_loop.idle_start_ms == pytest.approx(1.0)  # the dense references' mean, not the MoE's
    assert target.engine_loop.request_overhead_ms == pytest.approx(4.0)
    assert target.engine_loop.admit_us_per_block == moe.engine_loop.admit_us_per_block
    assert target.engine_loop.retire_us_per_token == moe.engine_loop.retire_us_per_token
    assert target.host == moe.host
    assert "idle_start_ms, request_overhead_ms: the references of its kind" in target.provenance["engine_loop"]
    # an MoE target from the same references: the MoE profile's, whatever the order
    moe_target = _project("qwen3-coder-30b-a3b", [dense, moe, other])
    assert moe_target.engine_loop.idle_start_ms == moe.engine_loop.idle_start_ms
    # no reference of its kind: the first reference's
    assert _project("qwen3-coder-30b-a3b", [dense, other]).engine_loop.idle_start_ms == pytest.approx(0.5)
    assert _project("qwen3-14b", [moe]).engine_loop == moe.engine_loop
    # the rule before issue 36 carries the first reference's engine loop whole
    assert _project("qwen3-14b", [moe, dense, other], rule="carry").engine_loop == moe.engine_loop


def test_an_moe_model_from_a_dense_reference_alone_reaches_its_weight_efficiency(dense_ref):
    prof = _project("qwen3-coder-30b-a3b", [dense_ref])
    assert prof.step_time.matmul_efficiency == pytest.approx(790 / 989)  # the measured GEMM, as the MoE fit has it
    assert weight_efficiency(prof) == pytest.approx(0.63, rel=1e-6)
    assert prof.step_time.bandwidth_efficiency == pytest.approx(0.88)  # no MoE reference: the dense one's
    assert prof.step_time.launch_eager_ms == pytest.approx(28.0 * 48 / 32)


def test_references_default_to_the_shipped_calibrated_profiles_and_refuse_none(moe):
    refs = references()
    assert refs[0].name == MOE and all(p.calibration == "calibrated" for p in refs)
    with pytest.raises(ConfigError):
        references([])
    with pytest.raises(ValueError):
        project_step_time(moe.model, [], measured_gemm_efficiency=None)
    with pytest.raises(ConfigError, match="--rule"):
        _project("qwen3-8b", [moe], rule="guess")


def test_a_dense_fit_frees_its_gemm_efficiency_in_place_of_the_experts(moe, dense_ref):
    free = ("fixed_ms", "moe_efficiency", "attention_efficiency", "bandwidth_efficiency", "moe_expert_pool",
            "launch_eager_ms")
    assert free_for(moe, free) == free
    assert free_for(dense_ref, free) == ("fixed_ms", "matmul_efficiency", "attention_efficiency",
                                         "bandwidth_efficiency", "launch_eager_ms")


def test_leave_one_model_out_projects_each_measured_model_from_the_others_only():
    from pdexporter.predict.projection import MEASURED, leave_one_model_out

    names = {m.name: m.profile for m in MEASURED}
    assert len(MEASURED) == 4 and all(m.reference() is not None for m in MEASURED)  # all four calibrated
    keys = {(8192, 4, 8192), (3072, 4, 8192), (6144, 4, 8192)}  # one of each run (32B: B = 3072, 14B: 6144)
    scores = leave_one_model_out(rules=("learned", "own"), keys=keys)
    assert [(s.target, s.rule) for s in scores] == [(m.name, r) for m in MEASURED for r in ("learned", "own")]
    for s in scores:
        assert s.n == 1 and s.mape["prefill_duration"] is not None
        if s.rule == "own":
            assert s.references == (names[s.target],)
        else:  # never its own calibrated profile: the others, in MEASURED's order
            assert s.references == tuple(p for t, p in names.items() if t != s.target)


def test_a_multi_chunk_prompt_is_one_the_first_chunk_cannot_hold_beside_the_decodes():
    from pdexporter.predict.projection import multi_chunk

    assert not multi_chunk((3072, 4, 1024)) and not multi_chunk((3072, 4, 3068))
    assert multi_chunk((3072, 4, 3069)) and multi_chunk((2048, 1, 2048)) and not multi_chunk((2048, 0, 2048))
