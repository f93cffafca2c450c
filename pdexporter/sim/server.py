"""vLLM's OpenAI-compatible HTTP API in front of the embedded engine (aiohttp, real time).

Endpoints as vLLM 0.22 serves them: POST /v1/completions and /v1/chat/completions (streaming in
vLLM's SSE shape, or one JSON answer), GET /v1/models, POST /tokenize and /detokenize, GET /health,
/version and /metrics. A client written for vLLM (the `openai` package, raw aiohttp) works
unchanged; a client that disconnects aborts its request in the engine, as vLLM does.

SSE shape (fixtures/vllm-0.22/sse-completions.txt): one `data: {json}\\n\\n` event per engine
step that produced tokens for the request (several steps' tokens in one event when the writer
fell behind, as vLLM's output collector merges them), `stream_options.include_usage` adds a final
`choices: []` event with usage, `continuous_usage_stats` puts usage on every event, then
`data: [DONE]`. Chat streams open with a role-only delta (`{"role":"assistant","content":""}`).

Every answer says it is modelled without breaking vLLM clients: an `x-pdexporter-modelled: true`
header, `system_fingerprint` naming the embedded engine and profile, and /version returning
vLLM's version with a `+pdexporter.sim` local label plus `"modelled": true`.

Send stamps (opt-in, for measuring client stamps; tests/benchmarks/bench_stamps.py): a streaming
request with the header `x-pdexporter-send-stamps: 1` gets, before every event, SSE comment lines
`: pdexporter-sent-ns=<perf_counter_ns>`, taken just before the write that sends the event, and,
from the second write on, `: pdexporter-prev-written-ns=<perf_counter_ns>`, taken just after the
previous write returned: together they bracket each write. They are CLOCK_MONOTONIC, comparable
with a client's `perf_counter_ns` on the same host. SSE clients ignore comments; without the header
the stream is byte for byte what vLLM sends.

Imitating SGLang (`sim serve --engine sglang [--enable-mixed-chunk]`): no /version (SGLang has
none); `GET /server_info` (and the deprecated `/get_server_info`) answers SGLang's server
arguments that pdexporter reads (`chunked_prefill_size`, `enable_mixed_chunk`,
`decode_log_interval`, `enable_metrics`, `disable_radix_cache`, ...) with its version and
`"modelled": true`; /metrics serves `sglang:*` series, and only with `--enable-metrics`, as SGLang
does; the step log is SGLang's `Prefill batch` / `Decode batch` lines, a decode step every
`--decode-log-interval` (default 40, as SGLang's).

P/D disaggregation (`--kv-role`, docs/disaggregation.md): a request's `kv_transfer_params` reach
the engine's connector; a non-streaming answer carries the connector's `kv_transfer_params` at
the top level (`CompletionResponse.kv_transfer_params`; streaming chunks have no such field, as
in vLLM); /version names the role (`"kv_role"`), so pdexporter knows which arm it measures. The
prefill role names its side channel from `VLLM_NIXL_SIDE_CHANNEL_HOST`/`_PORT`, as vLLM does.
An `X-Request-Id` header becomes the request id (`cmpl-<id>`), as in vLLM.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from pdexporter import __version__
from pdexporter.engines import SIM_KINDS, sim_engine
from pdexporter.errors import ConfigError
from pdexporter.sim import ENGINE_KIND, engine_version
from pdexporter.sim.engine import EngineCore, StepLines
from pdexporter.sim.episodes import HostEpisodes
from pdexporter.sim.imitation import DEFAULT_IMITATION, imitation
from pdexporter.sim.profile import Profile
from pdexporter.sim.scheduler import RequestOutput
from pdexporter.sim.tokenizer import WordTokenizer

__all__ = [
    "ApiError", "MODELLED_HEADER", "SEND_STAMPS_HEADER", "SERVED_HISTORY_STEPS", "ServeOptions", "SimServer",
    "cache_config_labels", "precise_event_loop", "run_server", "send_stamps", "sent_ns",
]

MODELLED_HEADER = "x-pdexporter-modelled"
SEND_STAMPS_HEADER = "x-pdexporter-send-stamps"
SENT_KEY, PREV_WRITTEN_KEY = "pdexporter-sent-ns", "pdexporter-prev-written-ns"
SERVED_HISTORY_STEPS = 4096  # `EngineCore.history` of a served engine (run_server)


def send_stamps(comment: str | None) -> dict[str, int]:
    """The engine's send stamps in an event's SSE comment (`SSEEvent.comment`), by key."""
    stamps: dict[str, int] = {}
    for line in (comment or "").split("\n"):
        key, sep, value = line.partition("=")
        if sep and key in (SENT_KEY, PREV_WRITTEN_KEY) and value.isdigit():
            stamps[key] = int(value)
    return stamps


def sent_ns(comment: str | None) -> int | None:
    """When the engine started the write that sent this event, if it said so."""
    return send_stamps(comment).get(SENT_KEY)


class _SendStamper:
    """Prefixes each event of a write with the send-stamp comments (module docs), when asked for."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self._written: int | None = None

    async def write(self, response: web.StreamResponse, events: list[bytes]) -> None:
        if self.on:  # stamped last, just before the write
            stamp = f": {SENT_KEY}={time.perf_counter_ns()}\n"
            if self._written is not None:
                stamp += f": {PREV_WRITTEN_KEY}={self._written}\n"
            prefix = stamp.encode()
            await response.write(b"".join(prefix + e for e in events))
            self._written = time.perf_counter_ns()
        else:
            await response.write(b"".join(events))
