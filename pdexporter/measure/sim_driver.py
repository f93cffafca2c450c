"""`SimDriver`: the measurement protocol's `EngineDriver`, straight on the embedded engine, no HTTP.

`pdexporter.measure.protocol` and `measure.point.measure_point` run on it unchanged. On the
virtual loop (`pdexporter._internal.vloop.run_virtual`) every `asyncio.sleep`/timeout and every
engine step costs no wall time, so a whole sweep is predicted in seconds; on a normal asyncio loop
the same driver runs in real time. Timestamps are the engine's clock in nanoseconds: a token's
time is its step's deadline, exactly (there is no network in between).

    async with SimDriver.create(profile="h200-qwen3-coder-30b-a3b", chunk_size=8192) as driver:
        record = await measure_point(driver, spec, settings, store)

Everything it produces says it is modelled: `info.modelled` is True, `info.kind` is
"pdexporter-sim" (or, imitating SGLang, "pdexporter-sim-sglang[-mixed]"), and records made
through it carry `config.modelled` and the note.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdexporter._internal.vloop import is_virtual
from pdexporter.client.metrics import MetricsSnapshot, engine_series, snapshot_from_families
from pdexporter.client.stream import Progress, TokenStream
from pdexporter.engines import DEFAULT_ENGINE, SIM_KINDS, IterationStep, adapter, sim_engine
from pdexporter.measure.driver import EngineInfo, PreparedRequest
from pdexporter.sim import engine_version
from pdexporter.sim.engine import EngineConfig, EngineCore, EngineMetrics, LoopClock
from pdexporter.sim.imitation import imitation
from pdexporter.sim.metrics import sim_metrics
from pdexporter.sim.profile import Profile, load_profile
from pdexporter.sim.scheduler import RequestOutput

__all__ = [
    "DEFAULT_PROFILE", "SimDriver",
]

DEFAULT_PROFILE = "h200-qwen3-coder-30b-a3b"


@dataclass
class SimDriver:
    engine: EngineCore
    info: EngineInfo
    metrics: Any = None  # the imitated engine's series (`sim_metrics`), or None
    progress: Progress = field(default_factory=Progress)
    _ids: itertools.count[int] = field(default_factory=itertools.count, repr=False)
    _live: dict[str, TokenStream] = field(default_factory=dict, repr=False)

    @classmethod
    def create(
        cls,
        profile: str | Path | Profile = DEFAULT_PROFILE,
        chunk_size: int | None = None,
        *,
        max_num_seqs: int | None = None,
        metrics: bool = True,
        kv_role: str | None = None,
        imitates: str = DEFAULT_ENGINE,
    ) -> SimDriver:
        """An engine on the running loop's clock (virtual on `vloop`, real otherwise); `kv_role`
        makes it one instance of a P/D pair (`pdexporter.sim.kvconnector`, docs/disaggregation.md);
        `imitates` the engine (setup) whose scheduling, metrics and step log it follows ("vllm",
        "sglang", "sglang-mixed")."""
        prof = profile if isinstance(profile, Profile) else load_profile(profile)
        try:
            clock = LoopClock()
        except RuntimeError as exc:
            raise RuntimeError(
                "SimDriver.create() needs a running event loop: call it inside a coroutine run by "
                "pdexporter._internal.vloop.run_virtual (virtual time) or asyncio.run (real time)"
            ) from exc
        config = EngineConfig.from_profile(prof, max_num_batched_tokens=chunk_size, max_num_seqs=max_num_seqs,
                                           imitates=imitates)
        vmetrics: EngineMetrics | None = (
            sim_metrics(prof, imitates, max_num_batched_tokens=config.max_num_batched_tokens) if metrics else None)
        role = None if kv_role in (None, "none") else kv_role
        engine = EngineCore(prof, clock, config=config, metrics=vmetrics, kv_role=role)
        kind = SIM_KINDS[role] if role else sim_engine(imitates)
        info = EngineInfo(
            kind=kind,
            model=prof.model.name,
            url=None,
            version=engine_version(prof, imitates),
            gpu=prof.gpu.name,
            chunk_size=config.max_num_batched_tokens,
            cuda_graphs=prof.engine.cuda_graphs,
            profile=prof.name,
            modelled=True,
            clock="virtual" if is_virtual(clock.loop) else "monotonic",
            max_model_len=prof.engine.max_model_len,
            command=(*imitation(imitates).command(prof.name),
                     *adapter(kind).chunk_size_flags(config.max_num_batched_tokens),
                     *(("--kv-role", role) if role else ())),
        )
        return cls(engine, info, vmetrics)

    async def __aenter__(self) -> SimDriver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- EngineDriver ---------------------------------------------------------------------

    def now_ns(self) -> int:
        return round(self.engine.clock.now() * 1e9)

    def prepare(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str) -> PreparedRequest:
        ids = prompt_token_ids if isinstance(prompt_token_ids, tuple) else tuple(int(i) for i in prompt_token_ids)
        return PreparedRequest(tag=tag, prompt_token_ids=ids, max_tokens=max_tokens)

    def start(self, prepared: PreparedRequest, *, retry_connect: bool = False) -> TokenStream:
        stream = TokenStream(f"{prepared.tag}-{next(self._ids)}", prepared.tag, on_update=self.progress.notify,
                             max_tokens=prepared.max_tokens)
        self._start_into(prepared, stream)
        return stream

    def _start_into(self, prepared: PreparedRequest, stream: TokenStream,
                    ended: asyncio.Future[None] | None = None) -> None:
        rid = stream.request_id
        stream.mark_sent(self.now_ns())
        prompt_tokens = len(prepared.prompt_token_ids)

        def sink(out: RequestOutput, t: float) -> None:
            t_ns = round(t * 1e9)
            if stream.prompt_tokens is None:
                stream.prompt_tokens = prompt_tokens
            stream.record(t_ns, len(out.new_token_ids))
            if out.finish_reason is not None:
                self._live.pop(rid, None)
                stream.finish(t_ns, out.finish_reason, prompt_tokens)
                if ended is not None and not ended.done():
                    ended.set_result(None)

        self._live[rid] = stream
        self.engine.add_request(rid, prepared.prompt_token_ids, prepared.max_tokens, sink,
                                kv_transfer_params=prepared.kv_transfer_params)

    # -- one instance of a P/D pair (`measure.pd.PdEndpoint`), in-process ---------------------

    def prepare_routed(self, prompt_token_ids: Sequence[int], max_tokens: int, tag: str, *, stream: bool = True,
                       kv_transfer_params: dict[str, Any] | None = None,
                       headers: Sequence[tuple[str, str]] = ()) -> PreparedRequest:
        ids = prompt_token_ids if isinstance(prompt_token_ids, tuple) else tuple(int(i) for i in prompt_token_ids)
        return PreparedRequest(tag=tag, prompt_token_ids=ids, max_tokens=max_tokens, headers=tuple(headers),
                               stream=stream, kv_transfer_params=kv_transfer_params)

    async def complete(self, prepared: PreparedRequest) -> tuple[dict[str, Any], int, int]:
        """The request run to its end; the answer a vLLM server gives for it (usage and the
        connector's kv_transfer_params), and when it was sent and finished."""
        done: asyncio.Future[RequestOutput] = asyncio.get_running_loop().create_future()
        rid = f"{prepared.tag}-{next(self._ids)}"
        tokens: list[int] = []

        def sink(out: RequestOutput, t: float) -> None:
            tokens.extend(out.new_token_ids)
            if out.finish_reason is not None and not done.done():
                done.set_result(out)

        t_sent = self.now_ns()
        self.engine.add_request(rid, prepared.prompt_token_ids, prepared.max_tokens, sink,
                                kv_transfer_params=prepared.kv_transfer_params)
        try:
            out = await done
        finally:
            if not done.done():
                self.engine.abort_request(rid)
        n_in = len(prepared.prompt_token_ids)
        answer = {"id": rid, "object": "text_completion", "kv_transfer_params": out.kv_transfer_params,
                  "usage": {"prompt_tokens": n_in, "completion_tokens": len(tokens),
                            "total_tokens": n_in + len(tokens)},
                  "choices": [{"index": 0, "finish_reason": out.finish_reason}]}
        return answer, t_sent, self.now_ns()

    async def send_into(self, prepared: PreparedRequest, stream: TokenStream, *,
                        retry_connect: bool = False) -> TokenStream:
        """Stream the request into `stream` and return when it ends."""
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._start_into(prepared, stream, ended)
        try:
            await ended
        except asyncio.CancelledError:
            self.engine.abort_request(stream.request_id)
            self._live.pop(stream.request_id, None)
            raise
        return stream

    async def scrape_metrics(self) -> MetricsSnapshot | None:
        if self.metrics is None:
            return None
        # The families pdexporter reads, straight from the registry: what parse_exposition would make
        # of the rendered text, without rendering and re-parsing it (a sweep scrapes ~2000 times).
        rules = adapter(self.info.kind)
        return snapshot_from_families(self.metrics.collect(engine_series(rules)), rules, t_ns=self.now_ns(),
                                      source="embedded engine")

    def step_mark(self) -> object | None:
        return self.engine.history.mark()

    def steps_since(self, mark: object | None) -> list[IterationStep] | None:
        if not isinstance(mark, int):
            return None
        return [s.to_iteration_step() for s in self.engine.history.since(mark)]

    async def cancel(self, streams: Sequence[TokenStream]) -> None:
        """End these streams now, as a client going away does (`measure.driver.Cancelling`)."""
        now = self.now_ns()
        for stream in streams:
            if self._live.pop(stream.request_id, None) is not None:
                self.engine.abort_request(stream.request_id)
            if not stream.done:
                stream.finish(now, "abort")

    async def aclose(self) -> None:
        """Abort what is still running (like clients going away) and stop the engine."""
        now = self.now_ns()
        for rid, stream in list(self._live.items()):
            self.engine.abort_request(rid)
            stream.finish(now, "abort")
        self._live.clear()
        self.engine.shutdown()

    # -- what the model says ----------------------------------------------------------------

    def modelled_decode_step_ms(self, d: int, context: int) -> float:
        return self.engine.modelled_decode_step_s(d, context) * 1e3
