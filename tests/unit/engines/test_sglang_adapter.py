"""SGLang's rules as its adapters hold them (read from SGLang 0.5.15's source, docs/engines.md):
its step lines in both modes, /server_info, its chunk schedules, its flags and its /metrics names."""

from __future__ import annotations

import pytest

from pdexporter.client.metrics import parse_exposition
from pdexporter.engines import adapter

DEFAULT, MIXED = adapter("sglang"), adapter("sglang-mixed")

# As SGLang 0.5.15's SchedulerMetricsReporter prints them on a one-GPU server (logging format
# "[%(asctime)s] %(message)s"): the prefill of a 20000-token prompt at B = 8192 beside 4 decodes,
# a decode step, and lines that are no steps.
LINES = [
    (
        "[2026-12-01 10:00:00] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.01, "
        "#running-req: 4, #queue-req: 0, #pending-token: 11808, cuda graph: False, input throughput (token/s): 1234.56"
    ),
    (
        "[2026-12-01 10:00:00] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.02, "
        "#running-req: 4, #queue-req: 0, #pending-token: 3616, cuda graph: False, input throughput (token/s): 40000.00"
    ),
    '[2026-12-01 10:00:00] INFO:     127.0.0.1:50432 - "POST /v1/completions HTTP/1.1" 200 OK',
    (
        "[2026-12-01 10:00:01] Prefill batch, #new-seq: 1, #new-token: 3616, #cached-token: 0, token usage: 0.02, "
        "#running-req: 4, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 30000.00"
    ),
    (
        "[2026-12-01 10:00:01] Decode batch, #running-req: 5, #token: 24900, token usage: 0.04, cuda graph: True, "
        "gen throughput (token/s): 612.20, #queue-req: 0"
    ),
    (
        "[2026-12-01 10:00:01 TP0] Decode batch [1234], #running-req: 4, #token: 16500, token usage: 0.02, "
        "cuda graph: True, gen throughput (token/s): 700.12, #queue-req: 0"
    ),
]


def test_default_mode_prefill_lines_carry_no_decodes() -> None:
    """Without mixed chunking the #running-req of a prefill line paused for it: no decode tokens."""
    steps = DEFAULT.parse_step_log(LINES)
    assert [(s.context_tokens, s.generation_requests) for s in steps] == [
        (8192, 0),
        (8192, 0),
        (3616, 0),
        (0, 5),
        (0, 4),
    ]
    assert steps[-1].iteration == 1234  # SGLANG_LOG_FORWARD_ITERS=1
    assert all(s.elapsed_ms == 0.0 for s in steps)  # SGLang logs no step time


def test_mixed_mode_prefill_lines_carry_the_running_decodes() -> None:
    steps = MIXED.parse_step_log(LINES)
    assert [(s.context_tokens, s.generation_requests, s.generation_tokens) for s in steps[:3]] == [
        (8192, 4, 4),
        (8192, 4, 4),
        (3616, 4, 4),
    ]
    assert steps[0].is_mixed


@pytest.mark.parametrize(
    ("p", "b", "d", "default", "mixed"),
    [
        (20000, 8192, 4, (8192, 8192, 3616), (8188, 8188, 3624)),
        (32768, 8192, 12, (8192,) * 4, (8180,) * 4 + (48,)),
        (512, 8192, 12, (512,), (512,)),
        (4096, 2048, 0, (2048, 2048), (2048, 2048)),
    ],
)
def test_chunk_schedules(p: int, b: int, d: int, default: tuple[int, ...], mixed: tuple[int, ...]) -> None:
    assert DEFAULT.chunk_schedule(p, b, d) == default and MIXED.chunk_schedule(p, b, d) == mixed
    # the decodes pause through the default mode's chunks: one stall; mixed: one step each
    assert DEFAULT.chunk_rule.decode_view(default) == (p,) and MIXED.chunk_rule.decode_view(mixed) == mixed


def test_budget_only_binds_mixed_chunking() -> None:
    assert DEFAULT.budget_problem(16, 16) is None  # the chunk does not share B with the decodes
    assert MIXED.budget_problem(16, 16) is not None and MIXED.budget_problem(17, 16) is None


SERVER_INFO = {
    "version": "0.5.15.post1",
    "chunked_prefill_size": 8192,
    "enable_mixed_chunk": False,
    "decode_log_interval": 40,
    "enable_metrics": False,
    "disable_radix_cache": False,
}


