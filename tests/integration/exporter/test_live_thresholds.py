"""`run --passive --decision FILE`: the router threshold, live from production traffic (issue 33).

The embedded engine (the H200 profile) serves 90 s of `pdexporter load`-shaped traffic beside the
exporter's probes and its passive tracker, in virtual time (`predict.passive`: the same tracker,
spans and scrapes as the live runner; minutes of traffic in seconds of this machine). Its
published events go, in the order and on the clock the traffic made them, into the live runner's
event model (`exporter.passive_live.LiveModel`) with the committed two-arm decision.json of the
same engine's GPU (`results/h200x2-arms/`): the refit publishes `pdexporter_offload_threshold_*`
and the exporter's HTTP server serves `/thresholds.yaml`. Not `realtime`: nothing here measures
this machine's time (the refit runs in a worker thread; the test waits for it).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pdexporter._internal.vloop import run_virtual
from pdexporter.analysis.live_thresholds import live_decision
from pdexporter.analysis.thresholds import compute_thresholds
from pdexporter.exporter import metrics as m
from pdexporter.exporter.metrics import ExporterMetrics
from pdexporter.exporter.passive_live import LiveModel, thresholds_response
from pdexporter.exporter.server import THRESHOLDS_PATH, metrics_app, start_server
from pdexporter.load.mix import LoadSpec
from pdexporter.predict.passive import PassiveSession, passive_session

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
PROFILE = "h200-qwen3-coder-30b-a3b"
B = 8192
DECISION = json.loads((ROOT / "results" / "h200x2-arms" / "decision.json").read_text())


@pytest.fixture(scope="module")
def session() -> PassiveSession:
    return run_virtual(passive_session(PROFILE, B, LoadSpec(rate=1.5, duration_s=90, seed=5), probes=4))


def _samples(metrics: ExporterMetrics) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


async def _refit(model: LiveModel, now: float) -> None:
    model.tick(now)
    assert model._future is not None
    for _ in range(1200):
        if model._future.done():
            break
        await asyncio.sleep(0.05)
    model.tick(now + 1)


async def test_live_thresholds_from_production_traffic_are_served(session: PassiveSession) -> None:
    metrics = ExporterMetrics()
    model = LiveModel(metrics, B, "pdexporter-sim", decision=DECISION, threshold_every_s=60.0, modelled=True)
    status, text, _ = thresholds_response(model, time.monotonic())
    assert status == 503 and text.count("\n") == 1 and "no live threshold yet: 0" in text
    for event in session.published:
        model.add(event, event.slow_run.end_ns)  # as the runner hands them over, on the traffic's clock
    assert model.added >= 30, session.outcomes
    now = time.monotonic()
    await _refit(model, now)
    live = model.thresholds
    assert live is not None and model.last is not None and live.events == model.last.model.events >= 20

    got = _samples(metrics)
    series = {(s.labels["decode_batch_size"], s.labels["bound"]): s.value for s in got[m.OFFLOAD_THRESHOLD]}
    assert {s.labels["chunk_size"] for s in got[m.OFFLOAD_THRESHOLD]} == {str(B)}
    decodes = sorted({int(d) for d, _ in series})
    assert decodes[0] == 1 and decodes[-1] >= 12  # the file's D, and beyond where the traffic went
    for d in decodes:
        low, central, high = (series[(str(d), b)] for b in ("low", "central", "high"))
        assert 0 < low <= central <= high, (d, low, central, high)
    events = {s.labels["decode_batch_size"]: s.value for s in got[m.OFFLOAD_THRESHOLD_EVENTS]}
    assert sum(events.values()) == live.events and max(events.values()) > 0
    assert got[m.OFFLOAD_THRESHOLD_TIMESTAMP][0].value == pytest.approx(time.time(), abs=120)

    # the one computation: what `pdexporter thresholds` gives for the live document
    doc = live_decision(DECISION, model.last.model, B, modelled=True)
    batch = compute_thresholds(doc, chunk_sizes=[B], decode_batch_sizes=decodes,
                               replicates=len(doc["replicates"]["model"]))
    for d in decodes:
        ours, theirs = live.result.at(B, d), batch.at(B, d)
        assert ours is not None and theirs is not None
        assert (ours.threshold, ours.low, ours.high) == (theirs.threshold, theirs.low, theirs.high)

    server, port = await start_server(metrics_app(
        metrics.registry, thresholds=lambda: thresholds_response(model, now + 31)), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{port}{THRESHOLDS_PATH}") as response:
                assert response.status == 200 and response.content_type == "application/yaml"
                body = await response.text()
                assert response.headers["Age"] == "30" and response.headers["X-Pdexporter-Events"] == str(live.events)
            async with client.get(f"http://127.0.0.1:{port}/metrics") as response:
                assert m.OFFLOAD_THRESHOLD in await response.text()
    finally:
        await server.cleanup()
    config = yaml.safe_load(body)
    decider = next(p for p in config["plugins"] if p["type"] == "prefix-based-pd-decider")
    d = live.current_d
    assert d is not None and 1 <= d <= decodes[-1]
    entry = live.result.at(B, d)
    assert entry is not None and entry.safe is not None
    assert decider["parameters"]["nonCachedTokens"] == entry.safe - 1 > 0  # the safe end where undecided
    assert "computed 30 s ago" in body and f"from {live.events} production prefills" in body
    assert f"the current load is D={d}" in body
    assert not math.isnan(series[(str(d), "central")])


async def test_thresholds_yaml_is_guarded_like_metrics() -> None:
    """docs/security.md: with --metrics-token-file, /thresholds.yaml needs the token too."""
    metrics = ExporterMetrics()
    model = LiveModel(metrics, B, "pdexporter-sim", decision=DECISION)
    app = metrics_app(metrics.registry, token="s3cret", thresholds=lambda: thresholds_response(model, 0.0),
                      links={THRESHOLDS_PATH: THRESHOLDS_PATH})
    server, port = await start_server(app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{port}{THRESHOLDS_PATH}"
            async with client.get(url) as response:
                assert response.status == 401
            async with client.get(url, headers={"Authorization": "Bearer s3cret"}) as response:
                assert response.status == 503 and response.headers["Retry-After"] == "30"
            async with client.get(f"http://127.0.0.1:{port}/", headers={"Authorization": "Bearer s3cret"}) as response:
                assert THRESHOLDS_PATH in await response.text()
    finally:
        await server.cleanup()
