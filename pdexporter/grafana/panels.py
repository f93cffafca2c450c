"""Plain builders for Grafana dashboard JSON (schemaVersion 39: Grafana 10.4 and 11.x load it as is).

Why plain dicts and not grafana-foundation-sdk: docs/deploy.md ("Why not grafana-foundation-sdk")
says what was tried and found (its epoch versions install Grafana 10.1 types unless a build is pinned
exactly; transformation options and override values are untyped in it). The committed dashboards
are checked byte for byte against this code, so that check is about *our* changes. The shapes used
here are few (time series, stat, table, rows, two kinds of variables) and are written down once below.

Everything here is pure: functions take values and return dicts; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DATASOURCE", "Dashboard", "GRID_WIDTH", "Json", "SCHEMA_VERSION", "dashboard_link", "datasource_variable",
    "info_table", "label_matrix", "query_variable", "row", "stat", "target", "targets", "thresholds", "timeseries",
    "up_down_mappings", "values_table",
]

SCHEMA_VERSION = 39
GRID_WIDTH = 24

# Every panel and query names the datasource through the dashboard variable, never a uid.
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}

Json = dict[str, Any]


def datasource_variable() -> Json:
    return {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    }


def query_variable(
    name: str, label: str, query: str, *, multi: bool = False, include_all: bool = False, numeric_sort: bool = False
) -> Json:
    """A variable filled by a Prometheus `label_values(...)` query (Grafana's templating syntax)."""
    variable: Json = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": dict(DATASOURCE),
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "current": {},
        "hide": 0,
        "includeAll": include_all,
        "multi": multi,
        "options": [],
        "refresh": 2,  # on time range change: a sweep adds chunk sizes while the dashboard is open
        "regex": "",
        "sort": 3 if numeric_sort else 1,  # 3 = numerical ascending
    }
    if include_all:
        variable["allValue"] = ".*"
    return variable


def target(expr: str, legend: str = "", *, ref_id: str = "A", instant: bool = False, table: bool = False) -> Json:
    return {
        "refId": ref_id,
        "datasource": dict(DATASOURCE),
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
        "format": "table" if table else "time_series",
    }


def targets(*exprs: tuple[str, str]) -> list[Json]:
    """(expr, legend) pairs -> targets with refIds A, B, C..."""
    return [target(expr, legend, ref_id=chr(ord("A") + i)) for i, (expr, legend) in enumerate(exprs)]


def _base(kind: str, title: str, description: str, queries: list[Json]) -> Json:
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": dict(DATASOURCE),
        "targets": queries,
    }


def timeseries(
    title: str,
    description: str,
    queries: list[Json],
    *,
    unit: str = "short",
    minimum: float | None = None,
    maximum: float | None = None,
    decimals: int | None = None,
    draw: str = "line",
) -> Json:
    defaults: Json = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": draw,
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "auto" if draw == "points" else "never",
            "pointSize": 5,
            "spanNulls": False,
            "axisPlacement": "auto",
        },
    }
    for key, value in (("min", minimum), ("max", maximum), ("decimals", decimals)):
        if value is not None:
            defaults[key] = value
    panel = _base("timeseries", title, description, queries)
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {
        "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True, "calcs": ["lastNotNull", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel


def thresholds(*steps: tuple[float | None, str]) -> Json:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for value, color in steps]}


def stat(
    title: str,
    description: str,
    queries: list[Json],
    *,
    unit: str = "short",
    decimals: int | None = None,
    steps: Json | None = None,
    mappings: list[Json] | None = None,
    graph: bool = True,
    text_mode: str = "auto",
) -> Json:
    defaults: Json = {
        "unit": unit,
        "color": {"mode": "thresholds"},
        "thresholds": steps or thresholds((None, "green")),
        "mappings": mappings or [],
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    panel = _base("stat", title, description, queries)
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background" if mappings else "value",
        "graphMode": "area" if graph else "none",
        "justifyMode": "auto",
        "orientation": "auto",
        "textMode": text_mode,
        "wideLayout": True,
        "showPercentChange": False,
    }
    return panel


