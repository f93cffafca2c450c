"""Kernel receive stamps: the socket option and its fallback, control messages, the clock conversion."""

from __future__ import annotations

import errno
import socket
import struct
import time

import pytest

from pdexporter.client import kstamp
from pdexporter.client.kstamp import (
    SO_TIMESTAMPING_OLD,
    SO_TIMESTAMPNS_NEW,
    SO_TIMESTAMPNS_OLD,
    RealtimeToPerf,
    RxStampsRefused,
    Target,
    enable_rx_stamps,
    rx_stamp_realtime_ns,
    rx_stamp_support,
)


def _refuse(monkeypatch: pytest.MonkeyPatch, refused: set[int]) -> list[int]:
    """setsockopt raising ENOPROTOOPT for these SOL_SOCKET options (a kernel without them); others pass."""
    tried: list[int] = []
    real = socket.socket.setsockopt

    def setsockopt(self: socket.socket, level: int, optname: int, value: object, *rest: object) -> None:
        if level == socket.SOL_SOCKET and optname in (SO_TIMESTAMPNS_OLD, SO_TIMESTAMPING_OLD):
            tried.append(optname)
            if optname in refused:
                raise OSError(errno.ENOPROTOOPT, "Protocol not available")
        real(self, level, optname, value, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "setsockopt", setsockopt)
    return tried


def test_timestampns_is_taken_first() -> None:
    with socket.socket() as sock:
        assert enable_rx_stamps(sock).name == "SO_TIMESTAMPNS"
        assert sock.getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS_OLD) == 1
    assert rx_stamp_support() is None


def test_timestamping_is_the_second_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    tried = _refuse(monkeypatch, {SO_TIMESTAMPNS_OLD})
    with socket.socket() as sock:
        assert enable_rx_stamps(sock).name == "SO_TIMESTAMPING"
    assert tried == [SO_TIMESTAMPNS_OLD, SO_TIMESTAMPING_OLD]


def test_both_refused_says_why_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse(monkeypatch, {SO_TIMESTAMPNS_OLD, SO_TIMESTAMPING_OLD})
    with socket.socket() as sock, pytest.raises(RxStampsRefused) as excinfo:
        enable_rx_stamps(sock)
    text = str(excinfo.value)
    assert "SO_TIMESTAMPNS: Protocol not available" in text and "SO_TIMESTAMPING" in text and "\n" not in text
    assert rx_stamp_support() == text


def test_an_unknown_architecture_is_refused_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kstamp.platform, "machine", lambda: "sparc64")
    assert "sparc64" in (rx_stamp_support() or "")


def test_control_messages_decode_to_realtime_ns() -> None:
    ns = struct.pack("@ll", 1_700_000_000, 123_456_789)
    assert rx_stamp_realtime_ns([(socket.SOL_SOCKET, SO_TIMESTAMPNS_OLD, ns)]) == 1_700_000_000_123_456_789
    timestamping = struct.pack("@llllll", 1_700_000_001, 5, 0, 0, 0, 0)  # software, (deprecated), hardware
    assert rx_stamp_realtime_ns([(socket.SOL_SOCKET, SO_TIMESTAMPING_OLD, timestamping)]) == 1_700_000_001_000_000_005
    new = struct.pack("=qq", 1_700_000_002, 7)
    assert rx_stamp_realtime_ns([(socket.SOL_SOCKET, SO_TIMESTAMPNS_NEW, new)]) == 1_700_000_002_000_000_007
    # no stamp: other levels, unknown types, short data, a zero stamp (the kernel had none)
    assert rx_stamp_realtime_ns([]) is None
    assert rx_stamp_realtime_ns([(socket.IPPROTO_IP, SO_TIMESTAMPNS_OLD, ns)]) is None
    assert rx_stamp_realtime_ns([(socket.SOL_SOCKET, 99, ns)]) is None
    assert rx_stamp_realtime_ns([(socket.SOL_SOCKET, SO_TIMESTAMPNS_OLD, ns[:8])]) is None
    assert rx_stamp_realtime_ns([(socket.SOL_SOCKET, SO_TIMESTAMPNS_OLD, bytes(16))]) is None


