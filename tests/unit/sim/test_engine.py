"""The engine core on a manual clock: async timing, metrics under vLLM's names, the iteration log."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pdexporter.client.iterlog import summarise_chunks
from pdexporter.client.metrics import parse_exposition
from pdexporter.engines import adapter
from pdexporter.sim.engine import NO_LOOP_COSTS, EngineConfig, EngineCore, ManualClock
from pdexporter.sim.profile import load_profile
from pdexporter.sim.server import cache_config_labels
from pdexporter.sim.vllm_metrics import VllmMetrics

PREFIX = tuple(range(2000, 2000 + 4096))
STEP = 0.010  # a constant step time makes the timeline easy to reason about


def cold(n: int, base: int = 50_000) -> tuple[int, ...]:
    return tuple(base + (i * 7919) % 90_000 for i in range(n))


@pytest.fixture
def profile():
    return load_profile("h200-qwen3-coder-30b-a3b")


def make(profile, b: int = 2048, step=lambda comp: STEP, log=None, loop_costs=NO_LOOP_COSTS):
    """A constant GPU step and no CPU or per-request costs, unless told: the scheduling alone."""
    clock = ManualClock()
    metrics = VllmMetrics(profile.model.name, cache_config=cache_config_labels(profile))
    engine = EngineCore(profile, clock, config=EngineConfig.from_profile(profile, max_num_batched_tokens=b),
                        step_model=step, loop_costs=loop_costs, metrics=metrics, log=log)
    return clock, engine, metrics


def test_a_request_arriving_during_step_n_is_first_scheduled_in_step_n_plus_2(profile):
    clock, engine, _ = make(profile)
    times: dict[str, list[float]] = {}
    for i in range(2):
        engine.add_request(f"d{i}", cold(16, 100 * i), 1000, lambda o, t: times.setdefault(o.request_id, []).append(t))
    clock.advance_to(0.105)  # step 11 (0.100-0.110) is running; step 12 is already scheduled
    running_step = len(engine.history) + 1
    engine.add_request("late", cold(100), 1, lambda o, t: times.setdefault(o.request_id, []).append(t))
    clock.advance_to(0.200)
    first_with_late = next(s for s in engine.history if s.context_tokens == 100)
    assert first_with_late.step_id == running_step + 2
    # scheduled at the end of step N (0.110), run as step N+2 (0.120-0.130), token out at its end
    assert times["late"] == [pytest.approx(0.130)]
    # decode tokens come out at every step end, exactly
    gaps = {round(b - a, 9) for a, b in zip(times["d0"][1:], times["d0"][2:])}
    assert gaps == {STEP}


def test_idle_engine_schedules_a_new_request_at_once(profile):
    clock, engine, _ = make(profile)
    out: list[float] = []
    clock.advance_to(5.0)
    engine.add_request("r", cold(10), 2, lambda o, t: out.append(t))
    clock.run()
    assert out == [pytest.approx(5.0 + STEP), pytest.approx(5.0 + 2 * STEP)]
    assert engine.idle


def test_steps_chain_on_absolute_deadlines(profile):
    """Start = max(schedule time, previous end): a slow callback does not delay later steps."""
    clock, engine, _ = make(profile)
    ends: list[float] = []
    engine.add_request("r", cold(10), 50, lambda o, t: ends.append(t))
    clock.run()
    starts = [s.t_start for s in engine.history]
    finishes = [s.t_end for s in engine.history]
    assert starts[1:] == pytest.approx(finishes[:-1])
    assert finishes[-1] == pytest.approx(50 * STEP)


def served_three_on_a_warm_prefix(profile):
    """The engine's metrics after a prefix warm-up and three 20-token requests on that prefix."""
    clock, engine, metrics = make(profile)
    engine.add_request("warm", PREFIX, 1)
    clock.run()
    for i in range(3):
        engine.add_request(f"p{i}", PREFIX, 20)
    clock.run()
    return metrics


def test_metrics_use_vllm_022_names_types_and_labels(profile, vllm_metrics_text: str):
    metrics = served_three_on_a_warm_prefix(profile)
    ours = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
    real = {f.name: f for f in text_string_to_metric_families(vllm_metrics_text)}
    wanted = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_queries",
              "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:request_success",
              "vllm:iteration_tokens_total", "vllm:inter_token_latency_seconds",
              "vllm:time_to_first_token_seconds", "vllm:request_prefill_time_seconds",
              "vllm:request_decode_time_seconds", "vllm:request_queue_time_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:cache_config_info"]
    for name in wanted:
        assert name in ours, name
        assert ours[name].type == real[name].type, name
        assert ours[name].documentation == real[name].documentation, name
        our_labels = {tuple(sorted(k for k in s.labels if k != "le")) for s in ours[name].samples}
        real_labels = {tuple(sorted(k for k in s.labels if k != "le")) for s in real[name].samples}
        assert our_labels == real_labels, name
        our_le = [s.labels["le"] for s in ours[name].samples if "le" in s.labels]
        real_le = [s.labels["le"] for s in real[name].samples if "le" in s.labels]
        assert our_le[: len(set(real_le))] == real_le[: len(set(real_le))], name


