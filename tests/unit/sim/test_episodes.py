"""The slow-host episodes in time (`sim.episodes`, `sim serve --host-speed switching`): their share and length, and the
engine's step-time model switching with them on its own clock (`engine.SwitchingSteps`, real step-time models)."""

from __future__ import annotations

import statistics

import pytest

from pdexporter.errors import ConfigError
from pdexporter.sim.engine import EngineConfig, EngineCore, ManualClock, SwitchingSteps
from pdexporter.sim.episodes import DWELL_S, HostEpisodes
from pdexporter.sim.profile import load_profile
from pdexporter.sim.serving import serve_embedded
from pdexporter.sim.steptime import StepComposition, StepTimeModel


def _episodes(ep: HostEpisodes, horizon: float, dt: float = 0.05) -> list[tuple[bool, float]]:
    """(slow, length) of each whole episode up to `horizon`, read through `slow_at` alone."""
    out, start, state = [], 0.0, ep.slow_at(0.0)
    for i in range(1, int(horizon / dt)):
        now = ep.slow_at(i * dt)
        if now != state:
            out.append((state, i * dt - start))
            start, state = i * dt, now
    return out[1:]  # the first one began before 0


def test_episodes_hold_their_share_and_last_seconds() -> None:
    ep = HostEpisodes(0.3, seed=7)
    runs = _episodes(ep, 20_000.0)
    slow = [length for is_slow, length in runs if is_slow]
    fast = [length for is_slow, length in runs if not is_slow]
    assert sum(slow) / (sum(slow) + sum(fast)) == pytest.approx(0.3, abs=0.03)
    assert statistics.fmean(slow) == pytest.approx(DWELL_S, rel=0.1)
    assert statistics.fmean(fast) == pytest.approx(DWELL_S * 0.7 / 0.3, rel=0.1)
    # a minute's share scatters as a measured one did (26-77 % on one H100): not the same every minute
    minutes = [statistics.fmean(ep.slow_at(m * 60 + s * 0.5) for s in range(120)) for m in range(60)]
    assert min(minutes) < 0.15 and max(minutes) > 0.45
    again = HostEpisodes(0.3, seed=7)
    assert [again.slow_at(t * 0.7) for t in range(500)] == [HostEpisodes(0.3, seed=7).slow_at(t * 0.7)
                                                             for t in range(500)]
    for bad in ((0.0, 2.0), (1.0, 2.0), (0.5, 0.0)):
        with pytest.raises(ValueError):
            HostEpisodes(*bad)


def test_the_steps_switch_with_the_episodes_on_the_engines_clock() -> None:
    """A one-chunk prefill beside four decodes costs the slow host's CPU time in a slow episode and the nominal one's
    otherwise; the GPU's time is the same in both (the slow host stretches CPU costs only)."""
    profile = load_profile("h200-qwen3-coder-30b-a3b")
    nominal, slow = (StepTimeModel(p, max_num_batched_tokens=8192) for p in (profile, profile.on_slow_host()))
    clock = ManualClock(100.0)  # the episodes count from the model's making, not the clock's origin
    ep = HostEpisodes(profile.host.slow_fraction, seed=3)
    model = SwitchingSteps(nominal, slow, ep, clock)
    comp = StepComposition.of([(1024, 0)] + [(1, 4096)] * 4)
    assert slow.cpu_s(comp) == pytest.approx(profile.host.slow_factor * nominal.cpu_s(comp), rel=1e-6)
    seen = set()
    for i in range(400):
        clock.advance_to(100.0 + i * 0.25)
        want = slow if ep.slow_at(i * 0.25) else nominal
        assert model.cpu_s(comp) == want.cpu_s(comp) and model.gpu_s(comp) == nominal.gpu_s(comp)
        seen.add(want is slow)
    assert seen == {True, False}
    # an engine given the episodes (what `sim serve --host-speed switching` builds) steps the same way
    clock = ManualClock(100.0)
    engine = EngineCore(profile, clock, config=EngineConfig.from_profile(profile, max_num_batched_tokens=8192),
                        host_episodes=HostEpisodes(profile.host.slow_fraction, seed=3))
    assert isinstance(engine.step_model, SwitchingSteps)
    for i in range(400):
        clock.advance_to(100.0 + i * 0.25)
        want = slow if ep.slow_at(i * 0.25) else nominal
        assert engine.step_model.cpu_s(comp) == want.cpu_s(comp)
    assert not isinstance(EngineCore(profile, clock).step_model, SwitchingSteps)


def test_switching_needs_a_profile_with_episodes() -> None:
    with pytest.raises(ConfigError, match=r"--host-speed switching: profile h200-llama-3.1-8b-instruct has no "
                                          r"slow-host episodes to switch to \(host.slow_fraction 0"):
        serve_embedded(log=print, default_profile="h200-llama-3.1-8b-instruct", host_speed="switching")
    with pytest.raises(ConfigError, match="expected nominal, slow, switching"):
        serve_embedded(log=print, default_profile="h200-qwen3-coder-30b-a3b", host_speed="fast")


def test_the_first_episode_is_slow_as_often_as_the_share_says() -> None:
    first = [HostEpisodes(0.25, seed=s).slow_at(0.0) for s in range(2000)]
    assert statistics.fmean(first) == pytest.approx(0.25, abs=0.03)
