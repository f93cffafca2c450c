"""The synthetic production load (`load.mix`): Poisson arrivals, the ShareGPT-like mix, reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from pdexporter.load.mix import SHAREGPT_LIKE, LoadSpec, schedule


def test_same_spec_same_schedule_other_seed_other_one() -> None:
    spec = LoadSpec(rate=2.0, duration_s=300, seed=7)
    assert schedule(spec) == schedule(spec)
    assert schedule(spec) != schedule(LoadSpec(rate=2.0, duration_s=300, seed=8))


def test_arrivals_are_poisson_at_the_rate() -> None:
    requests = schedule(LoadSpec(rate=3.0, duration_s=2000, seed=1))
    times = np.asarray([r.at_s for r in requests])
    assert np.all(np.diff(times) > 0) and times[-1] < 2000
    assert len(requests) == pytest.approx(6000, rel=0.05)
    gaps = np.diff(times)
    # exponential gaps of mean 1/3 s: Kolmogorov-Smirnov does not reject at 1 %
    from scipy import stats  # here, not at the top: 0.4 s of every test worker's collection

    assert stats.kstest(gaps, "expon", args=(0, 1 / 3.0)).pvalue > 0.01


def test_the_mix_reaches_every_prefill_size_of_the_seed_grid_within_its_bounds() -> None:
    requests = schedule(LoadSpec(rate=5.0, duration_s=2000, seed=2))
    share = {c.name: sum(r.component == c.name for r in requests) / len(requests) for c in SHAREGPT_LIKE}
    for c in SHAREGPT_LIKE:
        assert share[c.name] == pytest.approx(c.weight, abs=0.02)
        mine = [r for r in requests if r.component == c.name]
        assert all(c.prompt_min <= r.prompt_tokens <= c.prompt_max for r in mine)
        assert all(c.output_min <= r.max_tokens <= c.output_max for r in mine)
        assert np.median([r.prompt_tokens for r in mine]) == pytest.approx(c.prompt_median, rel=0.1)
    prompts = np.asarray([r.prompt_tokens for r in requests])
    for p in (512, 1024, 2048, 4096, 8192, 16384, 32768):  # every seed P has traffic within a factor sqrt(2)
        assert ((prompts >= p / 2**0.5) & (prompts < p * 2**0.5)).sum() > 20, p


@pytest.mark.parametrize("rate, duration", [(0, 10), (-1, 10), (1, 0), (float("nan"), 10)])
def test_bad_specs_are_refused(rate: float, duration: float) -> None:
    with pytest.raises(ValueError):
        LoadSpec(rate=rate, duration_s=duration)


@pytest.mark.parametrize("rate, duration", [(1e308, 1), (2000, 3600)])
def test_a_plan_of_more_requests_than_a_run_holds_is_refused_at_once(rate: float, duration: float) -> None:
    """Issue 31: `load --rate 1e308 --duration 1s` planned its schedule for ever, silently."""
    with pytest.raises(ValueError, match="at most 1,000,000 in one run"):
        LoadSpec(rate=rate, duration_s=duration)


def test_the_documents_heavy_mix_draws_its_own_weights_and_longer_prompts() -> None:
    from pdexporter.load.mix import DOCUMENTS_HEAVY, MIXES

    assert MIXES["sharegpt-like"] is SHAREGPT_LIKE and MIXES["documents-heavy"] is DOCUMENTS_HEAVY
    heavy = schedule(LoadSpec(rate=5.0, duration_s=2000, seed=2, mix=DOCUMENTS_HEAVY))
    light = schedule(LoadSpec(rate=5.0, duration_s=2000, seed=2))
    share = {c.name: sum(r.component == c.name for r in heavy) / len(heavy) for c in DOCUMENTS_HEAVY}
    for c in DOCUMENTS_HEAVY:
        assert share[c.name] == pytest.approx(c.weight, abs=0.02)
    assert np.median([r.prompt_tokens for r in heavy]) > 1.5 * np.median([r.prompt_tokens for r in light])


def test_load_refuses_an_unknown_mix_naming_it() -> None:
    from typer.testing import CliRunner

    from pdexporter.cli import app

    result = CliRunner().invoke(app, ["load", "--target", "http://127.0.0.1:9", "--mix", "poetry", "--duration", "1s"])
    assert result.exit_code != 0  # main() prints a ConfigError as its one line and exits 2
    assert "--mix 'poetry'" in str(result.exception) and "documents-heavy" in str(result.exception)
