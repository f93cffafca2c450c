"""SGLang restarted with another `--chunked-prefill-size` under a running exporter that took its
chunk size from the engine (none given): the windows go on under the new size, recorded where a run
started now would record them; in passive mode the tracker and the event model start afresh at the
new size. Where the size was given, the run ends in one line instead (exit 3). The engine is
pdexporter's embedded engine imitating SGLang over real HTTP (`sim serve --engine sglang`: it
publishes its chunk size in /server_info as SGLang does), stopped and started again on the same port."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pdexporter.errors import EngineChanged
from pdexporter.exporter.metrics import PASSIVE_MODEL_EVENTS, PASSIVE_MODEL_PREDICTION
from tests.helpers import free_port, until
from tests.integration.faults.faultkit import live, value
from tests.integration.sim.conftest import ServedEngine, start_sim_serve

pytestmark = pytest.mark.integration


async def sglang(tmp: Path, port: int, chunk: int) -> ServedEngine:
    tmp.mkdir(parents=True, exist_ok=True)
    return await asyncio.to_thread(start_sim_serve, tmp, "--engine", "sglang", "--enable-metrics", "--port", str(port),
                                   "--chunked-prefill-size", str(chunk))


async def test_a_published_chunk_size_that_changes_at_a_restart_is_followed(tmp_path: Path) -> None:
    port, lines = free_port(), []
    first = await sglang(tmp_path / "a", port, 4096)
    second: ServedEngine | None = None
    out = tmp_path / "out"
    try:
        async with live(first.url, log=lines.append, launcher_chunk=None, chunk_size=8192,
                        chunk_size_source="assumed", prefill_tokens=4096, out=out) as (runner, task):
            await until(lambda: runner.windows_seen >= 1, 60, "a first window")
            assert runner.config.chunk_size == 4096  # as it published it at the start
            await asyncio.to_thread(first.stop)
            second = await sglang(tmp_path / "b", port, 2048)
            await until(lambda: any("another chunk size" in line for line in lines), 60, "the new size adopted")
            windows = runner.windows_seen
            await until(lambda: runner.windows_seen > windows, 60, "a window under the new size")
            assert not task.done() and runner.config.chunk_size == 2048
            assert value(runner, "pdexporter_engine_info", chunk_size="2048", chunk_size_source="published") == 1
            assert value(runner, "pdexporter_engine_info", chunk_size="4096") == 0  # one engine, one series
            assert value(runner, "pdexporter_engine_restarts_total") >= 1
    finally:
        for engine in (first, second):
            if engine is not None:
                await asyncio.to_thread(engine.stop)
    said = next(line for line in lines if "another chunk size" in line)
    assert "chunk size 4096 -> 2048" in said and "windows go on under 2048" in said, said
    after = json.loads((out / "2048" / "D2_P4096.json").read_text())
    assert after["config"]["chunk_size"] == 2048 and after["config"]["chunk_size_source"] == "published"
    before = json.loads((out / "4096" / "D2_P4096.json").read_text())  # the first size's windows stay there
    started = [{r["engine_metrics"]["process_start_time_seconds"] for r in rec["reps"]} for rec in (before, after)]
    assert all(len(s) == 1 for s in started) and started[0] != started[1], started  # one engine process each


async def test_a_given_chunk_size_contradicted_at_a_restart_ends_the_run(tmp_path: Path) -> None:
    port = free_port()
    first = await sglang(tmp_path / "a", port, 4096)
    second: ServedEngine | None = None
    try:
        with pytest.raises(EngineChanged) as caught:
            async with live(first.url, launcher_chunk=4096, chunk_size=4096, prefill_tokens=4096) as (runner, task):
                await until(lambda: runner.windows_seen >= 1, 60, "a first window")
                await asyncio.to_thread(first.stop)
                second = await sglang(tmp_path / "b", port, 2048)
                await until(task.done, 60, "the run to end")
    finally:
        for engine in (first, second):
            if engine is not None:
                await asyncio.to_thread(engine.stop)
    message = str(caught.value)
    assert "\n" not in message and "4096" in message and "2048" in message, message


async def test_in_passive_mode_a_new_published_chunk_size_starts_the_event_model_afresh(tmp_path: Path) -> None:
    """The old size's event model cannot price the new size's prefills: a fresh tracker and model take
    over (a run started now), the old size's model series go, the scrapes reach the new tracker."""
    port, lines = free_port(), []
    first = await sglang(tmp_path / "a", port, 4096)
    second: ServedEngine | None = None
    cell = {"chunk_size": "4096", "decode_batch_size": "4", "new_prefill_tokens": "1024", "engine": "sglang"}
    try:
        async with live(first.url, log=lines.append, launcher_chunk=None, chunk_size=8192,
                        chunk_size_source="assumed", passive=True, inject_every_s=None,
                        out=tmp_path / "out") as (runner, task):
            await until(lambda: runner.passive is not None, 60, "passive mode to start")
            old = runner.passive
            assert old is not None and old.tracker.settings.chunk_size == 4096 and old.model.grid.chunk_sizes == (4096,)
            # what a refit of the old size had published
            runner.metrics.passive_model_prediction.labels(**cell, bound="estimate").set(0.5)
            runner.metrics.passive_model_events.set(12)
            await asyncio.to_thread(first.stop)
            second = await sglang(tmp_path / "b", port, 2048)
            await until(lambda: any("another chunk size" in line for line in lines), 60, "the new size adopted")
            new = runner.passive
            assert new is not None and new is not old and runner.traces.passive is new
            assert new.tracker.settings.chunk_size == 2048 and new.model.grid.chunk_sizes == (2048,)
            await until(lambda: len(new.tracker._scrapes) > 0, 30, "a scrape reaching the new tracker")
            assert not task.done() and runner.config.chunk_size == 2048
            families = {f.name: f for f in runner.metrics.registry.collect()}
            prediction = families[PASSIVE_MODEL_PREDICTION]
            assert not [s for s in prediction.samples if s.labels.get("chunk_size") == "4096"]
            assert value(runner, PASSIVE_MODEL_EVENTS) == 0
            assert value(runner, "pdexporter_engine_info", chunk_size="2048", chunk_size_source="published") == 1
    finally:
        for engine in (first, second):
            if engine is not None:
                await asyncio.to_thread(engine.stop)
