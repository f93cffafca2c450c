"""The scheduler against schedules worked out by hand from vLLM 0.22's rules (see scheduler.py)."""

from __future__ import annotations

import math
from collections import deque

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pdexporter.sim.scheduler import RequestStatus, Scheduler, SchedulerConfig, SchedulerOutput

PREFIX = tuple(range(1000, 1000 + 4096))


def cold(n: int, base: int = 50_000) -> tuple[int, ...]:
    return tuple(base + (i * 7919) % 90_000 for i in range(n))


class AsyncLoop:
    """vLLM's batch queue of two, by hand: step N+1 is scheduled before step N's outputs are known."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self.in_flight: deque[SchedulerOutput] = deque()
        self.done: list[SchedulerOutput] = []

    def fill(self) -> None:
        while len(self.in_flight) < 2 and self.s.has_requests():
            out = self.s.schedule()
            if out.empty and not any(not f.empty for f in self.in_flight):
                break
            self.in_flight.append(out)
            if out.empty:
                break

    def step(self) -> SchedulerOutput:
        """Finish the oldest step in flight, then schedule (what happens at each step's end)."""
        self.fill()
        out = self.in_flight.popleft()
        self.s.update_from_output(out)
        self.done.append(out)
        self.fill()
        return out


def running_decodes(d: int, b: int, **kw: object) -> tuple[Scheduler, AsyncLoop]:
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=b, **kw))  # type: ignore[arg-type]
    for i in range(d):
        s.add_request(f"probe{i}", cold(16, 10_000 + 100 * i), max_tokens=10_000)
    loop = AsyncLoop(s)
    for _ in range(4):
        loop.step()
    assert all(r.num_output_tokens > 0 for r in s.running)
    return s, loop


def test_d4_b2048_p32768_gives_16_chunks_of_2044_then_64():
    s, loop = running_decodes(4, 2048)
    s.add_request("prefill", cold(32768), max_tokens=1)
    steps = []
    while "prefill" in s.requests:
        steps.append(loop.step())
    mixed = [o for o in steps if o.num_context_tokens > 0]
    assert [o.num_context_tokens for o in mixed] == [2044] * 16 + [64]
    assert len(mixed) == math.ceil(32768 / (2048 - 4)) == 17
    for o in mixed:
        assert o.num_context_requests == 1
        assert o.num_generation_requests == 4
        assert o.num_generation_tokens == 4  # one token per decode, first in the budget
        assert o.total_num_scheduled_tokens <= 2048
    # the chunk's context position grows by 2044 each step: what makes late chunks slower
    positions = [next(e.num_computed_before for e in o.scheduled if e.is_context) for o in mixed]
    assert positions == [2044 * k for k in range(17)]


@pytest.mark.parametrize("b", [2048, 4096, 8192, 16384])
@pytest.mark.parametrize("d", [1, 2, 4, 12])
@pytest.mark.parametrize("p", [512, 2048, 8192, 32768])
def test_num_chunks_is_ceil_p_over_b_minus_d(b: int, d: int, p: int):
    s, loop = running_decodes(d, b)
    s.add_request("prefill", cold(p), max_tokens=1)
    chunks = []
    while "prefill" in s.requests:
        out = loop.step()
        chunks += [e.num_new_tokens for e in out.scheduled if e.request.request_id == "prefill"]
    assert sum(chunks) == p
    assert len(chunks) == math.ceil(p / (b - d))
    assert all(c == b - d for c in chunks[:-1])


@settings(max_examples=60, deadline=None)
@given(b=st.integers(512, 20_000), d=st.integers(0, 40), p=st.integers(1, 40_000))
def test_the_embedded_scheduler_chunks_as_the_vllm_adapter_says(b: int, d: int, p: int):
    """The chunk-schedule rule exists once, in the vLLM adapter; the embedded engine's scheduler
    implements it as code, and the two must agree."""
    from pdexporter.engines import adapter

    assume(d < b)
    if d:
        s, loop = running_decodes(d, b)
    else:
        s = Scheduler(SchedulerConfig(max_num_batched_tokens=b))
        loop = AsyncLoop(s)
    s.add_request("prefill", cold(p), max_tokens=1)
    chunks = []
    while "prefill" in s.requests:
        out = loop.step()
        chunks += [e.num_new_tokens for e in out.scheduled if e.request.request_id == "prefill"]
    assert tuple(chunks) == adapter("vllm").chunk_schedule(p, b, d) == adapter("pdexporter-sim").chunk_schedule(p, b, d)


def test_prefix_hit_leaves_the_last_block_to_compute():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8192))
    loop = AsyncLoop(s)
    s.add_request("warm", PREFIX, max_tokens=1)
    while "warm" in s.requests:
        loop.step()
    s.add_request("probe", PREFIX, max_tokens=8)
    out = s.schedule()
    (entry,) = out.scheduled
    # 4096 tokens, all cached: at most num_tokens - 1 = 4095 may hit -> 255 whole blocks = 4080
    assert entry.num_computed_before == 4080
    assert entry.num_new_tokens == 16
    assert entry.request.num_cached_tokens == 4080
    assert s.kv.stats.hits == 4080 and s.kv.stats.queries == 2 * 4096


def test_prefix_hit_on_a_longer_prompt_and_no_hit_when_the_first_block_differs():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=16384))
    loop = AsyncLoop(s)
    s.add_request("warm", PREFIX, max_tokens=1)
    while s.has_requests():
        loop.step()
    longer = s.add_request("longer", PREFIX + (7, 8, 9, 10), max_tokens=1)
    first_differs = s.add_request("other", (1,) + PREFIX[1:], max_tokens=1)
    out = s.schedule()
    by_id = {e.request.request_id: e for e in out.scheduled}
    assert by_id["longer"].num_computed_before == 4096 and by_id["longer"].num_new_tokens == 4
    assert by_id["other"].num_computed_before == 0 and by_id["other"].num_new_tokens == 4096
    assert longer.num_cached_tokens == 4096 and first_differs.num_cached_tokens == 0


