"""Kernel receive timestamps for streamed answers: a plain-socket HTTP/1.1 path that takes them.

Linux stamps every received packet when a socket asks for it (`SO_TIMESTAMPNS`, or
`SO_TIMESTAMPING` with `SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE`), and
`recvmsg` hands that time over as a control message. That is when the bytes reached this host,
before any wake-up, GIL hand-over or other stream's parsing: the error the wake-up stamp
(`exporter.probes.StampingSelector`) leaves, which is milliseconds on a loaded machine.

aiohttp cannot return control messages, so `RxTransport.stream` does one streamed exchange on
its own non-blocking socket: connect, send the pre-encoded request, then read with `recvmsg` from
a reader callback on the running loop (`loop.add_reader`, no task wake-up per read), framing
with `client.http1` and handing each read's body bytes to a sink with the read's stamp (in a
callback queued behind the loop iteration's other reads: `_Exchange._on_readable` says why). TLS,
keep-alive and proxies are not supported on this path; `EngineClient` keeps aiohttp for https.

Which stamp a read gets:
- the kernel's, when the option was taken and the read carried the control message. TCP reports
  the stamp of the *last* segment a `recvmsg` consumed (segments queued together are merged, and
  keep the later stamp), so every event a read completed gets the time the segment completing it
  arrived; an event that was already complete in an earlier segment of the same read is stamped
  late by the gap between the two segments. One probe stream gets one event per engine step,
  so that needs a reader a whole step late;
- else the `arrival_clock` (the loop's wake-up time in the exporter), and the sink is told, so
  the stream records the less precise clock.

Clock conversion: the kernel's stamp is CLOCK_REALTIME; the project's clock is
`time.perf_counter_ns` (CLOCK_MONOTONIC on Linux). `RealtimeToPerf` samples their offset with
paired reads (perf, realtime, perf; the narrowest of 8 brackets; the realtime read is taken to sit
mid-bracket) and samples again every second. Residual error: half the narrowest bracket (~40 ns
here, printed by tests/benchmarks/bench_stamps.py), plus, only across a step of the wall clock
(settimeofday, an NTP step; slewing moves both clocks alike), the step itself until the next
sample. A step forward makes converted stamps later than the read that returned them, which is
impossible, so it forces a new sample at once (and a stamp still later than its read is dropped,
the wake-up stamp taken instead); a step back makes them early until the next sample (at most 1 s
later) or until a converted stamp comes out before the stamp of the read before it on the same
socket, impossible as one socket's bytes arrive in order, which forces a sample at once. Without that
bound a step back larger than the gap between two reads put an event's stamp before its
predecessor's: a negative interval. A CI sweep on a loaded 2-core machine once crashed on one of
-0.26 ms; whether a clock step caused it is not known (`client.stream` lists the other ways), and
the stream holds any stamp still out of order (`TokenStream.record`).
"""

from __future__ import annotations

import asyncio
import platform
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from pdexporter.client.http1 import HttpFramingError, ResponseHead, ResponseReader
from pdexporter.client.sse import http_error
from pdexporter.errors import EngineError, EngineRefused, EngineTimeout, EngineUnreachable

__all__ = [
    "ANC_BYTES", "BodySink", "Clock", "RECV_BYTES", "RX_STAMP_OPTIONS", "RealtimeToPerf", "RxStampOption",
    "RxStampsRefused", "RxTransport", "TAIL_GRACE_S", "Target", "enable_rx_stamps", "rx_stamp_realtime_ns",
    "rx_stamp_support",
]

Clock = Callable[[], int]
# (body bytes of one read, that read's stamp in perf_counter_ns, stamped by the kernel?) -> ended?
BodySink = Callable[[bytes, int, bool], bool]

# asm-generic/socket.h and linux/net_tstamp.h; alpha, mips, parisc and sparc number them differently.
SO_TIMESTAMPNS_OLD, SO_TIMESTAMPING_OLD, SO_TIMESTAMPNS_NEW, SO_TIMESTAMPING_NEW = 35, 37, 64, 65
SOF_TIMESTAMPING_RX_SOFTWARE, SOF_TIMESTAMPING_SOFTWARE = 1 << 3, 1 << 4
_GENERIC_ARCHES = ("x86_64", "amd64", "i386", "i486", "i586", "i686", "aarch64", "arm64", "armv6l", "armv7l",
                   "armv8l", "riscv64", "ppc64le", "ppc64", "s390x", "loongarch64")
