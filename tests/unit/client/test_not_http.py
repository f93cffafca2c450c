"""An answer that is not HTTP is the connection's failure, not a crash: a port polled before its engine
listens can connect to itself when it lies in the ephemeral range, and the request comes back as the
"status line" (seen in CI: aiohttp's 400 "Bad status line" escaped the launcher's health poll)."""

from __future__ import annotations

import asyncio

import pytest

from pdexporter.client.client import EngineClient
from pdexporter.errors import EngineUnreachable


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """What a self-connected socket reads: the bytes it sent (a real TCP double, named as such)."""
    data = await reader.readuntil(b"\r\n\r\n")
    writer.write(data)
    await writer.drain()
    writer.close()


async def test_an_echoed_request_is_not_healthy_and_says_it_is_not_http() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with EngineClient(f"http://127.0.0.1:{port}") as client:
            assert await client.health() is False  # the start-up poll goes on polling
            with pytest.raises(EngineUnreachable, match=r"/health: not an HTTP answer \(.*Bad status line"):
                await client.get_text("/health", retry=False)
    finally:
        server.close()
        await server.wait_closed()
