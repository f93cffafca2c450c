"""The PromQL inside a dashboard: list it, fill in Grafana's variables, name the series it reads.

Pure functions, used by the tests that hand every expression to a real Prometheus and compare the
series names with a live scrape of the exporter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BUILTIN_VALUES", "Query", "VariableQuery", "panel_queries", "series_names", "substitute", "variable_queries",
]

# Grafana's built-in interval variables, with values a test (or `promtool`) can use.
BUILTIN_VALUES: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}

_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
     "inf", "nan", "atan2"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*(?:,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*)?\)\s*$", re.S)
_VARIABLE = re.compile(r"\$\{([a-zA-Z0-9_]+)(?::[a-z]+)?\}|\$([a-zA-Z0-9_]+)|\[\[([a-zA-Z0-9_]+)\]\]")


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a dashboard and where it sits."""

    where: str  # "panel 'Title' A" or "variable chunk_size"
    expr: str
    instant: bool = False


@dataclass(frozen=True)
class VariableQuery:
    """A `label_values(SELECTOR, LABEL)` variable: Grafana asks the series/label API, not the query API."""

    name: str
    selector: str
    label: str | None


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels", []))


def panel_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    found: list[Query] = []
    for panel in _walk_panels(dashboard.get("panels", [])):
        for tgt in panel.get("targets", []):
            if "expr" in tgt:
                found.append(Query(f"panel {panel['title']!r} {tgt.get('refId', '?')}", tgt["expr"],
                                   bool(tgt.get("instant"))))
    return found


def variable_queries(dashboard: Mapping[str, Any]) -> list[VariableQuery]:
    found: list[VariableQuery] = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var.get("query"), dict) else var.get("query", "")
        match = _LABEL_VALUES.match(query)
        if not match:
            raise ValueError(f"variable {var['name']}: only label_values(...) queries are supported, got {query!r}")
        found.append(VariableQuery(var["name"], match.group(1), match.group(2)))
    return found


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace `$name`, `${name}`, `${name:fmt}` and `[[name]]` the way Grafana would for one value each."""
    merged = {**BUILTIN_VALUES, **values}

    def replace(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        if name not in merged:
            raise KeyError(f"no value for dashboard variable ${name} in {expr!r}")
        return merged[name]

    return _VARIABLE.sub(replace, expr)


def series_names(expr: str) -> set[str]:
    """The metric names an expression selects (function names, keywords and label names excluded)."""
    names = set(_NAME_MATCHER.findall(expr))
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # ranges, subqueries
    previous = None
    while previous != text:  # groupings may nest inside each other's parentheses only after the lists go
        previous, text = text, _GROUPING.sub(" ", text)
    for match in _IDENT.finditer(text):
        name = match.group(1)
        rest = text[match.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation
        if name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names
