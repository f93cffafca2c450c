"""The live exporter: its lifecycle, the labelling of every probe interval, and publishing.

Two threads (docs/exporter.md draws them): the probe thread (`probes.ProbeLoop`) owns the engine
connections of the probes and of the injected prefills and stamps every token; this module runs
on the caller's loop: it labels every interval with the window maths, decides when to inject,
publishes series and spans, scrapes the engine and writes records (`sys.setswitchinterval` keeps
its GIL holds within ~0.5 ms).

A window is `measure.protocol.run_window`, the coroutine `measure` and `sweep` run, given the
exporter's continuous probes, its quiet-period baseline and a driver that sends from the probe
thread (`exporter.live`); its record is `measure.point.rep_record`'s (`exporter.records`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdexporter.client.client import EngineClient
from pdexporter.client.metrics import MetricsSnapshot
from pdexporter.engines import adapter, chunk_size_advice
from pdexporter.errors import ConfigError, EngineUnreachable, PdexporterError
from pdexporter.exporter.book import ProbeBook
from pdexporter.exporter.config import ExporterConfig
from pdexporter.exporter.live import ContinuousProbes, LoopDriver, ProbeState, QuietBaseline, Stopping
from pdexporter.exporter.metrics import ExporterMetrics, error_kind, grid_labels, publish_window, set_engine_info
from pdexporter.exporter.passive import PassiveEvent
from pdexporter.exporter.passive_live import LivePassive, TraceIntake, thresholds_response
from pdexporter.exporter.probes import ProbeLoop
from pdexporter.exporter.receiver import traces_app
from pdexporter.exporter.records import LiveRecords
from pdexporter.exporter.restarts import EngineRestarts
from pdexporter.exporter.scrape import EngineScraper
from pdexporter.exporter.server import THRESHOLDS_PATH, metrics_app, start_server, tls_context
from pdexporter.exporter.startup import EngineWait, WaitReport, exporter_probes, start_probes
from pdexporter.exporter.tracing import NoTracing, Tracing, make_tracing
from pdexporter.exporter.tracing import preload as tracing_preload
from pdexporter.launch import EngineHandle, Launcher, TraceDirected
from pdexporter.measure.driver import EngineInfo, PreparedRequest
from pdexporter.measure.point import PointSpec, now_iso, window_retryable
from pdexporter.measure.prompts import cold_prompt
from pdexporter.measure.protocol import InterferenceRun, run_window
from pdexporter.measure.records import RepRecord

__all__ = ["ProbeState", "Runner", "WindowResult"]

TICK_S = 0.05  # bookkeeping cadence on the runner's loop
KEEP_WINDOWS = 8  # `Runner.windows` keeps the last ones (each holds its probes' traces: ~0.2 MB at D = 12)
WINDOW_RETRIES, RETRY_AFTER_S = 2, 2.0  # a spoiled window is tried again this often, this soon (`_window_failed`)


@dataclass(frozen=True)
class WindowResult:
    """One analysed window, as the runner published it."""

    run: InterferenceRun
    rep: RepRecord
    record_path: str | None
    mode: str = "active"  # "passive": a production prefill (`event` says how it was attributed)
    event: PassiveEvent | None = None


class Runner:
    """Owns one exporter: engine (via the launcher), probe thread, metrics server, tracing."""

    def __init__(self, config: ExporterConfig, launcher: Launcher, *, api_key: str | None = None,
                 metrics_token: str | None = None, traces_token: str | None = None,
                 metrics: ExporterMetrics | None = None, tracing_factory: Callable[[EngineInfo], Tracing] | None = None,
                 on_window: Callable[[WindowResult], None] | None = None,
                 on_stream: Callable[[ProbeState], None] | None = None, on_inject: Callable[[int], None] | None = None,
                 log: Callable[[str], None] = lambda line: None, decision: dict[str, Any] | None = None) -> None:
        self.config, self.launcher, self.api_key, self.log = config, launcher, api_key, log
        self.decision = decision  # a two-arm decision.json (`--decision`): the live thresholds' other arm
        self.metrics_token, self.traces_token = metrics_token, traces_token
        self.metrics = metrics or ExporterMetrics()
        self._tracing_factory = tracing_factory or (
            lambda info: make_tracing(info, max_tokens=config.protocol.decode_output_tokens))
        self.tracing: Tracing = NoTracing()
        self.on_window, self.on_inject = on_window, on_inject
        self.book = ProbeBook(config, self.metrics, on_stream)
        self.injections_sent = 0
        self.spec = PointSpec(config.chunk_size, config.probe_streams, config.prefill_tokens).validate()
        self.records = LiveRecords(config, self.spec)
        self.handle: EngineHandle | None = None
        self.info: EngineInfo | None = None
        self.probes: ProbeLoop | None = None
        self.driver: LoopDriver | None = None
        self.bound_port: int | None = None
        self.traces_port: int | None = None  # the trace receiver's, when it is served
        # The last windows, for tests and callers; bounded, so a long run's memory stays flat.
        self.windows: collections.deque[WindowResult] = collections.deque(maxlen=KEEP_WINDOWS)
        self.windows_seen = 0
        self._slow_seen: list[tuple[int, int, int]] = []  # (P, D, slow steps) of contradicted windows
        self._lost_seen: BaseException | None = None  # the last probe failure told to the scraper
        self.scraper: EngineScraper | None = None
        self._window_task: asyncio.Task[None] | None = None
        self._next_injection = 0.0
        self._window_started: float | None = None  # when the last window began (monotonic)
        self._next_prefill: tuple[str, PreparedRequest] | None = None
        self._ready_event = asyncio.Event()
        self._in_flight = False
        self._failed_in_row = 0  # windows skipped since the last one analysed
        self.passive: LivePassive | None = None
        self.restarts: EngineRestarts | None = None  # the engine asked again after a restart (`exporter.restarts`)
        self.traces = TraceIntake(self.metrics, max_age_s=config.traces_max_age_s)

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def ready(self) -> asyncio.Event:
        """Set once the server listens and the probes are running (tests wait on it)."""
        return self._ready_event

    def abort_window(self) -> None:
        """Drop the window in flight (a second SIGINT): shutdown then goes on at once."""
        if self._window_task is not None and not self._window_task.done():
            self._window_task.cancel()

    def healthy(self) -> bool:
        return self.book.healthy()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set (or `duration_s` passed), then shut down in order. The
        metrics server listens first; the engine is then waited for (`exporter.startup`)."""
        cfg = self.config
        previous_switch = sys.getswitchinterval()
        sys.setswitchinterval(cfg.switch_interval_s)
        servers: list[Any] = []
        try:
            self.records.check_out_dir()
            await self._serve(servers)
            tracing_preload()  # before the probes: see tracing.preload
            self.handle = handle = await self.launcher.start(cfg.chunk_size)
            started = await start_probes(lambda: exporter_probes(cfg, handle, self.api_key, self.spec),
                                         EngineWait(cfg.engine_wait_s), stop=stop,
                                         on_wait=WaitReport(self.metrics, self.log),
                                         started_timeout_s=cfg.protocol.window_timeout_s)
            if started is None:
                return  # stopped while waiting for the engine
            self.probes, self.info = started
            self.book.probes = self.probes
            self._started()
            await self._loop(stop, deadline=None if cfg.duration_s is None else time.monotonic() + cfg.duration_s)
        finally:
            await self._shutdown(servers)
            sys.setswitchinterval(previous_switch)

    async def _serve(self, servers: list[Any]) -> None:
        """/metrics, and the trace receiver on its own port when asked (docs/security.md)."""
        cfg = self.config
        tls = tls_context(None if cfg.tls_cert_file is None else str(cfg.tls_cert_file),
                          None if cfg.tls_key_file is None else str(cfg.tls_key_file))
        scheme = "https" if tls is not None else "http"
        live = self.decision is not None
        app = metrics_app(self.metrics.registry, title="pdexporter run", healthy=self.healthy, token=self.metrics_token,
                          thresholds=self.thresholds_yaml if live else None,
                          links={THRESHOLDS_PATH: THRESHOLDS_PATH} if live else None)
        try:
            server, self.bound_port = await start_server(app, cfg.listen_host, cfg.listen_port, tls)
        except OSError as exc:
            raise ConfigError(f"--listen {cfg.listen_host}:{cfg.listen_port}: {exc.strerror or exc}") from exc
        servers.append(server)
        self.log(f"metrics on {scheme}://{cfg.listen_host}:{self.bound_port}/metrics"
                 + (" (bearer token required)" if self.metrics_token else ""))
        if not cfg.serves_traces:
            return
        host = cfg.traces_host
        receiver = traces_app(self.traces.sink, on_result=self.traces.exported, token=self.traces_token,
                              engine=lambda: self.info.kind if self.info is not None else None,
                              limits=cfg.receiver_limits, registry=self.metrics.registry)
        try:
            server, self.traces_port = await start_server(receiver, host, cfg.traces_listen_port, tls)
        except OSError as exc:
            raise ConfigError(f"--traces-listen {host}:{cfg.traces_listen_port}: {exc.strerror or exc}") from exc
        servers.append(server)
        self.log(f"OTLP trace receiver on {scheme}://{host}:{self.traces_port}/v1/traces"
                 + (" (bearer token required)" if self.traces_token else ""))
        if self.traces_token is None and not _loopback(host):
            self.log(f"pdexporter: warning: the trace receiver on {host}:{self.traces_port} takes spans from anyone "
                     "who reaches it: set --traces-token-file, or open the port to the engine alone (docs/security.md)")
        if cfg.passive and isinstance(self.launcher, TraceDirected):
            local = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
            env = {}
            if self.traces_token is not None:
                env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = f"Authorization=Bearer%20{self.traces_token}"
            if cfg.tls_cert_file is not None:
                env["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"] = str(cfg.tls_cert_file)
            self.launcher.send_traces_to(f"{scheme}://{local}:{self.traces_port}/v1/traces", env)

    def _settle_engine(self) -> None:
        """Once the engine answered: the chunk size it publishes replaces an assumed one (SGLang's
        /server_info), and D is checked against its budget rule (its adapter, now known)."""
        assert self.info is not None
        cfg = self.config
        if self.info.chunk_size_published and self.info.chunk_size and cfg.chunk_size_source == "assumed":
            cfg = self.config = cfg.model_copy(update={"chunk_size": self.info.chunk_size,
                                                       "chunk_size_source": "published"})
            self.spec = PointSpec(cfg.chunk_size, cfg.probe_streams, cfg.prefill_tokens).validate()
            self.records = LiveRecords(cfg, self.spec)
            self.records.check_out_dir()
        if cfg.engine != self.info.kind:
            self.config = cfg.model_copy(update={"engine": self.info.kind})
        self.spec.check_budget(self.info.kind)

    def _started(self) -> None:
        assert self.probes is not None and self.handle is not None and self.info is not None
        self._settle_engine()
        cfg = self.config
        self.log(f"probe timestamps: {self.probes.stamping}")
        if cfg.passive:
            self.passive = self.traces.passive = LivePassive(cfg, self.info, self.metrics, self.book,
                                                             self.records.store, decision=self.decision)
        self.restarts = EngineRestarts(self.handle, self._engine_info, model=cfg.model, api_key=self.api_key,
                                       chunk_note=lambda: f"{self.config.chunk_size} ({self.config.chunk_size_source})",
                                       log=self.log,
                                       count=self.metrics.engine_restarts.inc,
                                       adopt=self._adopt_chunk_size if cfg.chunk_size_source == "published" else None)
        self.scraper = EngineScraper(EngineClient(self.handle.url, api_key=self.api_key), adapter(self.info.kind),
                                     self.metrics,
                                     cfg.scrape_interval_s, lambda: not self.book.stopping,
                                     on_snapshot=self._passive_scrape if self.passive else None,
                                     on_restart=self._restart_seen, on_back=self._engine_back)
        self.driver = LoopDriver(self.probes, self.scraper.scrape_now, self.book.refresh, self._on_send)
        set_engine_info(self.metrics, self.info.kind, self.info.model, cfg.chunk_size, self.info.modelled,
                        cfg.chunk_size_source)
        if cfg.chunk_size_source == "assumed":
            self.log(f"--chunk-size not given: assuming {cfg.chunk_size}, the {self.info.kind} default (it does not "
                     "publish its own); every window checks it against the probes' cadence")
        elif cfg.chunk_size_source == "published":
            self.log(f"chunk size {cfg.chunk_size}: as the engine publishes it")
        self.tracing = self.book.tracing = self._tracing_factory(self.info)
        self._next_injection = time.monotonic() + (cfg.inject_every_s or 0.0)
        self._ready_event.set()
        if self.info.modelled and self.info.note:
            self.log(self.info.note)

    async def _loop(self, stop: asyncio.Event, deadline: float | None) -> None:
        cfg = self.config
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                stop.set()
            if self.probes is not None and self.probes.fatal is not None:
                raise self.probes.fatal
            if self.restarts is not None and self.restarts.changed is not None:
                raise self.restarts.changed
            if self.passive is not None:
                self._passive_tick()
            self.book.refresh()
            lost = self.book.last_error  # each probe failure once: a failure still held after the engine
            if self.scraper is not None and lost is not None and lost is not self._lost_seen \
                    and error_kind(lost) == "connect":  # answered would ask it again and again
                self._lost_seen = lost
                self.scraper.note_unreachable()
            if stop.is_set():
                break  # _shutdown finishes the window in flight (bounded by drain_timeout_s)
            if self._window_task is not None and self._window_task.done():
                self._window_task.result()  # a bug in the window code must not pass silently
                self._window_task = None
            if self._may_inject(now):
                self._window_task = asyncio.create_task(self._window(), name="pdexporter-window")
            # While a prefill is in flight the window takes its own scrapes, before and after.
            if not self._in_flight and self.scraper is not None:
                self.scraper.tick(now)
            if self._window_task is None and self._next_prefill is None and cfg.injecting:
                self._next_prefill = self._encode_prefill()  # between windows: touches nothing measured
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await stop.wait()

    def _engine_info(self) -> EngineInfo:
        """The engine the windows are recorded under (the restart watch compares a restarted engine with it)."""
        assert self.info is not None
        return self.info

    def _adopt_chunk_size(self, now: EngineInfo) -> str | None:
        """The engine restarted with another chunk size it publishes, and the run took its size from
        it: the windows go on under the new one (records in its `--out` directory, its schedule, the
        `engine_info` series), as a run started now would. In passive mode the tracker and the event
        model start afresh at the new size (`LivePassive.retire`: the old size's model series go; its
        events stay recorded under its own directory). An `--out` the new size's records cannot go to
        ends the run instead."""
        assert self.info is not None and now.chunk_size is not None
        cfg = self.config.model_copy(update={"chunk_size": now.chunk_size})
        spec = PointSpec(cfg.chunk_size, cfg.probe_streams, cfg.prefill_tokens).validate()
        records = LiveRecords(cfg, spec)
        try:
            records.check_out_dir()
        except ConfigError as exc:
            return str(exc)
        self.config, self.spec, self.records = cfg, spec, records
        self.info = dataclasses.replace(self.info, chunk_size=now.chunk_size)
        self._next_prefill = None
        self.metrics.engine_info.clear()  # one engine, one series: the old size's goes
        set_engine_info(self.metrics, self.info.kind, self.info.model, cfg.chunk_size, self.info.modelled,
                        cfg.chunk_size_source)
        if self.passive is not None:
            self.passive.retire()
            self.passive = self.traces.passive = LivePassive(cfg, self.info, self.metrics, self.book,
                                                             self.records.store, decision=self.decision)
        return None

    def _passive_scrape(self, snapshot: MetricsSnapshot, t0_ns: int, t1_ns: int) -> None:
        """A scrape's snapshot for passive mode's brackets (whichever tracker runs now: `_adopt_chunk_size`)."""
        if self.passive is not None:
            self.passive.tracker.add_scrape(snapshot, t0_ns, t1_ns)

    def _restart_seen(self, why: str) -> None:
        """The scraper saw the engine restart: ask it again; the chunk-size evidence starts afresh."""
        assert self.restarts is not None
        self._slow_seen.clear()  # the restarted engine may run another chunk size than the windows so far
        self.restarts.seen(why)

    def _engine_back(self, why: str) -> None:
        """The engine answers again after an outage: ask it again (it may have restarted unseen)."""
        assert self.restarts is not None
        self._slow_seen.clear()
        self.restarts.back(why)

    def _may_inject(self, now: float) -> bool:
        """A window is due: injecting, none in flight, not stopping, the engine not being asked again."""
        return (self.config.injecting and self._window_task is None and not self.book.stopping
                and now >= self._next_injection and not (self.restarts is not None and self.restarts.asking))

    async def _shutdown(self, servers: list[Any]) -> None:
        """Finish the window in flight, stop probes, end and flush spans, stop the engine."""
        self.book.stopping = True
        if self._window_task is not None and not self._window_task.done():
            try:
                async with asyncio.timeout(self.config.drain_timeout_s):
                    await asyncio.shield(self._window_task)
            except (TimeoutError, asyncio.CancelledError):
                self._window_task.cancel()
            except Exception:  # noqa: BLE001 - already counted; shutdown goes on
                pass
        if self.probes is not None:
            await asyncio.to_thread(self.probes.stop)
            self.book.refresh()
        self.book.end_all()
        await asyncio.to_thread(self.tracing.shutdown)
        if self.restarts is not None:
            await self.restarts.aclose()
        if self.scraper is not None:
            await self.scraper.aclose()
        for server in servers:
            await server.cleanup()
        await self.launcher.stop()

    def thresholds_yaml(self) -> tuple[int, str, dict[str, str]]:
        """`GET /thresholds.yaml` (`passive_live.thresholds_response`)."""
        return thresholds_response(self.passive.model if self.passive is not None else None, time.monotonic())

    # --- windows -----------------------------------------------------------------------------

    def _passive_tick(self) -> None:
        """Passive mode (`exporter.passive_live`): the production prefills the probes saw."""
        assert self.passive is not None
        for event, rep, record_path in self.passive.tick(self.scraper, self.windows_seen):
            self._emit(WindowResult(event.run, rep, record_path, mode="passive", event=event))  # type: ignore[arg-type]

    def _emit(self, result: WindowResult) -> None:
        self.windows.append(result)
        self.windows_seen += 1
        if self.on_window is not None:
            self.on_window(result)

    def _encode_prefill(self) -> tuple[str, PreparedRequest]:
        assert self.probes is not None
        salt = str(uuid.uuid4())
        prompt = cold_prompt(self.config.prefill_tokens, salt, self.config.protocol.token_range)
        return salt, self.probes.prepare(prompt, self.config.protocol.prefill_max_tokens, "prefill")

    def _on_send(self, stream: Any) -> None:
        self.injections_sent += 1
        if self.on_inject is not None:
            self.on_inject(self.injections_sent)

    async def _window(self) -> None:
        cfg = self.config
        assert self.driver is not None
        salt, prepared = self._next_prefill or self._encode_prefill()
        self._next_prefill = None
        started_at = now_iso()
        self._window_started = time.monotonic()  # the period runs start to start (`_schedule_next`)
        sent_before = self.driver.sent
        restarts_before = self.restarts.seen_count if self.restarts is not None else 0
        self._in_flight = True  # no periodic scrape from here to the end of the window
        try:
            run = await run_window(self.driver, cfg.probe_streams, cfg.prefill_tokens, cfg.protocol,
                                   ContinuousProbes(self.book), QuietBaseline(self.book), salt=salt,
                                   prepared=prepared, chunk_size=cfg.chunk_size)
        except Stopping:
            return
        except PdexporterError as exc:
            self._window_failed(exc, injected=self.driver.sent > sent_before)
            return
        finally:
            self._in_flight = False
        if self.restarts is not None and self.restarts.seen_count != restarts_before:
            # its own scrapes saw the engine restart: its probes and prefill ran on two engines
            self._window_failed(EngineUnreachable("the engine restarted during the window"), injected=True)
            return
        self._failed_in_row = 0
        self.book.label_window(run)
        self._publish(run, started_at)
        self._check_chunk_size(run)
        self._schedule_next()

    def _check_chunk_size(self, run: InterferenceRun) -> None:
        """The cadence contradicted the chunk size's schedule: say which sizes the windows fit."""
        if run.window.chunk_schedule_check == "contradicted" and run.window.slow_steps is not None:
            self._slow_seen.append((run.new_prefill_tokens, run.decode_batch_size, run.window.slow_steps))
            if self.info is not None:
                self.log(chunk_size_advice(self._slow_seen, self.config.chunk_size, self.config.chunk_size_source,
                                           self.info.kind))

    def _schedule_next(self) -> None:
        """The next window a period after this one started (`--inject-every` is start to start: from
        its end, a 5-s period ran windows ~5.5 s apart), at once if this one took longer."""
        period = self.config.inject_every_s or 0.0
        start = self._window_started if self._window_started is not None else time.monotonic()
        self._next_injection = max(time.monotonic(), start + period)

    def _window_failed(self, exc: BaseException, *, injected: bool) -> None:
        """Count it (`pdexporter_windows_skipped_total{kind}`: why no window came); the held
        intervals are dropped (`ProbeBook.drop_held`). A transient fault is given another window
        soon (`RETRY_AFTER_S`), at most `WINDOW_RETRIES` times in a row, then the next period: one
        spoiled window no longer costs a whole period (the audit's `run` made no window in 36 s)."""
        kind = error_kind(exc)
        self.metrics.errors.labels(kind=kind).inc()
        self.metrics.windows_skipped.labels(kind=kind).inc()
        if injected:
            self.metrics.injections.labels(outcome="error").inc()
        self.book.drop_held(injected=injected)
        self._failed_in_row += 1
        if self._failed_in_row <= WINDOW_RETRIES and window_retryable(exc):
            soon = min(RETRY_AFTER_S, self.config.inject_every_s or RETRY_AFTER_S)  # a shorter period's sooner
            self.log(f"window skipped: {exc}; another in {soon:g} s")
            self._next_injection = time.monotonic() + soon
        else:
            self.log(f"window skipped: {exc}")
            self._failed_in_row = 0
            self._schedule_next()

    def _publish(self, run: InterferenceRun, started_at: str) -> None:
        key = self.spec.key
        record_path, rep = self.records.save(run, started_at, self.windows_seen, self.info)
        publish_window(self.metrics, grid_labels(*key, engine=self.info.kind if self.info else "unknown"), rep)
        self.metrics.injections.labels(outcome="ok").inc()
        ids = {t.request_id for t in run.probes}
        self.tracing.window(run, rep, self.config.chunk_size, self.book.spans_of(ids))
        self.log(f"window {self.windows_seen + 1}: B={key[0]} D={key[1]} P={key[2]} {rep.summary_line()}")
        self._emit(WindowResult(run, rep, record_path))


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
