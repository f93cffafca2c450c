"""The embedded engine's core: vLLM's scheduler + the step-time model, run on an injectable clock.

Timing mirrors vLLM 0.22's `EngineCore.step_with_batch_queue` with async scheduling (batch queue
of 2): the scheduler prepares step N+1 while step N runs on the GPU, so

- from idle, a new request is scheduled at once (step 1), and step 2 right after it;
- when step N finishes (its *deadline*), its outputs are processed and emitted, then step N+2 is
  scheduled; it starts on the GPU when step N+1 ends. A request arriving while step N runs is
  therefore first scheduled in step N+2;
- a scheduler output without tokens still takes a queue slot (vLLM appends it too), but only
  while a real step is in flight, so an idle engine waits for input instead of spinning.

Each step's GPU time is `steptime.StepTimeModel` of its composition; its end is an absolute
deadline, start = max(schedule time, previous step's end), so time spent in Python never
accumulates. The clock gives `now()` and `call_at(deadline, callback)`: an asyncio loop's clock
in real time (the HTTP server), the virtual loop of `pdexporter._internal.vloop` (sweeps in
seconds), or `ManualClock` (tests). Tokens of a step are emitted at its deadline.

The engine keeps vLLM's metrics (`vllm_metrics.VllmMetrics`), logs one vLLM iteration-detail line
per step (`engine.iterlog.IterationStep.to_log_line`, with vLLM's `(EngineCore_DP0 pid=N) INFO`
prefix) and keeps the step history in memory. The line's "iteration elapsed time" is the modelled
GPU time of the step (vLLM's own number measures CPU-side waiting and is unreliable under async
scheduling, docs/vllm-facts.md).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pdexporter.engine.iterlog import IterationStep
from pdexporter.sim.profile import Profile
from pdexporter.sim.scheduler import (
    Request,
    RequestOutput,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)
from pdexporter.sim.steptime import StepComposition, StepTimeModel
from pdexporter.sim.vllm_metrics import VllmMetrics

BATCH_QUEUE_SIZE = 2  # vLLM: 2 with async scheduling (one step running, one scheduled)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on the engine's timeline (monotonic)."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable: ...

    def wall(self) -> float:
        """Unix time for log lines and `created` fields."""
        ...


class LoopClock:
    """An asyncio loop's clock: real time on a normal loop, virtual time on `vloop`'s."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self._epoch = time.time() - self.loop.time()

    def now(self) -> float:
        return self.loop.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        return self.loop.call_at(when, callback)

    def wall(self) -> float:
        return self._epoch + self.loop.time()


class ManualClock:
    """A clock that moves only when told to: `run()` fires callbacks in deadline order."""

    @dataclass(order=True)
    class _Timer:
        when: float
        seq: int
        callback: Callable[[], None] = field(compare=False)
        cancelled: bool = field(default=False, compare=False)

        def cancel(self) -> None:
            self.cancelled = True

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._heap: list[ManualClock._Timer] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return 1.7e9 + self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        timer = self._Timer(when, next(self._seq), callback)
        heapq.heappush(self._heap, timer)
        return timer

    def advance_to(self, t: float) -> None:
        """Fire every callback due by `t`, moving the clock to each deadline; end at `t`."""
        while self._heap and self._heap[0].when <= t:
            timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            self._now = max(self._now, timer.when)
            timer.callback()
        self._now = max(self._now, t)

    def run(self, until: Callable[[], bool] | None = None, max_time: float = 1e9) -> None:
        """Fire callbacks until none are left (or `until()` holds)."""
        while self._heap:
            if until is not None and until():
                return
            timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            if timer.when > max_time:
                heapq.heappush(self._heap, timer)
                return
            self._now = max(self._now, timer.when)
            timer.callback()


OutputSink = Callable[[RequestOutput, float], None]


