"""ScriptedEngine — a TEST DOUBLE of an OpenAI-compatible engine, for error paths and faults.

It speaks vLLM's SSE shape but has no scheduler: it streams tokens at a fixed cadence and can be
told to misbehave, so the client's, `measure`'s, `sweep`'s and `run`'s error paths can be
exercised (the fault-injection suite: tests/integration/faults/, docs/reliability.md). Fidelity
tests use the embedded engine (pdexporter.sim) instead: it never fails on purpose.

Two ways to make it misbehave:

- `behaviour`, for every completion request: ok | reject (HTTP 400) | fail (HTTP 500) | stall (3 s
  of silence after the headers) | malformed | no-done | disconnect (closed after 2 tokens);
- `faults`, a list of `Fault` rules, each hitting chosen requests: probes (max_tokens > 1) or
  prefills (max_tokens == 1: the injected prefill and the warm-ups), after `skip` matching
  requests, `times` of them (None: all). Kinds: `http-500`, `html-404` (a proxy's HTML error page),
  `reset` (connection closed before any byte), `close-mid-stream`, `malformed-sse`, `stall` (that
  stream goes silent, connection open), `freeze` (the whole engine stops emitting on every stream,
  as a hung engine loop would), `wrong-prompt-tokens` (usage.prompt_tokens off by one), `restart`
  (the request arrives, then the engine restarts: `restart()` below).

With `echo_auth`, every error body (the 500s, the 404 pages, /metrics' 404 too) quotes the
request's `Authorization` header, as a debugging proxy or framework error page does: what a
client must never print.

And for the other endpoints: `metrics` = ok | garbage | html-404 (and `stale_gauges`: the request
gauges as vLLM keeps them, stale once every request was aborted), `health_delay_s` (a slow
/health), `fail_gets` (the first GETs answer 503), `max_model_len` (in /v1/models), and
`restart()`: every connection dropped, the port closed for a moment, the counters in /metrics
start again from zero (they go down, as after a real restart) and `process_start_time_seconds` is
a minute later each time; `restart(model=...)` comes back serving another model.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from aiohttp import web

from tests.helpers import free_port

METRICS = (Path(__file__).parent / "fixtures" / "vllm-0.22" / "metrics.txt").read_text()
HTML_404 = ("<!DOCTYPE html><html><head><title>404 Not Found</title></head><body><h1>Not Found</h1>"
            "<p>The requested URL was not found on this server.</p><hr><address>nginx</address></body></html>")
GARBAGE_METRICS = "<<<this is not a Prometheus exposition>>>\n\x00\x01 vllm:num_requests_running{{{ 1 2 3\n"
FAULT_KINDS = ("http-500", "html-404", "reset", "close-mid-stream", "malformed-sse", "stall", "freeze",
               "wrong-prompt-tokens", "restart")
# The fixture's series the double keeps live: its own counters (they restart from 0 on restart()).
_LIVE_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total", "process_start_time_seconds")


@dataclass
class Fault:
    """One fault rule (module docs)."""

    kind: str
    on: str = "any"  # probe | prefill | any
    skip: int = 0
    times: int | None = 1
    at_token: int = 3  # mid-stream kinds: after this many tokens
    seconds: float = 3600.0  # stall / freeze: how long
    seen: int = 0  # matching requests so far
    hits: int = 0  # requests it hit

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}")

    def take(self, role: str) -> bool:
        if self.on not in ("any", role):
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.hits >= self.times):
            return False
        self.hits += 1
        return True


@dataclass
class ScriptedEngine:
    cadence_s: float = 0.005
    model: str = "scripted-model"
    api_key: str | None = None
    behaviour: str = "ok"  # ok | reject | fail | stall | malformed | no-done | disconnect
    faults: list[Fault] = field(default_factory=list)
    metrics: str = "ok"  # ok | garbage | html-404
    health_delay_s: float = 0.0
    max_model_len: int | None = 32768
    fail_gets: int = 0  # answer this many GETs with 503 first
    echo_auth: bool = False  # error bodies quote the request's Authorization header (module docs)
    get_calls: int = 0
    completion_calls: int = 0
    bodies: list[dict] = field(default_factory=list)
    # every streamed request's body and the perf_counter_ns of each token write: what the engine
    # really did, for tests that compare a measurement with it (its sleeps run late under load)
    streams: list[tuple[dict, list[int]]] = field(default_factory=list)
    # every completion request as it arrived: (role, streams the engine was running then), so a test
    # can see what really ran beside what (a re-run beside its failed attempt's streams, issue 31)
    arrivals: list[tuple[str, int]] = field(default_factory=list)
    on_arrival: Callable[[str, int], None] | None = None  # told each arrival, as `arrivals` records it
    url: str = ""
    port: int = 0
    restarts: int = 0
    _runner: web.AppRunner | None = None
    _open: dict[int, web.Request] = field(default_factory=dict)  # id -> open streaming request
    # vLLM's request gauges as they are: set at each step (here: each token written), as the step left
    # them (a request that finished in it no longer counted); after every request was aborted they
    # stay as they were until the engine steps again (vllm-project/vllm#22545). False: live counts.
    stale_gauges: bool = False
    _frozen_until: float = 0.0
    _gauge_running: float = 0.0
    _counters: dict[str, float] = field(default_factory=dict)
    _restarting: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self.port = self.port or free_port()
        await self._serve()
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._restarting is not None:
            await self._restarting
        await self._stop()

    async def _serve(self) -> None:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/health", self._get(self._health))
        app.router.add_get("/v1/models", self._get(self._models))
        app.router.add_get("/metrics", self._get(self._metrics))
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        # handler_cancellation: a request whose client went away ends at once, as vLLM aborts it (a
        # stalled stream would otherwise stay "running" in /metrics for its whole stall)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        for request in list(self._open.values()):
            if request.transport is not None:
                request.transport.close()
        self._open.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self, down_s: float = 0.3, model: str | None = None) -> None:
        """As a real restart looks from outside: connections dropped, the port refuses for
        `down_s`, then everything answers again with counters started from zero (serving `model`
        if given)."""
        await self._stop()
        await asyncio.sleep(down_s)
        self._counters.clear()
        if model is not None:
            self.model = model
        self.restarts += 1
        await self._serve()

    async def outage(self, down_s: float = 1.0) -> None:
        """The engine unreachable for `down_s` (a proxy or the network restarted), then back as the
        same process: its counters and start time go on."""
        await self._stop()
        await asyncio.sleep(down_s)
        await self._serve()

    def freeze(self, seconds: float) -> None:
        """Stop emitting tokens on every stream for `seconds` (a hung engine loop)."""
        self._frozen_until = time.monotonic() + seconds

    # --- GET endpoints ----------------------------------------------------------------------

    @web.middleware
    async def _auth(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Unauthorized", "code": 401}}, status=401)
        return await handler(request)

    def _get(self, make):  # type: ignore[no-untyped-def]
        async def handler(request: web.Request) -> web.StreamResponse:
            self.get_calls += 1
            if self.get_calls <= self.fail_gets:
                return web.json_response({"error": {"message": f"warming up{self._echo(request)}"}}, status=503)
            return await (make(request) if make == self._metrics else make())

        return handler

    async def _health(self) -> web.StreamResponse:
        if self.health_delay_s:
            await asyncio.sleep(self.health_delay_s)
        return web.Response(text="")

    async def _models(self) -> web.StreamResponse:
        entry: dict[str, object] = {"id": self.model, "object": "model"}
        if self.max_model_len is not None:
            entry["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [entry]})

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        if self.metrics == "garbage":
            return web.Response(text=GARBAGE_METRICS)
        if self.metrics == "html-404":
            return self._html_404(request)
        return web.Response(text=self.metrics_text())

    def _echo(self, request: web.Request) -> str:
        if not self.echo_auth:
            return ""
        return f" (request headers: Authorization: {request.headers.get('Authorization', '')})"

    def _html_404(self, request: web.Request) -> web.Response:
        page = HTML_404.replace("</p>", f"{self._echo(request)}</p>") if self.echo_auth else HTML_404
        return web.Response(status=404, text=page, content_type="text/html")

    def _http_500(self, request: web.Request) -> web.Response:
        return web.Response(status=500, text=f"Internal Server Error{self._echo(request)}")

    def metrics_text(self) -> str:
        """The vLLM 0.22 fixture with the double's own live values in a few series."""
        counted = {"vllm:prompt_tokens_total": self._counters.get("prompt", 0.0),
                   "vllm:generation_tokens_total": self._counters.get("generation", 0.0)}
        running = self._gauge_running if self.stale_gauges else float(len(self._open))
        live = {"vllm:num_requests_running": running, "vllm:num_requests_waiting": 0.0}

        def sub(match: re.Match[str]) -> str:
            name = match.group(2)
            if name == "process_start_time_seconds":  # a minute later after each restart
                return f"{match.group(1)} {float(match.group(3)) + 60.0 * self.restarts}"
            if name in counted:  # the fixture's count until the first restart, from zero after it
                return f"{match.group(1)} {(0.0 if self.restarts else float(match.group(3))) + counted[name]}"
            return f"{match.group(1)} {live[name]}"

        pattern = r"^((" + "|".join(re.escape(n) for n in _LIVE_SERIES) + r")(?:\{[^}]*\})?) (\S+)$"
        return re.sub(pattern, sub, METRICS, flags=re.MULTILINE)

    # --- completions ---------------------------------------------------------------------------

    def _fault_for(self, role: str) -> Fault | None:
        for fault in self.faults:
            if fault.take(role):
                return fault
        return None

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.completion_calls += 1
        body = await request.json()
        self.bodies.append(body)
        role = "prefill" if body.get("max_tokens") == 1 else "probe"
        self.arrivals.append((role, len(self._open)))
        if self.on_arrival is not None:
            self.on_arrival(role, len(self._open))
        fault = self._fault_for(role)
        kind = fault.kind if fault else None
        if self.behaviour == "reject":
            return web.json_response(
                {
                    "error": {
                        "message": f"This model's maximum context length is 4096 tokens. However, you requested "
                        f"{len(body.get('prompt', []))} tokens.",
                        "type": "BadRequestError",
                        "code": 400,
                    }
                },
                status=400,
            )
        if self.behaviour == "fail" or kind == "http-500":
            return self._http_500(request)
        if kind == "html-404":
            return self._html_404(request)
        if kind == "reset":
            request.transport.close()  # type: ignore[union-attr]
            return web.Response(status=500)  # never reaches the client
        chat = "messages" in body
        prompt_tokens = len(body["prompt"]) if not chat and isinstance(body["prompt"], list) else 7
        if kind == "wrong-prompt-tokens":
            prompt_tokens += 1
        if kind == "freeze":
            self.freeze(fault.seconds)  # type: ignore[union-attr]
        if kind == "restart":
            self._restarting = asyncio.get_running_loop().create_task(self.restart())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self._open[id(request)] = request
        try:
            return await self._stream(request, resp, body, chat, prompt_tokens, fault)
        except ConnectionResetError:  # the client went away (aiohttp's ClientConnectionResetError too)
            return resp
        finally:
            self._open.pop(id(request), None)

    async def _stream(self, request: web.Request, resp: web.StreamResponse, body: dict, chat: bool,
                      prompt_tokens: int, fault: Fault | None) -> web.StreamResponse:
        kind = fault.kind if fault else None
        self._counters["prompt"] = self._counters.get("prompt", 0.0) + prompt_tokens
        if self.behaviour == "stall":
            await asyncio.sleep(3)
        if self.behaviour == "malformed":
            await resp.write(b"data: {this is not json\n\n")
            return resp
        usage = (body.get("stream_options") or {}).get("continuous_usage_stats")
        written: list[int] = []
        self.streams.append((body, written))
        for k in range(1, body["max_tokens"] + 1):
            await asyncio.sleep(self.cadence_s)
            while time.monotonic() < self._frozen_until:
                await asyncio.sleep(0.01)
            if fault is not None and k == fault.at_token + 1:
                if kind == "close-mid-stream":
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                if kind == "malformed-sse":
                    await resp.write(b"data: {\"choices\": [{\"text\": \n\n")
                    return resp
                if kind == "stall":
                    await asyncio.sleep(fault.seconds)
            if self.behaviour == "disconnect" and k == 3:
                request.transport.close()  # type: ignore[union-attr]
                return resp
            choice = ({"index": 0, "delta": {"content": f" t{k}"}, "finish_reason": None} if chat
                      else {"index": 0, "text": f" t{k}", "logprobs": None, "finish_reason": None})
            if k == body["max_tokens"]:
                choice["finish_reason"] = "length"
            event = {"id": "cmpl-scripted", "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": 0, "model": self.model, "choices": [choice]}
            if usage:
                event["usage"] = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": k,
                    "total_tokens": prompt_tokens + k,
                }
            written.append(time.perf_counter_ns())
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self._counters["generation"] = self._counters.get("generation", 0.0) + 1
            self._gauge_running = float(len(self._open) - (k == body["max_tokens"]))
        final = {"id": "cmpl-scripted", "object": "text_completion", "created": 0, "model": self.model, "choices": [],
                 "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": body["max_tokens"],
                           "total_tokens": prompt_tokens + body["max_tokens"]}}
        await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        if self.behaviour != "no-done":
            await resp.write(b"data: [DONE]\n\n")
        return resp
