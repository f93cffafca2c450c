"""`pdexporter run --passive` in real time on the embedded engine, beside `pdexporter load` in its
own process: the embedded engine is pointed at the exporter's trace receiver (as a vLLM with
`--otlp-traces-endpoint` would be), the production prefills become `mode="passive"` windows,
records and labelled probe intervals; nothing is injected. Only what happened is checked here,
not timing (that is the virtual-time test's and the benchmark's business)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pdexporter.exporter import metrics as m
from pdexporter.exporter.config import build_config
from pdexporter.exporter.runner import Runner, WindowResult
from pdexporter.exporter.server import THRESHOLDS_PATH
from pdexporter.launch import SimLauncher
from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.measure.store import ResultsStore, load_record_file
from tests.helpers import stop_process

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
PROFILE = "h200-qwen3-coder-30b-a3b"
DECISION = ROOT / "results" / "h200x2-arms" / "decision.json"  # --decision: the live thresholds' other arm


def _samples(runner: Runner) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(runner.metrics.registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


@pytest.mark.slow
async def test_passive_run_publishes_production_prefills(tmp_path: Path) -> None:
    config = build_config(probe_streams=4, chunk_size=8192, listen_host="127.0.0.1", listen_port=0, passive=True,
                          traces_listen_port=0,
                          profile=PROFILE, out=tmp_path / "results", attribution_wait_s=15.0,
                          scrape_interval_s=1.0, protocol={"decode_output_tokens": 128},
                          decision_file=DECISION, threshold_every_s=10.0)
    windows: list[WindowResult] = []
    runner = Runner(config, SimLauncher(profile=PROFILE), on_window=windows.append,
                    decision=json.loads(DECISION.read_text()))
    served: list[tuple[int, str, str]] = []
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    load = None
    try:
        await asyncio.wait_for(runner.ready.wait(), 120)
        assert runner.handle is not None and runner.injections_sent == 0
        load = subprocess.Popen(
            [sys.executable, "-m", "pdexporter", "load", "--target", runner.handle.url, "--rate", "2",
             "--duration", "20s", "--seed", "3"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 75
        while len(windows) < 3 and time.monotonic() < deadline:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.5)
        async with aiohttp.ClientSession() as client:  # the live thresholds' endpoint, on the metrics port
            for path in (THRESHOLDS_PATH, "/"):
                async with client.get(f"http://127.0.0.1:{runner.bound_port}{path}") as response:
                    served.append((response.status, response.content_type, await response.text()))
    finally:
        if load is not None:  # enough traffic seen: the load stops with the test, not after its 20 s
            stop_process(load)
        stop.set()
        await asyncio.wait_for(task, 60)
    assert len(windows) >= 3, runner.passive.outcomes if runner.passive else None
    (status, kind, body), (_, _, landing) = served
    assert THRESHOLDS_PATH in landing
    if status == 200:  # a fit of >= 4 usable events came already (virtual time: test_live_thresholds)
        assert kind == "application/yaml" and yaml.safe_load(body)["plugins"]
    else:
        assert status == 503 and body.startswith("no live threshold yet: ") and body.count("\n") == 1
    assert runner.injections_sent == 0
    for w in windows:
        assert w.mode == "passive" and w.event is not None and w.event.published
        assert w.rep.baseline.source == "passive-quiet"
        assert w.event.source in ("otlp", "metrics")
        assert w.run.new_prefill_tokens == w.event.attribution.prompt_tokens
        assert w.rep.derived.tpot_penalty_ms is not None
    samples = _samples(runner)
    penalty = [s for s in samples[m.WINDOW_PENALTY] if s.labels["mode"] == "passive"]
    assert penalty and {s.labels["new_prefill_tokens"] for s in penalty} <= {str(2**k) for k in range(7, 18)}
    traces = {s.labels["kind"]: s.value for s in samples[m.REQUEST_TRACES]}
    assert traces["production"] > 0 and traces["probe"] > 0  # the engine's spans came in, ours set aside
    outcomes: dict[str, float] = {}  # summed over the sources (otlp, metrics, ...)
    for sample in samples[m.PASSIVE_EVENTS]:
        outcomes[sample.labels["outcome"]] = outcomes.get(sample.labels["outcome"], 0.0) + sample.value
    assert outcomes.get("published", 0) >= len(windows)
    windowed = [s for s in samples[f"{m.PROBE_TPOT}_count"] if s.labels["phase"] == "prefill_window"]
    assert windowed and windowed[0].value > 0  # probe intervals in the runs are labelled as such
    records = [load_record_file(p) for p in ResultsStore(tmp_path / "results").iter_record_paths()]
    assert records and all(r.config.mode == "passive" for r in records)
    reps = [rep for r in records for rep in r.reps]
    assert len(reps) == len(windows)
    assert all((rep.model_extra or {}).get("passive", {}).get("source") in ("otlp", "metrics") for rep in reps)
    # every production prefill the traces told, logged for a later rule (ids and token counts only),
    # and the runs of several prefills kept apart: merged/ and joint/ hold no published window
    logged = [json.loads(line) for line in (tmp_path / "results" / "requests.jsonl").read_text().splitlines()]
    # ... and the window settings the events were derived with, for `reanalyse` (window.json)
    assert json.loads((tmp_path / "results" / "window.json").read_text())["window"]["after_intervals"] == \
        ProtocolSettings().after_intervals
    assert logged and set(logged[0]) == {"request_id", "prompt_tokens", "first_token_ns", "prefill_ms"}
    ids = {r["request_id"] for r in logged}
    traced = [rep for rep in reps if rep.model_extra["passive"]["source"] == "otlp"]
    assert all(set(rep.model_extra["passive"]["request_ids"]) <= ids for rep in traced)
    # ... each with its prefills' own prompt tokens (what the event model prices a joint event's attention by)
    assert all(sum(rep.model_extra["passive"]["prompt_sizes"]) == rep.model_extra["passive"]["prompt_tokens"]
               for rep in traced)
    for folder in ("merged", "joint"):
        for path in ResultsStore(tmp_path / "results" / folder).iter_record_paths():
            assert all(rep.model_extra["passive"]["prefills"] > 1 for rep in load_record_file(path).reps)
