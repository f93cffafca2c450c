"""The seam between the measurement protocol and an engine.

The protocol (`measure.protocol`) is written once against `EngineDriver`. `HttpDriver` speaks
HTTP to any OpenAI-compatible engine (real vLLM, or the embedded engine served over HTTP); the
embedded engine also offers an in-process driver (`pdexporter.measure.sim_driver`) that runs on a
virtual clock, so a 196-config sweep is predicted in seconds with the same protocol code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pdexporter._internal.redact import redact_url
from pdexporter.client.client import COMPLETIONS_PATH, ClientTimeouts, EngineClient, completion_request, encode_body
from pdexporter.client.identity import ask_identity, settle_engine
from pdexporter.client.iterlog import IterationLogTail
from pdexporter.client.metrics import MetricsSnapshot
from pdexporter.client.stream import Progress, ProgressSignal, TokenStream
from pdexporter.engines import IterationStep, adapter, command_chunk_size
from pdexporter.errors import ConfigError, EngineError
from pdexporter.launch import EngineHandle

__all__ = [
    "Cancelling", "EngineDriver", "EngineInfo", "HttpDriver", "MODELLED_NOTE", "PreparedRequest", "describe_engine",
    "http_driver",
]

MODELLED_NOTE = (
    "MODELLED: produced by pdexporter's embedded engine (the imitated engine's scheduling + a step-time model), "
    "not measured on a GPU; real numbers come from a real engine"
)


@dataclass(frozen=True)
class EngineInfo:
    """What a record needs to say about the engine that produced it."""

    kind: str  # the engine adapter's name ("vllm", "sglang", "pdexporter-sim", ...; "openai-compatible": unknown)
    model: str
    url: str | None = None
    version: str | None = None
    gpu: str | None = None
    chunk_size: int | None = None  # the engine's max_num_batched_tokens, when known
    cuda_graphs: bool | None = None
    profile: str | None = None
    modelled: bool = False
    clock: str = "perf_counter_ns"
    command: tuple[str, ...] | None = None  # how the engine was started, secrets redacted
    prefill_engine: EngineInfo | None = None  # a P/D pair's prefill instance (`measure.pd`); this is its decode one
    max_model_len: int | None = None  # the engine's context limit (`/v1/models`), when it publishes it
    chunk_size_published: bool = False  # the engine said its chunk size itself (SGLang's /server_info)

    def changed_to(self, now: EngineInfo, *, chunk_size: bool = True) -> str | None:
        """What makes `now` (the engine asked again, after a restart) another engine than this one
        for a measurement: its kind, model, version, context limit or published chunk size (None:
        the same as far as it says; vLLM publishes no chunk size). `chunk_size=False`: all but it."""
        said = [("engine", self.kind, now.kind), ("model", self.model, now.model),
                ("version", self.version, now.version), ("max_model_len", self.max_model_len, now.max_model_len)]
        if chunk_size and (self.chunk_size_published or now.chunk_size_published):
            said.append(("chunk size", self.chunk_size, now.chunk_size))
        changed = [f"{what} {old} -> {new}" for what, old, new in said if old != new]
        return ", ".join(changed) or None

    def check_fits(self, spec: Any, settings: Any, field: str = "-P") -> None:
        """Refuse, in one line, a point (`measure.point.PointSpec`) whose requests exceed this
        engine's max_model_len: before any warm-up, not as a request that never finishes."""
        spec.check_fits(settings, self.max_model_len, field)

    @property
    def note(self) -> str | None:
        return MODELLED_NOTE if self.modelled else None


@dataclass(frozen=True)
class PreparedRequest:
    """A request ready to leave: encoded *before* any measured window opens."""

    tag: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    body: bytes = b""
    path: str = COMPLETIONS_PATH
    headers: tuple[tuple[str, str], ...] = ()  # extra HTTP headers (a P/D pair's X-Request-Id)
    stream: bool = True
    kv_transfer_params: dict[str, Any] | None = None  # P/D disaggregation; in `body` too over HTTP

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def with_max_tokens(self, max_tokens: int) -> PreparedRequest:
        """The same request asking for `max_tokens`: the body's one `"max_tokens":N` rewritten
        (microseconds on a 4096-id body, where encoding it again takes milliseconds)."""
        if max_tokens == self.max_tokens:
            return self
        old, new = f'"max_tokens":{self.max_tokens},'.encode(), f'"max_tokens":{max_tokens},'.encode()
        if self.body.count(old) != 1:
            raise ValueError(f"{self.tag}: the encoded body does not hold max_tokens={self.max_tokens} once")
        return dataclasses.replace(self, max_tokens=max_tokens, body=self.body.replace(old, new))


