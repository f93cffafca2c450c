"""A restart seen between two scrapes (`client.metrics.engine_restarted`), on vLLM 0.22's real
/metrics (tests/fixtures/vllm-0.22/metrics.txt), and what makes a restarted engine another one
(`EngineInfo.changed_to`)."""

from __future__ import annotations

import re
from pathlib import Path

from pdexporter.client.metrics import engine_restarted, parse_exposition
from pdexporter.engines import adapter
from pdexporter.measure.driver import EngineInfo

TEXT = (Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.22" / "metrics.txt").read_text()
VLLM = adapter("vllm")


def _with(text: str, name: str, value: float) -> str:
    return re.sub(rf"^({re.escape(name)}(?:\{{[^}}]*\}})?) \S+$", rf"\g<1> {value}", text, flags=re.MULTILINE)


def test_the_fixture_carries_the_process_start_time_under_its_canonical_name() -> None:
    snap = parse_exposition(TEXT, VLLM)
    assert snap.get("process_start_time_seconds") == 1.79602273114e9


def test_the_same_process_is_no_restart_however_its_counters_grow() -> None:
    before = parse_exposition(TEXT, VLLM)
    grown = _with(TEXT, "vllm:generation_tokens_total", before.get("generation_tokens_total") + 500)  # type: ignore[operator]
    assert engine_restarted(before, parse_exposition(grown, VLLM)) is None
    assert engine_restarted(before, before) is None


def test_a_new_process_start_time_is_a_restart_and_says_when() -> None:
    before = parse_exposition(TEXT, VLLM)
    after = parse_exposition(_with(TEXT, "process_start_time_seconds", 1.79602273114e9 + 125), VLLM)
    why = engine_restarted(before, after)
    assert why is not None and "process start time" in why and "UTC" in why


def test_without_the_process_collector_a_falling_counter_is_a_restart() -> None:
    no_collector = re.sub(r"^process_start_time_seconds .*$", "", TEXT, flags=re.MULTILINE)
    before = parse_exposition(no_collector, VLLM)
    assert before.get("process_start_time_seconds") is None
    after = parse_exposition(_with(no_collector, "vllm:generation_tokens_total", 3.0), VLLM)
    why = engine_restarted(before, after)
    assert why is not None and "vllm:generation_tokens_total fell" in why


def test_a_scrape_without_the_series_is_not_a_restart() -> None:
    before = parse_exposition(TEXT, VLLM)
    no_collector = re.sub(r"^process_start_time_seconds .*$", "", TEXT, flags=re.MULTILINE)
    assert engine_restarted(before, parse_exposition(no_collector, VLLM)) is None


def _info(**over: object) -> EngineInfo:
    base: dict[str, object] = {"kind": "vllm", "model": "m", "version": "0.22.0", "chunk_size": 8192,
                               "max_model_len": 200000}
    return EngineInfo(**{**base, **over})  # type: ignore[arg-type]


def test_another_model_version_or_context_limit_is_another_engine() -> None:
    assert _info().changed_to(_info()) is None
    assert _info().changed_to(_info(model="n")) == "model m -> n"
    assert _info().changed_to(_info(version="0.23.0", max_model_len=65536)) == (
        "version 0.22.0 -> 0.23.0, max_model_len 200000 -> 65536")


def test_a_chunk_size_counts_only_where_the_engine_publishes_it() -> None:
    # vLLM publishes none: the info's chunk size is what pdexporter was given, the same after a restart
    assert _info().changed_to(_info(chunk_size=2048)) is None
    published = _info(kind="sglang", chunk_size_published=True)
    assert published.changed_to(_info(kind="sglang", chunk_size=2048, chunk_size_published=True)) == (
        "chunk size 8192 -> 2048")
