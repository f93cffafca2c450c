"""The exporter's scrapes of the engine's /metrics: periodic (engine gauges), and the two a window
takes around its prefill (never overlapping a periodic one)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pdexporter.client.client import EngineClient
from pdexporter.client.metrics import MetricRules, MetricsSnapshot, engine_restarted
from pdexporter.errors import EngineError, EngineUnreachable
from pdexporter.exporter.metrics import ExporterMetrics, error_kind

__all__ = [
    "EngineScraper",
]


class EngineScraper:
    def __init__(self, client: EngineClient, rules: MetricRules, metrics: ExporterMetrics, interval_s: float,
                 count_errors: Callable[[], bool],
                 on_snapshot: Callable[[MetricsSnapshot, int, int], None] | None = None,
                 on_restart: Callable[[str], None] | None = None,
                 on_back: Callable[[str], None] | None = None) -> None:
        self.client = client
        self.rules = rules  # the engine's adapter: its /metrics names
        self.on_snapshot = on_snapshot  # (snapshot, perf_counter_ns before, after): passive mode's brackets
        self.metrics = metrics
        self.interval_s = interval_s
        self.count_errors = count_errors  # False while shutting down
        self._task: asyncio.Task[MetricsSnapshot | None] | None = None
        self._next = 0.0
        self.on_restart = on_restart  # (why): the engine restarted between two scrapes (`engine_restarted`)
        # (why): it answers again after a scrape could not reach it; a restart whose evidence the
        # counters do not keep (a young process's counters overtaken by the new one's, no start time)
        self.on_back = on_back
        self._last: MetricsSnapshot | None = None
        self._unreachable = False

    def note_unreachable(self) -> None:
        """The probes lost the engine (refused, or a connection lost): the next scrape that answers
        is an engine back after an outage (`on_back`), even where no scrape fell inside it."""
        self._unreachable = True

    def tick(self, now: float) -> None:
        """Start a periodic scrape when one is due and none runs."""
        if now >= self._next and (self._task is None or self._task.done()):
            self._next = now + self.interval_s
            self._task = asyncio.create_task(self.scrape())

    def trigger(self) -> None:
        """Scrape now unless a scrape is running (passive mode asks for one around a slow run)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.scrape())

    async def scrape(self) -> MetricsSnapshot | None:
        t0_ns = time.perf_counter_ns()
        t0 = time.perf_counter()
        try:
            snapshot = await self.client.scrape_metrics(self.rules, retry=False)
        except EngineError as exc:
            self._unreachable = self._unreachable or isinstance(exc, EngineUnreachable)
            self.metrics.engine_scrape_ok.set(0)
            self.metrics.engine_scrape_seconds.set(time.perf_counter() - t0)
            if self.count_errors():
                self.metrics.errors.labels(kind=error_kind(exc)).inc()
            return None
        self.metrics.engine_scrape_seconds.set(time.perf_counter() - t0)
        self.metrics.engine_scrape_ok.set(1)
        if self.on_snapshot is not None:
            self.on_snapshot(snapshot, t0_ns, time.perf_counter_ns())
        why = None if self._last is None else engine_restarted(self._last, snapshot)
        self._last, back, self._unreachable = snapshot, self._unreachable, False
        if why is not None and self.on_restart is not None:
            self.on_restart(why)
        elif back and self.on_back is not None:
            self.on_back("its /metrics answers again after it could not be reached")
        for gauge, name in ((self.metrics.engine_running, "num_requests_running"),
                            (self.metrics.engine_waiting, "num_requests_waiting"),
                            (self.metrics.engine_kv, "kv_cache_usage_perc")):
            value = snapshot.get(name)
            if value is not None:
                gauge.set(value)
        return snapshot

    async def scrape_now(self) -> MetricsSnapshot | None:
        """A window's scrape: after the periodic one in progress, if any."""
        if self._task is not None and not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)
        return await self.scrape()

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        await self.client.aclose()