@runtime_checkable
class EngineDriver(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    @property
    def progress(self) -> ProgressSignal: ...

    def now_ns(self) -> int: ...

    def prepare(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str) -> PreparedRequest: ...

    def start(self, prepared: PreparedRequest, *, retry_connect: bool = False) -> TokenStream:
        """Send the request; the returned stream fills in the background on the running loop."""
        ...

    async def scrape_metrics(self) -> MetricsSnapshot | None: ...

    def step_mark(self) -> object | None:
        """A position in the engine's own step log, or None if the driver cannot see it."""
        ...

    def steps_since(self, mark: object | None) -> list[IterationStep] | None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Cancelling(Protocol):
    """A driver that can end streams early, as a client going away does: the engine aborts them.
    Fast mode ends a probe set it has no further window for this way instead of letting it decode
    its leftover tokens (`probesets.PooledProbes.retire`)."""

    async def cancel(self, streams: Sequence[TokenStream]) -> None:
        """End these streams now (each finishes with reason "abort"); finished ones are left alone."""
        ...


async def cancel_streams(tasks_by_request: Mapping[str, asyncio.Task[Any]], streams: Sequence[TokenStream],
                         now_ns: Callable[[], int]) -> None:
    """`Cancelling.cancel` for a driver that runs each stream's request as a task: the tasks
    cancelled and awaited (their connections close, so the engine aborts the requests), then every
    stream not yet done finished as "abort"."""
    tasks = [t for s in streams if not s.done and (t := tasks_by_request.get(s.request_id)) is not None]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    now = now_ns()
    for s in streams:
        if not s.done:
            s.finish(now, "abort")


@dataclass
class HttpDriver:
    """Drives an engine over HTTP with `EngineClient`; all timestamps are `perf_counter_ns`."""

    client: EngineClient
    info: EngineInfo
    iteration_log: IterationLogTail | None = None
    progress: Progress = field(default_factory=Progress)
    _tasks: set[asyncio.Task[TokenStream]] = field(default_factory=set, repr=False)
    _by_stream: dict[str, asyncio.Task[TokenStream]] = field(default_factory=dict, repr=False)
    _ids: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def prepare(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str) -> PreparedRequest:
        ids = tuple(int(i) for i in prompt_token_ids)
        body = encode_body(completion_request(self.info.model, ids, max_tokens))
        return PreparedRequest(tag=tag, prompt_token_ids=ids, max_tokens=max_tokens, body=body)

    def start(self, prepared: PreparedRequest, *, retry_connect: bool = False) -> TokenStream:
        stream = TokenStream(f"{prepared.tag}-{next(self._ids)}", prepared.tag, on_update=self.progress.notify,
                             max_tokens=prepared.max_tokens)
        task = asyncio.get_running_loop().create_task(self.send_into(prepared, stream, retry_connect=retry_connect))
        self._tasks.add(task)
        self._by_stream[stream.request_id] = task
        task.add_done_callback(functools.partial(self._reap, request_id=stream.request_id))
        return stream

    # -- one instance of a P/D pair (`measure.pd.PdEndpoint`) --------------------------------

    def prepare_routed(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str, *, stream: bool = True,
                       kv_transfer_params: dict[str, Any] | None = None,
                       headers: Sequence[tuple[str, str]] = ()) -> PreparedRequest:
        """A request of a routed prefill: non-streaming to the prefill instance, streaming (with
        the prefill instance's kv_transfer_params) to the decode instance."""
        ids = tuple(int(i) for i in prompt_token_ids)
        body = completion_request(self.info.model, ids, max_tokens)
        if not stream:
            body["stream"] = False
            body.pop("stream_options", None)
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        return PreparedRequest(tag=tag, prompt_token_ids=ids, max_tokens=max_tokens, body=encode_body(body),
                               headers=tuple(headers), stream=stream, kv_transfer_params=kv_transfer_params)

    async def complete(self, prepared: PreparedRequest) -> tuple[dict[str, Any], int, int]:
        """A non-streaming request: its answer, and when it was sent and answered (ns)."""
        return await self.client.post_json(prepared.path, prepared.body, headers=dict(prepared.headers))

    async def send_into(
        self, prepared: PreparedRequest, stream: TokenStream, *, retry_connect: bool = False
    ) -> TokenStream:
        """A streaming request filling `stream` until it ends."""
        return await self.client.stream_into(prepared.path, prepared.body, stream, retry_connect=retry_connect,
                                             headers=dict(prepared.headers) if prepared.headers else None)

    def _reap(self, task: asyncio.Task[TokenStream], request_id: str | None = None) -> None:
        self._tasks.discard(task)
        if request_id is not None and self._by_stream.get(request_id) is task:
            del self._by_stream[request_id]
        if not task.cancelled():
            task.exception()  # recorded on the stream already; mark the task's exception as seen

    async def scrape_metrics(self) -> MetricsSnapshot | None:
        try:
            return await self.client.scrape_metrics(adapter(self.info.kind), retry=False)
        except EngineError:
            return None  # an engine without /metrics still gets measured; the record says so

    def step_mark(self) -> object | None:
        return self.iteration_log.mark() if self.iteration_log else None

    def steps_since(self, mark: object | None) -> list[IterationStep] | None:
        if self.iteration_log is None or not isinstance(mark, int):
            return None
        return self.iteration_log.read_since(mark)

    async def cancel(self, streams: Sequence[TokenStream]) -> None:
        """Close these streams' connections (vLLM aborts a request whose client went away)."""
        await cancel_streams(self._by_stream, streams, self.now_ns)

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        await self.cancel_all()
        await self.client.aclose()


async def describe_engine(client: EngineClient, handle: EngineHandle, *, model: str | None = None,
                          gpu: str | None = None) -> EngineInfo:
    """Who the engine at `handle` is, asked over `client`: its served model and max_model_len
    (/v1/models), its kind, version and published chunk size (its identity path), against what the
    launcher (`handle`) says. Asked again after a restart (`exporter.runner`)."""
    served_model, max_model_len = await client.served_model(model)
    identity = await ask_identity(client)
    kind = settle_engine(handle.kind, identity.found, redact_url(handle.url))
    rules = adapter(kind)
    payload = identity.payload
    modelled = handle.modelled or payload.get("modelled") is True
    profile, engine_gpu = handle.profile, handle.gpu
    if identity.found is not None and modelled:
        # e.g. pdexporter's embedded engine behind a URL: its numbers are a model, say so
        profile = profile or payload.get("profile")
        engine_gpu = engine_gpu or payload.get("gpu")
    published = rules.served_chunk_size(payload)
    if handle.chunk_size is not None and published is not None and published != handle.chunk_size:
        raise ConfigError(f"{redact_url(handle.url)}: chunk size {handle.chunk_size} was given, but the engine "
                          f"says it runs with {published} ({identity.path})")
    cuda_graphs = handle.cuda_graphs
    if handle.command is not None:
        # how it was started: by a launcher, or by someone else who said so (`--engine-command`)
        said = command_chunk_size(handle.command, kind)
        if said is not None and published is not None and said[1] != published:
            raise ConfigError(f"--engine-command: it starts the engine with {said[0]} {said[1]}, but the engine "
                              f"says it runs with {published} ({identity.path})")
        if cuda_graphs is None:
            cuda_graphs = rules.cuda_graphs(handle.command)
    return EngineInfo(
        kind=kind,
        model=served_model,
        url=redact_url(handle.url),  # what records and spans say: no user:password
        version=handle.version or identity.version,
        gpu=gpu or engine_gpu,
        chunk_size=handle.chunk_size or published,
        cuda_graphs=cuda_graphs,
        profile=profile,
        modelled=modelled,
        command=handle.command,
        max_model_len=max_model_len,
        chunk_size_published=published is not None,
    )


@asynccontextmanager
async def http_driver(
    handle: EngineHandle,
    *,
    model: str | None = None,
    api_key: str | None = None,
    gpu: str | None = None,
    read_timeout_s: float | None = None,
) -> AsyncIterator[HttpDriver]:
    """An `HttpDriver` for a launched (or external) engine, its model and max_model_len resolved
    from /v1/models. `read_timeout_s`: the longest silence allowed inside a stream (`--read-timeout`)."""
    timeouts = ClientTimeouts() if read_timeout_s is None else ClientTimeouts(read_s=read_timeout_s)
    client = EngineClient(handle.url, api_key=api_key, timeouts=timeouts)
    try:
        await client.get_text("/health")  # retried briefly; a dead target fails here with one line
        info = await describe_engine(client, handle, model=model, gpu=gpu)
        rules = adapter(info.kind)
        log = IterationLogTail(handle.iteration_log, rules.parse_step_log) if handle.iteration_log else None
        driver = HttpDriver(client, info, log)
    except BaseException:
        await client.aclose()
        raise
    try:
        yield driver
    finally:
        await driver.aclose()
