"""StepEngineDouble: a TEST DOUBLE of an engine, implementing `EngineDriver` in-process.

It schedules like vLLM v1 in the simplest form (step budget B, running decodes first, then
waiting prefills FCFS in chunks of what is left, the shared probe prefix cached so a probe computes
16 tokens) and advances its own clock by a fixed linear step-time model, as fast as the event loop
runs. It exists for the controller's logic tests (resume, deadlines, CV re-runs with scripted
noise), where the embedded engine's fidelity is not what is checked; integration tests use the
real embedded engine.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdexporter.client.stream import Progress, TokenStream
from pdexporter.engines import adapter, register
from pdexporter.launch.base import Launcher
from pdexporter.measure.driver import EngineInfo, PreparedRequest

PREFIX_TOKENS_CACHED = 4096 - 16
DOUBLE_ENGINE = "test-double"
_Vllm: Any = type(adapter("vllm"))


@register(DOUBLE_ENGINE)
class DoubleAdapter(_Vllm):  # type: ignore[misc]
    """The double's rules, registered as a third engine would be: vLLM's chunking, its own name."""

    name = DOUBLE_ENGINE

    def recognise(self, identity: Mapping[str, object]) -> bool:
        return False


@dataclass
class _Req:
    stream: TokenStream
    to_compute: int
    max_tokens: int
    generated: int = 0


@dataclass
class StepEngineDouble:
    chunk_size: int
    decode_ms: float = 6.0  # fixed cost of a step
    per_decode_ms: float = 0.25
    per_prefill_token_ms: float = 0.02
    noise: Callable[[int], float] = lambda injection: 1.0  # step-time factor while prefill `injection` runs
    info: EngineInfo = field(init=False)
    progress: Progress = field(default_factory=Progress)
    now: int = 0
    steps: int = 0
    injections: int = 0
    _waiting: list[_Req] = field(default_factory=list)
    _running: list[_Req] = field(default_factory=list)
    _wake: asyncio.Event | None = None
    _task: asyncio.Task[None] | None = None
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.info = EngineInfo(kind=DOUBLE_ENGINE, model="double", gpu="none", chunk_size=self.chunk_size,
                               modelled=True, clock="virtual")

    def now_ns(self) -> int:
        return self.now

    def prepare(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str) -> PreparedRequest:
        return PreparedRequest(tag=tag, prompt_token_ids=tuple(prompt_token_ids), max_tokens=max_tokens)

    def start(self, prepared: PreparedRequest, *, retry_connect: bool = False) -> TokenStream:
        stream = TokenStream(f"{prepared.tag}-{next(self._ids)}", prepared.tag, on_update=self.progress.notify)
        stream.mark_sent(self.now)
        n = prepared.prompt_tokens
        to_compute = 16 if prepared.tag == "probe" else n
        if prepared.tag == "prefill":
            self.injections += 1
        self._waiting.append(_Req(stream, to_compute, prepared.max_tokens))
        self._ensure_loop()
        return stream

    def _ensure_loop(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())
        self._wake.set()

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._step()
            await asyncio.sleep(0)

    def _step(self) -> None:
        budget = self.chunk_size
        decoding = [r for r in self._running]
        budget -= len(decoding)
        chunk_tokens = 0
        scheduled: list[tuple[_Req, int]] = []
        for req in list(self._waiting):
            if budget <= 0:
                break
            take = min(budget, req.to_compute)
            scheduled.append((req, take))
            budget -= take
            chunk_tokens += take
        step_ms = self.decode_ms + self.per_decode_ms * len(decoding) + self.per_prefill_token_ms * chunk_tokens
        if chunk_tokens > 16 * len(scheduled):
            step_ms *= self.noise(self.injections)
        self.now += int(step_ms * 1e6)
        self.steps += 1
        for req in decoding:
            req.generated += 1
            req.stream.record(self.now, 1)
            if req.generated >= req.max_tokens:
                self._running.remove(req)
                req.stream.finish(self.now, "length", None)
        for req, take in scheduled:
            req.to_compute -= take
            if req.to_compute == 0:
                self._waiting.remove(req)
                req.generated = 1
                req.stream.record(self.now, 1)
                if req.max_tokens <= 1:
                    req.stream.finish(self.now, "length", None)
                else:
                    self._running.append(req)

    async def scrape_metrics(self) -> None:
        return None

    def step_mark(self) -> object | None:
        return None

    def steps_since(self, mark: object | None) -> None:
        return None

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for req in [*self._waiting, *self._running]:
            if not req.stream.done:
                req.stream.fail(self.now, asyncio.CancelledError())


@dataclass
class DoubleProvider:
    """An `EngineProvider` handing out `StepEngineDouble`s (a test double)."""

    make: Callable[[int], StepEngineDouble] = lambda chunk: StepEngineDouble(chunk)
    description: str = "test double"
    launcher: Launcher | None = None  # a real launcher where its capabilities are what a test checks
    opened: list[int] = field(default_factory=list)
    closed: list[bool] = field(default_factory=list)
    drivers: list[StepEngineDouble] = field(default_factory=list)
    _driver: StepEngineDouble | None = None

    async def open(self, chunk_size: int) -> StepEngineDouble:
        self.opened.append(chunk_size)
        self._driver = self.make(chunk_size)
        self.drivers.append(self._driver)
        return self._driver

    async def close(self, *, stop_engine: bool) -> None:
        self.closed.append(stop_engine)
        if self._driver is not None:
            await self._driver.aclose()
            self._driver = None
