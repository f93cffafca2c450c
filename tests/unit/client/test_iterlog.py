"""vLLM's iteration-detail log lines: parsing and chunk summaries."""

from __future__ import annotations

from pathlib import Path

from pdexporter.client.iterlog import IterationLogTail, summarise_chunks
from pdexporter.engines import IterationStep, adapter

parse_iteration_lines, format_step = adapter("vllm").parse_step_log, adapter("vllm").format_step

# As vLLM 0.22 prints them (format seen in the engine's log; values from docs/vllm-facts.md).
LINES = [
    "(EngineCore_DP0 pid=4242) INFO 11-28 10:01:02 [core.py:418] Iteration(1200): 0 context requests, 0 context "
    "tokens, 4 generation requests, 4 generation tokens, iteration elapsed time: 6.01 ms",
    "(EngineCore_DP0 pid=4242) INFO 11-28 10:01:02 [core.py:418] Iteration(1201): 1 context requests, 8188 context "
    "tokens, 4 generation requests, 4 generation tokens, iteration elapsed time: 2.40 ms, GPU KV cache usage: 1.2%",
    "INFO 11-28 10:01:02 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s",
    "(EngineCore_DP0 pid=4242) INFO 11-28 10:01:03 [core.py:418] Iteration(1202): 1 context requests, 4 context "
    "tokens, 4 generation requests, 4 generation tokens, iteration elapsed time: 349.60 ms",
]


def test_parse_real_format_and_ignore_other_lines() -> None:
    steps = parse_iteration_lines(LINES)
    assert [s.iteration for s in steps] == [1200, 1201, 1202]
    assert steps[1].context_tokens == 8188 and steps[1].generation_requests == 4
    assert steps[2].elapsed_ms == 349.6
    assert steps[1].is_mixed and not steps[0].is_mixed


def test_chunk_summary_counts_context_steps() -> None:
    summary = summarise_chunks(parse_iteration_lines(LINES))
    assert summary.num_chunks == 2
    assert summary.chunk_tokens == (8188, 4)
    assert summary.decode_requests_beside == (4, 4)


def test_vllm_step_lines_round_trip() -> None:
    step = IterationStep(7, 1, 2044, 4, 4, 47.25)
    assert parse_iteration_lines([format_step(step)]) == [step]


def test_tail_reads_only_what_was_appended_since_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    tail = IterationLogTail(log, parse_iteration_lines)
    assert tail.mark() == 0 and tail.read_since(0) == []
    log.write_text("\n".join(LINES[:1]) + "\n")
    mark = tail.mark()
    with log.open("a") as handle:
        handle.write("\n".join(LINES[1:]) + "\n")
    assert [s.iteration for s in tail.read_since(mark)] == [1201, 1202]
