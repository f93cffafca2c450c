"""Failure paths of the live exporter, against ScriptedEngine (a TEST DOUBLE that can be told to
misbehave; the embedded engine never fails on purpose)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from pdexporter.exporter.config import build_config
from pdexporter.exporter.runner import Runner
from pdexporter.launch import ExternalLauncher
from tests.helpers import until
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.integration


def _value(runner: Runner, name: str, **labels: str) -> float:
    for family in runner.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0  # a labelled child not created yet


class PickyEngine(ScriptedEngine):
    """ScriptedEngine that can reject only the injected prefills (prompts of `reject_prompt_len`)."""

    reject_prompt_len: int | None = None

    async def _completions(self, request):  # type: ignore[no-untyped-def]
        if self.reject_prompt_len is not None:
            body = await request.json()
            if len(body.get("prompt", [])) == self.reject_prompt_len:
                self.completion_calls += 1
                return web.json_response({"error": {"message": "rejected by the test", "code": 400}}, status=400)
        return await super()._completions(request)


async def test_engine_errors_are_counted_and_the_exporter_recovers() -> None:
    async with PickyEngine(cadence_s=0.004) as engine:
        config = build_config(
            probe_streams=2, chunk_size=2048, prefill_tokens=64, inject_every_s=0.2, listen_host="127.0.0.1",
            listen_port=0, target=engine.url, scrape_interval_s=0.2, protocol={"decode_output_tokens": 96},
        )
        runner = Runner(config, ExternalLauncher(engine.url, 2048))
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        try:
            await asyncio.wait_for(runner.ready.wait(), 20)
            await until(lambda: runner.windows_seen >= 1, 20, "a first window", step_s=0.02)
            assert _value(runner, "pdexporter_up") == 1
            assert _value(runner, "pdexporter_engine_scrape_success") == 1

            engine.reject_prompt_len = 64  # the prefills fail, the probes do not
            await until(lambda: _value(runner, "pdexporter_injections_total", outcome="error") >= 2, 20,
                        "two failed injections", step_s=0.02)
            assert _value(runner, "pdexporter_errors_total", kind="http") >= 2
            assert _value(runner, "pdexporter_up") == 1
            engine.reject_prompt_len = None

            engine.behaviour = "reject"  # every new request now gets HTTP 400: probes die as they restart
            http_errors = _value(runner, "pdexporter_errors_total", kind="http")
            await until(lambda: _value(runner, "pdexporter_up") == 0, 20, "up 0", step_s=0.02)
            await until(lambda: _value(runner, "pdexporter_errors_total", kind="http") > http_errors + 1, 20,
                        "http errors", step_s=0.02)
            assert _value(runner, "pdexporter_errors_total", kind="connect") == 0

            windows = runner.windows_seen
            engine.behaviour = "ok"
            await until(lambda: _value(runner, "pdexporter_up") == 1, 20, "up 1", step_s=0.02)
            await until(lambda: runner.windows_seen > windows, 20, "windows after recovery", step_s=0.02)
            assert not task.done()
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
    assert _value(runner, "pdexporter_up") == 0
