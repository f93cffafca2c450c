"""A request aiohttp cannot parse is answered 400 with nothing on stderr (the runtime audit of
session 22: a header over 8 KB, 300 headers or an HTTP/2 preface each logged aiohttp's 8-10-line
traceback quoting the client's bytes, which any client could repeat)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from pdexporter.exporter.server import start_server

pytestmark = pytest.mark.integration


async def _send(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(200), timeout=10)
    writer.close()
    return answer


async def test_a_malformed_request_is_a_400_and_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics", ok)
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
            long_header = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n"
            assert (await _send(port, long_header))[9:12] == b"400"
            assert (await _send(port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))[9:12] == b"400"
            assert (await _send(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))[9:12] == b"200"
        assert not [r for r in caplog.records if r.name == "aiohttp.server"], caplog.text
    finally:
        await runner.cleanup()