@dataclass(slots=True)
class _Tracked:
    """Per-request timing, vLLM's RequestStateStats."""

    request: Request
    sink: OutputSink | None
    arrival: float
    queued: float
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One executed step: what it carried and when it ran on the (modelled) GPU."""

    iteration: int
    step_id: int
    t_start: float
    t_end: float
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    kv_cache_usage: float
    preempted: int = 0

    @property
    def duration_s(self) -> float:
        return self.t_end - self.t_start

    @property
    def num_tokens(self) -> int:
        return self.context_tokens + self.generation_tokens

    @property
    def is_mixed(self) -> bool:
        return self.context_tokens > 0 and self.generation_requests > 0

    def to_iteration_step(self) -> IterationStep:
        return IterationStep(
            iteration=self.iteration,
            context_requests=self.context_requests,
            context_tokens=self.context_tokens,
            generation_requests=self.generation_requests,
            generation_tokens=self.generation_tokens,
            elapsed_ms=round(self.duration_s * 1e3, 2),
        )


@dataclass(slots=True)
class _InFlight:
    output: SchedulerOutput
    t_start: float
    t_end: float


class StepHistory:
    """The last `limit` steps, addressable by a running index (marks survive trimming)."""

    def __init__(self, limit: int = 200_000) -> None:
        self._steps: deque[StepRecord] = deque(maxlen=limit)
        self._total = 0

    def append(self, step: StepRecord) -> None:
        self._steps.append(step)
        self._total += 1

    def mark(self) -> int:
        return self._total

    def since(self, mark: int) -> list[StepRecord]:
        first_kept = self._total - len(self._steps)
        start = max(mark, first_kept) - first_kept
        return list(itertools.islice(self._steps, start, None))

    def __len__(self) -> int:
        return self._total

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._steps)


def vllm_log_prefix(wall: float, pid: int) -> str:
    """`(EngineCore_DP0 pid=N) INFO MM-DD HH:MM:SS [core.py:NNN] ` as vLLM's engine core prints."""
    return f"(EngineCore_DP0 pid={pid}) INFO {time.strftime('%m-%d %H:%M:%S', time.localtime(wall))} [core.py:1132] "


@dataclass(frozen=True)
class EngineConfig:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    async_scheduling: bool = True

    @classmethod
    def from_profile(cls, profile: Profile, *, max_num_batched_tokens: int | None = None,
                     max_num_seqs: int | None = None, long_prefill_token_threshold: int | None = None,
                     ) -> EngineConfig:
        e = profile.engine
        return cls(
            max_num_batched_tokens=max_num_batched_tokens or e.max_num_batched_tokens,
            max_num_seqs=max_num_seqs or e.max_num_seqs,
            max_model_len=e.max_model_len,
            block_size=e.block_size,
            num_gpu_blocks=e.num_gpu_blocks,
            long_prefill_token_threshold=(
                e.long_prefill_token_threshold if long_prefill_token_threshold is None else long_prefill_token_threshold
            ),
            enable_prefix_caching=e.enable_prefix_caching,
            async_scheduling=e.async_scheduling,
        )

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            block_size=self.block_size,
            num_gpu_blocks=self.num_gpu_blocks,
            enable_prefix_caching=self.enable_prefix_caching,
            async_scheduling=self.async_scheduling,
        )