_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _json_response(body: Any, status: int = 200) -> web.Response:
    """Compact JSON, as vLLM's FastAPI responses are."""
    return web.Response(text=_DUMPS(body), status=status, content_type="application/json")


class ApiError(Exception):
    """An error answered in vLLM's JSON shape: {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.TYPES.get(self.status, "BadRequestError"),
                          "param": self.param, "code": self.status}}
        return _json_response(body, status=self.status)


@dataclass
class _Params:
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    model: str
    kv_transfer_params: dict | None = None


class SimServer:
    """The aiohttp application around one `EngineCore`."""

    def __init__(self, engine: EngineCore, profile: Profile, metrics: Any, options: ServeOptions | None = None) -> None:
        self.engine = engine
        self.profile = profile
        self.metrics = metrics
        self.options = options or ServeOptions()
        self.imitates = engine.config.imitates
        self.imitation = imitation(self.imitates)
        self.model_name = profile.model.name
        self.max_model_len = profile.engine.max_model_len
        self.tokenizer = WordTokenizer(profile.model.vocab_size)
        self.fingerprint = f"{ENGINE_KIND}-{__version__}-{profile.name}"
        self.version = engine_version(profile, self.imitates)
        self.kind = SIM_KINDS[engine.kv_role] if engine.kv_role else sim_engine(self.imitates)
        self.created = int(time.time())
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            try:
                collector(registry=metrics.registry)
            except ValueError:  # already registered
                pass

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/health", self.health)
        for path in self.imitation.identity_routes:  # SGLang: no /version; its server arguments say who it is
            app.router.add_get(path, self.version_info if path == "/version" else self.server_info)
        if self.imitation.metrics_always or self.options.enable_metrics:
            app.router.add_get("/metrics", self.metrics_text)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        try:
            response = await handler(request)
        except ApiError as exc:
            response = exc.response()
        except web.HTTPException as exc:
            if exc.status == 404:
                response = ApiError(f"Not Found: {request.path}", 404).response()
            elif exc.status == 405:
                response = ApiError(f"Method Not Allowed: {request.method} {request.path}", 405).response()
            else:
                raise
        if not response.prepared:
            response.headers[MODELLED_HEADER] = "true"
        return response

    # -- small endpoints --------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version_info(self, request: web.Request) -> web.Response:
        return _json_response({
            "version": self.version,
            "engine": ENGINE_KIND,
            "kv_role": self.engine.kv_role,
            "modelled": True,
            "profile": self.profile.name,
            "gpu": self.profile.gpu.name,
            "calibration": self.profile.calibration,
            "pdexporter_version": __version__,
        })

    async def server_info(self, request: web.Request) -> web.Response:
        """SGLang's /server_info: the server arguments pdexporter reads (engines.sglang), its version."""
        e = self.profile.engine
        config = self.engine.config
        return _json_response({
            "model_path": self.model_name,
            "served_model_name": self.model_name,
            "chunked_prefill_size": config.max_num_batched_tokens,
            "enable_mixed_chunk": self.imitation.mixed_chunk,
            "decode_log_interval": self.options.decode_log_interval,
            "enable_metrics": self.options.enable_metrics,
            "disable_radix_cache": not e.enable_prefix_caching,
            "max_running_requests": config.max_num_seqs,
            "context_length": self.max_model_len,
            "page_size": 1,
            "disable_overlap_schedule": False,
            "max_total_num_tokens": e.kv_capacity_tokens,
            "version": self.version,
            "engine": self.kind,
            "modelled": True,
            "profile": self.profile.name,
            "gpu": self.profile.gpu.name,
            "calibration": self.profile.calibration,
            "pdexporter_version": __version__,
        })

    async def models(self, request: web.Request) -> web.Response:
        return _json_response({"object": "list", "data": [{
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": self.imitation.owned_by,
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission", "created": self.created,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        }]})

    async def metrics_text(self, request: web.Request) -> web.Response:
        body = await self._off_loop(generate_latest, self.metrics.registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self._check_model(body)
        if "messages" in body:
            ids = self.tokenizer.encode(self.tokenizer.apply_chat_template(self._messages(body)))
        else:
            ids = self._prompt_ids(body.get("prompt"))
        return _json_response({
            "count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
            "token_strs": self.tokenizer.token_strs(ids) if body.get("return_token_strs") else None,
        })

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self._check_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ApiError("'tokens' must be a list of token ids", param="tokens")
        return _json_response({"prompt": self.tokenizer.decode(tokens).lstrip()})

    # -- request parsing ----------------------------------------------------------------------

    async def _json(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = await self._off_loop(json.loads, raw) if len(raw) >= 16_384 else json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(f"Invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError("The request body must be a JSON object")
        return body

    @staticmethod
    async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
        """Run CPU work (parsing a 32K-id body, rendering /metrics) in a worker thread.

        vLLM does that work in its API server while the engine core, another process, keeps
        stepping. Here both share one process; on the event loop, several ms of parsing would delay
        the next step's tokens and show up in the probes as a slow step the model does not have. In
        a thread, with the short GIL switch interval `run_server` sets, the loop takes the GIL back
        within a fraction of a millisecond when a step's deadline comes.
        """
        return await asyncio.to_thread(fn, *args)

    def _check_model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if model is None:
            return self.model_name
        if model != self.model_name:
            raise ApiError(f"The model `{model}` does not exist.", 404, "model")
        return model

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and set(map(type, prompt)) == {int}:
            ids = prompt
            lo, hi = min(ids), max(ids)
            if lo < 0 or hi >= self.profile.model.vocab_size:
                bad = lo if lo < 0 else hi
                raise ApiError(f"Token id {bad} is out of vocabulary (size {self.profile.model.vocab_size})",
                               param="prompt")
        elif isinstance(prompt, list):
            raise ApiError("pdexporter's embedded engine serves one prompt per request; send a string or one "
                           "list of token ids", param="prompt")
        else:
            raise ApiError("'prompt' must be a string or a list of token ids", param="prompt")
        if not ids:
            raise ApiError("The prompt is empty", param="prompt")
        return ids

    def _messages(self, body: dict[str, Any]) -> list[Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError("'messages' must be a non-empty list", param="messages")
        return messages

    def _params(self, body: dict[str, Any], prompt_ids: list[int], *, chat: bool) -> _Params:
        model = self._check_model(body)
        if body.get("n", 1) not in (1, None):
            raise ApiError("pdexporter's embedded engine supports n=1 only", param="n")
        if body.get("logprobs") not in (None, False) or body.get("echo"):
            raise ApiError("logprobs and echo are not modelled by pdexporter's embedded engine", param="logprobs")
        stream = bool(body.get("stream", False))
        options = body.get("stream_options")
        if options is not None and not stream:
            raise ApiError("Stream options can only be defined when `stream=True`.", param="stream_options")
        options = options or {}
        raw_max = body.get("max_completion_tokens") if chat and body.get("max_completion_tokens") is not None \
            else body.get("max_tokens")
        n_in = len(prompt_ids)
        if n_in >= self.max_model_len:
            raise ApiError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request has "
                f"{n_in} input tokens. Please reduce the length of the input messages.", param="input_tokens")
        if raw_max is None:
            max_tokens = self.max_model_len - n_in
        else:
            if not isinstance(raw_max, int) or isinstance(raw_max, bool) or raw_max < 1:
                raise ApiError(f"max_tokens must be at least 1, got {raw_max}.", param="max_tokens")
            max_tokens = raw_max
            if max_tokens > self.max_model_len - n_in:
                raise ApiError(
                    f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                    f"context length is {self.max_model_len} tokens and your request has {n_in} input tokens "
                    f"({max_tokens} > {self.max_model_len} - {n_in}).", param="max_tokens")
        # vLLM's should_include_usage: continuous usage only rides along with include_usage
        include_usage = bool(options.get("include_usage"))
        kv_params = body.get("kv_transfer_params")
        if kv_params is not None:
            from pdexporter.sim.kvconnector import KvParamsError, check_decode_params

            try:
                check_decode_params(kv_params)
            except KvParamsError as exc:
                raise ApiError(str(exc), param="kv_transfer_params") from None
            if kv_params.get("do_remote_prefill") and self.engine.kv_role != "decode":
                raise ApiError(f"kv_transfer_params.do_remote_prefill needs a decode instance; this engine's KV role "
                               f"is {self.engine.kv_role or 'none'}", param="kv_transfer_params")
        return _Params(prompt_ids, max_tokens, stream, include_usage,
                       include_usage and bool(options.get("continuous_usage_stats")), model, kv_params)

    # -- generation -----------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        self._check_model(body)
        prompt = body.get("prompt")
        big = isinstance(prompt, list) and len(prompt) > 2048
        ids = await self._off_loop(self._prompt_ids, prompt) if big else self._prompt_ids(prompt)
        params = self._params(body, ids, chat=False)
        return await self._generate(request, params, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        self._check_model(body)
        text = self.tokenizer.apply_chat_template(self._messages(body))
        ids = self.tokenizer.encode(text)
        if not ids:
            raise ApiError("The rendered chat prompt is empty", param="messages")
        return await self._generate(request, self._params(body, ids, chat=True), chat=True)

    async def _generate(self, request: web.Request, params: _Params, *, chat: bool) -> web.StreamResponse:
        given = request.headers.get("X-Request-Id")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{given or uuid.uuid4().hex[:16]}"
        engine_rid = f"{rid}-0" if not given else f"{rid}-0-{uuid.uuid4().hex[:8]}"
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.engine.add_request(engine_rid, params.prompt_ids, params.max_tokens,
                                lambda out, t: queue.put_nowait(out), kv_transfer_params=params.kv_transfer_params)
        finished = False
        try:
            if params.stream:
                response = await self._stream(request, rid, params, queue, chat)
            else:
                response = await self._collect(rid, params, queue, chat)
            finished = True
            return response
        finally:
            if not finished:
                self.engine.abort_request(engine_rid)  # the client went away (or we failed): free the slot

    async def _next(self, queue: asyncio.Queue[RequestOutput]) -> tuple[list[int], str | None]:
        """Tokens that arrived since the last read, merged (vLLM's output collector does the same)."""
        tokens, reason, _ = await self._next_output(queue)
        return tokens, reason

    @staticmethod
    async def _next_output(queue: asyncio.Queue[RequestOutput]) -> tuple[list[int], str | None, dict | None]:
        out = await queue.get()
        tokens = list(out.new_token_ids)
        reason = out.finish_reason
        while reason is None and not queue.empty():
            out = queue.get_nowait()
            tokens.extend(out.new_token_ids)
            reason = out.finish_reason
        return tokens, reason, out.kv_transfer_params

    async def _collect(self, rid: str, params: _Params, queue: asyncio.Queue[RequestOutput],
                       chat: bool) -> web.Response:
        tokens: list[int] = []
        reason = None
        kv_params = None
        while reason is None:
            new, reason, kv_params = await self._next_output(queue)
            tokens.extend(new)
        text = self.tokenizer.decode(tokens)
        n_in = len(params.prompt_ids)
        usage = {"prompt_tokens": n_in, "total_tokens": n_in + len(tokens), "completion_tokens": len(tokens),
                 "prompt_tokens_details": None}
        created = int(time.time())
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                              "annotations": None, "audio": None, "function_call": None,
                                              "tool_calls": [], "reasoning_content": None},
                      "logprobs": None, "finish_reason": reason, "stop_reason": None}
            body = {"id": rid, "object": "chat.completion", "created": created, "model": params.model,
                    "choices": [choice], "service_tier": None, "system_fingerprint": self.fingerprint,
                    "usage": usage, "prompt_logprobs": None, "kv_transfer_params": kv_params}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                      "prompt_logprobs": None, "prompt_token_ids": None, "token_ids": None}
            body = {"id": rid, "object": "text_completion", "created": created, "model": params.model,
                    "choices": [choice], "service_tier": None, "system_fingerprint": self.fingerprint,
                    "usage": usage, "kv_transfer_params": kv_params}
        return _json_response(body)

    async def _stream(self, request: web.Request, rid: str, params: _Params,
                      queue: asyncio.Queue[RequestOutput], chat: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
            MODELLED_HEADER: "true",
        })
        await response.prepare(request)
        created = int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": params.model}
        n_in = len(params.prompt_ids)
        produced = 0
        reason = None
        first = True
        stamper = _SendStamper(request.headers.get(SEND_STAMPS_HEADER, "") in ("1", "true"))
        while reason is None:
            tokens, reason = await self._next(queue)
            produced += len(tokens)
            text = self.tokenizer.decode(tokens)
            events = []
            if chat:
                if first:
                    role: dict[str, Any] = {
                        **head,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                    if params.continuous_usage:
                        role["usage"] = {"prompt_tokens": n_in, "total_tokens": n_in, "completion_tokens": 0}
                    events.append(role)
                choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None,
                                          "finish_reason": reason}
                if reason is not None:
                    choice["stop_reason"] = None
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                          "prompt_token_ids": None, "token_ids": None}
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if params.continuous_usage:
                chunk["usage"] = {"prompt_tokens": n_in, "total_tokens": n_in + produced, "completion_tokens": produced}
            if reason is not None and not params.include_usage:
                chunk["system_fingerprint"] = self.fingerprint
            events.append(chunk)
            first = False
            await stamper.write(response, [b"data: " + _DUMPS(e).encode() + b"\n\n" for e in events])
        tail = []
        if params.include_usage:
            final: dict[str, Any] = {
                **head,
                "choices": [],
                "usage": {"prompt_tokens": n_in, "total_tokens": n_in + produced, "completion_tokens": produced},
                "system_fingerprint": self.fingerprint,
            }
            tail.append(b"data: " + _DUMPS(final).encode() + b"\n\n")
        await stamper.write(response, [*tail, b"data: [DONE]\n\n"])
        await response.write_eof()
        return response


def cache_config_labels(profile: Profile) -> dict[str, str]:
    """vllm:cache_config_info's labels (those of a real 0.22 exposition), with this profile's values."""
    e = profile.engine
    return {
        "_block_size_resolved": "True", "block_size": str(e.block_size), "cache_dtype": "auto",
        "calculate_kv_scales": "False", "enable_prefix_caching": str(e.enable_prefix_caching),
        "gpu_memory_utilization": str(e.gpu_memory_utilization), "hash_block_size": "None",
        "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]", "kv_cache_memory_bytes": "None",
        "kv_offloading_backend": "native", "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "None",
        "num_gpu_blocks": str(e.num_gpu_blocks), "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256", "sliding_window": "None", "user_specified_block_size": "False",
        "user_specified_mamba_block_size": "False",
    }


def precise_event_loop() -> asyncio.AbstractEventLoop:
    """An asyncio loop whose timers fire within ~0.1 ms: real-time step deadlines need it.

    asyncio's default epoll selector rounds every wait up to a whole millisecond, which makes a
    6.5 ms step alternate between ~6 and ~7 ms as seen by a client (p50 off by 3 %). select(2)
    takes microseconds; a server with a few dozen sockets loses nothing by using it.
    """
    import selectors

    return asyncio.SelectorEventLoop(selectors.SelectSelector())


@dataclass
class ServeOptions:
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    long_prefill_token_threshold: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    kv_role: str | None = None  # "decode-bench" | "decode" | "prefill" (docs/disaggregation.md)
    otlp_traces_endpoint: str | None = None  # vLLM's --otlp-traces-endpoint (sim.otlp)
    imitates: str = DEFAULT_IMITATION  # `imitation.IMITATIONS` (`sim serve --engine [--enable-mixed-chunk]`)
    decode_log_interval: int = 1  # SGLang's --decode-log-interval: a Decode batch line every N decode steps
    enable_metrics: bool = True  # SGLang's --enable-metrics (vLLM always serves /metrics)
    host_episodes: bool = False  # `--host-speed switching`: slow-host episodes in time (`sim.episodes`)


async def run_server(
    profile: Profile,
    options: ServeOptions,
    *,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    log: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until `stop` is set (the CLI sets it on SIGTERM/SIGINT), then shut down cleanly."""
    import os
    import signal

    from pdexporter.sim.engine import EngineConfig, LoopClock

    loop = asyncio.get_running_loop()
    # Worker threads (request parsing, /metrics) must hand the GIL back quickly when a step's
    # deadline fires on the loop thread: 0.2 ms instead of CPython's default 5 ms.
    sys.setswitchinterval(2e-4)
    from pdexporter.sim.metrics import sim_metrics

    config = EngineConfig.from_profile(
        profile, max_num_batched_tokens=options.max_num_batched_tokens, max_num_seqs=options.max_num_seqs,
        long_prefill_token_threshold=options.long_prefill_token_threshold, imitates=options.imitates,
    )
    metrics = sim_metrics(profile, options.imitates, max_num_batched_tokens=config.max_num_batched_tokens,
                          cache_config=cache_config_labels(profile), decode_log_interval=options.decode_log_interval)
    connector = None
    if options.kv_role == "prefill":
        from pdexporter.sim.kvconnector import NixlPrefillConnector

        side_port = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")
        connector = NixlPrefillConnector(host=os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
                                         port=int(side_port) if side_port.isdigit() else 5600)
    # Clients of a served engine read its steps from the log; in memory it keeps a few thousand
    # (the default 200,000 were ~50 MB reached after ~40 min at D = 12: issue 13's 2.7 MB/min).
    # `--host-speed switching`: the nominal host's steps and the slow one's, by the episodes in time
    episodes = HostEpisodes(profile.host.slow_fraction) if options.host_episodes else None
    engine = EngineCore(profile, LoopClock(loop), config=config, metrics=metrics, log=log, kv_role=options.kv_role,
                        connector=connector, history_limit=SERVED_HISTORY_STEPS, host_episodes=episodes,
                        step_lines=StepLines.of(options.imitates, options.decode_log_interval))
    spans = None
    if options.otlp_traces_endpoint:
        from pdexporter.sim.otlp import RequestSpans

        spans = RequestSpans(options.otlp_traces_endpoint, engine=sim_engine(options.imitates))
        engine.on_request_finished = spans
    server = SimServer(engine, profile, metrics, options)
    # On SIGTERM the streams in flight are cut after a second (vLLM aborts its requests), not
    # waited for: aiohttp's default (60 s) kept a stopping engine alive for two minutes.
    from pdexporter._internal.httplog import quiet_malformed_requests

    quiet_malformed_requests()  # a malformed request: aiohttp's 400, no traceback on stderr
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        # a setting of this machine (the port taken, an address it does not have), as `run --listen`'s
        raise ConfigError(f"--port {options.port}: cannot listen on {options.host}:{options.port} "
                          f"({exc.strerror or exc})") from exc
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
            pass
    try:
        sockets = site._server.sockets if site._server is not None else ()  # type: ignore[attr-defined]  # an asyncio.Server
        port = sockets[0].getsockname()[1] if sockets else options.port
        host = "127.0.0.1" if options.host in ("0.0.0.0", "", "::") else options.host
        info = {
            "url": f"http://{host}:{port}",
            "gpu": profile.gpu.name,
            "version": server.version,
            "cuda_graphs": profile.engine.cuda_graphs,
            "pid": os.getpid(),
            "engine": server.kind,
            "modelled": True,
            "profile": profile.name,
            "model": profile.model.name,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "calibration": profile.calibration,
            "kv_role": engine.kv_role,
        }
        if on_ready is not None:
            on_ready(info)
        await stop.wait()
    finally:
        engine.shutdown()
        await runner.cleanup()
        if spans is not None:
            await asyncio.to_thread(spans.shutdown)
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError):
                pass
