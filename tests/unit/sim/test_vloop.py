from __future__ import annotations

import asyncio
import socket
import time

import pytest

from pdexporter._internal.vloop import VirtualEventLoop, is_virtual, run_virtual


def test_sleep_costs_no_wall_time_and_moves_the_clock_exactly():
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(3600)
        await asyncio.sleep(0.0015)
        return t0, loop.time()

    wall = time.perf_counter()
    t0, t1 = run_virtual(main())
    assert t1 - t0 == pytest.approx(3600.0015, abs=1e-9)
    assert time.perf_counter() - wall < 1.0


def test_timers_fire_in_order_at_their_deadlines():
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, float]] = []
        for name, when in (("c", 3.0), ("a", 1.0), ("b", 2.0)):
            loop.call_at(when, lambda n=name: seen.append((n, loop.time())))
        await asyncio.sleep(5)
        return seen

    assert run_virtual(main()) == [("a", 1.0), ("b", 2.0), ("c", 3.0)]


def test_timeouts_fire_on_virtual_time():
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 900)
        return loop.time()

    assert run_virtual(main()) == pytest.approx(900)


def test_real_io_still_works():
    async def main() -> bytes:
        assert is_virtual()
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=a)
        b.send(b"hello")
        data = await asyncio.wait_for(reader.read(5), 10)
        writer.close()
        b.close()
        return data

    assert run_virtual(main()) == b"hello"


def test_a_normal_loop_is_not_virtual():
    async def main() -> bool:
        return is_virtual()

    assert asyncio.run(main()) is False
    assert isinstance(VirtualEventLoop(), asyncio.AbstractEventLoop)