def up_down_mappings(up: str = "UP", down: str = "DOWN") -> list[Json]:
    return [
        {
            "type": "value",
            "options": {
                "0": {"text": down, "color": "red", "index": 0},
                "1": {"text": up, "color": "green", "index": 1},
            },
        }
    ]


def info_table(title: str, description: str, expr: str, columns: list[str]) -> Json:
    """An instant query shown as a table of some of its labels (for `*_info`-style series)."""
    panel = _base("table", title, description, [target(expr, instant=True, table=True)])
    panel["fieldConfig"] = {"defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"}}}, "overrides": []}
    panel["options"] = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
    panel["transformations"] = [
        {
            "id": "organize",
            "options": {
                "excludeByName": {},
                "includeByName": {name: True for name in columns},
                "indexByName": {name: i for i, name in enumerate(columns)},
                "renameByName": {},
            },
        }
    ]
    return panel


def values_table(title: str, description: str, columns: list[tuple[str, str, str]], keys: list[str]) -> Json:
    """One row per label set of `keys`, one column per (expr, column name, unit): instant queries
    merged on their labels (Grafana's `merge` transformation)."""
    queries = [target(expr, ref_id=_ref(i), instant=True, table=True) for i, (expr, _, _) in enumerate(columns)]
    panel = _base("table", title, description, queries)
    panel["fieldConfig"] = {
        "defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"}}},
        "overrides": [
            {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
            for _, name, unit in columns
        ],
    }
    panel["options"] = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
    panel["transformations"] = [
        {"id": "merge", "options": {}},
        {
            "id": "organize",
            "options": {
                "excludeByName": {},
                "includeByName": {name: True for name in [*keys, *(c for _, c, _ in columns)]},
                "indexByName": {name: i for i, name in enumerate([*keys, *(c for _, c, _ in columns)])},
                "renameByName": {f"Value #{_ref(i)}": name for i, (_, name, _) in enumerate(columns)},
            },
        },
    ]
    return panel


