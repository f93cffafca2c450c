"""The embedded engine's core: a scheduler (vLLM's, or SGLang's policy) + the step-time model, run
on an injectable clock.

Timing mirrors vLLM 0.22's engine core with async scheduling (`EngineCoreProc.run_busy_loop` and
`EngineCore.step_with_batch_queue`, vllm/v1/engine/core.py; batch queue of 2) on two timelines,
the engine core's CPU and the GPU. One turn of the busy loop:

1. take the requests whose preprocessing is done (`_process_input_queue`);
2. if the batch queue has room: schedule a step and launch it (`execute_model(non_block=True)`).
   The main thread is busy for the step's CPU time (`StepTimeModel.cpu_s`: schedule, prepare
   inputs, launch the forward: ~2 ms for a decode batch replayed as a CUDA graph, ~45 ms for a
   step without graphs); the GPU starts the step when it is free and the launch has begun, and
   ends it no earlier than the launch ends: end = max(start + gpu_s, launch end). If the queue
   still has room, go round again (vLLM: "don't block on next worker response unless the queue
   is full");
3. else wait for the oldest step's GPU end, `update_from_output`, emit its outputs.

So step N+1 is launched while step N runs: a request arriving while step N runs is first
scheduled in step N+2; a long launch (the first chunk of a prefill, no CUDA graph) holds back the
output of the decode step before it (the probes see one slow step before the first chunk, as on
the H200); a step's GPU work overlaps the next one's launch, so chunks run back to back at
max(cpu, gpu) each.

Per request (profile `engine_loop`), paid where vLLM pays them:
- `request_overhead_ms`: the front end's way in and out (HTTP, validation, IPC): a latency before
  the engine core sees the request; it blocks nothing.
- `admit_us_per_block`: the engine core's input thread builds the scheduler's `Request`, hashing
  every full prompt block for the prefix cache (`EngineCore.preprocess_add_request` ->
  `Request.from_engine_core_request(request, self.request_block_hasher)`, run in
  `process_input_sockets`). That thread holds the GIL, so it is modelled on the same CPU timeline
  as the busy loop: the loop's next CPU work waits behind it, and the request is ready after it.
- `idle_start_ms`: a step scheduled while nothing is in flight starts this much later on the GPU.
- `retire_us_per_token`: when a request finishes, the batch that carries its last output leaves
  late by this much per prompt token, and the outputs behind it queue up (the front end merges
  them: `RequestOutputCollector.put` "merged if the producer gets ahead of the consumer",
  vllm/v1/engine/output_processor.py). vLLM's own freeing (`Scheduler._free_request` ->
  `_free_blocks` -> `kv_cache_manager.free`, vllm/v1/core/sched/scheduler.py) sits in the
  engine loop, but on the H200 the probes came out 3-5 tokens at once after the stall of a 32K
  prefill: the engine kept stepping, so the time is spent downstream of the loop, and that is
  where it is modelled (docs/sim.md).

Each step's end is an absolute deadline, so time spent in Python never accumulates. The clock
gives `now()` and `call_at(deadline, callback)`: an asyncio loop's clock in real time (the HTTP
server), the virtual loop of `pdexporter._internal.vloop` (sweeps in seconds), or `ManualClock`
(tests). Outputs reach their sinks when the front end delivers them.

KV roles (a P/D pair, docs/disaggregation.md; `kv_role`, `pdexporter.sim.kvconnector`): the
scheduler gets the role's connector. `decode-bench`: the admitting step carries the connector's
KV fill (`StepComposition.kv_fill_tokens`, priced by the step-time model). `decode`: a request
whose KV comes from a prefill instance waits while the transfer runs (`Profile.kv_transfer`:
fixed + KV bytes / achieved link bandwidth, from when it was admitted); the engine learns that
the transfer is done with the output of the next step that ends after it (the worker reports
finished receives with a step's output; with nothing in flight at once, as vLLM's no-forward
poll does), records vLLM's NixlConnector series (`vllm:nixl_xfer_time_seconds`,
`vllm:nixl_bytes_transferred`), and while transfers land every step's GPU time grows by
`StepTimeModel.landing_factor`. `prefill`: finished `do_remote_decode` requests answer with
NixlConnector's kv_transfer_params. All of it is a model (MODELLED).

Imitating SGLang (`EngineConfig.imitates`, `sim serve --engine sglang [--enable-mixed-chunk]`) the
scheduler is `sglang_scheduler.SglangScheduler` (a step is a prefill batch whenever one can be
formed; the decodes pause for it, or join it with mixed chunking); the busy loop above stands in
for SGLang's overlap scheduler (step N+1 prepared while step N runs, step N's outputs sent after
step N+1 is launched), and the step-time model is the same physics.

The engine keeps the imitated engine's metrics (`vllm_metrics.VllmMetrics`,
`sglang_metrics.SglangMetrics`: `EngineMetrics`), logs one line per step in that engine's format
(`StepLines`: its adapter's `format_step` behind its log prefix, e.g. vLLM's
`(EngineCore_DP0 pid=N) INFO`) and keeps the last `history_limit` steps in memory (`StepHistory`:
the in-process driver reads a window's steps from it; a served engine's clients read the log, so
`sim serve` keeps only a few thousand, and its memory stays flat however long it runs). The line's
"iteration elapsed time" is the modelled GPU span of the step (vLLM's own number measures CPU-side
waiting and is unreliable under async scheduling, docs/vllm-facts.md).
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
from typing import Any, Protocol, runtime_checkable

from pdexporter._internal.vloop import is_virtual
from pdexporter.client.traces import RequestTrace
from pdexporter.engines import IterationStep
from pdexporter.sim.episodes import HostEpisodes
from pdexporter.sim.imitation import DEFAULT_IMITATION, imitation, sglang_log_prefix, vllm_log_prefix
from pdexporter.sim.imitation import IMITATIONS as _IMITATIONS
from pdexporter.sim.profile import Profile
from pdexporter.sim.scheduler import (
    Request,
    RequestOutput,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)
from pdexporter.sim.steptime import StepComposition, StepTimeModel, landing_factor
from pdexporter.sim.vllm_metrics import observe_many

__all__ = [
    "BATCH_QUEUE_SIZE", "Cancellable", "Clock", "EngineConfig", "EngineCore", "EngineMetrics", "IMITATIONS",
    "LoopClock", "LoopCosts", "ManualClock", "NO_LOOP_COSTS", "OutputSink", "StepHistory", "StepLines", "StepRecord",
    "StepTiming", "sglang_log_prefix", "vllm_log_prefix",
]

IMITATIONS = tuple(_IMITATIONS)  # the engines (setups) the embedded engine schedules like (`sim.imitation`)

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
    """An asyncio loop's clock: real time on a normal loop, virtual time on `vloop`'s. On a virtual
    loop the Unix epoch is whole seconds: a wall time (`start_ns` of a span, read back on the probes'
    clock) then rounds the same way in every run, so a seeded virtual run is the same run whenever it
    is made (with the epoch's fraction, 1 of 479 passive events flipped between joint and merged)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self._epoch = time.time() - self.loop.time()
        if is_virtual(self.loop):
            self._epoch = float(int(self._epoch))

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

    request: Request | None  # None until the busy loop hands it to the scheduler
    sink: OutputSink | None
    arrival: float
    queued: float
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    prompt_tokens: int = 0
    request_id: str = ""
    max_tokens: int = 0


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

    def __iter__(self):
        return iter(self._steps)


@dataclass
class StepLines:
    """The per-step log of the engine imitated: its adapter's `format_step` behind its prefix; a
    decode step (no prompt tokens) is written every `decode_every`-th time (SGLang's
    `--decode-log-interval`)."""

    format: Callable[[IterationStep], str]
    prefix: Callable[[float, int], str] = vllm_log_prefix
    decode_every: int = 1
    _decodes: int = 0

    @classmethod
    def of(cls, imitates: str, decode_every: int = 1) -> StepLines:
        """The log of the engine (setup) imitated, in its adapter's format (`engines.IMITATED`)."""
        from pdexporter.engines import adapter

        behaviour = imitation(imitates)
        return cls(adapter(behaviour.record_name).format_step, behaviour.log_prefix, decode_every)

    def line(self, step: IterationStep, wall: float, pid: int) -> str | None:
        if step.context_tokens == 0 and self.decode_every > 1:
            self._decodes += 1
            if self._decodes % self.decode_every:
                return None
        return self.prefix(wall, pid) + self.format(step)


class EngineMetrics(Protocol):
    """What the engine core updates: the imitated engine's series (`VllmMetrics`, `SglangMetrics`)."""

    time_to_first_token: Any
    inter_token_latency: Any

    def on_new_request(self, max_tokens: int) -> None: ...

    def on_step(self, *, prompt_tokens: int, generation_tokens: int, running: int, waiting: int,
                kv_usage: float, prefix_queries: int, prefix_hits: int, preemptions: int,
                context_tokens: int = 0, decode_tokens: int = 0) -> None: ...

    def on_queue(self, running: int, waiting: int) -> None: ...

    def on_finished(self, *, reason: str, e2e_s: float, queue_s: float | None, prefill_s: float | None,
                    decode_s: float | None, inference_s: float | None, prompt_tokens: int,
                    generation_tokens: int, computed_prompt_tokens: int) -> None: ...

    def enable_kv_transfer(self) -> None: ...

    def on_kv_transfer(self, seconds: float, nbytes: int) -> None: ...


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
    imitates: str = DEFAULT_IMITATION  # IMITATIONS: whose scheduling policy the steps follow

    def __post_init__(self) -> None:
        imitation(self.imitates)  # ValueError naming the imitations for any other

    @classmethod
    def from_profile(cls, profile: Profile, *, max_num_batched_tokens: int | None = None,
                     max_num_seqs: int | None = None, long_prefill_token_threshold: int | None = None,
                     imitates: str = DEFAULT_IMITATION) -> EngineConfig:
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
            imitates=imitates,
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


@runtime_checkable
class StepTiming(Protocol):
    """What the engine needs of a step-time model: GPU and CPU seconds of a step."""

    def gpu_s(self, comp: StepComposition) -> float: ...

    def cpu_s(self, comp: StepComposition) -> float: ...


class SwitchingSteps:
    """Two step-time models and the episodes that say which one a step runs at (`sim serve --host-speed
    switching`, `sim.episodes`): the nominal host's and the slow one's (`Profile.on_slow_host`)."""

    def __init__(self, nominal: StepTiming, slow: StepTiming, episodes: HostEpisodes, clock: Clock) -> None:
        self.nominal, self.slow, self.episodes, self.clock = nominal, slow, episodes, clock
        self.t0 = clock.now()

    def _now(self) -> StepTiming:
        return self.slow if self.episodes.slow_at(self.clock.now() - self.t0) else self.nominal

    def gpu_s(self, comp: StepComposition) -> float:
        return self._now().gpu_s(comp)

    def cpu_s(self, comp: StepComposition) -> float:
        return self._now().cpu_s(comp)


class _GpuOnly:
    """A plain `comp -> seconds` function as a step-time model with no CPU cost (tests, what-ifs)."""

    def __init__(self, fn: Callable[[StepComposition], float]) -> None:
        self.fn = fn

    def gpu_s(self, comp: StepComposition) -> float:
        return self.fn(comp)

    def cpu_s(self, comp: StepComposition) -> float:
        return 0.0

    def __call__(self, comp: StepComposition) -> float:
        return self.fn(comp)


@dataclass(slots=True)
class _Arrival:
    """A request on its way in: handed to the scheduler by the busy loop once `ready`."""

    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    ready: float
    kv_transfer_params: dict | None = None


@dataclass(frozen=True, slots=True)
class LoopCosts:
    """`Profile.engine_loop` in seconds (see the module docs for where each one is paid)."""

    request_overhead_s: float = 0.0
    admit_s_per_block: float = 0.0
    retire_s_per_token: float = 0.0
    idle_start_s: float = 0.0

    @classmethod
    def of(cls, profile: Profile) -> LoopCosts:
        e = profile.engine_loop
        return cls(e.request_overhead_ms * 1e-3, e.admit_us_per_block * 1e-6, e.retire_us_per_token * 1e-6,
                   e.idle_start_ms * 1e-3)


NO_LOOP_COSTS = LoopCosts()


class EngineCore:
    """Scheduler + step model on a clock; requests in, token outputs out through sinks."""

    def __init__(
        self,
        profile: Profile,
        clock: Clock,
        *,
        config: EngineConfig | None = None,
        step_model: StepTiming | Callable[[StepComposition], float] | None = None,
        loop_costs: LoopCosts | None = None,
        metrics: EngineMetrics | None = None,
        log: Callable[[str], None] | None = None,
        step_lines: StepLines | None = None,
        history_limit: int = 200_000,
        kv_role: str | None = None,
        connector: object | None = None,
        host_episodes: HostEpisodes | None = None,
    ) -> None:
        """`kv_role`: None, or "decode-bench" | "decode" | "prefill" (module docs); `connector`
        replaces the role's default connector (e.g. a prefill side naming its host and port).
        `log` gets one line per step, written by `step_lines` (the imitated engine's format).
        `host_episodes` (without `step_model`): each step at the nominal host's step times or the slow
        host's (`Profile.on_slow_host`), as the episodes say at that moment (`SwitchingSteps`)."""
        from pdexporter.sim.kvconnector import connector_for

        self.profile = profile
        self.clock = clock
        self.config = config or EngineConfig.from_profile(profile)
        self.kv_role = None if kv_role in (None, "none") else kv_role
        self.connector = connector if connector is not None else connector_for(self.kv_role)
        self.scheduler: Scheduler = imitation(self.config.imitates).scheduler(self.config.scheduler_config(),
                                                                             self.connector)
        self.step_lines = step_lines or StepLines.of(self.config.imitates)
        if step_model is None:  # the captured CUDA-graph sizes depend on this engine's token budget
            def model(p: Profile) -> StepTimeModel:
                return StepTimeModel(p, max_num_batched_tokens=self.config.max_num_batched_tokens,
                                     max_num_seqs=self.config.max_num_seqs)

            step_model = model(profile) if host_episodes is None else \
                SwitchingSteps(model(profile), model(profile.on_slow_host()), host_episodes, clock)
        self.step_model: StepTiming = step_model if isinstance(step_model, StepTiming) else _GpuOnly(step_model)
        self.costs = LoopCosts.of(profile) if loop_costs is None else loop_costs
        self.metrics = metrics
        self.log = log
        self.history = StepHistory(history_limit)
        self._tracked: dict[str, _Tracked] = {}
        self._queue: deque[_InFlight] = deque()
        self._arrivals: deque[_Arrival] = deque()
        self._gpu_free = float("-inf")
        self._cpu_free = float("-inf")  # the engine core's GIL: busy loop and input thread share it
        self._frontend_free = float("-inf")
        self._deliveries: deque[tuple[float, list[tuple[OutputSink, RequestOutput]]]] = deque()
        self._delivery_timer: Cancellable | None = None
        self._timer: Cancellable | None = None
        self._parked = True  # the busy loop waits for input (no timer of its own armed)
        self._pumping = False
        self._loop = self._busy_loop()
        self._iteration = 0
        self._pid = os.getpid()
        self._prefix_seen = (0, 0)
        self._preemptions_seen = 0
        self._closed = False
        self.async_scheduling = self.config.async_scheduling
        self._landing = 0  # KV transfers landing in this engine's memory now
        self._received: list[str] = []  # transfers done, reported with the next step's output
        self._landing_factor = landing_factor(profile)
        if self.kv_role == "decode" and metrics is not None:
            metrics.enable_kv_transfer()
        # Called with each finished request's trace (vLLM's `llm_request` span: `request_trace`).
        self.on_request_finished: Callable[[RequestTrace], None] | None = None

    # -- input ----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        sink: OutputSink | None = None,
        *,
        arrival: float | None = None,
        kv_transfer_params: dict | None = None,
    ) -> None:
        if self._closed:
            raise RuntimeError("engine is shut down")
        if request_id in self._tracked or request_id in self.scheduler.requests:
            raise ValueError(f"request id {request_id!r} is already in the scheduler")
        if not prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        now = self.clock.now()
        self._tracked[request_id] = _Tracked(None, sink, arrival if arrival is not None else now, now,
                                             prompt_tokens=len(prompt_token_ids), request_id=request_id,
                                             max_tokens=max_tokens)
        if self.metrics is not None:
            self.metrics.on_new_request(max_tokens)
        costs = self.costs
        if costs.request_overhead_s > 0:
            self.clock.call_at(now + costs.request_overhead_s,
                               lambda: self._reach_engine_core(request_id, prompt_token_ids, max_tokens,
                                                               kv_transfer_params))
        else:
            self._reach_engine_core(request_id, prompt_token_ids, max_tokens, kv_transfer_params)

    def _reach_engine_core(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                           kv_transfer_params: dict | None = None) -> None:
        """The input thread: block hashing under the GIL, then the request waits for the busy loop."""
        if self._closed or request_id not in self._tracked:
            return  # aborted on its way in
        now = self.clock.now()
        ready = now
        hashing = self.costs.admit_s_per_block * (len(prompt_token_ids) // self.config.block_size)
        if hashing > 0:
            ready = max(now, self._cpu_free) + hashing
            self._cpu_free = ready
        self._arrivals.append(_Arrival(request_id, prompt_token_ids, max_tokens, ready, kv_transfer_params))
        if self.metrics is not None:
            self.metrics.on_queue(self.scheduler.num_running, self.scheduler.num_waiting + len(self._arrivals))
        if self._parked:
            self._unpark()

    def abort_request(self, request_id: str) -> bool:
        """Drop a request (its client went away); True if it was still in the engine."""
        tracked = self._tracked.pop(request_id, None)
        if tracked is None:
            return False
        pending = [a for a in self._arrivals if a.request_id == request_id]
        if pending:
            self._arrivals.remove(pending[0])
        else:
            self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
        for _, batch in self._deliveries:
            batch[:] = [(sink, o) for sink, o in batch if o.request_id != request_id]
        self._record_finish(tracked, "abort", self.clock.now())
        if self.metrics is not None:
            self.metrics.on_queue(self.scheduler.num_running, self.scheduler.num_waiting + len(self._arrivals))
        return True

    def shutdown(self) -> None:
        self._closed = True
        for timer in (self._timer, self._delivery_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._delivery_timer = None

    def next_deadline(self) -> float | None:
        """When the step now on the (modelled) GPU ends; None when nothing runs."""
        return self._queue[0].t_end if self._queue else None

    @property
    def idle(self) -> bool:
        return not (self._queue or self._arrivals or self._deliveries or self.scheduler.has_requests())

    @property
    def num_unfinished(self) -> int:
        return len(self._tracked)

    # -- the busy loop --------------------------------------------------------------------

    def _unpark(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pump()

    def _pump(self) -> None:
        """Run the busy loop until it has to wait: for a deadline (a timer) or for input (parked)."""
        self._timer = None
        if self._closed or self._pumping:
            return  # re-entered from a sink: the running loop takes the new input at its next turn
        self._pumping = True
        try:
            while True:
                when = next(self._loop)
                if when is None:
                    self._parked = True
                    return
                if when > self.clock.now():
                    self._parked = False
                    self._timer = self.clock.call_at(when, self._pump)
                    return
        finally:
            self._pumping = False

    def _busy_loop(self):
        """vLLM's busy loop as a generator: yields the time it must wait for, None to wait for input."""
        queue = self._queue
        sched = self.scheduler
        clock = self.clock
        while True:
            now = clock.now()
            while self._arrivals and self._arrivals[0].ready <= now:
                self._admit(self._arrivals.popleft(), now)
            if len(queue) < BATCH_QUEUE_SIZE and sched.has_requests():
                out = sched.schedule()
                for loading in out.started_loads:
                    self._start_transfer(loading, now)
                if not out.empty:
                    cpu_end = self._launch(out, now)
                    if cpu_end > now:
                        yield cpu_end
                    if len(queue) < BATCH_QUEUE_SIZE:
                        continue
                elif any(not f.output.empty for f in queue):
                    # vLLM queues an empty batch too; it resolves at once, behind the step in flight
                    queue.append(_InFlight(out, now, now))
            if not queue:
                yield self._arrivals[0].ready if self._arrivals else None
                continue
            head = queue[0]
            while True:  # the step's GPU end, then the GIL (the input thread may take it meanwhile)
                ready = head.t_end if head.t_end > self._cpu_free else self._cpu_free
                if ready <= clock.now():
                    break
                yield ready
            queue.popleft()
            if not head.output.empty:
                self._finish_step(head, clock.now())

    def _launch(self, out: SchedulerOutput, now: float) -> float:
        """A scheduled step put in flight: its CPU launch after the last one's, its GPU work after the
        GPU's last step and no earlier than its last kernel's launch; returns the launch's end."""
        model = self.step_model
        comp = StepComposition.of(out.chunks(), out.num_sampled, out.kv_fill_tokens)
        cpu_start = now if now > self._cpu_free else self._cpu_free
        cpu_end = cpu_start + model.cpu_s(comp)
        gpu_start = cpu_start if cpu_start > self._gpu_free else self._gpu_free
        if not self._queue:
            gpu_start += self.costs.idle_start_s  # nothing in flight: the engine was idle
        gpu_s = model.gpu_s(comp)
        if self._landing:
            gpu_s *= self._landing_factor  # a KV transfer shares this GPU's memory bandwidth
        gpu_end = gpu_start + gpu_s
        if cpu_end > gpu_end:
            gpu_end = cpu_end  # the last kernel cannot run before it is launched
        self._cpu_free = cpu_end
        self._gpu_free = gpu_end
        self._queue.append(_InFlight(out, gpu_start, gpu_end))
        for entry in out.scheduled:
            tracked = self._tracked.get(entry.request.request_id)
            if tracked is not None and tracked.scheduled is None:
                tracked.scheduled = now
        return cpu_end

    def _admit(self, arrival: _Arrival, now: float) -> None:
        tracked = self._tracked.get(arrival.request_id)
        if tracked is None:
            return
        tracked.request = self.scheduler.add_request(arrival.request_id, arrival.prompt_token_ids, arrival.max_tokens,
                                                     arrival.kv_transfer_params)
        if self.metrics is not None:
            self.metrics.on_queue(self.scheduler.num_running, self.scheduler.num_waiting + len(self._arrivals))

    # -- KV transfers (decode role) ------------------------------------------------------

    def transfer_seconds(self, num_tokens: int) -> float:
        """The modelled transfer of `num_tokens` tokens of KV from the prefill instance."""
        return self.profile.kv_transfer.seconds(num_tokens, self.profile.model.kv_bytes_per_token)

    def _start_transfer(self, request: Request, now: float) -> None:
        tokens = request.num_computed_tokens - max(request.num_cached_tokens, 0)
        seconds = self.transfer_seconds(tokens)
        nbytes = self.profile.kv_transfer.bytes(tokens, self.profile.model.kv_bytes_per_token)
        self._landing += 1
        rid = request.request_id
        self.clock.call_at(now + seconds, lambda: self._transfer_done(rid, seconds, nbytes))

    def _transfer_done(self, request_id: str, seconds: float, nbytes: int) -> None:
        self._landing -= 1
        if self._closed:
            return
        if self.metrics is not None:
            self.metrics.on_kv_transfer(seconds, nbytes)
        if self._queue:
            self._received.append(request_id)  # reported with the output of the step in flight
            return
        if self.scheduler.finish_remote_load(request_id) and self._parked:
            self._unpark()

    def _finish_step(self, step: _InFlight, now: float) -> None:
        sched = self.scheduler
        out = step.output
        if self._received:
            for rid in self._received:
                sched.finish_remote_load(rid)
            self._received.clear()
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
        if self.log is not None and self.step_lines is not None:
            line = self.step_lines.line(record.to_iteration_step(), self.clock.wall(), self._pid)
            if line is not None:
                self.log(line)

        prompt_tokens = 0
        retired_prompt_tokens = 0
        metrics = self.metrics
        itl: dict[float, int] = {}
        batch: list[tuple[OutputSink, RequestOutput]] = []
        for o in outputs:
            tracked = self._tracked.get(o.request_id)
            if tracked is None or tracked.request is None:
                continue
            if tracked.first_token is None:
                tracked.first_token = now
                prompt_tokens += tracked.request.num_prompt_tokens
                if metrics is not None:
                    metrics.time_to_first_token.observe(now - tracked.arrival)
            else:
                gap = now - (tracked.last_token or now)
                itl[gap] = itl.get(gap, 0) + 1
            tracked.last_token = now
            if o.finished:
                del self._tracked[o.request_id]
                self._record_finish(tracked, o.finish_reason or "length", now)
                retired_prompt_tokens += tracked.request.num_prompt_tokens
            if tracked.sink is not None:
                batch.append((tracked.sink, o))
        if metrics is not None:
            for gap, count in itl.items():
                observe_many(metrics.inter_token_latency, gap, count)
            stats = sched.kv.stats
            queries, hits = stats.queries - self._prefix_seen[0], stats.hits - self._prefix_seen[1]
            self._prefix_seen = (stats.queries, stats.hits)
            preemptions = sched.num_preemptions - self._preemptions_seen
            self._preemptions_seen = sched.num_preemptions
            metrics.on_step(
                prompt_tokens=prompt_tokens, generation_tokens=len(outputs), running=sched.num_running,
                waiting=sched.num_waiting + len(self._arrivals), kv_usage=sched.kv.usage, prefix_queries=queries,
                prefix_hits=hits, preemptions=preemptions, context_tokens=out.num_context_tokens,
                decode_tokens=out.num_generation_tokens,
            )
        self._deliver(batch, now, retired_prompt_tokens)

    # -- the front end's output path ------------------------------------------------------

    def _deliver(self, batch: list[tuple[OutputSink, RequestOutput]], now: float, retired_prompt_tokens: int) -> None:
        """Hand a step's outputs to their sinks, in order, behind any retirement stall."""
        when = now if now > self._frontend_free else self._frontend_free
        when += self.costs.retire_s_per_token * retired_prompt_tokens
        self._frontend_free = when
        if when <= now and not self._deliveries:
            for sink, o in batch:
                sink(o, now)
            return
        self._deliveries.append((when, batch))
        if self._delivery_timer is None:
            self._delivery_timer = self.clock.call_at(self._deliveries[0][0], self._on_delivery)

    def _on_delivery(self) -> None:
        self._delivery_timer = None
        if self._closed:
            return
        now = self.clock.now()
        due: list[list[tuple[OutputSink, RequestOutput]]] = []
        while self._deliveries and self._deliveries[0][0] <= now:
            due.append(self._deliveries.popleft()[1])
        if due:
            for sink, o in due[0]:
                sink(o, now)
            # What queued up behind the stalled batch goes out merged, one output per request, as
            # vLLM's RequestOutputCollector merges deltas when the producer gets ahead.
            merged: dict[str, tuple[OutputSink, RequestOutput]] = {}
            for batch in due[1:]:
                for sink, o in batch:
                    prev = merged.get(o.request_id)
                    if prev is not None:
                        o = RequestOutput(o.request_id, prev[1].new_token_ids + o.new_token_ids, o.num_output_tokens,
                                          o.finish_reason, o.kv_transfer_params)
                    merged[o.request_id] = (sink, o)
            for sink, o in merged.values():
                sink(o, now)
        if self._deliveries:
            self._delivery_timer = self.clock.call_at(self._deliveries[0][0], self._on_delivery)

    def _record_finish(self, tracked: _Tracked, reason: str, now: float) -> None:
        if self.on_request_finished is not None:
            self.on_request_finished(self.request_trace(tracked, now))
        if self.metrics is None:
            return
        r = tracked.request
        prompt = r.num_prompt_tokens if r is not None else tracked.prompt_tokens
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
            prompt_tokens=prompt,
            generation_tokens=r.num_output_tokens if r is not None else 0,
            computed_prompt_tokens=prompt - max(r.num_cached_tokens, 0) if r is not None else 0,
        )

    def request_trace(self, tracked: _Tracked, now: float) -> RequestTrace:
        """What vLLM's per-request span says about a finished request (`client.traces`): arrival
        and finish on the Unix clock, its latencies as vLLM computes them (queue = scheduled -
        queued, prefill = first token - scheduled, decode = last token - first token)."""
        epoch = self.clock.wall() - now
        r = tracked.request

        def span(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else b - a

        return RequestTrace(
            request_id=tracked.request_id,
            start_ns=round((epoch + tracked.arrival) * 1e9),
            end_ns=round((epoch + now) * 1e9),
            prompt_tokens=r.num_prompt_tokens if r is not None else tracked.prompt_tokens,
            completion_tokens=r.num_output_tokens if r is not None else 0,
            ttft_s=span(tracked.arrival, tracked.first_token),
            e2e_s=now - tracked.arrival,
            queue_s=span(tracked.queued, tracked.scheduled),
            prefill_s=span(tracked.scheduled, tracked.first_token),
            decode_s=span(tracked.first_token, tracked.last_token),
            inference_s=span(tracked.scheduled, tracked.last_token),
            max_tokens=tracked.max_tokens or None,
        )

    # -- what the model says, without running it -----------------------------------------

    def modelled_decode_step_s(self, d: int, context: int) -> float:
        """The period of D decodes at `context` tokens each (what a probe's TPOT should be)."""
        comp = StepComposition.decode_batch(d, context)
        return max(self.step_model.gpu_s(comp), self.step_model.cpu_s(comp))
