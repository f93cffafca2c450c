"""Rebuild per-window values from what Prometheus recorded of the exporter, for the same table.

The exporter (`pdexporter run`, `pdexporter.exporter.metrics`) publishes, per grid point
(labels chunk_size / decode_batch_size / new_prefill_tokens), the last analysed window's numbers
as `pdexporter_window_*` gauges and counts windows in `pdexporter_windows_total`. A window is
therefore an *increment* of that counter: at the evaluation step where the counter of a label set
went up, the gauges of the same label set (same scrape) hold that window's values.

We ask the HTTP API's `query_range`, at one step s (default 1 s), for

    increments:  (C - L) > 0  or  (C unless L) > 0  or  (C < L),  L = last_over_time(C[5m] offset s)

(C = pdexporter_windows_total, L its last sample before the step: a rise within the step; a series
born within it; a counter reset), and for each gauge G: `G and (increments)`: its values only at
those steps. L is the last *sample*, not `C offset s`: a scrape that fails (a timeout on a loaded
exporter) marks every series stale, and `C offset s` then reads nothing at the next step, so each
series came back "born" with its whole count again, a window that never happened with the last
window's values (a real Prometheus did so in the suite beside a CPU burner); `last_over_time`
skips the staleness marker. So the answer grows
with the number of windows, not with the length of the range. A range longer than 11 000 steps
(Prometheus' limit) is split into several requests.

Two windows of one label set within one step show as one increment of 2: only the second window's
values exist anywhere, so it is kept and the loss is counted and reported (use a step no longer
than the scrape interval, and scrape more often than windows happen).

Each rebuilt window becomes one "repetition" of its grid point (`table.ConfigSamples`), so the
table, fits and criteria are the same code as for records. Windows carry a `mode` label: `pull`
takes one mode, `active` (injected prefills, and series from before the label existed) by default,
or `passive` (production prefills of `run --passive`, whose D and P labels are bins); for passive
tables every rise of the counter counts as an event (`window_counts`), also where two windows fell
into one step and only the second one's values survive (`analysis.passive`).

The HTTP part is a thin edge (`PrometheusAPI`, urllib, injectable `fetch`); the reconstruction
(`windows_from_series`) and the time parsing (`parse_time`) are pure.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdexporter._internal.durations import parse_duration
from pdexporter._internal.text import shorten
from pdexporter.analysis.table import INT_VALUES, REP_VALUES, ConfigSamples
from pdexporter.errors import ConfigError, PdexporterError
from pdexporter.exporter import metrics as m

__all__ = [
    "Fetch", "GRID", "MAX_POINTS", "PrometheusAPI", "PrometheusError", "PullResult", "Reconstruction",
    "WINDOW_GAUGES", "Window", "at_increments_query", "engines_from_series", "increments_query", "parse_time",
    "pull", "samples_from_windows", "urllib_fetch", "window_counts", "windows_from_series",
]

MAX_POINTS = 11_000
GRID = m.GRID_LABELS

# Gauge -> (table column, factor to the table's unit): every declared window quantity with both.
WINDOW_GAUGES: dict[str, tuple[str, float]] = {
    name: (q.column, 1.0 / q.gauge_factor) for name, q in m.WINDOW_GAUGES.items() if q.column
}


class PrometheusError(PdexporterError):
    """Prometheus could not be reached, refused the query, or holds nothing for the range."""

    exit_code = 3


# ---------------------------------------------------------------------------------------------
# Times


def parse_time(text: str, now: float, option: str = "--from") -> float:
    """RFC3339, unix seconds, `now`, or relative: `-1h`, `now-15m`. Returns unix seconds."""
    t = text.strip()
    hint = "use RFC3339 (2025-01-31T12:00:00Z), unix seconds, 'now', or relative like -1h / now-15m"
    if t == "now":
        return now
    relative = t[3:] if t.startswith("now") else t
    if relative.startswith("-") or relative.startswith("+"):
        try:
            seconds = parse_duration(relative[1:], option)
        except ConfigError:
            raise ConfigError(f"{option} {text!r}: not a duration ({hint})") from None
        return now - seconds if relative[0] == "-" else now + seconds
    try:
        value = float(t)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{option} {text!r}: not a time ({hint})")
        return value
    try:
        parsed = dt.datetime.fromisoformat(t.replace("z", "Z"))
    except ValueError:
        raise ConfigError(f"{option} {text!r}: not a time ({hint})") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)  # documented: naive times are UTC
    return parsed.timestamp()


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------
# HTTP edge


Fetch = Callable[[str, float], bytes]


def urllib_fetch(url: str, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (user-given URL)
        return response.read()


@dataclass
class PrometheusAPI:
    base_url: str
    timeout_s: float = 30.0
    fetch: Fetch = urllib_fetch

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlparse(self.base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"--prometheus {self.base_url!r}: not an http(s) URL")
        self.base_url = self.base_url.rstrip("/")

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        try:
            body = self.fetch(url, self.timeout_s)
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = json.loads(exc.read()).get("error", "")
            except (ValueError, OSError, AttributeError):
                pass
            raise PrometheusError(f"Prometheus at {self.base_url} answered HTTP {exc.code}"
                                  f"{': ' + detail if detail else ''}") from exc
        except urllib.error.URLError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.base_url} ({_reason(exc.reason)})") from exc
        except TimeoutError as exc:
            raise PrometheusError(f"Prometheus at {self.base_url} did not answer within {self.timeout_s:g} s") from exc
        except OSError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.base_url} ({_reason(exc)})") from exc
        except http.client.HTTPException as exc:  # a server that does not speak HTTP (BadStatusLine, ...)
            answer = shorten(str(exc), 80) or type(exc).__name__
            raise PrometheusError(f"{self.base_url} is not an HTTP server: it answered {answer!r}") from exc
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise PrometheusError(f"{self.base_url}{path}: answer is not JSON (is this a Prometheus server?)") from exc
        if not isinstance(payload, dict) or payload.get("status") != "success":
            error = payload.get("error", "unknown error") if isinstance(payload, dict) else "unexpected answer"
            raise PrometheusError(f"Prometheus at {self.base_url} refused the query: {error}")
        return payload.get("data", {})

    def build_info(self) -> dict[str, Any]:
        """/api/v1/status/buildinfo: the server's version (and a check that it is Prometheus)."""
        data = self._get("/api/v1/status/buildinfo", {})
        return data if isinstance(data, dict) else {}

    def query(self, query: str) -> list[dict[str, Any]]:
        """An instant query's vector (evaluated now)."""
        data = self._get("/api/v1/query", {"query": query})
        return list(data.get("result", [])) if data.get("resultType") == "vector" else []

    def query_range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A matrix over [start, end], split into requests of at most MAX_POINTS steps, merged."""
        merged: dict[tuple[tuple[str, str], ...], dict[float, str]] = {}
        labels_of: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        span = step * (MAX_POINTS - 1)
        t = start
        while t <= end:
            stop = min(end, t + span)
            data = self._get("/api/v1/query_range",
                             {"query": query, "start": _num(t), "end": _num(stop), "step": _num(step)})
            if data.get("resultType") != "matrix":
                raise PrometheusError(f"Prometheus at {self.base_url}: query_range of {query} gave "
                                      f"{data.get('resultType')!r}, not a matrix")
            for series in data.get("result", []):
                key = tuple(sorted(series.get("metric", {}).items()))
                labels_of[key] = dict(series.get("metric", {}))
                merged.setdefault(key, {}).update({float(ts): v for ts, v in series.get("values", [])})
            t = stop + step
        return [{"metric": labels_of[k], "values": sorted(v.items())} for k, v in merged.items()]


def _num(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".")


def _reason(reason: object) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or reason.__class__.__name__


# ---------------------------------------------------------------------------------------------
# Pure reconstruction


@dataclass(frozen=True)
class Window:
    labels: tuple[tuple[str, str], ...]  # every label of the series (grid labels, mode, instance, job)
    time: float
    values: dict[str, float | int | None]
    count: int = 1  # windows in this step: the increment (only the last one's values exist)

    @property
    def mode(self) -> str:
        """"active" or "passive" (series written before the label existed are active)."""
        return dict(self.labels).get("mode", "active")

    @property
    def engine(self) -> str | None:
        """The engine measured (series written before the label existed: None, see `engine_info`)."""
        return dict(self.labels).get("engine")

    @property
    def key(self) -> tuple[int, int, int]:
        labels = dict(self.labels)
        return (int(labels["chunk_size"]), int(labels["decode_batch_size"]), int(labels["new_prefill_tokens"]))


@dataclass(frozen=True)
class Reconstruction:
    windows: list[Window]
    missed: int = 0  # windows that fell between two scrapes of the same label set
    skipped_series: list[str] = field(default_factory=list)


def _labels(metric: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in metric.items() if k != "__name__"))


def _value(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def windows_from_series(
    increments: Sequence[Mapping[str, Any]],
    gauges: Mapping[str, Sequence[Mapping[str, Any]]],
) -> Reconstruction:
    """One window per point of the increments matrix (value = how much the counter rose in that
    step); its values are the gauges of the same label set at the same evaluation time."""
    gauge_at: dict[str, dict[tuple[tuple[str, str], ...], dict[float, float | None]]] = {}
    for name, series_list in gauges.items():
        table: dict[tuple[tuple[str, str], ...], dict[float, float | None]] = {}
        for series in series_list:
            table[_labels(series["metric"])] = {float(ts): _value(v) for ts, v in series["values"]}
        gauge_at[name] = table
    windows: list[Window] = []
    missed = 0
    skipped: list[str] = []
    for series in increments:
        labels = _labels(series["metric"])
        if not all(k in dict(labels) for k in GRID):
            skipped.append(str(dict(labels)))
            continue
        for ts_raw, text in series["values"]:
            ts, increase = float(ts_raw), _value(text)
            if increase is None or increase < 0.5:
                continue
            missed += int(round(increase)) - 1
            values: dict[str, float | int | None] = {}
            for name, (column, factor) in WINDOW_GAUGES.items():
                raw = gauge_at.get(name, {}).get(labels, {}).get(ts)
                if raw is None:
                    values[column] = None
                elif column in INT_VALUES:
                    values[column] = int(round(raw))
                else:
                    values[column] = raw * factor
            windows.append(Window(labels, ts, values, count=max(1, int(round(increase)))))
    windows.sort(key=lambda w: (w.time, w.labels))
    return Reconstruction(windows, missed, skipped)


LOOKBACK = "5m"  # Prometheus' default lookback: how far back the last sample before a step is looked for


def increments_query(step: float) -> str:
    c, s = m.WINDOWS, f"{int(round(step * 1000))}ms"
    before = f"last_over_time({c}[{LOOKBACK}] offset {s})"  # the last sample before the step, stale or not
    return f"(({c} - {before}) > 0) or (({c} unless {before}) > 0) or ({c} < {before})"


def at_increments_query(gauge: str, step: float) -> str:
    return f"{gauge} and ({increments_query(step)})"


def _rep(window: Window) -> dict[str, float | int | None]:
    """A window as one repetition of the table: the gauged columns; the others are not exported."""
    rep: dict[str, float | int | None] = dict.fromkeys(REP_VALUES)
    rep.update(window.values)
    d = window.key[1]
    total = rep.get("total_interference_ms")
    if rep.get("aggregate_interference_ms") is None and total is not None:
        rep["aggregate_interference_ms"] = float(total) * d
    if rep.get("decode_tokens_delayed") is None and rep.get("slow_steps") is not None:
        rep["decode_tokens_delayed"] = int(rep["slow_steps"]) * d  # type: ignore[arg-type]
    return rep


def samples_from_windows(windows: Iterable[Window], engines: Mapping[int, Mapping[str, str]] | None = None,
                         source: str = "") -> list[ConfigSamples]:
    """Group windows by grid point (across exporter instances); each window is one repetition."""
    grouped: dict[tuple[int, int, int], list[Window]] = {}
    for w in windows:
        grouped.setdefault(w.key, []).append(w)
    out = []
    for key in sorted(grouped):
        info = (engines or {}).get(key[0], {})
        engine = grouped[key][0].engine or info.get("engine", "unknown")
        out.append(ConfigSamples(
            chunk_size=key[0], decode_batch_size=key[1], new_prefill_tokens=key[2],
            reps=tuple(_rep(w) for w in grouped[key]),
            modelled=str(info.get("modelled", "false")).lower() == "true",
            engine=engine, model=info.get("model"), source=source,
            passive=grouped[key][0].mode == "passive",
        ))
    return out


def window_counts(windows: Iterable[Window]) -> dict[tuple[int, int, int], int]:
    """Windows per grid point, those lost between two scrapes included (the counter's rises)."""
    counts: dict[tuple[int, int, int], int] = {}
    for w in windows:
        counts[w.key] = counts.get(w.key, 0) + w.count
    return counts


def engines_from_series(series_list: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, str]]:
    """chunk size -> the engine_info labels last seen for it."""
    out: dict[int, tuple[float, dict[str, str]]] = {}
    for series in series_list:
        labels = dict(series["metric"])
        try:
            chunk = int(labels.get("chunk_size", ""))
        except ValueError:
            continue
        last = max((float(ts) for ts, _ in series["values"]), default=-math.inf)
        if chunk not in out or last > out[chunk][0]:
            out[chunk] = (last, labels)
    return {k: v for k, (_, v) in out.items()}