def test_a_real_socket_pair_gets_a_stamp_between_send_and_read() -> None:
    """Loopback TCP: the kernel stamp, converted, lies after the send and before the read returned.

    The first packets after a process's first socket asks for stamps may come without one: Linux
    turns receive stamping on for the whole stack from a work item (`net_enable_timestamp` defers the
    static key), so a fresh test worker's first read can beat it (seen once in four CI runs on a
    2-core machine). The client takes an unstamped read's wake-up time; here the pair exchanges
    messages until one is stamped, within 200."""
    clock_map = RealtimeToPerf()
    with socket.create_server(("127.0.0.1", 0)) as server, socket.socket() as client:
        enable_rx_stamps(client)
        client.connect(server.getsockname())
        peer, _ = server.accept()
        with peer:
            for _ in range(200):
                sent = time.perf_counter_ns()
                peer.sendall(b"token")
                data, anc, _, _ = client.recvmsg(1024, kstamp.ANC_BYTES)
                read = time.perf_counter_ns()
                assert data == b"token"
                real = rx_stamp_realtime_ns(anc)
                if real is not None:
                    break
                time.sleep(0.005)
    assert real is not None, "no kernel receive stamp in 200 loopback messages"
    t = clock_map.to_perf_ns(real, read)
    assert t is not None and sent - 100_000 <= t <= read


class FakeClocks:
    """Scripted realtime and perf clocks (a test double of the two clocks)."""

    def __init__(self, offset_ns: int, gaps: list[int]) -> None:
        self.perf_ns = 1_000_000_000
        self.offset_ns = offset_ns
        self.gaps = list(gaps)  # time each realtime read takes, in turn
        self._pending = 0

    def perf(self) -> int:
        self.perf_ns += self._pending
        self._pending = 0
        return self.perf_ns

    def realtime(self) -> int:
        gap = self.gaps.pop(0) if self.gaps else 100
        self.perf_ns += gap // 2
        self._pending = gap - gap // 2
        return self.perf_ns + self.offset_ns


def test_offset_comes_from_the_narrowest_bracket() -> None:
    clocks = FakeClocks(offset_ns=5_000, gaps=[900, 40, 700, 300])
    conv = RealtimeToPerf(pairs=4, realtime=clocks.realtime, perf=clocks.perf)
    assert conv.uncertainty_ns == 20  # half of the 40 ns bracket
    assert abs(conv.offset_ns - 5_000) <= conv.uncertainty_ns
    assert conv.to_perf_ns(clocks.perf_ns + 5_000 - 1_000, clocks.perf_ns) == clocks.perf_ns - 1_000


def test_offset_is_sampled_again_after_the_period() -> None:
    clocks = FakeClocks(offset_ns=5_000, gaps=[100] * 100)
    conv = RealtimeToPerf(resample_s=1.0, pairs=2, realtime=clocks.realtime, perf=clocks.perf)
    assert conv.samples == 1
    clocks.offset_ns = 1_000  # the wall clock stepped back by 4 µs: stamps look early, undetectably
    clocks.perf_ns += 500_000_000
    t = conv.to_perf_ns(clocks.perf_ns + 1_000 - 10, clocks.perf_ns)  # within the period: no new sample
    assert conv.samples == 1 and t == pytest.approx(clocks.perf_ns - 4_010, abs=100)
    clocks.perf_ns += 600_000_000
    now = clocks.perf_ns
    t = conv.to_perf_ns(now + 1_000 - 10, now)
    assert conv.samples == 2 and conv.max_shift_ns == pytest.approx(4_000, abs=100)
    assert t == pytest.approx(now - 10, abs=100)


def test_a_stamp_after_its_read_forces_a_sample_and_is_dropped_if_still_impossible() -> None:
    clocks = FakeClocks(offset_ns=0, gaps=[100] * 100)
    conv = RealtimeToPerf(pairs=1, realtime=clocks.realtime, perf=clocks.perf)
    clocks.offset_ns = 2_000_000  # the wall clock stepped forward 2 ms: the old offset makes stamps late
    read = clocks.perf_ns
    t = conv.to_perf_ns(read + 2_000_000 - 50_000, read)  # a segment 50 µs before the read, new wall time
    assert conv.samples == 2 and t == pytest.approx(read - 50_000, abs=200)
    assert conv.to_perf_ns(clocks.perf_ns + 10_000_000, clocks.perf_ns) is None  # from the future: dropped
    assert conv.samples == 3