_TIMESPEC = struct.Struct("@ll")  # the *_OLD control messages: struct timespec of the C ABI
_TIMESPEC64 = struct.Struct("=qq")  # the *_NEW ones: struct __kernel_timespec
_CMSG_LAYOUT = {SO_TIMESTAMPNS_OLD: _TIMESPEC, SO_TIMESTAMPING_OLD: _TIMESPEC,  # SCM_TIMESTAMPING: ts[0] is software
                SO_TIMESTAMPNS_NEW: _TIMESPEC64, SO_TIMESTAMPING_NEW: _TIMESPEC64}
RECV_BYTES = 32 * 1024
ANC_BYTES = 128  # one scm_timestamping (48 bytes) with its header, or one timespec
TAIL_GRACE_S = 1.0  # after [DONE], how long to wait for the body's end before closing anyway


@dataclass(frozen=True)
class RxStampOption:
    """A socket option that makes the kernel report receive times."""

    name: str
    optname: int
    value: int


RX_STAMP_OPTIONS = (
    RxStampOption("SO_TIMESTAMPNS", SO_TIMESTAMPNS_OLD, 1),
    RxStampOption("SO_TIMESTAMPING", SO_TIMESTAMPING_OLD, SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE),
)


class RxStampsRefused(OSError):
    """No receive-timestamp option could be set; the message says why, in one line."""


def enable_rx_stamps(sock: socket.socket) -> RxStampOption:
    """Ask the kernel to stamp what this socket receives: the first option it accepts."""
    if not sys.platform.startswith("linux"):
        raise RxStampsRefused(f"kernel receive stamps are read the Linux way; this is {sys.platform}")
    machine = platform.machine().lower()
    if machine not in _GENERIC_ARCHES:
        raise RxStampsRefused(f"SO_TIMESTAMPNS's number is not known for {machine or 'this CPU'}")
    reasons = []
    for option in RX_STAMP_OPTIONS:
        try:
            sock.setsockopt(socket.SOL_SOCKET, option.optname, option.value)
        except OSError as exc:
            reasons.append(f"{option.name}: {exc.strerror or exc}")
            continue
        return option
    raise RxStampsRefused("; ".join(reasons))


def rx_stamp_support() -> str | None:
    """None if this host's TCP sockets take a receive-stamp option, else why not (one line)."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        return f"cannot open a TCP socket: {exc.strerror or exc}"
    try:
        enable_rx_stamps(sock)
    except RxStampsRefused as exc:
        return str(exc)
    finally:
        sock.close()
    return None


def rx_stamp_realtime_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The receive time (CLOCK_REALTIME, ns) in `recvmsg`'s control messages, if there is one."""
    for level, kind, data in ancdata:
        if level != socket.SOL_SOCKET:
            continue
        layout = _CMSG_LAYOUT.get(kind)
        if layout is None or len(data) < layout.size:
            continue
        sec, nsec = layout.unpack_from(data)
        if sec or nsec:
            return sec * 1_000_000_000 + nsec
    return None


class RealtimeToPerf:
    """CLOCK_REALTIME nanoseconds -> `perf_counter_ns`, through an offset sampled every `resample_s`."""

    def __init__(
        self,
        resample_s: float = 1.0,
        pairs: int = 8,
        *,
        realtime: Clock = time.time_ns,
        perf: Clock = time.perf_counter_ns,
    ) -> None:
        self._realtime, self._perf = realtime, perf
        self._resample_ns = int(resample_s * 1e9)
        self._pairs = max(1, pairs)
        self.offset_ns = 0  # realtime - perf
        self.uncertainty_ns = 0  # half the bracket the offset was read in
        self.sampled_ns = 0  # perf time of the last sample
        self.samples = 0
        self.max_shift_ns = 0  # largest change of the offset between two samples (a wall-clock step)
        self.sample()

    def sample(self) -> None:
        best: tuple[int, int, int] | None = None
        for _ in range(self._pairs):
            before = self._perf()
            real = self._realtime()
            after = self._perf()
            if best is None or after - before < best[0]:
                best = (after - before, real - (before + after) // 2, after)
        assert best is not None
        gap, offset, at = best
        if self.samples:
            self.max_shift_ns = max(self.max_shift_ns, abs(offset - self.offset_ns))
        self.offset_ns, self.uncertainty_ns, self.sampled_ns = offset, (gap + 1) // 2, at
        self.samples += 1

    def to_perf_ns(self, real_ns: int, not_after_ns: int, not_before_ns: int | None = None) -> int | None:
        """`real_ns` on the perf clock; `not_after_ns` is a perf time known to be later (after the read),
        `not_before_ns` one that should be earlier (the stamp of the same socket's read before)."""
        if not_after_ns - self.sampled_ns > self._resample_ns:
            self.sample()
        t_ns = real_ns - self.offset_ns
        if t_ns > not_after_ns:  # impossible unless the wall clock stepped since the last sample
            self.sample()
            t_ns = real_ns - self.offset_ns
            if t_ns > not_after_ns:
                return None
        elif not_before_ns is not None and t_ns < not_before_ns:
            # Bytes of one socket arrive in order: the wall clock stepped back since the last sample
            # (or the stamp is out of order for another reason, which a new sample does not change:
            # the stream holds that one, `TokenStream.record`).
            self.sample()
            t_ns = real_ns - self.offset_ns
        return t_ns


@dataclass(frozen=True)
class Target:
    url: str  # for messages
    host: str
    port: int
    host_header: str
    path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r}: the kernel-stamped path speaks plain http:// only")
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        host_header = parts.netloc.rsplit("@", 1)[-1]
        return cls(url, parts.hostname, parts.port or 80, host_header, path)


