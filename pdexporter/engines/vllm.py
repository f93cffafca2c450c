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

import itertools
import json
import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pdexporter.engines._registry import (
    BUDGET_RULE,
    COLOCATED,
    ChunkRule,
    IterationStep,
    KvSetup,
    MetricKind,
    flag_values,
    info_labels,
    largest_graph,
    last_cause,
    register,
)

__all__ = [
    "CANDIDATE_CHUNK_SIZES", "CHUNK_FLAG", "DECODE_BENCH", "DEFAULT_CHUNK_SIZE", "ITERATION_RE", "KV_TRANSFER_FLAG",
    "METRIC_ALIASES", "NIXL", "OPTIONAL_METRICS", "P2P_NCCL", "PAIR_CONNECTORS",
    "OpenAICompatibleAdapter", "REQUEST_SPAN_ATTRIBUTES", "REQUEST_SPAN_NAME", "STEP_LOG_FLAG", "TRACING_IMPORTS",
    "VllmAdapter", "compilation_config_of", "connector_of", "cudagraph_sizes", "format_step", "graph_max_tokens_of",
    "parse_step_log", "transfer_config_of",
]

# vLLM's KV connectors (`--kv-transfer-config`): what makes a vLLM one side of the offload decision
# (the adapters of `engines.disagg`).
DECODE_BENCH = "DecodeBenchConnector"
NIXL = "NixlConnector"
P2P_NCCL = "P2pNcclConnector"
PAIR_CONNECTORS = (NIXL, P2P_NCCL)
KV_TRANSFER_FLAG = "--kv-transfer-config"

# vLLM's own defaults for `vllm serve` (arg_utils): 8192 on GPUs with >= 70 GB, 2048 below.
DEFAULT_CHUNK_SIZE = 8192
# Chunk sizes a deployment plausibly runs with, tried when inferring B from the cadence.
CANDIDATE_CHUNK_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
CHUNK_FLAG = "--max-num-batched-tokens"
STEP_LOG_FLAG = "--enable-logging-iteration-details"  # one `Iteration(N): ...` line per engine step