def test_server_info_says_who_it_is_its_chunk_size_and_what_it_lacks() -> None:
    assert DEFAULT.recognise(SERVER_INFO) and not MIXED.recognise(SERVER_INFO)
    assert MIXED.recognise({**SERVER_INFO, "enable_mixed_chunk": True})
    assert not DEFAULT.recognise({**SERVER_INFO, "modelled": True})  # the embedded engine's own adapter
    assert DEFAULT.served_chunk_size(SERVER_INFO) == 8192
    assert DEFAULT.served_chunk_size({**SERVER_INFO, "chunked_prefill_size": -1}) is None
    problems = DEFAULT.setup_problems(SERVER_INFO)
    assert any("--decode-log-interval 1" in p for p in problems) and any(
        "--enable-metrics" in p for p in problems
    )
    assert DEFAULT.setup_problems({**SERVER_INFO, "decode_log_interval": 1, "enable_metrics": True}) == ()
    assert DEFAULT.prefix_caching(SERVER_INFO, None) is True
    assert DEFAULT.prefix_caching({**SERVER_INFO, "disable_radix_cache": True}, None) is False


def test_flags_and_modes_from_the_command_line() -> None:
    assert DEFAULT.chunk_size_flags(8192) == (
        "--chunked-prefill-size",
        "8192",
        "--decode-log-interval",
        "1",
        "--enable-metrics",
    )
    assert MIXED.chunk_size_flags(8192)[-1] == "--enable-mixed-chunk"
    launch = ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--chunked-prefill-size", "8192"]
    assert (
        DEFAULT.for_command(launch) == "sglang"
        and DEFAULT.for_command([*launch, "--enable-mixed-chunk"]) == "sglang-mixed"
    )
    assert DEFAULT.cuda_graphs(launch) is True
    assert DEFAULT.cuda_graphs([*launch, "--disable-cuda-graph"]) is False
    assert DEFAULT.cuda_graphs([*launch, "--cuda-graph-backend-decode", "disabled"]) is False
    assert DEFAULT.cuda_graphs([*launch, "--cuda-graph-backend-decode=full"]) is True
    assert DEFAULT.cuda_graphs([*launch, "--disable-prefill-cuda-graph"]) is True  # decode graphs stay


# An SGLang 0.5.15 /metrics, shaped as its collectors write it (observability/metrics_collector.py).
LABELS = 'engine_type="unified",model_name="qwen3-coder-30b-a3b",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
TOKENIZER = 'engine_type="unified",model_name="qwen3-coder-30b-a3b"'
EXPOSITION = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{LABELS}}} 4.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{LABELS}}} 0.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{{LABELS}}} 0.03
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{{TOKENIZER}}} 36864.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{{TOKENIZER}}} 1025.0
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{{{TOKENIZER}}} 5.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{{{TOKENIZER},le="0.1"}} 4.0
sglang:time_to_first_token_seconds_bucket{{{TOKENIZER},le="+Inf"}} 5.0
sglang:time_to_first_token_seconds_count{{{TOKENIZER}}} 5.0
sglang:time_to_first_token_seconds_sum{{{TOKENIZER}}} 1.62
# HELP sglang:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_bucket{{{TOKENIZER},le="0.006"}} 1000.0
sglang:inter_token_latency_seconds_bucket{{{TOKENIZER},le="+Inf"}} 1020.0
sglang:inter_token_latency_seconds_count{{{TOKENIZER}}} 1020.0
sglang:inter_token_latency_seconds_sum{{{TOKENIZER}}} 6.9
# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{{{TOKENIZER},le="+Inf"}} 5.0
sglang:e2e_request_latency_seconds_count{{{TOKENIZER}}} 5.0
sglang:e2e_request_latency_seconds_sum{{{TOKENIZER}}} 8.1
# HELP sglang:queue_time_seconds Histogram of queueing time in seconds.
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_bucket{{{LABELS},le="+Inf"}} 5.0
sglang:queue_time_seconds_count{{{LABELS}}} 5.0
sglang:queue_time_seconds_sum{{{LABELS}}} 0.01
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{{LABELS}}} 650.0
"""


def test_metrics_under_canonical_names() -> None:
    snap = parse_exposition(EXPOSITION, DEFAULT)
    assert snap.missing == ()
    assert snap.values["num_requests_running"] == 4.0 and snap.values["kv_cache_usage_perc"] == 0.03
    assert snap.values["prompt_tokens_total"] == 36864.0
    assert snap.values["inter_token_latency_seconds_count"] == 1020.0
    assert snap.sources["num_requests_waiting"] == "sglang:num_queue_reqs"
    assert snap.model_names == ("qwen3-coder-30b-a3b",)
    # vLLM's adapter reads none of it: the names are the engine's
    assert parse_exposition(EXPOSITION, adapter("vllm")).values == {}