class RxTransport:
    """Streamed HTTP/1.1 exchanges on plain sockets, stamped with the kernel's receive time.

    One per client (it caches resolved addresses and owns the clock conversion); use it from one
    event loop. `refused` is None when the kernel takes a receive-stamp option, else why not.
    """

    def __init__(self, *, clock_map: RealtimeToPerf | None = None, kernel_stamps: bool = True) -> None:
        self.refused: str | None = rx_stamp_support() if kernel_stamps else "kernel stamps switched off"
        self.clock_map = clock_map or RealtimeToPerf()
        self._addresses: dict[tuple[str, int], list[tuple[int, tuple[object, ...]]]] = {}

    @property
    def kernel_stamps(self) -> bool:
        return self.refused is None

    async def stream(
        self,
        target: Target,
        request: bytes,
        on_body: BodySink,
        *,
        arrival_clock: Clock,
        on_sent: Callable[[], None],
        connect_s: float,
        read_s: float,
    ) -> ResponseHead:
        """Send `request` and feed the body to `on_body` until it says the stream ended (then wait
        briefly for the body's end) or the body ends. Raises `EngineHTTPError` for an error status,
        `EngineUnreachable`/`EngineTimeout`/`EngineError` with one-line messages naming the URL."""
        loop = asyncio.get_running_loop()
        sock, stamped = await self._connect(loop, target, connect_s)
        exchange = _Exchange(loop, sock, target.url, on_body, self.clock_map if stamped else None,
                             arrival_clock, read_s)
        try:
            on_sent()
            try:
                await loop.sock_sendall(sock, request)
            except OSError as exc:
                raise EngineUnreachable(f"{target.url}: connection lost before the first byte "
                                        f"({_reason(exc)})") from exc
            exchange.start()
            await exchange.done
        finally:
            exchange.close()
        head = exchange.reader.head
        assert head is not None
        if head.status >= 400:
            raise http_error(target.url, head.status, b"".join(exchange.error_body))
        return head

    def _stamping(self, sock: socket.socket) -> bool:
        if self.refused is not None:
            return False
        try:
            enable_rx_stamps(sock)
        except RxStampsRefused:
            return False  # this socket only: its reads get the arrival clock, and say so
        return True

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, target: Target, connect_s: float
    ) -> tuple[socket.socket, bool]:
        """A connected non-blocking socket, and whether it asked for receive stamps (before
        connecting, so the kernel stamps from the first segment on)."""
        key = (target.host, target.port)
        try:
            async with asyncio.timeout(connect_s):
                addresses = self._addresses.get(key)
                if addresses is None:
                    infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
                    addresses = [(family, address) for family, _, _, _, address in infos]
                    self._addresses[key] = addresses
                last: OSError | None = None
                for family, address in addresses:
                    sock = socket.socket(family, socket.SOCK_STREAM)
                    try:
                        stamped = self._stamping(sock)
                        sock.setblocking(False)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        await loop.sock_connect(sock, address)
                    except BaseException as exc:
                        sock.close()
                        if not isinstance(exc, OSError):
                            raise
                        last = exc
                        continue
                    return sock, stamped
        except TimeoutError as exc:
            self._addresses.pop(key, None)
            raise EngineTimeout(f"cannot connect to {target.url}: no answer within {connect_s:g} s") from exc
        except socket.gaierror as exc:
            raise EngineRefused(f"cannot connect to {target.url}: {_reason(exc)}") from exc
        self._addresses.pop(key, None)
        reason = _reason(last) if last is not None else "no address"
        raise EngineRefused(f"cannot connect to {target.url}: {reason}") from last


