"""A generation stream as the client sees it: when each event arrived and how many tokens it held.

Drivers (HTTP against a real engine, or in-process against the embedded one) fill a
`TokenStream`; the measurement protocol only reads it. `Progress` lets the protocol wait for
"any stream moved" with one event object instead of a task per stream.

`stamp_clock` says where the stream's event times came from, most precise first:

- "kernel-rx": the kernel's receive time of the TCP segment that completed the event
  (SO_TIMESTAMPNS, `client.kstamp`), converted to `perf_counter_ns`;
- "wakeup": when the reading loop's selector returned (`exporter.probes.StampingSelector`);
- "read": when the reading code ran.

A stream whose events mix clocks (a read without a kernel stamp) names the least precise one, so
every stamp of the stream is at least as good as its `stamp_clock` says. None: not recorded
(in-process drivers on a virtual clock, records written before the field existed).

Event times never go back (`TokenStream.record`). A TCP stream's bytes arrive in order, so an
event read after another cannot have arrived before it; a stamp that says so is wrong by at least
the step back, and every consumer (the window maths, the exporter's live intervals, stall checks)
would read a negative interval from it. Ways it can happen: a kernel stamp converted with a
realtime->perf offset from before a backward step of the wall clock (`client.kstamp`: caught at the
first such stamp since, which forces a new sample, but the kernel's own order is not checked); a
read without a kernel stamp, stamped from the arrival clock *before* its `recvmsg`, followed by a
kernel stamp the kernel took before that moment for a segment it queued to the socket only after
the read (IP delivery stamps it, TCP queues it a moment later: a vCPU descheduled in between on a
loaded VM stretches that moment). Such an event is held at the stamp before it (a 0 ms interval)
and listed in `stamps_held` with how far back its stamp was, so the raw record still tells the stamp
it came with, and a window can report, or refuse, what was corrected (`measure.protocol.stamp_problem`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

__all__ = [
    "PollingProgress", "Progress", "ProgressSignal", "STAMP_CLOCKS", "StampClock", "TokenStream",
]

StampClock = Literal["kernel-rx", "wakeup", "read"]
STAMP_CLOCKS: tuple[StampClock, ...] = ("kernel-rx", "wakeup", "read")  # most precise first


class ProgressSignal(Protocol):
    """What a driver's streams are waited on with: `Progress` (the filling loop wakes it) or
    `PollingProgress` (another thread fills them, it polls)."""

    def notify(self) -> None: ...

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float | None = None) -> bool: ...


class Progress:
    """A level-triggered wake-up shared by all streams of one driver."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Wait until `predicate()` holds; False on timeout. Clock-agnostic (virtual loops work)."""

        async def _loop() -> None:
            while True:
                self._event.clear()
                if predicate():
                    return
                await self._event.wait()

        try:  # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancel that meets a done wait
            async with asyncio.timeout(timeout_s):
                await _loop()
        except TimeoutError:
            return predicate()
        return True


class PollingProgress:
    """`Progress` for streams another thread fills: look at the predicate every `poll_s` (calling
    `on_poll` first), so the filling thread never has to wake this loop up."""

    def __init__(self, poll_s: float = 0.01, on_poll: Callable[[], None] | None = None) -> None:
        self.poll_s = poll_s
        self.on_poll = on_poll

    def notify(self) -> None:
        return None

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float | None = None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            if self.on_poll is not None:
                self.on_poll()
            if predicate():
                return True
            if deadline is not None and loop.time() > deadline:
                return False
            await asyncio.sleep(self.poll_s)


@dataclass
class TokenStream:
    """Events of one streamed generation. Times are from the driver's clock, in nanoseconds."""

    request_id: str
    tag: str = "probe"
    on_update: Callable[[], None] | None = None
    t_sent_ns: int | None = None
    event_times_ns: list[int] = field(default_factory=list)
    event_tokens: list[int] = field(default_factory=list)
    n_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    finished: bool = False
    error: BaseException | None = None
    t_finished_ns: int | None = None
    stamp_clock: StampClock | None = None
    max_tokens: int | None = None  # what the request asked for, when the sender says
    # The failure of the last attempt of a stream start being retried (`EngineClient.stream_into`),
    # until an event comes: the stream is not failed yet, but its engine is not answering.
    attempt_error: BaseException | None = None
    # (event index, how far its stamp was before the event before it, ns): events held at the stamp
    # before them because theirs went back (module docs); empty on a stream whose stamps kept order
    stamps_held: list[tuple[int, int]] = field(default_factory=list)

    @property
    def tokens_left(self) -> int | None:
        """Tokens still to come (None when `max_tokens` is not known)."""
        return None if self.max_tokens is None else self.max_tokens - self.n_tokens

    def note_stamp_clock(self, clock: StampClock) -> None:
        """Some of this stream's stamps come from `clock`: keep the least precise clock seen."""
        if self.stamp_clock is None or STAMP_CLOCKS.index(clock) > STAMP_CLOCKS.index(self.stamp_clock):
            self.stamp_clock = clock

    def mark_sent(self, t_ns: int) -> None:
        self.t_sent_ns = t_ns

    def record(self, t_ns: int, n_tokens: int) -> None:
        if n_tokens <= 0:
            return
        if self.event_times_ns and t_ns < self.event_times_ns[-1]:  # a stamp before its predecessor's
            self.stamps_held.append((len(self.event_times_ns), self.event_times_ns[-1] - t_ns))
            t_ns = self.event_times_ns[-1]
        self.event_times_ns.append(t_ns)
        self.event_tokens.append(n_tokens)
        self.n_tokens += n_tokens
        self.attempt_error = None
        if self.on_update is not None:
            self.on_update()

    def finish(self, t_ns: int, reason: str | None = None, prompt_tokens: int | None = None) -> None:
        self.finished = True
        self.t_finished_ns = t_ns
        self.finish_reason = reason or self.finish_reason
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if self.on_update is not None:
            self.on_update()

    def reopen(self) -> None:
        """Clear a failure before a retry; only legal while nothing was received."""
        if self.event_times_ns:
            raise RuntimeError(f"stream {self.request_id} already has events; it cannot be retried")
        self.error, self.finished, self.finish_reason, self.t_finished_ns = None, False, None, None
        self.stamp_clock = None

    def fail(self, t_ns: int, error: BaseException) -> None:
        self.error = error
        self.finish(t_ns, "error")

    @property
    def t_first_ns(self) -> int | None:
        return self.event_times_ns[0] if self.event_times_ns else None

    @property
    def done(self) -> bool:
        return self.finished or self.error is not None

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