def test_metric_values_follow_vllm_accounting(profile):
    metrics = served_three_on_a_warm_prefix(profile)
    snap = parse_exposition(generate_latest(metrics.registry).decode(), adapter("pdexporter-sim"))
    assert snap.model_names == (profile.model.name,)
    assert snap.get("prompt_tokens_total") == 4 * 4096  # whole prompts, cached tokens included
    assert snap.get("generation_tokens_total") == 1 + 3 * 20
    assert snap.get("prefix_cache_queries_total") == 4 * 4096
    assert snap.get("prefix_cache_hits_total") == 3 * 4080
    assert snap.get("request_success_total") == 4
    assert snap.get("inter_token_latency_seconds_count") == 3 * 19
    assert snap.get("time_to_first_token_seconds_count") == 4
    assert snap.get("num_requests_running") == 0 and snap.get("kv_cache_usage_perc") == 0.0
    assert snap.get("num_preemptions_total") == 0
    assert set(snap.missing) == set()


def test_iteration_log_lines_parse_and_give_the_chunks(profile):
    lines: list[str] = []
    clock, engine, _ = make(profile, b=2048, log=lines.append)
    for i in range(4):
        engine.add_request(f"d{i}", cold(16, 300 * i), 400)
    clock.advance_to(0.2)
    mark = len(lines)
    engine.add_request("prefill", cold(8192), 1)
    clock.advance_to(1.0)
    assert all(line.startswith("(EngineCore_DP0 pid=") and " INFO " in line and "[core.py:" in line
               for line in lines)
    steps = adapter("pdexporter-sim").parse_step_log(lines[mark:])
    chunks = summarise_chunks(steps)
    assert chunks.chunk_tokens == (2044, 2044, 2044, 2044, 16)
    assert set(chunks.decode_requests_beside) == {4}
    assert [s.to_iteration_step() for s in engine.history.since(len(engine.history) - len(steps))] == steps


def test_abort_frees_the_request_and_counts_it(profile):
    clock, engine, metrics = make(profile)
    got: list[str] = []
    engine.add_request("a", cold(100), 1000, lambda o, t: got.append(o.request_id))
    clock.advance_to(0.05)
    assert engine.abort_request("a")
    assert not engine.abort_request("a")
    clock.run()
    assert engine.idle and engine.scheduler.kv.usage == 0.0
    snap = parse_exposition(generate_latest(metrics.registry).decode(), adapter("pdexporter-sim"))
    assert snap.get("request_success_total") == 1  # finished_reason="abort"
    n = len(got)
    clock.advance_to(10)
    assert len(got) == n


def test_preemptions_reach_the_metric(profile):
    small = profile.model_copy(update={"engine": profile.engine.model_copy(update={"kv_capacity_tokens": 160})})
    clock, engine, metrics = make(small, b=512)
    engine.add_request("r1", cold(64, 1), 40)
    engine.add_request("r2", cold(64, 2), 40)
    clock.run()
    snap = parse_exposition(generate_latest(metrics.registry).decode(), adapter("pdexporter-sim"))
    assert snap.get("num_preemptions_total") >= 1
    assert snap.get("generation_tokens_total") == 80


# -- the CPU / GPU timeline and the per-request costs (vLLM 0.22's busy loop, docs/sim.md) ---------

class Timing:
    """A test double step-time model: fixed GPU and CPU seconds, the CPU long for a step with a
    prefill chunk (a launch without CUDA graphs), nothing for a decode batch (a graph replay)."""

    def __init__(self, gpu: float = STEP, chunk_gpu: float = 0.030, chunk_cpu: float = 0.050) -> None:
        self.gpu, self.chunk_gpu, self.chunk_cpu = gpu, chunk_gpu, chunk_cpu

    def gpu_s(self, comp) -> float:
        return self.chunk_gpu if comp.max_query_len >= 64 else self.gpu

    def cpu_s(self, comp) -> float:
        return self.chunk_cpu if comp.max_query_len >= 64 else 0.0


_PREFILL_100 = cold(100)


def _run_probe_and_prefill(profile, timing, loop_costs=NO_LOOP_COSTS, prefill=_PREFILL_100):
    clock, engine, _ = make(profile, step=timing, loop_costs=loop_costs)
    probe: list[float] = []
    first: list[float] = []
    engine.add_request("probe", cold(16, 7), 1000, lambda o, t: probe.extend([t] * len(o.new_token_ids)))
    clock.advance_to(0.105)
    engine.add_request("prefill", prefill, 1, lambda o, t: first.append(t))
    clock.advance_to(0.5)
    gaps = [round(b - a, 6) for a, b in zip(probe, probe[1:])]
    return engine, probe, gaps, first[0]


