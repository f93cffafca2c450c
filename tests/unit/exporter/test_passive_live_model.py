"""run --passive's live event model (exporter.passive_live.LiveModel): refitted off the loop as
events come, published as the pdexporter_passive_model_* gauges."""

from __future__ import annotations

import asyncio
import math
import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pdexporter.exporter import metrics as m
from pdexporter.exporter.metrics import ExporterMetrics
from pdexporter.exporter.passive_live import MODEL_EVERY_S, MODEL_FIRST_EVERY_S, LiveModel
from tests.unit.analysis.test_passive_model import _events


def _samples(metrics: ExporterMetrics) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


async def test_the_live_model_refits_off_the_loop_and_publishes_how_sure_it_is() -> None:
    metrics = ExporterMetrics()
    model = LiveModel(metrics, 8192, "pdexporter-sim")
    for e in _events(120, noise=0.1):
        model.events.append(e)
        model.added += 1
    now = time.monotonic()
    model.tick(now)  # starts the fit in a worker thread
    assert model._future is not None
    for _ in range(600):
        if model._future is not None and model._future.done():
            break
        await asyncio.sleep(0.05)
    model.tick(now + 1)
    assert model.last is not None and model.next_s >= now + 1 + MODEL_EVERY_S
    got = _samples(metrics)
    assert got[m.PASSIVE_MODEL_EVENTS][0].value == 120
    width = got[m.PASSIVE_MODEL_HALFWIDTH][0].value
    assert 0 < width < 0.5 and not math.isnan(width)
    reached = {
        (s.labels["decode_batch_size"], s.labels["new_prefill_tokens"]): s.value
        for s in got[m.PASSIVE_MODEL_REACHED]
    }
    assert len(reached) == 42 and reached[("1", "2048")] == 0 and reached[("8", "2048")] == 1
    assert got[m.PASSIVE_MODEL_CELLS][0].value == sum(reached.values())
    bounds = {
        s.labels["bound"]: s.value
        for s in got[m.PASSIVE_MODEL_PREDICTION]
        if s.labels["decode_batch_size"] == "8" and s.labels["new_prefill_tokens"] == "2048"
    }
    assert set(bounds) == set(m.PASSIVE_MODEL_BOUNDS)
    assert bounds["low"] <= bounds["estimate"] <= bounds["high"] and 0.1 < bounds["estimate"] < 1.0  # seconds
    model.tick(now + 2)  # nothing new since: no refit
    assert model._future is None


async def _fit_now(model: LiveModel, now: float) -> None:
    model.tick(now)
    assert model._future is not None
    for _ in range(600):
        if model._future.done():
            break
        await asyncio.sleep(0.05)
    model.tick(now + 1)


async def test_until_a_fit_gives_an_answer_the_next_comes_sooner() -> None:
    """Two events give no model: the next fit is due MODEL_FIRST_EVERY_S later, not MODEL_EVERY_S (the
    first numbers of a new exporter came up to 30 s after there were events enough); once a fit gave
    an answer, every MODEL_EVERY_S again, even when a later fit gives none."""
    assert MODEL_FIRST_EVERY_S < MODEL_EVERY_S
    model = LiveModel(ExporterMetrics(), 8192, "pdexporter-sim")
    events = _events(120, noise=0.1)
    for e in events[:2]:
        model.events.append(e)
        model.added += 1
    t1 = time.monotonic()
    await _fit_now(model, t1)
    assert model.last is None and t1 + 1 + MODEL_FIRST_EVERY_S <= model.next_s < t1 + 1 + MODEL_EVERY_S
    for e in events[2:]:
        model.events.append(e)
        model.added += 1
    t2 = model.next_s
    await _fit_now(model, t2)
    assert model.last is not None and model.next_s >= t2 + 1 + MODEL_EVERY_S
    model.events.clear()  # a later fit with too few events: the interval stays MODEL_EVERY_S
    for e in events[:2]:
        model.events.append(e)
        model.added += 1
    t3 = model.next_s
    await _fit_now(model, t3)
    assert model._future is None and model.next_s >= t3 + 1 + MODEL_EVERY_S


def test_an_exporter_that_is_not_passive_does_not_import_pandas() -> None:
    """The event model (numpy, pandas) is imported when passive mode fits, not by `run` itself."""
    import subprocess
    import sys

    code = ("import sys; import pdexporter.cli.run, pdexporter.exporter.runner, pdexporter.exporter.passive_live;"
            "print(sorted(m for m in sys.modules if m.startswith(('pandas', 'pdexporter.analysis.passive_model'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


async def test_thresholds_that_cannot_be_computed_are_said_not_fatal() -> None:
    """A decision.json the evaluator cannot read: refused in one line at start (`decision_problem`),
    and should one get through, the refit goes on and /thresholds.yaml says why (503)."""
    import copy
    import json
    from pathlib import Path

    from pdexporter.analysis.live_thresholds import decision_problem
    from pdexporter.exporter.passive_live import thresholds_response

    doc = json.loads((Path(__file__).resolve().parents[3] / "results" / "h200x2-arms" / "decision.json").read_text())
    assert decision_problem(doc) is None
    broken = copy.deepcopy(doc)
    broken["two_arm"]["terms"]["decode_side"]["coefficients"] = {}
    problem = decision_problem(broken)
    assert problem is not None and problem.startswith("its two-arm verdict cannot be evaluated (KeyError")
    metrics = ExporterMetrics()
    model = LiveModel(metrics, 8192, "pdexporter-sim", decision=broken)
    for e in _events(60, noise=0.1):
        model.events.append(e)
        model.added += 1
    now = time.monotonic()
    model.tick(now)
    assert model._future is not None
    for _ in range(600):
        if model._future.done():
            break
        await asyncio.sleep(0.05)
    model.tick(now + 1)
    assert model.last is not None and model.thresholds is None  # the event model itself was published
    status, text, _ = thresholds_response(model, now + 2)
    assert status == 503 and "the thresholds could not be computed (KeyError" in text and text.count("\n") == 1


async def test_the_last_minutes_launch_levels_are_published() -> None:
    """Events whose launch-bound one-chunk prompts ran at two levels give the last 5 minutes' count at each and the
    slow share; events of one level give no level series and a NaN share (what the gauges' help says)."""
    from tests.unit.analysis.test_passive_model import _two_level_events

    metrics = ExporterMetrics()
    model = LiveModel(metrics, 8192, "pdexporter-sim")
    for e in _two_level_events(240):
        model.events.append(e)
        model.added += 1
    await _fit_now(model, time.monotonic())
    got = _samples(metrics)
    counts = {s.labels["level"]: s.value for s in got[m.PASSIVE_MODEL_LAUNCH_EVENTS]}
    assert set(counts) == set(m.LAUNCH_LEVEL_LABELS) and 60 <= counts["fast"] <= 75 and 60 <= counts["slow"] <= 75
    share = got[m.PASSIVE_MODEL_LAUNCH_SLOW_SHARE][0].value
    assert share == counts["slow"] / (counts["fast"] + counts["slow"]) and 0.4 < share < 0.6
    one = LiveModel(metrics, 8192, "pdexporter-sim")
    for e in _events(120, noise=0.1):
        one.events.append(e)
        one.added += 1
    await _fit_now(one, time.monotonic())
    got = _samples(metrics)
    assert m.PASSIVE_MODEL_LAUNCH_EVENTS not in got and math.isnan(got[m.PASSIVE_MODEL_LAUNCH_SLOW_SHARE][0].value)
