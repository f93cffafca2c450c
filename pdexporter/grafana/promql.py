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
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_OPENS = re.compile(r"\s*\(")
_MAX_GROUPING_PASSES = 8  # a grouping's list holds label names: nesting deeper is no dashboard's PromQL
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
        parsed = _label_values(query)
        if parsed is None:
            raise ValueError(f"variable {var['name']}: only label_values(...) queries are supported, got {query!r}")
        found.append(VariableQuery(var["name"], *parsed))
    return found


def _label_values(query: str) -> tuple[str, str | None] | None:
    """`label_values(SELECTOR[, LABEL])` as (selector, label), in one pass (None: not that form)."""
    text = query.strip()
    if not (text.startswith("label_values") and text.endswith(")")):
        return None
    inner = text[len("label_values"):].lstrip()
    if not inner.startswith("("):
        return None
    inner = inner[1:-1].strip()
    head, comma, tail = inner.rpartition(",")
    if comma and _LABEL_NAME.fullmatch(tail.strip()):
        return head.strip(), tail.strip()
    return inner, None


def _blank_strings(expr: str) -> str:
    """Each quoted string ("...", '...' with backslash escapes; `...` raw) as `""`, in one pass: a quote
    with no end is kept as it is and the text after it read on (a later quote of the same kind has no
    end either: its scan would run in step with the first one's, so none is tried again)."""
    out: list[str] = []
    i, n = 0, len(expr)
    endless: set[str] = set()
    while i < n:
        ch = expr[i]
        if ch not in "\"'`" or ch in endless:
            out.append(ch)
            i += 1
            continue
        j = i + 1
        while j < n and expr[j] != ch:
            j += 2 if expr[j] == "\\" and ch != "`" else 1
        if j < n:
            out.append('""')
            i = j + 1
        else:
            endless.add(ch)
            out.append(ch)
            i += 1
    return "".join(out)


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
    text = _blank_strings(expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # ranges, subqueries
    for _ in range(_MAX_GROUPING_PASSES):  # groupings may nest in each other's parentheses once the lists go
        text, removed = _GROUPING.subn(" ", text)
        if not removed:
            break
    for match in _IDENT.finditer(text):
        name = match.group(1)
        if _OPENS.match(text, match.end()):
            continue  # a function or an aggregation
        if name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names
