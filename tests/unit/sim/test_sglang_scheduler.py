"""The embedded engine's SGLang policy (`sim.sglang_scheduler`): what each step carries, in both
modes, against the SGLang adapters' rules (the one place those rules are written)."""

from __future__ import annotations

from collections import deque

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pdexporter.engines import adapter
from pdexporter.sim.scheduler import SchedulerConfig, SchedulerOutput
from pdexporter.sim.sglang_scheduler import SglangScheduler


def cold(n: int, base: int = 50_000) -> tuple[int, ...]:
    return tuple(base + (i * 7919) % 90_000 for i in range(n))


def decoding(d: int, b: int, mixed: bool) -> tuple[SglangScheduler, deque[SchedulerOutput]]:
    """D requests past their prefill, stepped with a batch queue of two (the overlap scheduler)."""
    s = SglangScheduler(SchedulerConfig(max_num_batched_tokens=b, num_gpu_blocks=40_000), mixed_chunk=mixed)
    for i in range(d):
        s.add_request(f"probe{i}", cold(16, 10_000 + 100 * i), max_tokens=10_000)
    queue: deque[SchedulerOutput] = deque()
    for _ in range(2 + d if d else 0):
        step(s, queue)
    assert all(r.num_output_tokens > 0 for r in s.running)
    return s, queue


def step(s: SglangScheduler, queue: deque[SchedulerOutput]) -> SchedulerOutput:
    while len(queue) < 2 and s.has_requests():
        queue.append(s.schedule())
    out = queue.popleft()
    s.update_from_output(out)
    return out


def prefill_steps(s: SglangScheduler, queue: deque[SchedulerOutput], p: int) -> list[SchedulerOutput]:
    s.add_request("prefill", cold(p), max_tokens=1)
    out = []
    while "prefill" in s.requests or any(
        e.request.request_id == "prefill" for o in queue for e in o.scheduled
    ):
        out.append(step(s, queue))
    return out


def test_default_mode_runs_the_chunks_back_to_back_while_the_decodes_pause() -> None:
    s, queue = decoding(4, 8192, mixed=False)
    steps = prefill_steps(s, queue, 20_000)
    chunks = [o for o in steps if o.num_context_tokens]
    assert [o.num_context_tokens for o in chunks] == [8192, 8192, 3616]
    assert all(
        o.num_generation_requests == 0 and o.total_num_scheduled_tokens == o.num_context_tokens
        for o in chunks
    )  # a prefill-only step: no decode token in it
    first = steps.index(chunks[0])
    assert steps[first : first + 3] == chunks  # back to back: no decode step in between
    after = step(s, queue)  # then the decodes' next step (the prefill's request with them, scheduled ahead)
    assert after.num_context_tokens == 0 and after.num_generation_requests >= 4


def test_mixed_mode_shrinks_the_chunk_by_the_decodes_that_join_it() -> None:
    s, queue = decoding(4, 8192, mixed=True)
    chunks = [o for o in prefill_steps(s, queue, 20_000) if o.num_context_tokens]
    assert [o.num_context_tokens for o in chunks] == [8188, 8188, 3624]
    assert all(o.num_generation_requests == 4 and o.total_num_scheduled_tokens == 8192 for o in chunks[:-1])


@settings(max_examples=40, deadline=None)
@given(b=st.integers(256, 12_000), d=st.integers(0, 24), p=st.integers(1, 30_000), mixed=st.booleans())
def test_the_scheduler_chunks_as_the_sglang_adapters_say(b: int, d: int, p: int, mixed: bool) -> None:
    name = "sglang-mixed" if mixed else "sglang"
    assume(adapter(name).budget_problem(b, d) is None)
    s, queue = decoding(d, b, mixed)
    chunks = tuple(
        e.num_new_tokens
        for o in prefill_steps(s, queue, p)
        for e in o.scheduled
        if e.request.request_id == "prefill"
    )
    assert (
        chunks
        == adapter(name).chunk_schedule(p, b, d)
        == adapter(f"pdexporter-sim-{name}").chunk_schedule(p, b, d)
    )
