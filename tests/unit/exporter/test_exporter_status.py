"""`pdexporter_up` and its reason (exporter.status), and the start-up wait's settings (exporter.startup)."""

from __future__ import annotations

import pytest

from pdexporter.errors import (
    ConfigError,
    EngineHTTPError,
    EngineRefused,
    EngineTimeout,
    EngineUnreachable,
    MeasurementError,
    SSEProtocolError,
)
from pdexporter.exporter.metrics import UP_REASONS, ExporterMetrics, set_up
from pdexporter.exporter.startup import EngineWait, parse_engine_wait
from pdexporter.exporter.status import STALL_S, reason_of, up_reason


@pytest.mark.parametrize(("error", "reason"), [
    (EngineRefused("cannot connect"), "engine-unreachable"),
    (EngineUnreachable("connection lost"), "engine-unreachable"),
    (EngineTimeout("no answer"), "engine-timeout"),
    (EngineHTTPError("u", 503, "loading"), "engine-http-error"),
    (SSEProtocolError("not JSON"), "engine-protocol-error"),
    (MeasurementError("warm-up did not finish"), "engine-protocol-error"),
])
def test_each_failure_has_its_reason(error: Exception, reason: str) -> None:
    assert reason_of(error) == reason and reason in UP_REASONS


def test_up_reason_while_the_probes_run() -> None:
    ok = dict(open_probes=4, wanted=4, seconds_since_token=0.1, probe_thread_ok=True, last_error=None)
    assert up_reason(**ok) == "ok"
    assert up_reason(**{**ok, "open_probes": 3}) == "probes-restarting"
    assert up_reason(**{**ok, "open_probes": 3, "handing_over": 1}) == "ok"  # a probe between two streams
    assert up_reason(**{**ok, "seconds_since_token": STALL_S + 1}) == "probes-stalled"
    assert up_reason(**{**ok, "open_probes": 0, "last_error": EngineRefused("x")}) == "engine-unreachable"
    # A failure since the last token wins over "ok" (the book clears it at the next token): an
    # engine that died was up 1 for ~5 s while its probes' restarts were retried, then flapped for
    # 8 s as they came and went (issue 24).
    assert up_reason(**{**ok, "last_error": EngineHTTPError("u", 500, "x")}) == "engine-http-error"
    assert up_reason(**{**ok, "last_error": EngineRefused("x")}) == "engine-unreachable"
    # one open probe silent for STALL_S is a stall, though the others' tokens flow (it held every
    # window for the read timeout, 300 s, with up 1 "ok")
    assert up_reason(**{**ok, "stalled_probes": 1}) == "probes-stalled"


def test_set_up_exports_every_reason_and_one_of_them() -> None:
    metrics = ExporterMetrics()
    values = {}
    set_up(metrics, "engine-http-error")
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "pdexporter_up_reason":
                values[sample.labels["reason"]] = sample.value
            if sample.name == "pdexporter_up":
                up = sample.value
    assert set(values) == set(UP_REASONS) and values["engine-http-error"] == 1 and sum(values.values()) == 1
    assert up == 0
    with pytest.raises(ValueError, match="unknown up reason"):
        set_up(metrics, "because")


def test_engine_wait() -> None:
    assert parse_engine_wait("forever") is None and parse_engine_wait("20m") == 1200.0
    with pytest.raises(ConfigError, match="--engine-wait '0s'"):
        parse_engine_wait("0s")
    with pytest.raises(ConfigError, match="--engine-wait 'soon'"):
        parse_engine_wait("soon")
    assert EngineWait().backoffs() == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
