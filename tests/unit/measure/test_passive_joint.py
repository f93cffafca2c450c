"""Joint events: several traced prefills in one run of slow steps read as one chunked stream
(`measure.passive.joint_attribution` with the vLLM adapter's `joint_prefill_tokens`), and the
cases that must stay `merged`."""

from __future__ import annotations

from pathlib import Path

from pdexporter.engines import adapter
from pdexporter.measure.passive import Attribution, RequestPrefill, SlowRun, attribute_traces, joint_attribution

MS = 1_000_000
STEP = 15 * MS  # the tracker's tolerance: 1.5 steps of a 10 ms decode step
VLLM = adapter("vllm").joint_prefill_tokens


def _run(start_ms: float, end_ms: float) -> SlowRun:
    return SlowRun(start_ms * MS, end_ms * MS, (60.0, 60.0, 60.0), 3, 5)


def _req(rid: str, tokens: int, scheduled_ms: float, first_ms: float) -> RequestPrefill:
    return RequestPrefill(rid, tokens, first_ms * MS, first_ms - scheduled_ms)


def _joint(run: SlowRun, requests: list[RequestPrefill]) -> Attribution | None:
    traced = attribute_traces(run, requests, STEP)
    assert traced is not None
    return joint_attribution(traced, requests, run, STEP, VLLM)


def test_vllm_rule_chains_prefills_admitted_into_the_previous_ones_last_chunk_step() -> None:
    # b admitted in a's last chunk step (before a's first token), c one step after b's first token
    assert VLLM([(0.0, 100 * MS, 6000), (90 * MS, 160 * MS, 3000), (170 * MS, 200 * MS, 500)], STEP) == 9500
    # a decode-only stretch between them: two schedules, not one stream
    assert VLLM([(0.0, 100 * MS, 6000), (140 * MS, 200 * MS, 3000)], STEP) is None
    # the later admission's first token long before the earlier one's: not FCFS through one budget
    assert VLLM([(0.0, 300 * MS, 6000), (10 * MS, 100 * MS, 3000)], STEP) is None
    assert VLLM([(0.0, 100 * MS, 6000)], STEP) is None  # one prefill is no joint event
    # an engine whose batching nobody checked keeps them merged
    assert adapter("sglang").joint_prefill_tokens([(0.0, 100 * MS, 6000), (90 * MS, 160 * MS, 3000)], STEP) is None


def test_two_chained_prefills_in_one_run_are_one_event_of_their_summed_prompt() -> None:
    run = _run(100, 260)
    requests = [_req("a", 6000, 105, 200), _req("b", 3000, 190, 255), _req("late", 800, 400, 450)]
    got = _joint(run, requests)
    assert got is not None and got.joint and not got.single
    assert got.prompt_tokens == 9000 and got.prefills == 2 and got.request_ids == ("a", "b") and got.source == "otlp"
    assert got.prompt_sizes == (6000, 3000)  # each prefill's, in stream order: what the event model prices


def test_prefills_with_a_gap_between_them_are_not_attributed() -> None:
    # b was admitted 40 ms after a's first token: the run bridged a normal step between two prefills
    run = _run(100, 300)
    assert _joint(run, [_req("a", 6000, 105, 200), _req("b", 3000, 240, 295)]) is None


def test_a_prefill_admitted_before_the_run_began_is_not_attributed() -> None:
    # a's first chunks ran before the run's start (another run, or steps the probes did not see as slow)
    run = _run(100, 260)
    assert _joint(run, [_req("a", 6000, 20, 200), _req("b", 3000, 190, 255)]) is None


def test_a_request_still_prefilling_at_the_runs_end_keeps_the_run_merged() -> None:
    # c shared the run's last steps and ended later: the run holds more than a and b
    run = _run(100, 260)
    requests = [_req("a", 6000, 105, 200), _req("b", 3000, 190, 255), _req("c", 20000, 240, 900)]
    assert _joint(run, requests) is None


def test_without_the_prefill_time_the_admission_is_unknown_and_nothing_is_joint() -> None:
    run = _run(100, 260)
    requests = [_req("a", 6000, 105, 200), RequestPrefill("b", 3000, 255 * MS, None)]
    assert _joint(run, requests) is None


def test_a_single_or_metrics_attribution_is_never_joint() -> None:
    run = _run(100, 260)
    requests = [_req("a", 6000, 105, 200)]
    assert _joint(run, requests) is None
    counters = Attribution("metrics", 9000, 2)  # the counters say how many, not when each was admitted
    assert joint_attribution(counters, requests, run, STEP, VLLM) is None


def test_the_committed_h200_run_holds_no_joint_records() -> None:
    """The committed live-thresholds run was recorded before joint events existed: its records are
    the published single prefills, and reading joint/ beside them changes nothing."""
    from pdexporter.analysis.job import load_passive_events

    run = Path(__file__).resolve().parents[3] / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-live-thresholds"
    events = load_passive_events([run / "passive"])
    assert len(events) == 271 and all(e.prefills == 1 for e in events)
    assert not (run / "passive" / "joint").exists()