def _ref(i: int) -> str:
    """refIds A..Z, then AA, AB, ..."""
    return chr(ord("A") + i) if i < 26 else chr(ord("A") + i // 26 - 1) + chr(ord("A") + i % 26)


def label_matrix(
    title: str,
    description: str,
    expr: str,
    *,
    row_label: str,
    column_label: str,
    corner: str,
    unit: str = "none",
    decimals: int = 2,
    color_scheme: str = "continuous-GrYlRd",
    minimum: float | None = None,
) -> Json:
    """A colour-graded grid of one value per (row label, column label): a heatmap over labels.

    Grafana's heatmap panel cannot take its axes from labels: it buckets over time, or needs a data
    frame crafted with `meta.type: heatmap-cells`, which no transformation produces (grafana issue
    #60806 asks for exactly this and was closed unimplemented). A table panel does render such a
    grid: the instant query comes back as a table (one row per series, a column per label), the
    "Grouping to matrix" transformation pivots it to rows = `row_label`, columns = `column_label`,
    and a continuous colour scheme on `color-background` cells turns it into a heatmap.

    Ordering: Grouping to matrix keeps first-appearance order and makes the row key a string, so
    the labels are converted to numbers and sorted *before* the pivot: by the column label, then
    (Grafana's sort is stable) by the row label, which yields ascending rows and columns.
    """
    panel = _base("table", title, description, [target(expr, instant=True, table=True)])
    row_column = f"{row_label}\\{column_label}"
    defaults: Json = {
        "unit": unit,
        "decimals": decimals,
        "color": {"mode": color_scheme},
        "thresholds": thresholds((None, "green")),
        "custom": {"align": "center", "cellOptions": {"type": "color-background", "mode": "gradient"}},
        "noValue": "-",
    }
    if minimum is not None:
        defaults["min"] = minimum
    panel["fieldConfig"] = {
        "defaults": defaults,
        "overrides": [
            {
                "matcher": {"id": "byName", "options": corner},
                "properties": [
                    {"id": "custom.cellOptions", "value": {"type": "auto"}},
                    {"id": "unit", "value": "none"},
                    {"id": "decimals", "value": 0},
                    {"id": "custom.align", "value": "left"},
                ],
            }
        ],
    }
    panel["options"] = {"showHeader": True, "cellHeight": "md", "footer": {"show": False, "reducer": ["sum"]}}
    panel["transformations"] = [
        {
            "id": "convertFieldType",
            "options": {
                "fields": {},
                "conversions": [
                    {"targetField": row_label, "destinationType": "number"},
                    {"targetField": column_label, "destinationType": "number"},
                ],
            },
        },
        {"id": "sortBy", "options": {"fields": {}, "sort": [{"field": column_label, "desc": False}]}},
        {"id": "sortBy", "options": {"fields": {}, "sort": [{"field": row_label, "desc": False}]}},
        {
            "id": "groupingToMatrix",
            "options": {
                "rowField": row_label,
                "columnField": column_label,
                "valueField": "Value",
                "emptyValue": "null",
            },
        },
        {
            "id": "organize",
            "options": {"excludeByName": {}, "indexByName": {}, "renameByName": {row_column: corner}},
        },
    ]
    return panel


def row(title: str, *, collapsed: bool = False) -> Json:
    return {"type": "row", "title": title, "collapsed": collapsed, "panels": []}


@dataclass
class Dashboard:
    """Collects panels and lays them out left to right on Grafana's 24-column grid."""

    uid: str
    title: str
    description: str
    tags: list[str]
    variables: list[Json]
    time_from: str = "now-30m"
    refresh: str = "10s"
    links: list[Json] = field(default_factory=list)
    _panels: list[Json] = field(default_factory=list)
    _x: int = 0
    _y: int = 0
    _row_height: int = 0

    def row(self, title: str) -> None:
        self._newline()
        panel = row(title)
        panel["gridPos"] = {"h": 1, "w": GRID_WIDTH, "x": 0, "y": self._y}
        self._append(panel)
        self._y += 1

    def add(self, panel: Json, *, w: int, h: int = 8) -> None:
        if not 0 < w <= GRID_WIDTH:
            raise ValueError(f"panel {panel['title']!r}: width {w} outside 1..{GRID_WIDTH}")
        if self._x + w > GRID_WIDTH:
            self._newline()
        panel["gridPos"] = {"h": h, "w": w, "x": self._x, "y": self._y}
        self._append(panel)
        self._x += w
        self._row_height = max(self._row_height, h)

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_height
        self._x, self._row_height = 0, 0

    def _append(self, panel: Json) -> None:
        panel["id"] = len(self._panels) + 1
        self._panels.append(panel)

    def build(self) -> Json:
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": self.tags,
            "editable": True,
            "graphTooltip": 1,  # shared crosshair
            "timezone": "browser",
            "time": {"from": self.time_from, "to": "now"},
            "refresh": self.refresh,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "weekStart": "",
            "links": self.links,
            "annotations": {
                "list": [
                    {
                        "builtIn": 1,
                        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                        "enable": True,
                        "hide": True,
                        "iconColor": "rgba(0, 211, 255, 1)",
                        "name": "Annotations & Alerts",
                        "type": "dashboard",
                    }
                ]
            },
            "templating": {"list": self.variables},
            "panels": self._panels,
        }


def dashboard_link(title: str, uid_tag: str) -> Json:
    """A link to sibling dashboards by tag, keeping the time range and variables."""
    return {
        "title": title,
        "type": "dashboards",
        "tags": [uid_tag],
        "asDropdown": False,
        "includeVars": True,
        "keepTime": True,
        "targetBlank": False,
        "icon": "external link",
        "tooltip": "",
        "url": "",
    }
