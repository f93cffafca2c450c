"""Parsing a real vLLM 0.22 /metrics exposition under canonical names."""

from __future__ import annotations

import pytest

from pdexporter.client.metrics import metric_deltas, parse_exposition
from pdexporter.engines import adapter
from pdexporter.errors import EngineError

VLLM = adapter("vllm")


def test_real_exposition_has_every_series_pdexporter_reads(vllm_metrics_text: str) -> None:
    snap = parse_exposition(vllm_metrics_text, VLLM)
    assert snap.missing == ()
    assert snap.model_names == ("qwen3-coder-30b-a3b",)
    assert snap.values["prompt_tokens_total"] == 1548800.0
    assert snap.values["prefix_cache_hits_total"] == 1085280.0
    assert snap.values["inter_token_latency_seconds_count"] == 67830.0
    assert snap.values["inter_token_latency_seconds_sum"] == pytest.approx(558.0796883)
    # request_success_total is summed over its finished_reason label set
    assert snap.values["request_success_total"] == 316.0
    assert snap.sources["kv_cache_usage_perc"] == "vllm:kv_cache_usage_perc"
    buckets = snap.buckets["inter_token_latency_seconds"]
    assert buckets[-1][0] == float("inf") and buckets[-1][1] == 67830.0


def test_older_vllm_names_resolve_through_aliases() -> None:
    text = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
        "# TYPE vllm:time_per_output_token_seconds histogram\n"
        'vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 3\n'
        'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 4\n'
        'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.05\n'
    )
    snap = parse_exposition(text, VLLM)
    assert snap.values["kv_cache_usage_perc"] == 0.25
    assert snap.sources["inter_token_latency_seconds"] == "vllm:time_per_output_token_seconds"
    assert snap.values["inter_token_latency_seconds_count"] == 4


def test_every_alias_is_tried_newest_first() -> None:
    for canonical, (_, names) in VLLM.metric_aliases.items():
        assert names, canonical
        # vLLM's own series, or the API server's process collector (its start time: restarts)
        assert all(name.startswith("vllm:") or name == "process_start_time_seconds" for name in names)


def test_deltas_cover_counters_and_histograms_and_keep_gauges(vllm_metrics_text: str) -> None:
    before = parse_exposition(vllm_metrics_text, VLLM)
    after_text = vllm_metrics_text.replace(
        'vllm:prompt_tokens_total{engine="0",model_name="qwen3-coder-30b-a3b"} 1.5488e+06',
        'vllm:prompt_tokens_total{engine="0",model_name="qwen3-coder-30b-a3b"} 1.5570e+06',
    ).replace(
        'vllm:num_requests_running{engine="0",model_name="qwen3-coder-30b-a3b"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="qwen3-coder-30b-a3b"} 5.0',
    )
    deltas = metric_deltas(before, parse_exposition(after_text, VLLM))
    assert deltas["prompt_tokens_total_delta"] == pytest.approx(8200.0)
    assert deltas["generation_tokens_total_delta"] == 0.0
    assert deltas["num_requests_running"] == 5.0
    assert "inter_token_latency_seconds_count_delta" in deltas


def test_a_counter_reset_drops_the_delta_instead_of_going_negative(vllm_metrics_text: str) -> None:
    before = parse_exposition(vllm_metrics_text, VLLM)
    after = parse_exposition(vllm_metrics_text.replace("} 1.5488e+06", "} 10.0"), VLLM)
    deltas = metric_deltas(before, after)
    assert "prompt_tokens_total_delta" not in deltas
    assert all(v >= 0 for k, v in deltas.items() if k.endswith("_delta"))


def test_garbage_is_a_one_line_error() -> None:
    with pytest.raises(EngineError) as excinfo:
        parse_exposition("vllm:num_requests_running{oops 1 2 3\n", VLLM, source="http://x/metrics")
    assert "http://x/metrics" in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


@pytest.mark.parametrize("text", ["<<<this is not a Prometheus exposition>>>\n\x00 vllm:x{{{ 1 2\n",
                                  "<!DOCTYPE html><html><body>Not Found</body></html>\n"])
def test_garbage_without_one_known_line_is_an_error_not_an_empty_snapshot(text: str) -> None:
    """Cutting the text to the known families must not turn garbage into 'no series'."""
    with pytest.raises(EngineError, match="not a Prometheus text exposition"):
        parse_exposition(text, VLLM)
    assert parse_exposition("# HELP other_total x\n# TYPE other_total counter\nother_total 1\n", VLLM).values == {}


def test_parsing_only_the_known_families_gives_the_same_snapshot(vllm_metrics_text: str) -> None:
    """parse_exposition cuts the text to the families it reads before parsing (a sweep parses
    /metrics twice per window); the snapshot is the one the whole text gives."""
    from prometheus_client.parser import text_string_to_metric_families

    from pdexporter.client.metrics import known_lines, snapshot_from_families

    whole = snapshot_from_families(text_string_to_metric_families(vllm_metrics_text), VLLM)
    assert parse_exposition(vllm_metrics_text, VLLM) == whole and whole.missing == ()
    assert len(known_lines(vllm_metrics_text, VLLM)) < len(vllm_metrics_text) / 2
