"""Fitting the GPU's step-time parameters (stage 1): recovers known parameters from step times they
generated; observations taken from a record the way calibrate reads the H200 sweep."""

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
    HoldoutReport,
    PointError,
    StepObservation,
    chunk_sizes,
    fit_step_params,
    mixed_composition,
    observations_from_record,
    split_holdout,
    with_values,
)
from pdexporter.sim.profile import load_profile
from pdexporter.sim.steptime import StepComposition, StepTimeModel


@pytest.fixture(scope="module")
def base():
    return load_profile("h200-qwen3-coder-30b-a3b")


def synthetic(profile, params, noise: float = 0.0, seed: int = 1) -> list[StepObservation]:
    """Decode steps and the middle chunks of 32K prefills, timed by the model (max of GPU, next CPU)."""
    model = StepTimeModel(profile, params)
    rng = np.random.default_rng(seed)
    obs = [StepObservation(c, 0.0, "decode") for c in (StepComposition.decode_batch(d, 4200) for d in (1, 2, 4, 6, 8, 12))]
    for b in (2048, 4096, 8192, 16384):
        for d in (1, 4, 12):
            chunks = chunk_sizes(32768, b, d)
            starts = np.cumsum([0, *chunks])
            comps = [mixed_composition(c, int(s), d, 4150) for c, s in zip(chunks, starts)]
            obs += [StepObservation(comps[k], 0.0, "mixed", next_composition=comps[k + 1])
                    for k in range(1, len(chunks) - 1)]
    return [StepObservation(o.composition, o.model_s(model) * (1 + noise * rng.standard_normal()), o.kind,
                            next_composition=o.next_composition) for o in obs]


GPU = ("fixed_ms", "moe_efficiency", "attention_efficiency", "bandwidth_efficiency")


def test_fit_recovers_the_parameters_that_made_the_step_times(base):
    truth = base.step_time.model_copy(update={"fixed_ms": 3.4, "moe_efficiency": 0.35,
                                              "attention_efficiency": 0.45, "bandwidth_efficiency": 0.8})
    obs = synthetic(base, truth)
    fit = fit_step_params(base, obs, GPU, prior_weight=0.0, robust=False)
    assert fit.success and fit.mape < 0.1
    for name in GPU:
        assert getattr(fit.params, name) == pytest.approx(getattr(truth, name), rel=0.02), name


def test_fit_with_noise_gets_close_and_reports_the_error(base):
    truth = base.step_time.model_copy(update={"moe_efficiency": 0.4, "attention_efficiency": 0.5})
    obs = synthetic(base, truth, noise=0.03)
    fit = fit_step_params(base, obs)
    assert 1.0 < fit.mape < 5.0  # the 3 % noise is what is left
    assert fit.params.attention_efficiency == pytest.approx(0.5, rel=0.1)
    assert set(fit.by_kind) == {"decode", "mixed"}


def test_cpu_bound_steps_say_nothing_about_the_gpu(base):
    """A chunk whose next launch takes longer than its GPU work is timed by the CPU: the fit must
    not bend the GPU parameters to it."""
    slow_launch = base.step_time.model_copy(update={"launch_eager_ms": 400.0})
    obs = synthetic(base, slow_launch)
    assert all(o.seconds == pytest.approx(0.4 + o.next_composition.num_tokens * slow_launch.cpu_us_per_token / 1e6)
               for o in obs if o.kind == "mixed" and o.next_composition.num_tokens > 512 and o.seconds < 0.45)
    fit = fit_step_params(base.model_copy(update={"step_time": slow_launch}), obs, GPU, prior_weight=0.0)
    assert fit.mape < 0.5


def test_unknown_parameter_is_refused(base):
    with pytest.raises(ValueError, match="cannot fit"):
        fit_step_params(base, synthetic(base, base.step_time), ("warp_factor",))
    with pytest.raises(ValueError, match="cannot fit"):  # a CPU cost is stage 2's (by simulation)
        fit_step_params(base, synthetic(base, base.step_time), ("launch_eager_ms",))


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
    # the decode step, and the middle chunks only: the first overlaps the launch stall before it,
    # the last carries the request's retirement (stage 2 fits both through the timeline)
    assert [o.kind for o in obs.observations] == ["decode"] + ["mixed"] * 3
    assert [o.seconds for o in obs.observations] == pytest.approx([0.006, 0.051, 0.057, 0.062])
    mixed = [o.composition for o in obs.observations[1:]]
    assert [c.num_tokens for c in mixed] == [2048, 2048, 2048]  # chunks 2-4 of 2044 x 4 + 16, + 4 decodes
    assert mixed[1].attention_pairs > mixed[0].attention_pairs  # the third chunk sits after the second
    nxt = [o.next_composition for o in obs.observations[1:]]
    assert [c.num_tokens for c in nxt] == [2048, 2048, 16 + 4]  # the step launched while each one runs
    assert nxt[-1].num_sampled == 5 and mixed[0].num_sampled == 4  # the last chunk samples the prefill's token
    assert obs.reps_used == 1 and obs.reps_mismatched == 0


def test_split_holdout_is_deterministic_and_disjoint():
    keys = [(b, d, p) for b in (2048, 8192) for d in (1, 4) for p in (512, 4096, 32768)]
    train, held = split_holdout(keys, 0.25)
    assert (train, held) == split_holdout(list(reversed(keys)), 0.25)
    assert not train & held and train | held == set(keys) and len(held) == 3
    assert split_holdout(keys, 0.0) == (set(keys), set())
    with pytest.raises(ValueError):
        split_holdout(keys, 1.0)


def test_with_values_sets_step_time_and_engine_loop_fields(base):
    prof = with_values(base, {"attention_efficiency": 0.33, "retire_us_per_token": 1.25})
    assert prof.step_time.attention_efficiency == 0.33 and prof.engine_loop.retire_us_per_token == 1.25
    assert prof.step_time.fixed_ms == base.step_time.fixed_ms


def test_holdout_table_is_per_chunk_size_and_overall():
    report = HoldoutReport(prefill_duration=[PointError((2048, 1, 512), 100.0, 110.0),
                                             PointError((8192, 1, 512), 100.0, 96.0)])
    table = report.table()
    assert table["prefill_duration"] == {"2048": pytest.approx(10.0), "8192": pytest.approx(4.0),
                                         "all": pytest.approx(7.0)}
    assert table["during_tpot"]["all"] is None