def test_blocks_are_shared_and_registered_when_scheduled():
    """Two identical cold prompts in one step: the second hits the blocks the first just allocated."""
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=16384))
    s.add_request("a", PREFIX, max_tokens=1)
    s.add_request("b", PREFIX, max_tokens=1)
    out = s.schedule()
    assert [e.num_new_tokens for e in out.scheduled] == [4096, 16]
    shared = set(s.kv.blocks_of("a")) & set(s.kv.blocks_of("b"))
    assert len(shared) == 255


def test_preemption_recomputes_the_last_running_request_when_kv_is_short():
    # 11 blocks, one is the null block: 10 usable = 160 tokens for two 64-token prompts.
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=512, num_gpu_blocks=11))
    loop = AsyncLoop(s)
    r1 = s.add_request("r1", cold(64, 1000), max_tokens=40)
    r2 = s.add_request("r2", cold(64, 2000), max_tokens=40)
    first = loop.step()
    assert [e.num_new_tokens for e in first.scheduled] == [64, 64]  # 8 blocks used, 2 free
    preempt_step = None
    while s.has_requests():
        out = loop.step()
        if out.preempted_request_ids and preempt_step is None:
            preempt_step = out
    # Token 81 of each needs a 6th block; the pool has none for r1, so r2 (last in) is preempted.
    assert s.num_preemptions >= 1
    assert r2.num_preemptions >= 1 and r1.num_preemptions == 0
    assert preempt_step is not None
    assert preempt_step.preempted_request_ids[0] == "r2"
    # r1 kept decoding in that step; nothing waiting was admitted in a step that preempted
    assert [e.request.request_id for e in preempt_step.scheduled] == ["r1"]
    # r1 decoded one token per step from its first to its last, never interrupted
    r1_steps = [o for o in loop.done if any(e.request is r1 for e in o.scheduled)]
    assert [next(e.num_new_tokens for e in o.scheduled if e.request is r1) for o in r1_steps[1:]] == [1] * 39
    # r2 was recomputed (prompt + outputs so far) after r1 freed its blocks, and still finished
    assert r1.status == RequestStatus.FINISHED_LENGTH_CAPPED and r1.num_output_tokens == 40
    assert r2.status == RequestStatus.FINISHED_LENGTH_CAPPED and r2.num_output_tokens == 40
    resumed = [o for o in loop.done if any(e.request is r2 and e.num_new_tokens > 1 for e in o.scheduled)]
    assert len(resumed) >= 2  # its first prefill, then the recompute
    assert s.kv.num_free_blocks == 10


def test_max_num_seqs_keeps_the_rest_waiting():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=2))
    for i in range(3):
        s.add_request(f"r{i}", cold(32, 100 * i), max_tokens=4)
    out = s.schedule()
    assert [e.request.request_id for e in out.scheduled] == ["r0", "r1"]
    assert s.num_waiting == 1 and s.num_running == 2


def test_long_prefill_token_threshold_caps_a_chunk():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=1000))
    s.add_request("long", cold(2500), max_tokens=1)
    sizes = []
    loop = AsyncLoop(s)
    while s.has_requests():
        sizes += [e.num_new_tokens for e in loop.step().scheduled]
    assert sizes == [1000, 1000, 500]


def test_async_scheduling_never_schedules_past_max_tokens():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8192))
    loop = AsyncLoop(s)
    r = s.add_request("one", cold(100), max_tokens=1)
    steps = []
    while s.has_requests():
        steps.append(loop.step())
    assert [sum(e.num_new_tokens for e in o.scheduled) for o in steps if not o.empty] == [100]
    assert r.output_token_ids and r.num_output_tokens == 1
    r3 = s.add_request("three", cold(100, 7), max_tokens=3)
    tokens = []
    while s.has_requests():
        out = loop.step()
        tokens += [e.num_new_tokens for e in out.scheduled]
    assert tokens == [100, 1, 1] and r3.num_output_tokens == 3


def test_iteration_log_classes_follow_vllm():
    """Context = no output token yet (vLLM's compute_iteration_details)."""
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8192))
    s.add_request("r", cold(40), max_tokens=5)
    loop = AsyncLoop(s)
    first, second, third = loop.step(), loop.step(), loop.step()
    assert (first.num_context_requests, first.num_context_tokens) == (1, 40)
    # scheduled before the first token was known: still "context", one token
    assert (second.num_context_requests, second.num_context_tokens) == (1, 1)
    assert (third.num_generation_requests, third.num_generation_tokens) == (1, 1)


def test_abort_frees_blocks_and_leaves_no_trace():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8192, num_gpu_blocks=100))
    s.add_request("r", cold(320), max_tokens=50)
    s.schedule()
    assert s.kv.num_free_blocks < 99
    s.finish_requests(["r"], RequestStatus.FINISHED_ABORTED)
    assert s.kv.num_free_blocks == 99 and not s.has_requests()


def test_bad_requests_are_refused():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=16))
    with pytest.raises(ValueError, match="prompt"):
        s.add_request("x", (), 1)
    with pytest.raises(ValueError, match="max_tokens"):
        s.add_request("y", (1,), 0)
    s.add_request("z", (1,), 1)
    with pytest.raises(ValueError, match="already"):
        s.add_request("z", (1,), 1)