class EngineCore:
    """Scheduler + step model on a clock; requests in, token outputs out through sinks."""

    def __init__(
        self,
        profile: Profile,
        clock: Clock,
        *,
        config: EngineConfig | None = None,
        step_model: Callable[[StepComposition], float] | None = None,
        metrics: VllmMetrics | None = None,
        log: Callable[[str], None] | None = None,
        history_limit: int = 200_000,
    ) -> None:
        self.profile = profile
        self.clock = clock
        self.config = config or EngineConfig.from_profile(profile)
        self.scheduler = Scheduler(self.config.scheduler_config())
        self.step_model = step_model or StepTimeModel(profile)
        self.metrics = metrics
        self.log = log
        self.history = StepHistory(history_limit)
        self._tracked: dict[str, _Tracked] = {}
        self._queue: deque[_InFlight] = deque()
        self._gpu_free = float("-inf")
        self._timer: Cancellable | None = None
        self._iteration = 0
        self._pid = os.getpid()
        self._prefix_seen = (0, 0)
        self._preemptions_seen = 0
        self._closed = False
        self.async_scheduling = self.config.async_scheduling

    # -- input ----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        sink: OutputSink | None = None,
        *,
        arrival: float | None = None,
    ) -> Request:
        if self._closed:
            raise RuntimeError("engine is shut down")
        now = self.clock.now()
        request = self.scheduler.add_request(request_id, prompt_token_ids, max_tokens)
        self._tracked[request_id] = _Tracked(request, sink, arrival if arrival is not None else now, now)
        if self.metrics is not None:
            self.metrics.on_new_request(max_tokens)
            self.metrics.on_queue(self.scheduler.num_running, self.scheduler.num_waiting)
        if not self._queue:
            self._kick(now)  # an idle engine core schedules at once
        return request

    def abort_request(self, request_id: str) -> bool:
        """Drop a request (its client went away); True if it was still in the engine."""
        done = self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
        tracked = self._tracked.pop(request_id, None)
        if not done or tracked is None:
            return False
        self._record_finish(tracked, "abort", self.clock.now())
        if self.metrics is not None:
            self.metrics.on_queue(self.scheduler.num_running, self.scheduler.num_waiting)
        return True

    def shutdown(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def idle(self) -> bool:
        return not self._queue and not self.scheduler.has_requests()

    @property
    def num_unfinished(self) -> int:
        return len(self._tracked)

    # -- the step loop --------------------------------------------------------------------

    def _kick(self, now: float) -> None:
        """Fill the batch queue (vLLM: schedule while the queue has room and there is work)."""
        queue = self._queue
        sched = self.scheduler
        while len(queue) < BATCH_QUEUE_SIZE and sched.has_requests():
            real_in_flight = any(not f.output.empty for f in queue)
            out = sched.schedule()
            if out.empty:
                if real_in_flight:
                    queue.append(_InFlight(out, max(now, self._gpu_free), max(now, self._gpu_free)))
                break
            start = now if now > self._gpu_free else self._gpu_free
            duration = self.step_model(StepComposition.of(out.chunks(), sum(1 for s in out.scheduled if s.samples)))
            end = start + duration
            self._gpu_free = end
            queue.append(_InFlight(out, start, end))
            for entry in out.scheduled:
                tracked = self._tracked.get(entry.request.request_id)
                if tracked is not None and tracked.scheduled is None:
                    tracked.scheduled = now
        self._arm()

    def _arm(self) -> None:
        if self._timer is None and self._queue and not self._closed:
            self._timer = self.clock.call_at(self._queue[0].t_end, self._on_step_end)

    def _on_step_end(self) -> None:
        self._timer = None
        if self._closed or not self._queue:
            return
        step = self._queue.popleft()
        now = self.clock.now()
        if not step.output.empty:
            self._finish_step(step, now)
        self._kick(now)

    def _finish_step(self, step: _InFlight, now: float) -> None:
        sched = self.scheduler
        out = step.output
        outputs = sched.update_from_output(out)
        self._iteration += 1
        record = StepRecord(
            iteration=self._iteration - 1,
            step_id=out.step_id,
            t_start=step.t_start,
            t_end=step.t_end,
            context_requests=out.num_context_requests,
            context_tokens=out.num_context_tokens,
            generation_requests=out.num_generation_requests,
            generation_tokens=out.num_generation_tokens,
            kv_cache_usage=sched.kv.usage,
            preempted=len(out.preempted_request_ids),
        )
        self.history.append(record)
        if self.log is not None:
            self.log(vllm_log_prefix(self.clock.wall(), self._pid) + record.to_iteration_step().to_log_line())

        prompt_tokens = 0
        metrics = self.metrics
        for o in outputs:
            tracked = self._tracked.get(o.request_id)
            if tracked is None:
                continue
            if tracked.first_token is None:
                tracked.first_token = now
                prompt_tokens += tracked.request.num_prompt_tokens
                if metrics is not None:
                    metrics.time_to_first_token.observe(now - tracked.arrival)
            elif metrics is not None:
                metrics.inter_token_latency.observe(now - (tracked.last_token or now))
            tracked.last_token = now
            if o.finished:
                del self._tracked[o.request_id]
                self._record_finish(tracked, o.finish_reason or "length", now)
            if tracked.sink is not None:
                tracked.sink(o, now)
        if metrics is not None:
            stats = sched.kv.stats
            queries, hits = stats.queries - self._prefix_seen[0], stats.hits - self._prefix_seen[1]
            self._prefix_seen = (stats.queries, stats.hits)
            preemptions = sched.num_preemptions - self._preemptions_seen
            self._preemptions_seen = sched.num_preemptions
            metrics.on_step(
                prompt_tokens=prompt_tokens, generation_tokens=len(outputs), running=sched.num_running,
                waiting=sched.num_waiting, kv_usage=sched.kv.usage, prefix_queries=queries, prefix_hits=hits,
                preemptions=preemptions,
            )

    def _record_finish(self, tracked: _Tracked, reason: str, now: float) -> None:
        if self.metrics is None:
            return
        r = tracked.request
        self.metrics.on_finished(
            reason=reason,
            e2e_s=now - tracked.arrival,
            queue_s=(tracked.scheduled - tracked.queued) if tracked.scheduled is not None else None,
            prefill_s=(tracked.first_token - tracked.scheduled)
            if tracked.first_token is not None and tracked.scheduled is not None else None,
            decode_s=(tracked.last_token - tracked.first_token)
            if tracked.last_token is not None and tracked.first_token is not None else None,
            inference_s=(tracked.last_token - tracked.scheduled)
            if tracked.last_token is not None and tracked.scheduled is not None else None,
            prompt_tokens=r.num_prompt_tokens,
            generation_tokens=r.num_output_tokens,
            computed_prompt_tokens=r.num_prompt_tokens - max(r.num_cached_tokens, 0),
        )

    # -- what the model says, without running it -----------------------------------------

    def modelled_decode_step_s(self, d: int, context: int) -> float:
        """The step time of D decodes at `context` tokens each (what a probe's TPOT should be)."""
        return self.step_model(StepComposition.decode_batch(d, context))
