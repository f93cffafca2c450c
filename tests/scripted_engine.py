"""ScriptedEngine — a TEST DOUBLE of an OpenAI-compatible engine for client edge cases.

It speaks vLLM's SSE shape but has no scheduler: it streams tokens at a fixed cadence and can be
told to misbehave (reject, fail, stall, break the SSE shape, drop the connection) so the
client's error paths can be exercised. Fidelity tests use the embedded engine (pdexporter.sim)
instead.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tests.helpers import free_port

METRICS = (Path(__file__).parent / "fixtures" / "vllm-0.22" / "metrics.txt").read_text()


@dataclass
class ScriptedEngine:
    cadence_s: float = 0.005
    model: str = "scripted-model"
    api_key: str | None = None
    behaviour: str = "ok"  # ok | reject | fail | stall | malformed | no-done | disconnect
    fail_gets: int = 0  # answer this many GETs with 503 first
    get_calls: int = 0
    completion_calls: int = 0
    bodies: list[dict] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def __aenter__(self) -> ScriptedEngine:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/health", self._get(lambda: web.Response(text="")))
        app.router.add_get("/v1/models", self._get(lambda: web.json_response({"object": "list", "data": [{"id": self.model}]})))
        app.router.add_get("/metrics", self._get(lambda: web.Response(text=METRICS)))
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Unauthorized", "code": 401}}, status=401)
        return await handler(request)

    def _get(self, make):  # type: ignore[no-untyped-def]
        async def handler(_: web.Request) -> web.StreamResponse:
            self.get_calls += 1
            if self.get_calls <= self.fail_gets:
                return web.json_response({"error": {"message": "warming up"}}, status=503)
            return make()

        return handler

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.completion_calls += 1
        body = await request.json()
        self.bodies.append(body)
        if self.behaviour == "reject":
            return web.json_response(
                {"error": {"message": f"This model's maximum context length is 4096 tokens. However, you requested "
                                      f"{len(body.get('prompt', []))} tokens.", "type": "BadRequestError", "code": 400}},
                status=400,
            )
        if self.behaviour == "fail":
            return web.Response(status=500, text="Internal Server Error")
        chat = "messages" in body
        prompt_tokens = len(body["prompt"]) if not chat and isinstance(body["prompt"], list) else 7
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.behaviour == "stall":
            await asyncio.sleep(3)
        if self.behaviour == "malformed":
            await resp.write(b"data: {this is not json\n\n")
            return resp
        usage = (body.get("stream_options") or {}).get("continuous_usage_stats")
        for k in range(1, body["max_tokens"] + 1):
            await asyncio.sleep(self.cadence_s)
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
                event["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": k, "total_tokens": prompt_tokens + k}
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        final = {"id": "cmpl-scripted", "object": "text_completion", "created": 0, "model": self.model, "choices": [],
                 "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": body["max_tokens"],
                           "total_tokens": prompt_tokens + body["max_tokens"]}}
        await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        if self.behaviour != "no-done":
            await resp.write(b"data: [DONE]\n\n")
        return resp
