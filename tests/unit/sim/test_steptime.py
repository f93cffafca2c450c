"""The step-time model: physical shape, and the shipped H200 profile against docs/vllm-facts.md."""

from __future__ import annotations

import pytest

from pdexporter.sim.calibrate import mixed_composition, vllm_facts_observations
from pdexporter.sim.profile import load_profile
from pdexporter.sim.steptime import StepComposition, StepTimeModel


@pytest.fixture(scope="module")
def h200() -> StepTimeModel:
    return StepTimeModel(load_profile("h200-qwen3-coder-30b-a3b"))


@pytest.fixture(scope="module")
def h20() -> StepTimeModel:
    return StepTimeModel(load_profile("h20-qwen3-coder-30b-a3b"))


def test_composition_sums():
    comp = StepComposition.of([(100, 50), (1, 4096)])
    assert comp.num_tokens == 101 and comp.num_requests == 2 and comp.max_query_len == 100
    assert comp.attention_pairs == 100 * 50 + 100 * 101 / 2 + 4096 + 1
    assert comp.kv_read_tokens == 150 + 4097
    assert not comp.uniform_decode and StepComposition.decode_batch(4, 10).uniform_decode


def test_experts_touched_uniform_routing(h20: StepTimeModel):
    assert h20.experts_touched(1) == pytest.approx(8)
    assert h20.experts_touched(12) == pytest.approx(128 * (1 - (120 / 128) ** 12))
    assert h20.experts_touched(2048) == pytest.approx(128, rel=1e-6)


def test_decode_steps_grow_with_d_and_context(h200: StepTimeModel):
    times = [h200.decode_step_s(d, 4096) for d in (1, 2, 4, 8, 12)]
    assert times == sorted(times) and times[0] < times[-1]
    assert h200.decode_step_s(4, 8192) > h200.decode_step_s(4, 4096)


def test_a_chunk_costs_more_the_later_it_sits_in_the_prompt(h200: StepTimeModel):
    steps = [h200(mixed_composition(2044, 2044 * k, 4, 4136)) for k in range(16)]
    assert steps == sorted(steps)
    assert steps[-1] > 2 * steps[0]


def test_mixed_steps_pay_the_graph_overhead(h200: StepTimeModel):
    decode = StepComposition.decode_batch(4, 4096)
    small_mixed = StepComposition.of([(4, 2044)] + [(1, 4096)] * 4)
    big_mixed = StepComposition.of([(600, 0)] + [(1, 4096)] * 4)
    assert h200.overhead_s(decode) == 0.0
    assert h200.overhead_s(small_mixed) == pytest.approx(h200.params.piecewise_overhead_ms / 1e3)
    assert h200.overhead_s(big_mixed) == pytest.approx(h200.params.eager_overhead_ms / 1e3)
    # a 4-token prefill tail beside 4 decodes is well above the slow-step threshold (1.2 x decode)
    assert h200(small_mixed) > 1.2 * h200(decode)


def test_h20_is_compute_bound_where_h200_is_not(h200: StepTimeModel, h20: StepTimeModel):
    chunk = mixed_composition(8188, 0, 4, 4136)
    assert h20(chunk) > 4 * h200(chunk)
    # decode steps are bandwidth-bound: the two GPUs are within a factor of 1.5
    assert h20.decode_step_s(4, 4096) / h200.decode_step_s(4, 4096) < 1.5


@pytest.mark.parametrize("obs", vllm_facts_observations(), ids=lambda o: o.label)
def test_h200_profile_reproduces_the_measured_facts(h200: StepTimeModel, obs):
    assert h200(obs.composition) == pytest.approx(obs.seconds, rel=0.10)


def test_breakdown_adds_up(h200: StepTimeModel):
    b = h200.breakdown(mixed_composition(2044, 0, 4, 4136))
    assert b.total_s == pytest.approx(h200(mixed_composition(2044, 0, 4, 4136)))
    assert b.total_s >= b.fixed_s + b.overhead_s + max(b.weights_compute_s, b.weights_memory_s)
    assert h200(StepComposition.of([])) == 0.0
