"""Kernel receive stamps against the real embedded engine (`pdexporter sim serve`, its own process) over loopback."""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import Iterator

import pytest

from pdexporter.client import kstamp
from pdexporter.client.client import COMPLETIONS_PATH, EngineClient, completion_request, encode_body
from pdexporter.client.sse import SSEEvent
from pdexporter.client.stream import TokenStream
from pdexporter.exporter.probes import ProbeLoop
from pdexporter.launch import EngineHandle, SimLauncher
from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.sim.server import PREV_WRITTEN_KEY, SEND_STAMPS_HEADER, send_stamps, sent_ns

pytestmark = [pytest.mark.integration, pytest.mark.realtime]  # run alone (scripts/test.sh)

PROFILE = "h200-qwen3-coder-30b-a3b"
PROMPT = list(range(1000, 1064))


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineHandle]:
    launcher = SimLauncher(profile=PROFILE)
    handle = asyncio.run(launcher.start(2048))
    try:
        yield handle
    finally:
        asyncio.run(launcher.stop())


class Tap:
    """Every event a client saw: its stamp, the engine's send stamp, and when the tap ran."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, int | None, int, int]] = []  # stream, stamp, sent, seen, tokens
        self.comments: list[str | None] = []

    def __call__(self, stream: TokenStream, event: SSEEvent, t_ns: int, n_tokens: int) -> None:
        self.rows.append((stream.request_id, t_ns, sent_ns(event.comment), time.perf_counter_ns(), n_tokens))
        self.comments.append(event.comment)


async def _streams(url: str, n: int, tokens: int, *, rx: bool, send_stamps: bool = True,
                   tap: Tap | None = None) -> tuple[EngineClient, list[TokenStream]]:
    headers = {SEND_STAMPS_HEADER: "1"} if send_stamps else {}
    async with EngineClient(url, rx_stamps=rx, extra_headers=headers, event_tap=tap) as client:
        model = await client.resolve_model(None)
        body = encode_body(completion_request(model, PROMPT, tokens))
        streams = [TokenStream(f"s{i}") for i in range(n)]
        await asyncio.gather(*(client.stream_into(COMPLETIONS_PATH, body, s) for s in streams))
    return client, streams


def test_kernel_stamps_are_present_ordered_and_lie_between_send_and_read(engine: EngineHandle) -> None:
    tap = Tap()
    client, streams = asyncio.run(_streams(engine.url, 4, 48, rx=True, tap=tap))
    assert client.stamping.startswith("kernel-rx")
    assert [s.stamp_clock for s in streams] == ["kernel-rx"] * 4
    for s in streams:
        assert s.n_tokens == 48 and s.finish_reason == "length"
        assert s.t_sent_ns is not None and s.t_sent_ns < s.event_times_ns[0]
        assert all(b >= a for a, b in zip(s.event_times_ns, s.event_times_ns[1:]))
    uncertainty = client._rx.clock_map.uncertainty_ns if client._rx else 0
    with_tokens = [r for r in tap.rows if r[4] > 0]
    assert len(with_tokens) == sum(len(s.event_times_ns) for s in streams)
    for _, stamp, sent, seen, _ in with_tokens:
        assert sent is not None  # the engine stamped every event we asked it to
        # The segment cannot reach us before the engine stamped its write, nor after our code saw it.
        assert sent - 2 * uncertainty - 1_000 <= stamp <= seen
    # On loopback the kernel stamps a segment inside the sender's write: most stamps lie between the
    # engine's stamps before and after its write (the rest were read together with a later write).
    inside = 0
    for i, (rid, stamp, sent, _, n) in enumerate(tap.rows):
        after = next((send_stamps(c).get(PREV_WRITTEN_KEY) for (r, *_), c in zip(tap.rows[i + 1:], tap.comments[i + 1:])
                      if r == rid), None)
        if n > 0 and sent is not None and after is not None:
            inside += sent - 2 * uncertainty - 1_000 <= stamp <= after + 2 * uncertainty + 1_000
    assert inside >= 0.8 * len(with_tokens)


def test_event_counts_equal_the_aiohttp_paths(engine: EngineHandle) -> None:
    """Both paths read streams of the same batch at the same time (same prompt, greedy, same length):
    every engine write is one event on either path, none lost, split or merged by the client."""
    taps = {True: Tap(), False: Tap()}

    async def main() -> dict[bool, list[TokenStream]]:
        results = await asyncio.gather(*(_streams(engine.url, 3, 40, rx=rx, tap=taps[rx]) for rx in (True, False)))
        return {rx: streams for rx, (_, streams) in zip((True, False), results)}

    streams = asyncio.run(main())
    assert [s.stamp_clock for s in streams[True]] == ["kernel-rx"] * 3
    assert [s.stamp_clock for s in streams[False]] == ["read"] * 3
    for rx in (True, False):
        for s in streams[rx]:
            writes = [sent for rid, _, sent, _, n in taps[rx].rows if rid == s.request_id and n > 0]
            assert len(set(writes)) == len(writes) == len(s.event_times_ns)  # one event per engine write
            assert s.n_tokens == 40 and s.prompt_tokens == len(PROMPT)
    events = {rx: sum(len(s.event_tokens) for s in streams[rx]) for rx in (True, False)}
    merged = {rx: sum(n - 1 for s in streams[rx] for n in s.event_tokens) for rx in (True, False)}
    assert events[True] + merged[True] == events[False] + merged[False] == 120
    if merged[True] == merged[False] == 0:  # the engine wrote every step's token on its own
        assert events[True] == events[False] == 120


def test_send_stamps_are_opt_in_and_the_default_wire_has_no_comments(engine: EngineHandle) -> None:
    plain, stamped = Tap(), Tap()
    asyncio.run(_streams(engine.url, 1, 8, rx=True, send_stamps=False, tap=plain))
    asyncio.run(_streams(engine.url, 1, 8, rx=True, send_stamps=True, tap=stamped))
    assert plain.comments and all(c is None for c in plain.comments)
    assert all(sent_ns(c) is not None for c, r in zip(stamped.comments, stamped.rows) if r[4] > 0)


def _refuse_stamps(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.socket.setsockopt

    def setsockopt(self: socket.socket, level: int, optname: int, *rest: object) -> None:
        if level == socket.SOL_SOCKET and optname in (kstamp.SO_TIMESTAMPNS_OLD, kstamp.SO_TIMESTAMPING_OLD):
            raise OSError(errno.ENOPROTOOPT, "Protocol not available")
        real(self, level, optname, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "setsockopt", setsockopt)


def test_a_kernel_that_refuses_the_option_gets_the_old_path(engine: EngineHandle,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_stamps(monkeypatch)
    client, streams = asyncio.run(_streams(engine.url, 2, 16, rx=True))
    assert client.stamping.startswith("read (aiohttp; kernel stamps refused: SO_TIMESTAMPNS: Protocol not available")
    assert [s.stamp_clock for s in streams] == ["read", "read"] and all(s.n_tokens == 16 for s in streams)


def test_a_socket_that_refuses_the_option_is_read_with_the_arrival_clock(engine: EngineHandle,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The host takes the option, one socket does not: the plain-socket path stays, its stamps say
    which clock they are."""

    async def main() -> TokenStream:
        async with EngineClient(engine.url) as client:
            model = await client.resolve_model(None)
            assert client.stamping.startswith("kernel-rx")  # probed with the real setsockopt
            _refuse_stamps(monkeypatch)
            stream = TokenStream("s")
            await client.stream_into(COMPLETIONS_PATH, encode_body(completion_request(model, PROMPT, 12)), stream)
            return stream

    stream = asyncio.run(main())
    assert stream.stamp_clock == "read" and stream.n_tokens == 12


