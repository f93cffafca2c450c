"""The P/D routing step, client-side: a driver for the decode instance of a prefill/decode pair.

`PdDriver` is an `EngineDriver` over two instances (`PdEndpoint`: an `HttpDriver` for a real or
embedded engine over HTTP, or an in-process `SimDriver` on a virtual clock). Probe streams,
warm-up of the shared prefix and every other request go to the **decode** instance. The
injected prefill (tag "prefill", and the shape warm-ups, "warm-shape") is routed as a P/D router
routes it (vLLM's tests/v1/kv_connector/nixl_integration/toy_proxy_server.py; docs/
disaggregation.md):

1. to the **prefill** instance, non-streaming, `max_tokens` 1, with
   `kv_transfer_params = {"do_remote_decode": true, "do_remote_prefill": false, "remote_*": null}`
   (NixlConnector); its answer's top-level `kv_transfer_params` say where the KV is;
2. to the **decode** instance, streaming, the original request plus those `kv_transfer_params`
   verbatim. There the request waits for its KV (NixlConnector reads it from the prefill
   instance) and is admitted in one 1-token step (`engines.disagg`).

For `P2pNcclConnector` no `kv_transfer_params` travel; instead both requests carry the header
`X-Request-Id: ___prefill_addr_{P zmq}___decode_addr_{D zmq}_{uuid}` (vLLM's
disagg_proxy_p2p_nccl_xpyd.py), and both servers need VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1
(issue #42839).

Which times the window uses. The probes run on the decode instance, so their window is the
decode-side half of the routed request: t_inject = the request reaching the decode instance
(`t_sent_decode`), t_first = its first token there. The prefill instance's half runs *before*
the window opens (`Routing.route_ahead`, called by `protocol.run_window` before the probes are
made ready): it computes on another GPU, so the probes would only have to outlast it, and fast
mode's probe sets could not know for how long. NixlConnector's transfer is a read by the decode
instance when the request arrives there, so it falls inside the window exactly as in the
back-to-back flow; with P2pNcclConnector the prefill instance pushes the KV while it computes,
before the window (its receive cost on the decode side is then not in the window: say so when
comparing). The offloaded TTFT is the sum of the measured parts:

    offload_ttft = prefill (t_sent_P -> answer) + route (our own work between) + decode side (t_sent_D -> first token)

The route term is what this client spent turning the prefill's answer into the decode request
(parse, encode): the artificial wait between the two halves is not in it. The decode side holds
the transfer and the admission step; the decode instance's connector metrics (NixlConnector:
`vllm:nixl_xfer_time_seconds`, `vllm:nixl_bytes_transferred`) give the transfer's own time and
bytes, as deltas over the window. Both instances' /metrics are scraped around each half and
kept in the raw file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pdexporter.client.metrics import MetricsSnapshot, metric_deltas
from pdexporter.client.stream import Progress, TokenStream
from pdexporter.engines import NIXL, P2P_NCCL, IterationStep
from pdexporter.errors import ConfigError, EngineError
from pdexporter.measure.driver import EngineInfo, PreparedRequest, cancel_streams

ROUTED_TAGS = frozenset({"prefill", "warm-shape"})
# What the prefill instance is asked to do (toy_proxy_server.py, NixlConnector)
PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
    "remote_host": None, "remote_port": None,
}


@runtime_checkable
class PdEndpoint(Protocol):
    """One instance of a pair, as the routing step needs it (HttpDriver, SimDriver)."""

    info: EngineInfo

    def now_ns(self) -> int: ...

    def prepare(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str) -> PreparedRequest: ...

    def prepare_routed(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str, *, stream: bool = True,
                       kv_transfer_params: dict[str, Any] | None = None,
                       headers: Sequence[tuple[str, str]] = ()) -> PreparedRequest: ...

    async def complete(self, prepared: PreparedRequest) -> tuple[dict[str, Any], int, int]: ...

    async def send_into(self, prepared: PreparedRequest, stream: TokenStream, *,
                        retry_connect: bool = False) -> TokenStream: ...

    async def scrape_metrics(self) -> MetricsSnapshot | None: ...

    def step_mark(self) -> object | None: ...

    def steps_since(self, mark: object | None) -> list[IterationStep] | None: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class RouteTiming:
    """The routed request's clock: its two halves and what the prefill instance said."""

    connector: str
    t_sent_prefill_ns: int
    t_done_prefill_ns: int
    route_ns: int  # our own work between the prefill's answer and the decode request being ready
    t_sent_decode_ns: int | None = None
    t_first_decode_ns: int | None = None
    prefill_prompt_tokens: int | None = None
    kv_params: Mapping[str, Any] = field(default_factory=dict)  # the prefill instance's answer, block ids counted
    prefill_metrics_before: Mapping[str, float] | None = None
    prefill_metrics_after: Mapping[str, float] | None = None

    @property
    def prefill_ms(self) -> float:
        return (self.t_done_prefill_ns - self.t_sent_prefill_ns) / 1e6

    @property
    def route_ms(self) -> float:
        return self.route_ns / 1e6

    @property
    def decode_ms(self) -> float | None:
        if self.t_sent_decode_ns is None or self.t_first_decode_ns is None:
            return None
        return (self.t_first_decode_ns - self.t_sent_decode_ns) / 1e6

    @property
    def ttft_ms(self) -> float | None:
        d = self.decode_ms
        return None if d is None else self.prefill_ms + self.route_ms + d

    def with_decode(self, stream: TokenStream) -> RouteTiming:
        return dataclasses.replace(self, t_sent_decode_ns=stream.t_sent_ns, t_first_decode_ns=stream.t_first_ns)

    def to_raw(self, t0_ns: int) -> dict[str, Any]:
        def rel(t: int | None) -> int | None:
            return None if t is None else t - t0_ns

        return {
            "connector": self.connector, "t_sent_prefill_ns": rel(self.t_sent_prefill_ns),
            "t_done_prefill_ns": rel(self.t_done_prefill_ns), "route_ns": self.route_ns,
            "t_sent_decode_ns": rel(self.t_sent_decode_ns), "t_first_decode_ns": rel(self.t_first_decode_ns),
            "prefill_prompt_tokens": self.prefill_prompt_tokens, "kv_params": dict(self.kv_params),
            "prefill_metrics_before": dict(self.prefill_metrics_before) if self.prefill_metrics_before else None,
            "prefill_metrics_after": dict(self.prefill_metrics_after) if self.prefill_metrics_after else None,
        }

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], t0_ns: int = 0) -> RouteTiming:
        def ab(t: int | None) -> int | None:
            return None if t is None else int(t) + t0_ns

        return cls(
            connector=str(raw.get("connector", NIXL)), t_sent_prefill_ns=int(raw["t_sent_prefill_ns"]) + t0_ns,
            t_done_prefill_ns=int(raw["t_done_prefill_ns"]) + t0_ns, route_ns=int(raw.get("route_ns", 0)),
            t_sent_decode_ns=ab(raw.get("t_sent_decode_ns")), t_first_decode_ns=ab(raw.get("t_first_decode_ns")),
            prefill_prompt_tokens=raw.get("prefill_prompt_tokens"), kv_params=dict(raw.get("kv_params") or {}),
            prefill_metrics_before=raw.get("prefill_metrics_before"),
            prefill_metrics_after=raw.get("prefill_metrics_after"),
        )


