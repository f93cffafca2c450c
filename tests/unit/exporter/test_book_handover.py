"""`pdexporter_up` across probe hand-overs (exporter.book): a probe that ended well is replaced
within `RESTART_GRACE_S`; a scrape that falls in the gap must still read up 1 "ok". It read 0
"probes-restarting" in CI once (a SIGTERM test scraped right after a window, as a probe ended), and a
production alert on `pdexporter_up == 0` would have flapped the same way at every hand-over.

The probe thread is replaced by `FakeProbeLoop`, a test double holding only what the book reads
(its event queue, its stamp sensor, its health): the book's logic is pure bookkeeping over it.
"""

from __future__ import annotations

import collections
import queue
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from pdexporter.client.stream import TokenStream
from pdexporter.errors import EngineRefused
from pdexporter.exporter import book as book_module
from pdexporter.exporter.book import ProbeBook
from pdexporter.exporter.config import build_config
from pdexporter.exporter.metrics import ExporterMetrics
from pdexporter.exporter.probes import ALIGN_WAIT_S, FINISHED, STARTED, Lifecycle
from pdexporter.exporter.status import RESTART_GRACE_S


@dataclass
class FakeProbeLoop:
    """Test double of `probes.ProbeLoop`: the events and health the book reads, nothing else."""

    events: queue.SimpleQueue[Lifecycle] = field(default_factory=queue.SimpleQueue)
    sensor: Any = field(default_factory=lambda: SimpleNamespace(samples_ns=collections.deque()))
    alive: bool = True
    fatal: BaseException | None = None


class Clock:
    def __init__(self) -> None:
        self.s = 1000.0

    def monotonic(self) -> float:
        return self.s

    def perf_counter_ns(self) -> int:
        return int(self.s * 1e9)


def _reading(metrics: ExporterMetrics) -> tuple[float, str]:
    up, reason = None, None
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "pdexporter_up":
                up = sample.value
            if sample.name == "pdexporter_up_reason" and sample.value == 1:
                reason = sample.labels["reason"]
    assert up is not None and reason is not None
    return up, reason


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(book_module, "time", c)
    return c


def _streaming(clock: Clock, name: str) -> TokenStream:
    stream = TokenStream(name, max_tokens=8)
    stream.mark_sent(clock.perf_counter_ns())
    stream.record(clock.perf_counter_ns() + 1000, 1)
    return stream


def _two_probes_running(clock: Clock) -> tuple[ExporterMetrics, ProbeBook, FakeProbeLoop, list[TokenStream]]:
    """A book with two probe slots, each streaming its first probe."""
    metrics = ExporterMetrics()
    book = ProbeBook(build_config(probe_streams=2, chunk_size=2048, prefill_tokens=3000), metrics)
    loop = FakeProbeLoop()
    book.probes = loop  # type: ignore[assignment]
    streams = [_streaming(clock, f"probe{i}-0") for i in range(2)]
    for slot, stream in enumerate(streams):
        loop.events.put(Lifecycle(STARTED, slot, stream))
    book.refresh()
    return metrics, book, loop, streams


def test_up_stays_1_through_a_normal_hand_over_and_drops_when_the_slot_stays_empty(clock: Clock) -> None:
    assert RESTART_GRACE_S > ALIGN_WAIT_S  # the longest a well-ended probe waits for its successor
    metrics, book, loop, first = _two_probes_running(clock)
    assert _reading(metrics) == (1, "ok")

    # slot 0 ends well: its end not yet drained, then drained, its successor not started yet
    first[0].finish(clock.perf_counter_ns(), "length")
    book.refresh()
    assert _reading(metrics) == (1, "ok")
    loop.events.put(Lifecycle(FINISHED, 0, first[0]))
    clock.s += ALIGN_WAIT_S  # waiting for the other probe to end, to restart in phase
    first[1].record(clock.perf_counter_ns(), 1)
    book.refresh()
    assert _reading(metrics) == (1, "ok")

    # the successor comes: ok; then it ends well and none follows within the grace: restarting
    second = _streaming(clock, "probe0-1")
    loop.events.put(Lifecycle(STARTED, 0, second))
    book.refresh()
    assert _reading(metrics) == (1, "ok")
    second.finish(clock.perf_counter_ns(), "length")
    loop.events.put(Lifecycle(FINISHED, 0, second))
    book.refresh()
    assert _reading(metrics) == (1, "ok")
    clock.s += RESTART_GRACE_S + 0.1
    first[1].record(clock.perf_counter_ns(), 1)
    book.refresh()
    assert _reading(metrics) == (0, "probes-restarting")


def test_a_probe_that_failed_is_no_hand_over(clock: Clock) -> None:
    metrics, book, loop, streams = _two_probes_running(clock)
    streams[0].fail(clock.perf_counter_ns(), EngineRefused("connection refused"))
    loop.events.put(Lifecycle(FINISHED, 0, streams[0]))
    book.refresh()
    assert _reading(metrics) == (0, "engine-unreachable")


def test_a_token_received_before_the_failure_does_not_clear_it(clock: Clock) -> None:
    """The engine dies: one stream breaks while the other still holds tokens its socket had received before.
    Absorbed after the failure, they said "a token came" and cleared it, so `up_reason` read
    probes-restarting between the two breaks (the faults test, on a loaded CPU in session 34). Only a token
    received after the failure was noticed says the engine is back."""
    metrics, book, loop, streams = _two_probes_running(clock)
    clock.s += 0.5
    buffered = clock.perf_counter_ns()  # received by stream 1 just as the engine went
    clock.s += 0.01
    streams[0].fail(clock.perf_counter_ns(), EngineRefused("connection reset"))
    loop.events.put(Lifecycle(FINISHED, 0, streams[0]))
    streams[1].record(buffered, 1)  # absorbed in the same refresh as the failure
    book.refresh()
    assert _reading(metrics) == (0, "engine-unreachable")
    clock.s += 0.2
    streams[1].record(buffered + 1000, 1)  # the socket's last buffered bytes, read later
    book.refresh()
    assert _reading(metrics) == (0, "engine-unreachable")
    clock.s += 0.2
    streams[1].record(clock.perf_counter_ns(), 1)  # a token received now: the engine answers again
    book.refresh()
    assert _reading(metrics) == (0, "probes-restarting")