def test_https_targets_keep_aiohttp() -> None:
    client = EngineClient("https://vllm.example:8443")
    assert client._rx_transport() is None and client.stamping == "read (aiohttp; https is read by aiohttp)"


def test_probe_loop_streams_carry_kernel_stamps_and_the_switch_restores_wakeup(engine: EngineHandle) -> None:
    settings = ProtocolSettings(decode_context_tokens=256, decode_output_tokens=64, inject_at_tokens=8,
                                after_intervals=8)

    async def run(rx: bool) -> tuple[str | None, list[TokenStream]]:
        loop = ProbeLoop(engine, 2, settings, rx_stamps=rx)
        await loop.wait_started(timeout_s=60)
        seen: list[TokenStream] = []
        deadline = time.monotonic() + 30
        while len([s for s in seen if s.finished]) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            while not loop.events.empty():
                seen.append(loop.events.get().stream)
        loop.stop()
        return loop.stamping, [s for s in seen if s.finished and s.n_tokens]

    stamping, streams = asyncio.run(run(True))
    assert stamping is not None and stamping.startswith("kernel-rx (plain socket; wakeup stamp")
    assert streams and all(s.stamp_clock == "kernel-rx" for s in streams)
    stamping, streams = asyncio.run(run(False))
    assert stamping is not None and stamping.startswith("wakeup (aiohttp")
    assert streams and all(s.stamp_clock == "wakeup" for s in streams)