@dataclass(frozen=True)
class OffloadNumbers:
    """A repetition's offloaded-arm numbers (`measure.quantities` reads them as source "offload"):
    the TTFT split from the route's clock, the transfer from the decode instance's connector
    metrics (their deltas over the window; None where the connector publishes none)."""

    prefill_ms: float | None
    route_ms: float | None
    decode_ms: float | None
    ttft_ms: float | None
    kv_transfer_ms: float | None
    kv_bytes: float | None
    kv_transfers: float | None


def offload_numbers(route: RouteTiming | None, deltas: Mapping[str, float]) -> OffloadNumbers | None:
    """None for a window that was not routed (colocated, or DecodeBench's free transfer) and has
    no transfer metrics."""
    transfers = deltas.get("kv_transfer_time_seconds_count_delta")
    seconds = deltas.get("kv_transfer_time_seconds_sum_delta")
    nbytes = deltas.get("kv_transfer_bytes_sum_delta")
    measured = transfers is not None and transfers > 0
    if route is None and not measured:
        return None
    return OffloadNumbers(
        prefill_ms=route.prefill_ms if route else None,
        route_ms=route.route_ms if route else None,
        decode_ms=route.decode_ms if route else None,
        ttft_ms=route.ttft_ms if route else None,
        kv_transfer_ms=seconds * 1e3 if measured and seconds is not None else None,
        kv_bytes=nbytes if measured else None,
        kv_transfers=transfers if measured else None,
    )


@runtime_checkable
class Routing(Protocol):
    """A driver that routes the injected prefill through another instance first
    (`protocol.run_window` asks for the first half before the window and the timing after)."""

    async def route_ahead(self, prepared: PreparedRequest) -> None: ...

    def route_of(self, stream: TokenStream) -> RouteTiming | None: ...