def test_a_stamp_before_the_one_before_it_forces_a_sample() -> None:
    """A wall-clock step back within the resample period made converted stamps early: once larger
    than the gap between two reads, an event read later came out 0.26 ms before the one before it
    (a negative interval). The previous stamp is a bound: a stamp before it is sampled again."""
    clocks = FakeClocks(offset_ns=5_000, gaps=[100] * 100)
    conv = RealtimeToPerf(resample_s=1.0, pairs=2, realtime=clocks.realtime, perf=clocks.perf)
    clocks.perf_ns += 100_000_000
    first = conv.to_perf_ns(clocks.perf_ns + 5_000 - 20_000, clocks.perf_ns)  # 20 µs before its read
    assert first is not None and conv.samples == 1
    clocks.offset_ns = 5_000 - 400_000  # the wall clock steps back 0.4 ms
    clocks.perf_ns += 120_000  # the next segment lands 0.12 ms after the first, read at once
    real = clocks.perf_ns + clocks.offset_ns
    assert conv.to_perf_ns(real, clocks.perf_ns) < first  # without the bound: 0.28 ms before it
    assert conv.samples == 1
    t = conv.to_perf_ns(real, clocks.perf_ns, not_before_ns=first)
    assert conv.samples == 2 and t == pytest.approx(clocks.perf_ns, abs=200) and t > first


class _ScriptedSocket:
    """What `_Exchange` reads: one (body bytes, realtime stamp) per `recvmsg`."""

    def __init__(self, reads: list[tuple[bytes, int]]) -> None:
        self.reads = list(reads)

    def fileno(self) -> int:
        return -1

    def recvmsg(self, size: int, ancsize: int) -> tuple[bytes, list[tuple[int, int, bytes]], int, None]:
        data, real_ns = self.reads.pop(0)
        sec, nsec = divmod(real_ns, 1_000_000_000)
        return data, [(socket.SOL_SOCKET, SO_TIMESTAMPNS_OLD, struct.pack("@ll", sec, nsec))], 0, None


def test_an_exchange_bounds_each_kernel_stamp_by_the_one_before(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import types

    clocks = FakeClocks(offset_ns=1_700_000_000_000_000_000, gaps=[100] * 100)
    conv = RealtimeToPerf(resample_s=1.0, pairs=2, realtime=clocks.realtime, perf=clocks.perf)
    # the exchange's own reads of the perf clock (after each recvmsg): 2 ms on, within the period
    monkeypatch.setattr(kstamp, "time", types.SimpleNamespace(perf_counter_ns=lambda: clocks.perf_ns + 2_000_000))
    first_real = clocks.perf_ns + 1_000_000 + clocks.offset_ns
    clocks.offset_ns -= 400_000  # a step back 0.4 ms after the first segment landed
    second_real = clocks.perf_ns + 1_120_000 + clocks.offset_ns
    sock = _ScriptedSocket([(b"data: 1\n\n", first_real), (b"data: 2\n\n", second_real)])
    loop = asyncio.new_event_loop()
    try:
        exchange = kstamp._Exchange(loop, sock, "http://x/", lambda body, t, k: False,  # type: ignore[arg-type]
                                    conv, clocks.perf, 1.0)
        exchange._on_readable()
        exchange._on_readable()
        stamps = [t for _, t, kernel, _ in exchange._pending if kernel]
    finally:
        loop.close()
    assert len(stamps) == 2 and stamps[1] >= stamps[0] and conv.samples == 2
    assert stamps[1] - stamps[0] == pytest.approx(120_000, abs=500)


def test_the_real_clocks_convert_within_microseconds() -> None:
    conv = RealtimeToPerf()
    before = time.perf_counter_ns()
    t = conv.to_perf_ns(time.time_ns(), time.perf_counter_ns() + 1_000_000)
    after = time.perf_counter_ns()
    assert t is not None and before - 50_000 <= t <= after + 50_000
    assert conv.uncertainty_ns < 50_000


def test_targets_are_plain_http_only() -> None:
    t = Target.parse("http://[::1]:8001/v1/completions?x=1")
    assert (t.host, t.port, t.host_header, t.path) == ("::1", 8001, "[::1]:8001", "/v1/completions?x=1")
    assert Target.parse("http://vllm/v1/completions").port == 80
    with pytest.raises(ValueError, match="plain http"):
        Target.parse("https://vllm/v1/completions")
