"""vLLM (V1 engine, 0.22 and later): the rules pdexporter relies on, in one place.

Chunking (docs/vllm-facts.md, and all 1,650 repetitions of the H200 sweep): each engine step has
a budget of `max_num_batched_tokens` (B) tokens; the running decodes take one token each first
and a new prefill gets what is left, so a P-token prompt runs as ceil(P / (B - D)) chunks of
B - D tokens and a tail. vLLM 0.22 does not publish B in /metrics (`vllm:cache_config_info`
carries no scheduler settings), so against an engine someone else started B must be given, or is
taken as vLLM's default for the OpenAI server on a >= 70 GB GPU (8192) and checked window by
window against the probes' cadence (`engines.infer_chunk_size`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pdexporter.engine.iterlog import IterationStep, parse_iteration_lines
from pdexporter.engine.metrics import ALIASES
from pdexporter.engines._registry import MetricKind, budget_schedule, check_budget, register

# vLLM's own defaults for `vllm serve` (arg_utils): 8192 on GPUs with >= 70 GB, 2048 below.
DEFAULT_CHUNK_SIZE = 8192
# Chunk sizes a deployment plausibly runs with, tried when inferring B from the cadence.
CANDIDATE_CHUNK_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


@register("vllm", "openai-compatible")
class VllmAdapter:
    name = "vllm"
    default_chunk_size = DEFAULT_CHUNK_SIZE
    metric_aliases: Mapping[str, tuple[MetricKind, tuple[str, ...]]] = ALIASES

    def chunk_schedule(self, prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
        return budget_schedule(prompt_tokens, chunk_size, running_decodes)

    def check_decodes(self, chunk_size: int, running_decodes: int, *, what: str = "-D") -> None:
        check_budget(chunk_size, running_decodes, what)

    def parse_step_log(self, lines: Iterable[str]) -> list[IterationStep]:
        return parse_iteration_lines(lines)

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        return ("--max-num-batched-tokens", str(chunk_size), "--enable-chunked-prefill",
                "--enable-logging-iteration-details")

    def recognise(self, version_payload: Mapping[str, object]) -> bool:
        return "version" in version_payload and not version_payload.get("modelled")
