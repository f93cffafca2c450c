"""The exposition: every series documented, no `_created` series, conventions held."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pdexporter.exporter import metrics as m

DOCS = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"


def _exposition() -> str:
    metrics = m.ExporterMetrics()
    metrics.probe_tpot.labels(phase="baseline").observe(0.006)
    metrics.probe_tokens.inc(3)
    metrics.injections.labels(outcome="ok").inc()
    metrics.probe_timestamp_delay.observe(0.0001)
    return generate_latest(metrics.registry).decode()


def test_no_created_series() -> None:
    text = _exposition()
    assert "_created" not in text
    assert "pdexporter_probe_tokens_total 3.0" in text


def test_every_series_is_documented_and_prefixed() -> None:
    documented = set(re.findall(r"`(pdexporter_[a-z0-9_]+)`", DOCS.read_text()))
    families = {f.name for f in text_string_to_metric_families(_exposition())}
    for family in families:
        assert family.startswith("pdexporter_")
        assert family in documented or f"{family}_total" in documented, family
    for name in (m.PROBE_TPOT, m.PROBE_TIMESTAMP_DELAY, m.UP, m.ERRORS):
        assert name in documented


def test_counters_end_in_total_and_durations_in_seconds() -> None:
    text = _exposition()
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            assert any(s.name.endswith("_total") for s in family.samples) or not family.samples
        if "duration" in family.name or "tpot" in family.name or "delay" in family.name:
            assert family.name.endswith("_seconds") or family.name.endswith("_ratio"), family.name