@dataclass(frozen=True)
class RoutedRequest(PreparedRequest):
    """The injected prefill of a pair: where it goes first, and its own id across both halves."""

    route: str = ""
    first_hop: PreparedRequest | None = None


@dataclass
class _Hop:
    timing: RouteTiming
    decode_request: PreparedRequest


def p2p_request_id(prefill_addr: str, decode_addr: str, route: str) -> str:
    """P2pNcclConnector's request id (vLLM's parse_request_id regexes on both sides)."""
    return f"___prefill_addr_{prefill_addr}___decode_addr_{decode_addr}_{route}"


def kv_params_summary(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the raw file keeps of the prefill instance's answer: everything but the block ids,
    which are counted."""
    if not params:
        return {}
    out = {k: v for k, v in params.items() if k != "remote_block_ids"}
    blocks = params.get("remote_block_ids")
    out["remote_blocks"] = len(blocks) if isinstance(blocks, list) else None
    return out


@dataclass
class PdDriver:
    """`EngineDriver` of a P/D pair's decode instance with the routing step in front (module docs)."""

    prefill: PdEndpoint
    decode: PdEndpoint
    connector: str = NIXL
    p2p_addresses: tuple[str, str] | None = None  # (prefill zmq, decode zmq) for P2pNcclConnector
    progress: Progress = field(default_factory=Progress)
    info: EngineInfo = field(init=False)
    _ids: itertools.count[int] = field(default_factory=itertools.count, repr=False)
    _hops: dict[str, _Hop] = field(default_factory=dict, repr=False)
    _routes: dict[str, RouteTiming] = field(default_factory=dict, repr=False)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set, repr=False)
    _by_stream: dict[str, asyncio.Task[Any]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.connector not in (NIXL, P2P_NCCL):
            raise ConfigError(f"P/D connector {self.connector!r}: expected {NIXL} or {P2P_NCCL}")
        if self.connector == P2P_NCCL and self.p2p_addresses is None:
            raise ConfigError(f"{P2P_NCCL} needs both instances' zmq addresses (kv_ip:kv_port) for X-Request-Id")
        limits = [i.max_model_len for i in (self.decode.info, self.prefill.info) if i.max_model_len is not None]
        self.info = dataclasses.replace(self.decode.info, prefill_engine=self.prefill.info,
                                        max_model_len=min(limits) if limits else None)

    # -- EngineDriver ---------------------------------------------------------------------

    def now_ns(self) -> int:
        return self.decode.now_ns()

    def prepare(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str) -> PreparedRequest:
        if tag not in ROUTED_TAGS:
            return self.decode.prepare(prompt_token_ids, max_tokens, tag)
        route = uuid.uuid4().hex
        kv = dict(PREFILL_KV_PARAMS) if self.connector == NIXL else None
        first = self.prefill.prepare_routed(prompt_token_ids, 1, f"{tag}-prefill", stream=False, kv_transfer_params=kv,
                                            headers=self._headers(route))
        ids = tuple(int(i) for i in prompt_token_ids)
        return RoutedRequest(tag=tag, prompt_token_ids=ids, max_tokens=max_tokens, route=route, first_hop=first)

    def _headers(self, route: str) -> tuple[tuple[str, str], ...]:
        if self.connector == P2P_NCCL and self.p2p_addresses is not None:
            return (("X-Request-Id", p2p_request_id(*self.p2p_addresses, route)),)
        return (("X-Request-Id", route),)

    async def route_ahead(self, prepared: PreparedRequest) -> None:
        """The prefill instance's half, before the window opens (module docs)."""
        if isinstance(prepared, RoutedRequest) and prepared.route not in self._hops:
            self._hops[prepared.route] = await self._hop(prepared)

    async def _hop(self, prepared: RoutedRequest) -> _Hop:
        assert prepared.first_hop is not None
        before = await self.prefill.scrape_metrics()
        answer, t_sent, t_done = await self.prefill.complete(prepared.first_hop)
        t0 = self.now_ns()
        params = answer.get("kv_transfer_params")
        if self.connector == NIXL and not isinstance(params, dict):
            raise EngineError(
                f"the prefill instance ({self.prefill.info.url or self.prefill.info.kind}) answered without "
                "kv_transfer_params: is it started with --kv-transfer-config naming NixlConnector?")
        decode_request = self.decode.prepare_routed(
            prepared.prompt_token_ids, prepared.max_tokens, prepared.tag, stream=True,
            kv_transfer_params=params if self.connector == NIXL else None, headers=self._headers(prepared.route))
        route_ns = self.now_ns() - t0
        after = await self.prefill.scrape_metrics()
        got_usage = answer.get("usage")
        usage = got_usage if isinstance(got_usage, dict) else {}
        timing = RouteTiming(
            connector=self.connector, t_sent_prefill_ns=t_sent, t_done_prefill_ns=t_done, route_ns=route_ns,
            prefill_prompt_tokens=usage.get("prompt_tokens"), kv_params=kv_params_summary(params),
            prefill_metrics_before=before.values if before else None,
            prefill_metrics_after=after.values if after else None,
        )
        return _Hop(timing, decode_request)

    def start(self, prepared: PreparedRequest, *, retry_connect: bool = False) -> TokenStream:
        stream = TokenStream(f"{prepared.tag}-{next(self._ids)}", prepared.tag, on_update=self.progress.notify,
                             max_tokens=prepared.max_tokens)
        if isinstance(prepared, RoutedRequest):
            work = self._routed(prepared, stream)
        else:
            work = self.decode.send_into(prepared, stream, retry_connect=retry_connect)
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        self._by_stream[stream.request_id] = task
        task.add_done_callback(self._reap)
        return stream

    async def cancel(self, streams: Sequence[TokenStream]) -> None:
        """End these streams now (`driver.Cancelling`): their requests' tasks cancelled and awaited,
        so the decode instance's connection closes and it aborts them."""
        await cancel_streams(self._by_stream, streams, self.now_ns)

    async def _routed(self, prepared: RoutedRequest, stream: TokenStream) -> TokenStream:
        try:
            hop = self._hops.pop(prepared.route, None) or await self._hop(prepared)
        except (EngineError, OSError) as exc:
            error = exc if isinstance(exc, EngineError) else EngineError(f"prefill instance: {exc}")
            stream.fail(self.now_ns(), error)
            raise error from exc
        self._routes[stream.request_id] = hop.timing
        return await self.decode.send_into(hop.decode_request, stream)

    def route_of(self, stream: TokenStream) -> RouteTiming | None:
        timing = self._routes.pop(stream.request_id, None)
        return timing.with_decode(stream) if timing is not None else None

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        for request_id in [k for k, t in self._by_stream.items() if t is task]:
            del self._by_stream[request_id]
        if not task.cancelled():
            task.exception()  # recorded on the stream already

    async def scrape_metrics(self) -> MetricsSnapshot | None:
        return await self.decode.scrape_metrics()

    def step_mark(self) -> object | None:
        return self.decode.step_mark()

    def steps_since(self, mark: object | None) -> list[IterationStep] | None:
        return self.decode.steps_since(mark)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.decode.aclose()
        await self.prefill.aclose()


def prefill_metric_deltas(route: RouteTiming) -> dict[str, float]:
    """The prefill instance's /metrics deltas over its half of the routed request."""
    if not route.prefill_metrics_before or not route.prefill_metrics_after:
        return {}
    before = MetricsSnapshot(dict(route.prefill_metrics_before))
    after = MetricsSnapshot(dict(route.prefill_metrics_after))
    return {k: round(v, 6) for k, v in metric_deltas(before, after).items()}


@asynccontextmanager
async def pd_driver(prefill_handle: Any, decode_handle: Any, *, model: str | None = None, api_key: str | None = None,
                    gpu: str | None = None, connector: str = NIXL,
                    p2p_addresses: tuple[str, str] | None = None,
                    read_timeout_s: float | None = None) -> AsyncIterator[PdDriver]:
    """A `PdDriver` over two launched engines (`launch.EngineHandle`s), each through `http_driver`."""
    from contextlib import AsyncExitStack

    from pdexporter.measure.driver import http_driver

    async with AsyncExitStack() as stack:
        decode = await stack.enter_async_context(http_driver(decode_handle, model=model, api_key=api_key, gpu=gpu,
                                                             read_timeout_s=read_timeout_s))
        prefill = await stack.enter_async_context(http_driver(prefill_handle, model=model, api_key=api_key, gpu=gpu,
                                                              read_timeout_s=read_timeout_s))
        driver = PdDriver(prefill, decode, connector=connector, p2p_addresses=p2p_addresses)
        try:
            yield driver
        finally:
            for task in list(driver._tasks):
                task.cancel()
            if driver._tasks:
                await asyncio.gather(*driver._tasks, return_exceptions=True)


__all__ = [
    "PREFILL_KV_PARAMS",
    "ROUTED_TAGS",
    "OffloadNumbers",
    "PdDriver",
    "PdEndpoint",
    "RouteTiming",
    "RoutedRequest",
    "Routing",
    "kv_params_summary",
    "offload_numbers",
    "p2p_request_id",
    "pd_driver",
    "prefill_metric_deltas",
]