# canonical name -> (kind, sample base names used by engines, newest first)
METRIC_ALIASES: dict[str, tuple[MetricKind, tuple[str, ...]]] = {
    "num_requests_running": ("gauge", ("vllm:num_requests_running",)),
    "num_requests_waiting": ("gauge", ("vllm:num_requests_waiting",)),
    "kv_cache_usage_perc": ("gauge", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "prompt_tokens_total": ("counter", ("vllm:prompt_tokens_total",)),
    "generation_tokens_total": ("counter", ("vllm:generation_tokens_total",)),
    "prefix_cache_queries_total": (
        "counter",
        ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    ),
    "prefix_cache_hits_total": ("counter", ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
    "num_preemptions_total": ("counter", ("vllm:num_preemptions_total",)),
    "request_success_total": ("counter", ("vllm:request_success_total",)),
    "inter_token_latency_seconds": (
        "histogram",
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ),
    "time_to_first_token_seconds": ("histogram", ("vllm:time_to_first_token_seconds",)),
    "iteration_tokens": ("histogram", ("vllm:iteration_tokens_total",)),
    "request_prefill_time_seconds": ("histogram", ("vllm:request_prefill_time_seconds",)),
    "request_decode_time_seconds": ("histogram", ("vllm:request_decode_time_seconds",)),
    "request_queue_time_seconds": ("histogram", ("vllm:request_queue_time_seconds",)),
    "e2e_request_latency_seconds": ("histogram", ("vllm:e2e_request_latency_seconds",)),
    # NixlConnector's own series (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py, 0.22),
    # recorded by the reader, i.e. the decode instance, per finished transfer: the window's deltas
    # give the KV transfer time and bytes of the offloaded request (docs/disaggregation.md).
    "kv_transfer_time_seconds": ("histogram", ("vllm:nixl_xfer_time_seconds",)),
    "kv_transfer_bytes": ("histogram", ("vllm:nixl_bytes_transferred",)),
    "kv_transfer_failures_total": ("counter", ("vllm:nixl_num_failed_transfers_total",)),
    # the API server's process collector (0.22 exports it; a restart shows as a new value)
    "process_start_time_seconds": ("gauge", ("process_start_time_seconds",)),
}

# Series only an engine with a KV connector exports: their absence is no gap in a scrape.
OPTIONAL_METRICS = frozenset({"kv_transfer_time_seconds", "kv_transfer_bytes", "kv_transfer_failures_total",
                              "process_start_time_seconds"})


# `--enable-logging-iteration-details`: one line per engine step,
#   Iteration(N): a context requests, b context tokens, c generation requests, d generation tokens,
#   iteration elapsed time: t ms[, GPU KV cache usage: u%]
# "context tokens" is the prefill chunk of that step. Raw files keep steps in this format.
ITERATION_RE = re.compile(
    r"Iteration\((?P<iteration>\d+)\):\s+"
    r"(?P<ctx_req>\d+)\s+context requests,\s+"
    r"(?P<ctx_tok>\d+)\s+context tokens,\s+"
    r"(?P<gen_req>\d+)\s+generation requests,\s+"
    r"(?P<gen_tok>\d+)\s+generation tokens,\s+"
    r"iteration elapsed time:\s+(?P<elapsed>[0-9.]+)\s*ms"
)


# vLLM's OTLP request trace (vllm/tracing, `--otlp-traces-endpoint`; 0.22): one span per finished
# request, started at its arrival, ended when it finishes, with these attributes (seconds, tokens).
# canonical name -> vLLM's attribute (`client.traces` decodes them). No per-step events in 0.22.
REQUEST_SPAN_NAME = "llm_request"
REQUEST_SPAN_ATTRIBUTES: dict[str, str] = {
    "request_id": "gen_ai.request.id",
    "prompt_tokens": "gen_ai.usage.prompt_tokens",
    "completion_tokens": "gen_ai.usage.completion_tokens",
    "ttft_s": "gen_ai.latency.time_to_first_token",
    "e2e_s": "gen_ai.latency.e2e",
    "queue_s": "gen_ai.latency.time_in_queue",
    "prefill_s": "gen_ai.latency.time_in_model_prefill",
    "decode_s": "gen_ai.latency.time_in_model_decode",
    "inference_s": "gen_ai.latency.time_in_model_inference",
    "max_tokens": "gen_ai.request.max_tokens",
}


# What vLLM 0.22's tracing imports (vllm/tracing/otel.py, in one try block): if any of it fails,
# tracing is off, yet with --otlp-traces-endpoint the output processor still traces, with
# `SpanKind` left as `Any`, and every request then fails with HTTP 500 and the API server shuts
# down (docs/vllm-facts.md). `pdexporter doctor` imports exactly these in the engine's Python.
TRACING_IMPORTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("opentelemetry.trace", ("SpanKind", "Tracer", "set_tracer_provider")),
    ("opentelemetry.context.context", ("Context",)),
    ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", ("OTLPSpanExporter",)),
    ("opentelemetry.exporter.otlp.proto.http.trace_exporter", ("OTLPSpanExporter",)),
    ("opentelemetry.propagate", ("inject",)),
    ("opentelemetry.sdk.environment_variables", ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",)),
    ("opentelemetry.sdk.resources", ("Resource",)),
    ("opentelemetry.sdk.trace", ("TracerProvider",)),
    ("opentelemetry.sdk.trace.export", ("BatchSpanProcessor",)),
    ("opentelemetry.trace.propagation.tracecontext", ("TraceContextTextMapPropagator",)),
)


def parse_step_log(lines: Iterable[str]) -> list[IterationStep]:
    steps = []
    for line in lines:
        match = ITERATION_RE.search(line)
        if match:
            steps.append(IterationStep(
                iteration=int(match["iteration"]), context_requests=int(match["ctx_req"]),
                context_tokens=int(match["ctx_tok"]), generation_requests=int(match["gen_req"]),
                generation_tokens=int(match["gen_tok"]), elapsed_ms=float(match["elapsed"]),
            ))
    return steps


def format_step(step: IterationStep) -> str:
    """The line vLLM prints for this step (the embedded engine logs the same; raw files keep it)."""
    return (
        f"Iteration({step.iteration}): {step.context_requests} context requests, "
        f"{step.context_tokens} context tokens, {step.generation_requests} generation requests, "
        f"{step.generation_tokens} generation tokens, iteration elapsed time: {step.elapsed_ms:.2f} ms"
    )



def transfer_config_of(argv: Sequence[str] | str) -> dict[str, Any] | None:
    """The `--kv-transfer-config` an engine command line carries (None: none, or not JSON)."""
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    values = flag_values(words, KV_TRANSFER_FLAG)
    if not values:
        return None
    try:
        parsed = json.loads(values[0])
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def connector_of(argv: Sequence[str] | str) -> str | None:
    config = transfer_config_of(argv)
    connector = config.get("kv_connector") if config else None
    return str(connector) if connector else None


# CUDA graphs (`cudagraph_sizes`, `graph_max_tokens`): a step of more tokens than the largest captured size
# is launched kernel by kernel. The flags that set the sizes, in every form `vllm serve` takes them.
COMPILATION_FLAGS = ("--compilation-config", "-cc")
MAX_NUM_SEQS_FLAG = "--max-num-seqs"
EAGER_FLAG = "--enforce-eager"


def cudagraph_sizes(max_num_batched_tokens: int, max_num_seqs: int, capture_sizes: Sequence[int] | None = None,
                    max_capture_size: int | None = None) -> tuple[int, ...]:
    """vLLM 0.22's CUDA-graph capture sizes (`VllmConfig._set_cudagraph_sizes`, vllm/config/vllm.py).

    The largest size is `max_capture_size`, by default min(2 max_num_seqs, 512), never above the token
    budget B = max_num_batched_tokens. Given sizes are de-duplicated, sorted and those above B dropped;
    else the default list [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), plus B itself when B
    is at most the largest size. When both the sizes and the maximum are given, the largest size kept
    must be the maximum (vLLM raises otherwise: a list up to 2560 with max 2560 is refused at B = 2048).
    A batch of N tokens runs as the graph of the smallest size >= N (`steptime.padded_size`).
    """
    budget = max_num_batched_tokens
    largest = max_capture_size if max_capture_size is not None else min(2 * max_num_seqs, 512)
    largest = min(budget, largest)
    if capture_sizes is not None:
        sizes = sorted({int(s) for s in capture_sizes if s <= budget})
    else:
        sizes = [s for s in (1, 2, 4) if s <= largest]
        if largest >= 8:
            sizes += list(range(8, min(largest + 1, 256), 8))
        if largest >= 256:
            sizes += list(range(256, largest + 1, 16))
        if budget <= largest and budget not in sizes:
            sizes = sorted({*sizes, budget})
    if capture_sizes is not None and max_capture_size is not None and (sizes[-1] if sizes else 0) != max_capture_size:
        raise ValueError(f"max_cudagraph_capture_size={max_capture_size} is not the largest of cudagraph_capture_sizes "
                         f"at or below max_num_batched_tokens={budget} ({sizes[-1] if sizes else 'none'}); vLLM 0.22 "
                         "refuses to start: give cudagraph_capture_sizes alone")
    return tuple(sizes)


def compilation_config_of(argv: Sequence[str] | str) -> dict[str, Any] | None:
    """The `--compilation-config` (`-cc`) a command line gives, with its dotted keys
    (`--compilation-config.max_cudagraph_capture_size 2048`), merged in the order given (the later wins); {}
    where it gives none; None where a whole config is not a JSON object (what vLLM makes of it is not known)."""
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    config: dict[str, Any] = {}
    for i, word in enumerate(words):
        name, sep, value = word.partition("=")
        flag = next((f for f in COMPILATION_FLAGS if name == f or name.startswith(f + ".")), None)
        if flag is None:
            continue
        if not sep:
            if i + 1 >= len(words):
                continue
            value = words[i + 1]
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        if name == flag:
            if not isinstance(parsed, dict):
                return None
            config.update(parsed)
        else:
            config[name[len(flag) + 1:]] = parsed
    return config


def graph_max_tokens_of(argv: Sequence[str] | str, chunk_size: int) -> int | None:
    """The largest step (tokens) a `vllm serve` with these arguments and this max_num_batched_tokens runs as a
    CUDA graph: 0 with `--enforce-eager` or `cudagraph_mode` NONE; else the largest of `cudagraph_sizes` from its
    capture sizes, max_cudagraph_capture_size and `--max-num-seqs` (default 512 tokens, as for max_num_seqs >= 256
    and B >= 512). None where the command line cannot say (a compilation config that is not JSON, sizes vLLM
    would refuse)."""
    captured = graph_sizes_of(argv, chunk_size)
    return None if captured is None else largest_graph(captured)


def graph_sizes_of(argv: Sequence[str] | str, chunk_size: int) -> tuple[int, ...] | None:
    """Every step size such a `vllm serve` captures a CUDA graph for (`cudagraph_sizes`; () with `--enforce-eager`
    or `cudagraph_mode` NONE; None where the command line cannot say, as `graph_max_tokens_of`)."""
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    config = compilation_config_of(words)
    if config is None:
        return None
    if EAGER_FLAG in words or str(config.get("cudagraph_mode", "")).upper() == "NONE":
        return ()
    seqs = flag_values(words, MAX_NUM_SEQS_FLAG)
    try:
        max_num_seqs = int(seqs[-1]) if seqs else 256
        sizes = config.get("cudagraph_capture_sizes")
        largest = config.get("max_cudagraph_capture_size")
        captured = cudagraph_sizes(chunk_size, max_num_seqs, None if sizes is None else [int(s) for s in sizes],
                                   None if largest is None else int(largest))
    except (TypeError, ValueError):
        return None
    return tuple(captured)


# The datasheet GPUs (`pdexporter.sim.hardware`) as vLLM names them in its tuned-config files
# (torch.cuda.get_device_name() with its spaces as underscores), an 80 GB SXM part where both exist.
MOE_DEVICE_NAMES = {"H200": "NVIDIA_H200", "H100": "NVIDIA_H100_80GB_HBM3", "H20": "NVIDIA_H20",
                    "A100": "NVIDIA_A100-SXM4-80GB", "L40S": "NVIDIA_L40S"}
DEFAULT_MOE_CONFIG_LOG = "Using default MoE config. Performance might be sub-optimal!"


def tuned_moe_config(experts: int, width: int, gpu: str) -> bool | None:
    """Whether vLLM 0.22 ships a tuned bf16 fused-MoE kernel configuration for `experts` routed experts of
    `width` (one expert's intermediate size per tensor-parallel rank) on `gpu` (a datasheet name); None for
    a GPU it names no file for. Without one, vLLM runs its Triton MoE kernel with a default configuration
    (`DEFAULT_MOE_CONFIG_LOG` in its log)."""
    from pdexporter.engines._vllm_moe_configs import TUNED_BF16

    device = MOE_DEVICE_NAMES.get(gpu.upper())
    if device is None:
        return None
    shipped = {tuple(int(x) for x in pair.split(",")) for pair in TUNED_BF16.get(device, "").split()}
    return (experts, width) in shipped


# the API server's error once its engine core process died (vllm/v1/engine/utils.py, 0.22): the root cause
# is the engine core's exception above it
START_FAILURE_WRAPPERS = ("Engine core initialization failed",)


@register("vllm")
class VllmAdapter:
    name = "vllm"
    default_chunk_size = DEFAULT_CHUNK_SIZE
    candidate_chunk_sizes = CANDIDATE_CHUNK_SIZES
    chunk_flag = CHUNK_FLAG
    metric_aliases: Mapping[str, tuple[MetricKind, tuple[str, ...]]] = METRIC_ALIASES
    optional_metrics: frozenset[str] = OPTIONAL_METRICS
    request_span_name = REQUEST_SPAN_NAME
    request_span_attributes: Mapping[str, str] = REQUEST_SPAN_ATTRIBUTES
    tracing_imports: tuple[tuple[str, tuple[str, ...]], ...] = TRACING_IMPORTS
    cache_config_metric: str | None = "vllm:cache_config_info"  # labels: enable_prefix_caching, block_size, ...
    kv: KvSetup = COLOCATED
    chunk_rule: ChunkRule = BUDGET_RULE  # decodes take their token of B first, and run in the chunk's step
    identity_path = "/version"
    sim_profile: str | None = None
    # scheduler stats with every step's outputs; after every request was aborted they stay as they
    # were until the engine steps again (vllm-project/vllm#22545): `protocol.settle_engine` nudges it
    request_gauges_per_step = True

    def chunk_schedule(self, prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
        return self.chunk_rule.schedule(prompt_tokens, chunk_size, running_decodes)

    def budget_problem(self, chunk_size: int, running_decodes: int) -> str | None:
        return self.chunk_rule.problem(chunk_size, running_decodes)

    def joint_prefill_tokens(self, prefills: Sequence[tuple[float, float, int]],
                             step_ns: float) -> int | None:
        """vLLM's scheduler (V1, 0.22: `Scheduler.schedule`, mirrored by `sim.scheduler`) fills each step's
        budget B with the running requests first, a partial prefill's next chunk among them, then admits waiting
        requests FCFS into what is left (the step logs of the committed H200 runs show steps of "2 context
        requests" and "3 context requests"). A prefill that waits behind another is therefore admitted into the
        leftover budget of the other's last chunk step (or the step right after it), and from the decodes' side
        the two are one chunked stream of P1 + P2 tokens through the same B - D budget: ceil((P1 + P2) / (B -
        D)) chunk steps, not two schedules. Several prefills are one stream when, in order of admission
        (`scheduled`), each was admitted no later than one step (`step_ns`, the caller's tolerance) after the
        previous one's first token and their first tokens come out in that order: no decode-only step between
        them. Then the stream's P is the sum of their prompt tokens (vLLM's span counts cached prompt tokens
        too, as for a single prefill)."""
        if len(prefills) < 2 or any(not math.isfinite(s) for s, _, _ in prefills):
            return None
        ordered = sorted(prefills)
        for (_, first_a, _), (scheduled_b, first_b, _) in itertools.pairwise(ordered):
            if scheduled_b > first_a + step_ns or first_b < first_a - step_ns:
                return None
        return sum(tokens for _, _, tokens in ordered)

    def parse_step_log(self, lines: Iterable[str]) -> list[IterationStep]:
        return parse_step_log(lines)

    def format_step(self, step: IterationStep) -> str:
        return format_step(step)

    def cuda_graphs(self, argv: Sequence[str]) -> bool | None:
        """vLLM captures CUDA graphs unless told not to (the seed's --enforce-eager ablation)."""
        return EAGER_FLAG not in argv

    def graph_sizes(self, argv: Sequence[str], chunk_size: int) -> tuple[int, ...] | None:
        """The sizes it pads a step to (`graph_sizes_of`), the largest 512 by default; more with
        `--compilation-config '{"cudagraph_capture_sizes": [..., 2064]}'`, which takes a one-chunk prompt of up to
        ~2K tokens off the eager launch floor (results/h100-vllm0.22-qwen3-coder-30b-a3b-engine-ab)."""
        return graph_sizes_of(argv, chunk_size)

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        return (CHUNK_FLAG, str(chunk_size), "--enable-chunked-prefill", STEP_LOG_FLAG)

    def for_command(self, argv: Sequence[str], role: str | None = None) -> str:
        """Its KV connector (`--kv-transfer-config`) and pair role make a vLLM the offloaded arm
        (the adapters of `engines.disagg`): DecodeBenchConnector the decode-bench arm, NixlConnector
        or P2pNcclConnector in a pair that pair's decode or prefill instance; a plain one is itself."""
        connector = connector_of(argv)
        if connector == DECODE_BENCH:
            return "vllm-decode-bench"
        if connector in PAIR_CONNECTORS and role == "decode":
            return "vllm-pd-decode" if connector == NIXL else "vllm-pd-decode-p2p"
        if connector in PAIR_CONNECTORS and role == "prefill":
            return "vllm-pd-prefill"
        return "vllm"

    def recognise(self, identity: Mapping[str, object]) -> bool:
        return "version" in identity and not identity.get("modelled")

    def served_chunk_size(self, identity: Mapping[str, object]) -> int | None:
        return None  # vLLM 0.22 publishes max_num_batched_tokens nowhere (not in /version nor /metrics)

    def setup_problems(self, identity: Mapping[str, object]) -> tuple[str, ...]:
        return ()  # nothing in /version says how it was started

    def prefix_caching(self, identity: Mapping[str, object], metrics_text: str | None) -> bool | None:
        labels = info_labels(metrics_text, self.cache_config_metric)
        if labels is None or "enable_prefix_caching" not in labels:
            return None
        return labels["enable_prefix_caching"].lower() == "true"

    def start_failure(self, log_lines: Sequence[str]) -> str:
        return last_cause(log_lines, START_FAILURE_WRAPPERS)


@register("openai-compatible")
class OpenAICompatibleAdapter(VllmAdapter):
    """An OpenAI-compatible engine nobody identified (no /version an adapter recognises, no
    --engine): measured with vLLM's rules as a stated assumption, and recorded under this name,
    never as "vllm". The chunk schedule then has to survive the cadence check window by window."""

    name = "openai-compatible"

    def for_command(self, argv: Sequence[str], role: str | None = None) -> str:
        return self.name

    def recognise(self, identity: Mapping[str, object]) -> bool:
        return False
