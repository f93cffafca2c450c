"""Fitting step-time parameters: recovers known parameters from step times they generated."""

from __future__ import annotations

import numpy as np
import pytest

from pdexporter.measure.records import (
    BaselineBlock,
    DerivedBlock,
    InterferenceBlock,
    RecordConfig,
    RepRecord,
    aggregate,
)
from pdexporter.sim.calibrate import (
    chunk_sizes,
    fit_step_params,
    mixed_composition,
    observations_from_record,
    split_holdout,
    StepObservation,
)
from pdexporter.sim.profile import load_profile
from pdexporter.sim.steptime import StepComposition, StepTimeModel


@pytest.fixture(scope="module")
def base():
    return load_profile("h200-qwen3-coder-30b-a3b")


def synthetic(profile, params, noise: float = 0.0, seed: int = 1) -> list[StepObservation]:
    model = StepTimeModel(profile, params)
    rng = np.random.default_rng(seed)
    comps = [StepComposition.decode_batch(d, 4200) for d in (1, 2, 4, 6, 8, 12)]
    for b in (2048, 4096, 8192, 16384):
        for d in (1, 4, 12):
            pos = 0
            for c in chunk_sizes(32768, b, d):
                comps.append(mixed_composition(c, pos, d, 4150))
                pos += c
    return [StepObservation(c, model(c) * (1 + noise * rng.standard_normal()), "decode" if c.uniform_decode
                            else "mixed") for c in comps]


def test_fit_recovers_the_parameters_that_made_the_step_times(base):
    truth = base.step_time.model_copy(update={"fixed_ms": 3.4, "eager_overhead_ms": 35.0,
                                              "attention_efficiency": 0.45, "bandwidth_efficiency": 0.8})
    obs = synthetic(base, truth)
    fit = fit_step_params(base, obs, ("fixed_ms", "eager_overhead_ms", "attention_efficiency", "bandwidth_efficiency"),
                          prior_weight=0.0)
    assert fit.success and fit.mape < 0.1
    for name in ("fixed_ms", "eager_overhead_ms", "attention_efficiency", "bandwidth_efficiency"):
        assert getattr(fit.params, name) == pytest.approx(getattr(truth, name), rel=0.02), name


def test_fit_with_noise_gets_close_and_reports_the_error(base):
    truth = base.step_time.model_copy(update={"eager_overhead_ms": 30.0, "attention_efficiency": 0.5})
    obs = synthetic(base, truth, noise=0.03)
    fit = fit_step_params(base, obs)
    assert 1.0 < fit.mape < 5.0  # the 3 % noise is what is left
    assert fit.params.attention_efficiency == pytest.approx(0.5, rel=0.1)
    assert set(fit.by_kind) == {"decode", "mixed"}


def test_unknown_parameter_is_refused(base):
    with pytest.raises(ValueError, match="cannot fit"):
        fit_step_params(base, synthetic(base, base.step_time), ("warp_factor",))


def test_observations_from_a_record():
    config = RecordConfig(decode_batch_size=4, new_prefill_tokens=8192, chunk_size=2048, model="m", gpu="H200")
    rep = RepRecord(
        rep=0,
        baseline=BaselineBlock(tpot_p50_ms=6.0, tpot_p90_ms=6.5, tpot_p99_ms=7.0, step_time_ms=6.0),
        interference=InterferenceBlock(
            tpot_during_prefill_p50_ms=50, tpot_during_prefill_p90_ms=60, tpot_after_prefill_p50_ms=6,
            num_chunks_actual=5, prefill_duration_ms=260, prefill_ttft_ms=260,
            chunk_step_times_ms=[46.0, 51.0, 57.0, 62.0, 9.5], chunk_tokens_engine_log=None),
        derived=DerivedBlock(tpot_penalty_p50_ms=44, tpot_penalty_ratio=7.3, total_interference_ms=200,
                             decode_tokens_delayed=20),
    )
    obs = observations_from_record(aggregate(config, [rep]))
    assert [o.kind for o in obs.observations] == ["decode"] + ["mixed"] * 5
    assert [o.seconds for o in obs.observations] == pytest.approx([0.006, 0.046, 0.051, 0.057, 0.062, 0.0095])
    mixed = [o.composition for o in obs.observations[1:]]
    assert [c.num_tokens for c in mixed] == [2048, 2048, 2048, 2048, 16 + 4]  # chunks 2044 x 4 + 16, + 4 decodes
    assert mixed[1].attention_pairs > mixed[0].attention_pairs  # the second chunk sits after the first
    assert mixed[-1].num_sampled == 5 and mixed[0].num_sampled == 4  # the last chunk samples the prefill's token
    assert obs.reps_used == 1 and obs.reps_mismatched == 0


def test_split_holdout_is_deterministic_and_disjoint():
    keys = [(b, d, p) for b in (2048, 8192) for d in (1, 4) for p in (512, 4096, 32768)]
    train, held = split_holdout(keys, 0.25)
    assert (train, held) == split_holdout(list(reversed(keys)), 0.25)
    assert not train & held and train | held == set(keys) and len(held) == 3
    assert split_holdout(keys, 0.0) == (set(keys), set())
    with pytest.raises(ValueError):
        split_holdout(keys, 1.0)
