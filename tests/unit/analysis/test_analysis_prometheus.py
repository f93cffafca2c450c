"""The Prometheus puller's pure parts: time arguments, window reconstruction, error mapping."""

from __future__ import annotations

import datetime as dt
import json
import urllib.error

import pytest

from pdexporter.errors import ConfigError
from pdexporter.exporter import metrics as m
from pdexporter.exporter import prometheus as pm

NOW = 1_700_000_000.0


@pytest.mark.parametrize("text, expected", [
    ("now", NOW),
    ("-1h", NOW - 3600),
    ("now-15m", NOW - 900),
    ("-1h30m", NOW - 5400),
    ("-90s", NOW - 90),
    ("-5", NOW - 5),
    ("-1.5h", NOW - 5400),
    ("1699990000", 1699990000.0),
    ("1699990000.25", 1699990000.25),
    ("2023-11-14T22:13:20Z", NOW),
    ("2023-11-14T23:13:20+01:00", NOW),
    ("2023-11-14T22:13:20", NOW),  # naive: UTC (documented)
])
def test_parse_time(text, expected):
    assert pm.parse_time(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["yesterday", "-1x", "2023-13-45T00:00:00Z", "", "-", "nan", "-inf"])
def test_parse_time_rejects_with_one_line(text):
    with pytest.raises(ConfigError) as info:
        pm.parse_time(text, NOW, "--from")
    message = str(info.value)
    assert message.startswith("--from") and "\n" not in message and "RFC3339" in message


def test_parse_duration():
    assert pm.parse_duration("1s") == 1.0
    assert pm.parse_duration("250ms") == 0.25
    assert pm.parse_duration("2m") == 120.0
    assert pm.parse_duration("15") == 15.0
    with pytest.raises(ConfigError, match="^--step '1 sec'"):
        pm.parse_duration("1 sec", "--step")


def _labels(b: int, d: int, p: int, instance: str = "exp:1") -> dict[str, str]:
    return {"chunk_size": str(b), "decode_batch_size": str(d), "new_prefill_tokens": str(p),
            "instance": instance, "job": "pdexporter"}


def _series(labels: dict[str, str], points: list[tuple[float, float]]) -> dict:
    return {"metric": labels, "values": [[t, repr(v)] for t, v in points]}


def test_windows_take_the_gauges_at_the_increment_step():
    a, b = _labels(8192, 4, 8192), _labels(2048, 1, 512)
    increments = [_series(a, [(10.0, 1.0), (40.0, 1.0)]), _series(b, [(20.0, 2.0)])]
    gauges = {
        m.WINDOW_PENALTY: [_series(a, [(10.0, 0.0469), (40.0, 0.05)]), _series(b, [(20.0, 0.003)])],
        m.WINDOW_BASELINE: [_series(a, [(10.0, 0.0423), (40.0, 0.0423)])],
        m.WINDOW_CHUNKS: [_series(a, [(10.0, 1.0), (40.0, 2.0)]), _series(b, [(20.0, 1.0)])],
        m.WINDOW_SLOW_STEPS: [_series(a, [(10.0, 2.0), (40.0, 3.0)]), _series(b, [(20.0, 1.0)])],
        m.WINDOW_TOTAL: [_series(a, [(10.0, 0.0469)])],
    }
    rebuilt = pm.windows_from_series(increments, gauges)
    assert [w.time for w in rebuilt.windows] == [10.0, 20.0, 40.0]
    assert rebuilt.missed == 1  # b rose by 2 within one step: one window's values are gone
    first = rebuilt.windows[0]
    assert first.key == (8192, 4, 8192)
    assert first.values["tpot_penalty_ms"] == pytest.approx(46.9)
    assert first.values["tpot_baseline_ms"] == pytest.approx(42.3)
    assert first.values["num_chunks"] == 1
    assert first.values["slow_steps"] == 2
    assert first.values["tpot_interference_ms"] is None  # that gauge was not recorded
    samples = pm.samples_from_windows(rebuilt.windows, {8192: {"engine": "pdexporter-sim", "modelled": "true"}})
    by_key = {s.key: s for s in samples}
    assert len(by_key[(8192, 4, 8192)].reps) == 2
    assert by_key[(8192, 4, 8192)].modelled and by_key[(8192, 4, 8192)].engine == "pdexporter-sim"
    assert not by_key[(2048, 1, 512)].modelled
    rep = by_key[(8192, 4, 8192)].reps[0]
    assert rep["aggregate_interference_ms"] == pytest.approx(4 * 46.9)
    assert rep["decode_tokens_delayed"] == 2 * 4  # slow steps x D


def test_series_without_grid_labels_are_skipped():
    rebuilt = pm.windows_from_series([_series({"instance": "x"}, [(1.0, 1.0)])], {})
    assert rebuilt.windows == [] and rebuilt.skipped_series


def test_queries_name_the_exporters_series():
    q = pm.at_increments_query(m.WINDOW_PENALTY, 1.0)
    assert q.startswith(f"{m.WINDOW_PENALTY} and (")
    assert f"last_over_time({m.WINDOWS}[5m] offset 1000ms)" in q


def test_api_rejects_a_non_http_url():
    with pytest.raises(ConfigError, match="not an http"):
        pm.PrometheusAPI("localhost:9090")


def _failing(exc: BaseException):
    """A test double of the HTTP fetch that raises what urllib would."""
    def fetch(url: str, timeout: float) -> bytes:
        raise exc
    return fetch


@pytest.mark.parametrize("exc, words", [
    (urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")), "cannot reach Prometheus"),
    (TimeoutError("timed out"), "did not answer within"),
])
def test_transport_errors_become_one_line(exc, words):
    api = pm.PrometheusAPI("http://prom.example:9090", fetch=_failing(exc))
    with pytest.raises(pm.PrometheusError) as info:
        api.query_range("up", 0, 10, 1)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_query_errors_and_non_json_answers():
    def bad_query(url, timeout):
        return json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode()

    with pytest.raises(pm.PrometheusError, match="refused the query: parse error"):
        pm.PrometheusAPI("http://p:9090", fetch=bad_query).query_range("up", 0, 10, 1)
    with pytest.raises(pm.PrometheusError, match="not JSON"):
        pm.PrometheusAPI("http://p:9090", fetch=lambda u, t: b"<html>").query_range("up", 0, 10, 1)


def test_long_ranges_are_split_into_requests_of_at_most_11000_points():
    calls: list[dict[str, str]] = []

    def fetch(url: str, timeout: float) -> bytes:
        from urllib.parse import parse_qs, urlparse

        params = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
        calls.append(params)
        start, end = float(params["start"]), float(params["end"])
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"a": "1"}, "values": [[start, "1"], [end, "2"]]}]}}).encode()

    out = pm.PrometheusAPI("http://p:9090", fetch=fetch).query_range("x", 0.0, 30_000.0, 1.0)
    assert len(calls) == 3
    for c in calls:
        assert (float(c["end"]) - float(c["start"])) / float(c["step"]) + 1 <= pm.MAX_POINTS
    assert float(calls[0]["start"]) == 0.0 and float(calls[-1]["end"]) == 30_000.0
    assert len(out) == 1 and len(out[0]["values"]) == 6  # series merged across requests


def test_pull_checks_the_range_before_asking():
    api = pm.PrometheusAPI("http://p:9090", fetch=_failing(AssertionError("must not be called")))
    with pytest.raises(ConfigError, match="is not before"):
        pm.pull(api, NOW, NOW - 60)


def test_iso_is_utc():
    assert pm._iso(NOW) == dt.datetime.fromtimestamp(NOW, dt.UTC).isoformat(timespec="seconds")
