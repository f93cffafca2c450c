"""Cost models: recovery of known coefficients, honest held-out scores, the choice between them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdexporter.analysis import models as md
from pdexporter.analysis.synthetic import SyntheticTruth, seed_grid, synthetic_records, true_aggregate_ms
from pdexporter.analysis.table import build_table, samples_from_record
from pdexporter.engines import adapter

SMALL_GRID = list(seed_grid(chunks=(2048, 8192), decodes=(0, 1, 4, 12), prefills=(1024, 4096, 16384, 32768)))


def _fit_input(truth: SyntheticTruth, grid=SMALL_GRID, reps: int = 2, strip_steps: bool = False):
    records = synthetic_records(truth, grid, reps=reps)
    if strip_steps:
        for r in records:
            for rep in r.reps:
                rep.interference.chunk_step_times_ms = []
            r.interference.chunk_step_times_ms = []
    samples = [samples_from_record(r) for r in records]
    table = build_table(samples)
    return table, samples, md.fit_data(table, samples)


NOISELESS = SyntheticTruth(step_noise=0.0, rep_noise=0.0, client_jitter_ms=0.0)


@pytest.fixture(scope="module")
def noiseless():
    return _fit_input(NOISELESS)


def test_context_model_recovers_known_coefficients_exactly_without_noise(noiseless):
    _, _, data = noiseless
    model = md.fit_context_model(data)
    assert model.n_step_rows > 0 and model.n_point_rows == 0  # fitted on the mixed steps themselves
    assert model.alpha0_ms == pytest.approx(NOISELESS.alpha0_ms, rel=1e-3)
    assert model.alpha1_ms_per_decode == pytest.approx(NOISELESS.alpha1_ms_per_decode, rel=1e-3)
    assert model.gamma_ms_per_token == pytest.approx(NOISELESS.gamma_ms_per_token, rel=1e-3)
    assert model.beta_ms_per_token_pair == pytest.approx(NOISELESS.beta_ms_per_token_pair, rel=1e-3)


def test_context_model_recovers_coefficients_from_totals_alone():
    # Records without per-step times (e.g. the Prometheus path): the per-point rows carry the fit.
    _, _, data = _fit_input(NOISELESS, strip_steps=True)
    model = md.fit_context_model(data)
    assert model.n_step_rows == 0 and model.n_point_rows == len(data)
    assert model.gamma_ms_per_token == pytest.approx(NOISELESS.gamma_ms_per_token, rel=0.02)
    assert model.beta_ms_per_token_pair == pytest.approx(NOISELESS.beta_ms_per_token_pair, rel=0.02)
    assert model.alpha0_ms == pytest.approx(NOISELESS.alpha0_ms, rel=0.05)


def test_context_model_recovers_coefficients_within_their_error_bars_with_noise():
    truth = SyntheticTruth(step_noise=0.01, rep_noise=0.03)
    _, _, data = _fit_input(truth, grid=list(seed_grid()), reps=5)
    model = md.fit_context_model(data)
    for fitted, se, true in zip(model.values, model.stderr, (truth.alpha0_ms, truth.alpha1_ms_per_decode,
                                                             truth.gamma_ms_per_token, truth.beta_ms_per_token_pair)):
        assert se is not None and se > 0
        assert abs(fitted - true) < 5 * se, (fitted, true, se)
    assert model.beta_ms_per_token_pair == pytest.approx(truth.beta_ms_per_token_pair, rel=0.05)


def test_predictions_match_the_true_cost(noiseless):
    _, _, data = noiseless
    model = md.fit_context_model(data)
    for b, d, p in [(2048, 4, 32768), (8192, 12, 1024), (4096, 6, 10000)]:  # (4096, 6, 10000) never seen
        assert float(model.predict(d, p, b)) == pytest.approx(true_aggregate_ms(NOISELESS, b, d, p), rel=0.01)


def test_a_graph_step_that_admits_the_request_is_told_from_a_tail():
    """Small prompts that fit a CUDA graph pay a fixed graph0 in their one step (on the H200 a 64-
    to 384-token prompt cost each decode ~9 ms whatever its length), a graph tail after eager chunks
    pays none: the fit separates the two, and kappa alone (no graph0) could not reach both."""
    truth = SyntheticTruth(step_noise=0.0, rep_noise=0.0, client_jitter_ms=0.0, graph0_ms=6.0,
                           kappa_graph_ms_per_token=0.01)
    grid = [*SMALL_GRID, *((8192, d, p) for d in (1, 4, 12) for p in (64, 128, 256, 384))]
    _, _, data = _fit_input(truth, grid=grid)
    model = md.fit_context_model(data)
    assert model.graph0_ms == pytest.approx(6.0, rel=0.02)
    assert model.kappa_graph_ms_per_token == pytest.approx(0.01, rel=0.05)
    for b, d, p in [(8192, 4, 64), (8192, 12, 384), (2048, 4, 4096)]:  # whole-graph prompts, a graph tail
        assert float(model.predict(d, p, b)) == pytest.approx(true_aggregate_ms(truth, b, d, p), rel=0.02)


def test_seed_model_recovers_a_known_per_chunk_penalty_table():
    # Data made by the seed's own model: C = n * D * pi(D, B) with an arbitrary pi table.
    pi = {(2048, 1): 11.0, (2048, 4): 9.0, (2048, 12): 30.0, (8192, 1): 40.0, (8192, 4): 44.0, (8192, 12): 25.0}
    rows = [(b, d, p) for (b, d) in pi for p in (1024, 4096, 16384, 32768)]
    b, d, p = (np.array(x, dtype=float) for x in zip(*rows))
    n = md.num_chunks(p, b, d)
    total = n * np.array([pi[(int(bi), int(di))] for bi, di in zip(b, d)])
    data = md.FitData(b, d, p, total * d, total, tuple(() for _ in rows))
    model = md.fit_seed_model(data)
    for (bb, dd), value in pi.items():
        assert model.penalty_per_chunk_ms(dd, bb) == pytest.approx(value)
    # between fitted D values: linear; beyond them: clamped; unseen chunk size: nearest in log2
    assert model.penalty_per_chunk_ms(2, 2048) == pytest.approx(11.0 + (9.0 - 11.0) / 3)
    assert model.penalty_per_chunk_ms(20, 8192) == pytest.approx(25.0)
    assert model.penalty_per_chunk_ms(4, 3000) == pytest.approx(9.0)
    assert model.penalty_per_chunk_ms(4, 6000) == pytest.approx(44.0)
    report = md.fit_models(data)
    assert report.chosen == md.SEED_MODEL  # a non-linear-in-D table is the seed model's home ground
    assert report.held_out_r2(md.SEED_MODEL) == pytest.approx(1.0)


def test_cross_validation_never_trains_on_held_out_points(noiseless):
    _, _, data = noiseless
    seen: list[set[tuple[float, float, float]]] = []

    def spy(train: md.FitData):
        seen.append(set(zip(train.chunk_size, train.decode, train.prefill)))
        return md.fit_context_model(train)

    for scheme in (md.LEAVE_P_OUT, md.KFOLD):
        seen.clear()
        folds = md.folds_for(data, scheme)
        result = md.cross_validate(spy, data, scheme)
        assert len(seen) == len(folds)
        for trained, held in zip(seen, folds):
            held_keys = set(zip(data.chunk_size[held], data.decode[held], data.prefill[held]))
            assert not trained & held_keys
        covered = np.sort(np.concatenate(folds))
        assert np.array_equal(covered, np.arange(len(data)))  # every point predicted exactly once
        assert np.isfinite(result.predictions).all()


def test_held_out_r2_is_honest_for_the_seed_model_on_context_data():
    truth = SyntheticTruth(step_noise=0.01, rep_noise=0.03)
    _, _, data = _fit_input(truth, reps=3)
    report = md.fit_models(data)
    assert report.primary_scheme == md.LEAVE_P_OUT
    seed = report.fits[md.SEED_MODEL]
    # A constant penalty per chunk cannot extrapolate to an unseen (longer) prompt.
    assert seed.held_out[md.LEAVE_P_OUT].r2 < seed.in_sample_r2
    assert report.chosen == md.CONTEXT_MODEL
    assert report.held_out_r2() > 0.99
    assert "higher held-out R^2" in report.reason
    doc = report.to_dict()
    units = {c["name"]: c["unit"] for c in doc["models"][md.CONTEXT_MODEL]["coefficients_detail"]}
    assert units["beta_ms_per_token_pair"] == "ms per query-context token pair"


def test_r_squared():
    y = np.array([1.0, 2.0, 3.0, 4.0])
    assert md.r_squared(y, y) == 1.0
    assert md.r_squared(y, np.full(4, y.mean())) == 0.0
    assert md.r_squared(np.array([1.0]), np.array([1.0])) is None


def test_only_one_decode_value_leaves_alpha1_out():
    grid = list(seed_grid(chunks=(2048, 8192), decodes=(4,), prefills=(1024, 4096, 16384, 32768)))
    _, _, data = _fit_input(NOISELESS, grid=grid)
    model = md.fit_context_model(data)
    assert model.alpha1_ms_per_decode == 0.0 and model.stderr[1] is None
    assert model.beta_ms_per_token_pair == pytest.approx(NOISELESS.beta_ms_per_token_pair, rel=1e-3)


@settings(deadline=None)  # a chunk schedule of 300K tokens at B = 2 takes a while beside 8 workers
@given(p=st.integers(1, 300_000), b=st.integers(2, 40_000), d=st.integers(0, 64))
def test_chunks_cover_the_prompt_and_attention_pairs_telescope(p, b, d):
    if d >= b:
        return
    chunks = md.chunk_schedule(p, b, d)
    assert sum(chunks) == p
    assert len(chunks) == len(adapter('vllm').chunk_schedule(p, b, d)) == int(md.num_chunks(p, b, d))
    assert all(0 < c <= b - d for c in chunks)
    prefix = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    pairs = float(np.sum(md.attention_pairs(chunks, prefix)))
    assert math.isclose(pairs, p * (p + 1) / 2, rel_tol=1e-12)


def test_a_few_wild_steps_do_not_tilt_the_context_fit():
    # 3 % of the mixed steps hit by a 200 ms hiccup (a GC pause, another tenant): a least-squares fit
    # would drag alpha0 up by several ms; the Huber fit gives those rows little weight.
    _, _, clean = _fit_input(NOISELESS)
    rng = np.random.default_rng(3)
    steps = []
    hit = 0
    for point in clean.steps:
        reps = []
        for base, times in point:
            times = list(times)
            for k in range(len(times)):
                if rng.random() < 0.03:
                    times[k] += 200.0
                    hit += 1
            reps.append((base, tuple(times)))
        steps.append(tuple(reps))
    assert hit > 0
    dirty = md.FitData(clean.chunk_size, clean.decode, clean.prefill, clean.cost_ms, clean.total_ms, tuple(steps))
    model = md.fit_context_model(dirty)
    assert model.n_downweighted >= hit
    assert model.alpha0_ms == pytest.approx(NOISELESS.alpha0_ms, rel=0.02)
    assert model.gamma_ms_per_token == pytest.approx(NOISELESS.gamma_ms_per_token, rel=0.02)
    assert model.beta_ms_per_token_pair == pytest.approx(NOISELESS.beta_ms_per_token_pair, rel=0.02)


def _with_stall(samples, stall):
    """The samples with `stall(P)` ms per decode stream added outside the chunk steps (as the engine's
    admission and retirement add it to a window's total, not to its chunk steps)."""
    from dataclasses import replace

    out = []
    for s in samples:
        if s.decode_batch_size < 1:
            out.append(s)
            continue
        extra = stall(s.new_prefill_tokens)
        reps = tuple({**r, "total_interference_ms": r["total_interference_ms"] + extra,
                      "aggregate_interference_ms": (r["total_interference_ms"] + extra) * s.decode_batch_size}
                     for r in s.reps)
        out.append(replace(s, reps=reps, top_level=None))
    return out


STALL_GRID = [(32768, d, p) for d in (0, 1, 4, 12) for p in (1024, 2048, 4096, 8192, 16384, 30000)]  # one chunk each


def test_a_stall_that_stops_growing_with_the_prompt_is_fitted_saturated(monkeypatch):
    """On the H200 what a window loses outside its chunk steps grows to ~40 ms by P ~ 8K and no
    further (the engine's step log): the stall fit finds where it saturates, and predicts the
    longest prompt within 1 %, where a stall linear in P misses by more."""
    records = synthetic_records(NOISELESS, STALL_GRID, reps=2)
    samples = _with_stall([samples_from_record(r) for r in records], lambda p: 40.0 * min(p, 8192) / 8192)
    data = md.fit_data(build_table(samples), samples)
    model = md.fit_context_model(data)
    assert model.sigma_saturation_tokens == 8192
    assert model.sigma1_ms_per_token * 8192 == pytest.approx(40.0, rel=0.02)  # what it grows by, up to P_sat
    assert model.to_dict()["coefficients"]["sigma_saturation_tokens"] == 8192

    def truth(d: int, p: int) -> float:
        return true_aggregate_ms(NOISELESS, 32768, d, p) + d * 40.0 * min(p, 8192) / 8192

    for d, p in ((4, 30000), (12, 24576), (1, 2048)):
        assert float(model.predict(d, p, 32768)) == pytest.approx(truth(d, p), rel=0.01)
    monkeypatch.setattr(md, "STALL_SATURATION_TOKENS", (None,))
    linear = md.fit_context_model(md.fit_data(build_table(samples), samples))
    assert linear.sigma_saturation_tokens is None and "sigma_saturation_tokens" not in linear.to_dict()["coefficients"]
    assert abs(float(linear.predict(4, 30000, 32768)) / truth(4, 30000) - 1) > 0.01


def test_a_stall_linear_in_the_prompt_stays_linear():
    records = synthetic_records(NOISELESS, STALL_GRID, reps=2)
    samples = _with_stall([samples_from_record(r) for r in records], lambda p: 2.0 + 0.002 * p)
    model = md.fit_context_model(md.fit_data(build_table(samples), samples))
    assert model.sigma_saturation_tokens is None
    assert model.sigma1_ms_per_token == pytest.approx(0.002, rel=0.05)


def test_a_stall_that_starts_growing_late_is_fitted_with_its_onset(monkeypatch):
    """The passive events' residual is flat up to ~2K tokens and steep after it (the engine's step log:
    -2..-6 ms up to ~2,500 tokens, +8..+15 at 3-4K): the stall fit finds the onset with the saturation,
    and predicts the short prompts within 1 %, where a stall growing from P = 0 misses them."""
    records = synthetic_records(NOISELESS, STALL_GRID, reps=2)

    def stall(p: int) -> float:
        return 30.0 * min(max(p - 2048, 0), 8192 - 2048) / (8192 - 2048)

    samples = _with_stall([samples_from_record(r) for r in records], stall)
    model = md.fit_context_model(md.fit_data(build_table(samples), samples))
    assert (model.sigma_onset_tokens, model.sigma_saturation_tokens) == (2048, 8192)
    assert model.to_dict()["coefficients"]["sigma_onset_tokens"] == 2048
    for d, p in ((4, 1024), (12, 2048), (4, 4096), (1, 30000)):
        truth = true_aggregate_ms(NOISELESS, 32768, d, p) + d * stall(p)
        assert float(model.predict(d, p, 32768)) == pytest.approx(truth, rel=0.01)
    monkeypatch.setattr(md, "STALL_ONSET_TOKENS", (0.0,))
    from_zero = md.fit_context_model(md.fit_data(build_table(samples), samples))
    assert "sigma_onset_tokens" not in from_zero.to_dict()["coefficients"]
    worst = max(abs(float(from_zero.predict(d, p, 32768)) / (true_aggregate_ms(NOISELESS, 32768, d, p) + d * stall(p))
                    - 1) for d, p in ((4, 1024), (12, 2048), (4, 4096)))
    assert worst > 0.01


def test_one_reading_events_do_not_pull_the_stall_low():
    """A passive event is one noisy reading. Weighted by its measured total, the stall fit would favour the
    events that happened to read low (on this grid it sat ~12 % below the truth); weighted by the total its
    chunk steps predict, symmetric noise leaves it where it is."""
    from dataclasses import replace

    grid = [(32768, d, p) for d in (0, 1, 4, 12) for p in (512, 1024, 2048, 4096, 8192)]
    rng = np.random.default_rng(1)
    samples = []
    for record in synthetic_records(NOISELESS, grid, reps=1):
        sample = samples_from_record(record)
        if sample.decode_batch_size < 1:
            samples.append(sample)
            continue
        for _ in range(8):  # eight one-reading events a cell, 20 ms of stall each, read +-15 ms
            total = sample.reps[0]["total_interference_ms"] + 20.0 + float(rng.choice([-15.0, 15.0]))
            rep = {**sample.reps[0], "total_interference_ms": total,
                   "aggregate_interference_ms": total * sample.decode_batch_size}
            samples.append(replace(sample, reps=(rep,), top_level=None))
    model = md.fit_context_model(md.fit_data(build_table(samples), samples))
    for d, p in ((1, 512), (4, 512), (12, 1024), (4, 2048), (1, 8192)):
        truth = true_aggregate_ms(NOISELESS, 32768, d, p) + d * 20.0
        assert float(model.predict(d, p, 32768)) == pytest.approx(truth, rel=0.05)


def test_the_robust_fits_median_is_numpys_to_the_bit() -> None:
    """huber_nnls takes its scale from `models._median` (np.median without its per-call overhead, two a round):
    the same value to the bit for odd and even lengths, ties, infinities and NaN, so no fit moves."""
    rng = np.random.default_rng(7)
    cases = [rng.standard_normal(n) * scale for n in (1, 2, 3, 4, 9, 10, 101, 500) for scale in (1e-6, 1.0, 3e4)]
    cases += [np.array([2.0, 2.0, 1.0, 3.0]), np.array([np.inf, 1.0, 2.0]), np.array([1.0, -np.inf, 5.0, 0.5])]
    for a in cases:
        assert md._median(a) == float(np.median(a)), a
    assert np.isnan(md._median(np.array([1.0, np.nan, 2.0])))