# ---------------------------------------------------------------------------------------------
# The pull


@dataclass(frozen=True)
class PullResult:
    samples: list[ConfigSamples]
    windows: int
    missed: int
    start: float
    end: float
    step: float
    counts: dict[tuple[int, int, int], int] = field(default_factory=dict)  # windows per grid point, lost ones too
    other_mode: int = 0  # windows of the other mode, left out


def pull(api: PrometheusAPI, start: float, end: float, step: float = 1.0, mode: str = "active",
         engine: str | None = None) -> PullResult:
    """The windows of one mode ("active": injected, the default; "passive": production prefills)
    and one engine (`engine`: needed when the range holds windows of several, e.g. vLLM's and
    SGLang's exporters scraped by one Prometheus; one table is one engine's)."""
    if end <= start:
        raise ConfigError(f"--from {_iso(start)} is not before --to {_iso(end)}")
    if step < 0.001:
        raise ConfigError(f"--step {step:g}: must be at least 1 ms")
    increments = api.query_range(increments_query(step), start, end, step)
    gauges = {name: api.query_range(at_increments_query(name, step), start, end, step) for name in WINDOW_GAUGES}
    if mode not in m.MODES:
        raise ConfigError(f"--mode {mode!r}: expected one of {', '.join(m.MODES)}")
    rebuilt = windows_from_series(increments, gauges)
    chosen = [w for w in rebuilt.windows if w.mode == mode]
    other = len(rebuilt.windows) - len(chosen)
    seen = sorted({w.engine for w in chosen if w.engine is not None})
    if engine is not None:
        if engine not in seen:
            raise PrometheusError(f"--engine {engine}: no {m.WINDOWS} of that engine (mode {mode}) between "
                                  f"{_iso(start)} and {_iso(end)}; engines there: {', '.join(seen) or 'none labelled'}")
        chosen = [w for w in chosen if w.engine == engine]
    elif len(seen) > 1:
        raise PrometheusError(f"Prometheus at {api.base_url} holds windows of {len(seen)} engines ({', '.join(seen)}) "
                              "in that range: one table is one engine's, add --engine NAME")
    if not chosen:
        hint = f" ({other} {'passive' if mode == 'active' else 'active'} ones: add --mode " \
               f"{'passive' if mode == 'active' else 'active'})" if other else ""
        raise PrometheusError(f"Prometheus at {api.base_url} shows no new {m.WINDOWS} (mode {mode}) between "
                              f"{_iso(start)} and {_iso(end)}: no exporter windows in that range to tabulate{hint}")
    missed = sum(w.count - 1 for w in chosen)
    # Only the labels matter here; a step within the 5-minute lookback still sees every series.
    info_step = min(max(step, (end - start) / 1000), 300.0)
    engines = engines_from_series(api.query_range(m.ENGINE_INFO, start, end, info_step))
    samples = samples_from_windows(chosen, engines, source=f"prometheus {api.base_url}")
    return PullResult(samples, len(chosen), missed, start, end, step, window_counts(chosen), other)
