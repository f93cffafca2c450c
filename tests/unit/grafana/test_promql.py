"""The small PromQL reader used to check dashboards against the exporter's series."""

from __future__ import annotations

import pytest

from pdexporter.grafana.promql import series_names, substitute


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('pdexporter_up{instance=~"$instance"}', {"pdexporter_up"}),
        ("histogram_quantile(0.9, sum by (phase, le) (rate(x_bucket{a=\"b\"}[$__rate_interval])))", {"x_bucket"}),
        ("sum(rate(a_total[5m])) by (kind) / ignoring (kind) group_left sum(b)", {"a_total", "b"}),
        ("a / on (job) group_left (version) b_info", {"a", "b_info"}),
        ('max without (instance) (last_over_time(g{l="by (x) and"}[$__range])) - h offset 5m', {"g", "h"}),
        ('{__name__="named_series", job="x"}', {"named_series"}),
        ("a and bool b or c unless d", {"a", "b", "c", "d"}),
        ("1 + 2 * 3e2", set()),
        ("rate(x[5m:30s])", {"x"}),
        ("label_replace(s, \"dst\", \"$1\", \"src\", \"(.*)\")", {"s"}),
    ],
)
def test_series_names(expr: str, names: set[str]) -> None:
    assert series_names(expr) == names


def test_substitute_all_syntaxes() -> None:
    expr = 'rate(a{c="$chunk_size", i=~"${instance}", j="${instance:regex}", k="[[chunk_size]]"}[$__rate_interval])'
    out = substitute(expr, {"chunk_size": "8192", "instance": ".*"})
    assert out == 'rate(a{c="8192", i=~".*", j=".*", k="8192"}[1m])'


def test_substitute_names_a_missing_variable() -> None:
    with pytest.raises(KeyError, match=r"\$nope"):
        substitute('a{x="$nope"}', {})
