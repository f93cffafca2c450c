"""The exporter's health endpoints over real HTTP: /livez, /readyz and /healthz.

Kubernetes probes these (the Helm chart: liveness -> /livez, readiness -> /readyz). Liveness must
not depend on the engine (a sidecar beside a vLLM that loads for 20 minutes must not be killed),
and readiness must hold while the engine is down so Prometheus keeps scraping `pdexporter_up 0`.
The first tests drive `metrics_app` through aiohttp's test client; the last one runs the real
Runner against ScriptedEngine (a TEST DOUBLE of an engine) and takes the engine away.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.registry import Collector

from pdexporter.exporter.config import build_config
from pdexporter.exporter.runner import Runner
from pdexporter.exporter.server import metrics_app
from pdexporter.launch import ExternalLauncher
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.integration


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("pdexporter_up", "1 while the probes run", registry=registry).set(0)
    return registry


async def _client(app) -> TestClient:  # type: ignore[no-untyped-def]
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_livez_and_readyz_answer_while_the_probes_are_unhealthy() -> None:
    """Engine down / probes not started: /healthz says so, liveness and readiness do not."""
    health = {"ok": False}
    client = await _client(metrics_app(_registry(), healthy=lambda: health["ok"]))
    try:
        assert (await client.get("/healthz")).status == 503
        live, ready = await client.get("/livez"), await client.get("/readyz")
        assert (live.status, await live.text()) == (200, "ok\n")
        assert (ready.status, await ready.text()) == (200, "ready\n")
        metrics = await client.get("/metrics")
        assert metrics.status == 200 and "pdexporter_up 0.0" in await metrics.text()
        health["ok"] = True
        assert (await client.get("/healthz")).status == 200  # /healthz still reflects probe health
        page = await (await client.get("/")).text()
        for path in ("/metrics", "/healthz", "/livez", "/readyz"):
            assert f'href="{path}"' in page
    finally:
        await client.close()


class BrokenCollector(Collector):
    """A collector whose collect() raises: /metrics cannot be served."""

    def collect(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("collector exploded")


async def test_readyz_fails_when_metrics_cannot_be_served_but_livez_does_not() -> None:
    registry = _registry()
    registry.register(BrokenCollector())
    client = await _client(metrics_app(registry))
    try:
        assert (await client.get("/metrics")).status == 500
        ready = await client.get("/readyz")
        assert ready.status == 503 and "collector exploded" in await ready.text()
        assert (await client.get("/livez")).status == 200
    finally:
        await client.close()


async def _status(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


async def test_runner_stays_live_and_ready_when_the_engine_goes_away() -> None:
    engine = ScriptedEngine(cadence_s=0.004)
    await engine.__aenter__()
    config = build_config(
        probe_streams=2, chunk_size=2048, prefill_tokens=64, inject_every_s=None, listen_host="127.0.0.1",
        listen_port=0, target=engine.url, scrape_interval_s=0.5, protocol={"decode_output_tokens": 96},
    )
    runner = Runner(config, ExternalLauncher(engine.url, 2048))
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    engine_up = True
    try:
        await asyncio.wait_for(runner.ready.wait(), 20)
        base = f"http://127.0.0.1:{runner.bound_port}"
        async with aiohttp.ClientSession() as session:
            assert (await _status(session, f"{base}/livez"))[0] == 200
            assert (await _status(session, f"{base}/readyz"))[0] == 200
            await engine.__aexit__(None, None, None)  # the engine goes away (a restart, an OOM...)
            engine_up = False
            deadline = time.monotonic() + 30
            while True:
                status, body = await _status(session, f"{base}/metrics")
                assert status == 200
                if "\npdexporter_up 0.0" in "\n" + body:
                    break
                assert time.monotonic() < deadline, "pdexporter_up never went to 0 with the engine gone"
                await asyncio.sleep(0.2)
            while 'pdexporter_up_reason{reason="engine-unreachable"} 1.0' not in body:  # why up is 0
                # (first maybe "engine-protocol-error": a stream closed before [DONE]; then refused)
                assert time.monotonic() < deadline, "up_reason never said engine-unreachable"
                await asyncio.sleep(0.2)
                status, body = await _status(session, f"{base}/metrics")
            assert await _status(session, f"{base}/livez") == (200, "ok\n")
            assert await _status(session, f"{base}/readyz") == (200, "ready\n")
            assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        if engine_up:
            await engine.__aexit__(None, None, None)