class _Exchange:
    """The reading half of one exchange: a reader callback, its stamps, framing and timeouts."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        url: str,
        on_body: BodySink,
        clock_map: RealtimeToPerf | None,
        arrival_clock: Clock,
        read_s: float,
    ) -> None:
        self.loop, self.sock, self.url = loop, sock, url
        self.fd = sock.fileno()
        self.on_body = on_body
        self.clock_map = clock_map
        self.arrival_clock = arrival_clock
        self.read_s = read_s
        self.read_ns = int(read_s * 1e9)
        self.reader = ResponseReader()
        self.done: asyncio.Future[None] = loop.create_future()
        self.error_body: list[bytes] = []
        self.got_bytes = False
        self.ended = False  # the sink saw the end of the stream
        self._last_ns = time.perf_counter_ns()
        self._last_stamp_ns: int | None = None  # the stamp of the last read that brought bytes
        self._reading = False
        self._closed = False
        self._pending: list[tuple[bytes | None, int, bool, str | None]] = []
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._tail: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._last_ns = time.perf_counter_ns()
        self.loop.add_reader(self.fd, self._on_readable)
        self._reading = True
        self._timer = self.loop.call_later(self.read_s, self._idle_check)

    def close(self) -> None:
        self._closed = True
        self._stop_reading()
        self.sock.close()

    def _pause_reading(self) -> None:
        if self._reading:
            self.loop.remove_reader(self.fd)
            self._reading = False

    def _stop_reading(self) -> None:
        self._pause_reading()
        for timer in (self._timer, self._tail):
            if timer is not None:
                timer.cancel()

    def _finish(self) -> None:
        self._stop_reading()
        if not self.done.done():
            self.done.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self._stop_reading()
        if not self.done.done():
            self.done.set_exception(exc)

    def _idle_check(self) -> None:
        idle = time.perf_counter_ns() - self._last_ns
        if idle >= self.read_ns:
            self._fail(EngineTimeout(f"{self.url}: no event for {self.read_s:g} s"))
        else:
            self._timer = self.loop.call_later((self.read_ns - idle) / 1e9, self._idle_check)

    def _on_readable(self) -> None:
        """Read and stamp now; parse in a callback queued behind this loop iteration's other reads.

        With D sockets readable at once, parsing each read before the next socket is read would
        read the last one D parses (~25 µs each) after the wake-up, late enough at D = 64 for the
        engine's next write on it to have landed and been merged with its stamp. So reads go first,
        as aiohttp's transports do, and the parsing follows."""
        t_wake = self.arrival_clock()  # stamp first, read and parse after
        try:
            data, ancdata, _flags, _ = self.sock.recvmsg(RECV_BYTES, ANC_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._pause_reading()
            self._queue(None, 0, False, _reason(exc))
            return
        if not data:
            self._pause_reading()  # EOF stays readable: stop the callbacks, handle it in order
            self._queue(b"", 0, False, None)
            return
        self._last_ns = t_wake
        self.got_bytes = True
        t_ns, kernel = t_wake, False
        if self.clock_map is not None:
            real_ns = rx_stamp_realtime_ns(ancdata)
            if real_ns is not None:
                # Not `t_wake` as the bound: a segment can land between the wake-up and this read.
                converted = self.clock_map.to_perf_ns(real_ns, time.perf_counter_ns(), self._last_stamp_ns)
                if converted is not None:
                    t_ns, kernel = converted, True
        self._last_stamp_ns = t_ns
        self._queue(data, t_ns, kernel, None)

    def _queue(self, data: bytes | None, t_ns: int, kernel: bool, error: str | None) -> None:
        self._pending.append((data, t_ns, kernel, error))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        for data, t_ns, kernel, error in pending:
            if self._closed or self.done.done():
                return
            if error is not None:
                self._lost(error)
            elif not data:
                self._on_eof()
            else:
                self._consume(data, t_ns, kernel)

    def _consume(self, data: bytes, t_ns: int, kernel: bool) -> None:
        try:
            body = self.reader.feed(data)
            head = self.reader.head
            if head is not None and head.status >= 400:
                self.error_body.append(body)
            elif body and not self.ended:
                self.ended = self.on_body(body, t_ns, kernel)
        except HttpFramingError as exc:
            self._fail(EngineError(f"{self.url}: malformed HTTP response ({exc})"))
            return
        except BaseException as exc:  # noqa: BLE001 - the sink's error (SSE shape, engine error) ends the exchange
            self._fail(exc)
            return
        if self.reader.complete:
            self._finish()
        elif self.ended and self._tail is None:
            self._tail = self.loop.call_later(TAIL_GRACE_S, self._finish)

    def _on_eof(self) -> None:
        if self.reader.head is None:
            self._lost("the server closed the connection")
        elif self.reader.eof() or self.ended or self.reader.head.status >= 400:
            self._finish()
        else:
            self._lost("the server closed the connection")

    def _lost(self, reason: str) -> None:
        where = "mid-stream" if self.got_bytes else "before the first byte"
        self._fail(EngineUnreachable(f"{self.url}: connection lost {where} ({reason})"))


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).lower().split())