def test_a_long_launch_holds_back_the_output_of_the_step_before_it(profile):
    """The chunk's step is launched (50 ms of CPU) while the decode step before it runs; that
    step's tokens leave when the launch is done, the chunk's own 30 ms overlap the launch."""
    engine, probe, gaps, t_first = _run_probe_and_prefill(profile, Timing())
    chunk = next(s for s in engine.history if s.context_tokens == 100)
    # launched at 0.110 (after step 11's output) for 50 ms; on the GPU after step 12, from 0.120:
    # its 30 ms of GPU work cannot end before its last kernel is launched, at 0.160
    assert (chunk.t_start, chunk.t_end) == (pytest.approx(0.120), pytest.approx(0.160))
    # decode steps, then step 12 held back to the launch's end, then the chunk right behind it
    assert gaps[:10] == [STEP] * 10
    assert gaps[10] == pytest.approx(0.050) and gaps[11] == pytest.approx(0.0)
    assert t_first == pytest.approx(0.160)
    assert gaps[12] == pytest.approx(STEP)


def test_a_gpu_bound_chunk_hides_its_launch(profile):
    engine, probe, gaps, t_first = _run_probe_and_prefill(profile, Timing(chunk_gpu=0.200, chunk_cpu=0.050))
    chunk = next(s for s in engine.history if s.context_tokens == 100)
    assert chunk.t_end - chunk.t_start == pytest.approx(0.200)
    assert gaps[10] == pytest.approx(0.050)  # the held-back decode step
    assert t_first == pytest.approx(chunk.t_end)


def test_admission_hashes_the_prompt_before_the_loop_sees_it(profile):
    """10 us per 16-token block for 3200 blocks: the busy loop's CPU is taken for 32 ms, so the
    step in flight comes out late, and the request is scheduled after it."""
    costs = NO_LOOP_COSTS.__class__(admit_s_per_block=10e-6)
    engine, probe, gaps, t_first = _run_probe_and_prefill(profile, Timing(chunk_cpu=0.0, chunk_gpu=0.005), costs,
                                                         cold(51_200))
    chunk = next(s for s in engine.history if s.context_tokens >= 64)
    # (the probe's own 16-token prompt took its 10 us at the start: abs=1e-4)
    assert chunk.t_start == pytest.approx(0.105 + 0.032, abs=1e-4)  # scheduled when the hashing is done
    assert max(gaps) == pytest.approx(0.105 + 0.032 - 0.100, abs=1e-4)  # step 11's tokens waited for the GIL


def test_retirement_delays_the_batch_that_finishes_a_request_and_the_rest_queue_behind(profile):
    costs = NO_LOOP_COSTS.__class__(retire_s_per_token=1e-6)  # 25.6 ms for a 25,600-token prompt
    engine, probe, gaps, t_first = _run_probe_and_prefill(profile, Timing(chunk_cpu=0.0, chunk_gpu=0.010),
                                                         costs, cold(25_600))
    last = [s for s in engine.history if s.context_tokens >= 64][-1]
    assert t_first == pytest.approx(last.t_end + 0.0256)
    # the probe's token of that step left with it; the steps run meanwhile come out at once
    i = next(k for k, t in enumerate(probe) if t == pytest.approx(t_first))
    assert probe[i + 1] == pytest.approx(t_first) and probe[i + 2] == pytest.approx(t_first)
    assert engine.history.since(0)[-1].t_end > t_first  # the engine kept stepping meanwhile


def test_a_request_on_an_idle_engine_waits_for_the_idle_start(profile):
    clock, engine, _ = make(profile, loop_costs=NO_LOOP_COSTS.__class__(idle_start_s=0.012,
                                                                         request_overhead_s=0.003))
    out: list[float] = []
    clock.advance_to(5.0)
    engine.add_request("r", cold(10), 2, lambda o, t: out.append(t))
    clock.run()
    assert out == [pytest.approx(5.0 + 0.003 + 0.012 + STEP), pytest.approx(5.0 + 0.003 + 0.012 + 2 * STEP)]


def test_abort_on_the_way_in_leaves_nothing_behind(profile):
    clock, engine, metrics = make(profile, loop_costs=NO_LOOP_COSTS.__class__(request_overhead_s=0.010))
    got: list[str] = []
    engine.add_request("a", cold(100), 10, lambda o, t: got.append(o.request_id))
    assert engine.abort_request("a")
    clock.run()
    assert got == [] and engine.idle and engine.scheduler.kv.usage == 0.0
