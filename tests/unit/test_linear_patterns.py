"""Regular expressions on text from outside (an engine's log and error pages, the user's durations
and command line) read it in linear time. Each was quadratic on a crafted input found by the audit
of session 24 (regexes timed at 10 KB, 100 KB and 1 MB): the sizes here took 20 s to minutes
before. Complexity guards, not speed targets: linear is milliseconds, quadratic is minutes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from pdexporter._internal.durations import parse_duration
from pdexporter._internal.text import body_reason
from pdexporter.cli import _hide_stray_tokens
from pdexporter.engines.sglang import PREFILL_RE, parse_step_log
from pdexporter.errors import ConfigError
from pdexporter.grafana.promql import series_names, variable_queries

GUARD_S = 10.0
HEAD = "Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 1, "


def timed(call: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    result = call()
    assert time.perf_counter() - started < GUARD_S
    return result


def test_an_sglang_log_line_repeating_the_prefill_head_is_read_once() -> None:
    """A logged prompt (`--log-requests`) can repeat the step line's head without its end: 68 s at 1 MB."""
    assert timed(lambda: PREFILL_RE.search(HEAD * 16_000)) is None  # 1 MB
    real = ("[2026-12-03 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, "
            "token usage: 0.01, #running-req: 4, #queue-req: 0")
    match = PREFILL_RE.search(real)
    assert match is not None and (match["tokens"], match["cached"], match["running"]) == ("8192", "0", "4")
    assert len(parse_step_log([real], mixed=False)) == 1


def test_an_error_page_of_broken_markup_and_many_brackets_is_read_once() -> None:
    """The fallback for markup Python's parser gives up on: 3.5 s at 100 KB, 6 minutes at 1 MB."""
    reason = timed(lambda: body_reason("<html><![bogus[" + "<" * 300_000))
    assert isinstance(reason, str) and len(reason) < 400


def test_a_long_run_of_digits_is_one_line_and_quick() -> None:
    """`--duration 1111...x`: every digit was a start (2 s for 10,000 digits)."""
    with pytest.raises(ConfigError, match="expected a duration"):
        timed(lambda: parse_duration("1" * 30_000 + "x", "--duration"))
    assert parse_duration("1h30m") == 5400.0 and parse_duration("2m5s") == 125.0 and parse_duration("1.5") == 1.5
    for bad in ("5m x", "m5", "", "1h-5m"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_a_usage_error_repeating_extra_arguments_is_read_once() -> None:
    """click's message quotes the user's words: 1.1 s at 100 KB, 2 minutes at 1 MB."""
    message = "unexpected extra argument (" * 30_000
    assert timed(lambda: _hide_stray_tokens(message)) == message  # no closing bracket: nothing to hide
    key = "sk" + "a1" * 10
    shown = _hide_stray_tokens(f"Got unexpected extra argument ({key})")
    assert key not in shown and shown.startswith("Got unexpected extra argument (<22 characters not shown")


def test_a_dashboards_promql_with_endless_quotes_and_nesting_is_read_once() -> None:
    """A dashboard's expression (`grafana.promql`): escaped quotes with no end were 15 s at 20 KB, a
    label_values variable with no closing bracket and a function name far from its bracket were quadratic too."""
    assert timed(lambda: series_names('x{a="' + '\\"' * 300_000 + "}")) == {"x"}
    assert timed(lambda: series_names("sum by (a) (" * 100_000 + "up" + ")" * 100_000)) == {"up"}
    assert timed(lambda: series_names("by(" * 100_000 + "a)" + ")" * 100_000)) == set()  # groupings in groupings
    assert timed(lambda: series_names("f (" * 100_000 + "up")) == {"up"}
    with pytest.raises(ValueError, match="only label_values"):
        timed(lambda: variable_queries({"templating": {"list": [
            {"type": "query", "name": "v", "query": "label_values(" + "a , " * 200_000}]}}))
    # and what they read stays what it was
    assert series_names('sum by (le) (rate(pdx_tpot_bucket{mode="x\\"y"}[5m])) / on(job) group_left up') == {
        "pdx_tpot_bucket", "up"}
    assert series_names('{__name__="pdx_a"} + count(`raw"quote`) + b') == {"pdx_a", "b"}
    (one,) = variable_queries({"templating": {"list": [
        {"type": "query", "name": "inst", "query": {"query": ' label_values( pdx_up{a="1",b="2"} , instance ) '}}]}})
    assert (one.selector, one.label) == ('pdx_up{a="1",b="2"}', "instance")
    plain = {"type": "query", "name": "m", "query": 'label_values(up{a="x,y"})'}
    (two,) = variable_queries({"templating": {"list": [plain]}})
    assert (two.selector, two.label) == ('up{a="x,y"}', None)
