"""SGLang (0.5.15): the rules pdexporter relies on, in one place. Read from its source
(`python/sglang/srt/managers/scheduler.py`, `schedule_policy.py`,
`scheduler_components/metrics_reporter.py`, `observability/metrics_collector.py`,
`entrypoints/http_server.py`) and checked on an H200 (docs/sglang-facts.md).

Chunking, two modes (`Scheduler.get_next_batch_to_run`, `PrefillAdder`):

- default (`--enable-mixed-chunk` off): a step is a prefill batch or a decode batch, and a
  prefill batch runs whenever there is one ("Run prefill first if possible"). A prompt longer
  than `--chunked-prefill-size` (B) is cut into chunks of B tokens; the chunked request goes
  first into every following prefill batch until its last chunk, so its chunks run back to back
  and the running decodes pause for all of them: ceil(P / B) steps of B tokens and a tail, then
  the decodes' next step. Adapter "sglang": `ChunkRule(decodes_take_budget=False,
  decodes_in_chunk_step=False)`.
- `--enable-mixed-chunk`: the running decodes join every prefill batch (`mix_with_running`) and
  the chunk shrinks by their number (`rem_chunk_tokens -= running_bs`): ceil(P / (B - D)) steps
  of B - D tokens, vLLM's shape. Adapter "sglang-mixed": `ChunkRule(decodes_pay_chunk_tokens=True)`
  (both True, and each decode in a chunk's step pays per chunk token: `MIXED_RULE`).

The cost model each mode implies (`analysis.models`, chosen by these rules, not by name): default,
the decodes see one stall per prefill, the chunk steps back to back (each a whole step, the
decodes' own work not in it; attention over the growing prefix); mixed, vLLM's chunk steps plus
delta x D x c per step.

`--max-prefill-tokens` (16384 by default) caps the tokens of *several* new requests in one
prefill batch; the first request's chunk is bounded by B alone, so it never shortens a chunk here.

Who it is: SGLang serves no /version; `GET /server_info` answers its server arguments (among them
`chunked_prefill_size`, `enable_mixed_chunk`, `decode_log_interval`, `enable_metrics`,
`disable_radix_cache`) with `"version"`, so B and the mode are read from the engine itself.

Step log (INFO, `SchedulerMetricsReporter`), one line per step with `--decode-log-interval 1`
(the default, 40, logs every 40th decode step):

    [2026-12-01 10:00:00] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.01, #running-req: 4, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 0.00
    [2026-12-01 10:00:00] Decode batch, #running-req: 4, #token: 16500, token usage: 0.02, cuda graph: True, gen throughput (token/s): 700.12, #queue-req: 0

`#new-token` is the step's prefill chunk (all new requests' tokens), `#running-req` on a prefill
line the running batch beside it: the decodes mixed into the step (mixed mode) or the decodes
paused for it (default), which only the mode tells apart. SGLang logs no step time (elapsed 0).
With `SGLANG_LOG_FORWARD_ITERS=1` the lines read `Prefill batch [N], ...`.

/metrics (with `--enable-metrics`, `sglang:*`; scheduler gauges are set when a step is logged,
the tokenizer's counters and histograms when a request finishes): see `METRIC_ALIASES`. Note
`sglang:prompt_tokens_total` and `generation_tokens_total` grow when a request *finishes* (vLLM's
grow as tokens are computed), and there is no prefix-cache query counter.

Its OTLP tracing (`--enable-trace`) exports a tree of per-stage spans, not one span per request:
pdexporter reads no SGLang traces (`request_span_name` is empty).
"""  # noqa: E501 (verbatim data)

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from pdexporter.engines._registry import (
    COLOCATED,
    ChunkRule,
    IterationStep,
    KvSetup,
    MetricKind,
    flag_values,
    last_cause,
    register,
)

__all__ = [
    "CANDIDATE_CHUNK_SIZES",
    "CHUNK_FLAG",
    "DECODE_RE",
    "DEFAULT_CHUNK_SIZE",
    "METRIC_ALIASES",
    "MIXED_CHUNK_FLAG",
    "MIXED_RULE",
    "PAUSE_RULE",
    "PREFILL_RE",
    "SIM_PROFILE",
    "SglangAdapter",
    "SglangMixedAdapter",
    "format_step",
    "log_prefix",
    "parse_step_log",
]

# SGLang's default chunked_prefill_size on a GPU with more than ~90 GB (server_args, H100/H200: 8192).
DEFAULT_CHUNK_SIZE = 8192
CANDIDATE_CHUNK_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
CHUNK_FLAG = "--chunked-prefill-size"
MIXED_CHUNK_FLAG = "--enable-mixed-chunk"
# The embedded engine's profile imitating SGLang (pdexporter/sim/profiles/, docs/engines.md)
SIM_PROFILE = "h200-sglang0.5.15-qwen3-coder-30b-a3b"
# graph_max_tokens 0: the chunk steps launched eagerly, as with `--disable-prefill-cuda-graph` (the
# H200 sweeps); SGLang's default captures "breakable" prefill graphs up to chunked_prefill_size.
PAUSE_RULE = ChunkRule(decodes_take_budget=False, decodes_in_chunk_step=False)  # the default mode
# --enable-mixed-chunk. The decodes run as one-token rows of the chunk's extend batch, and with
# triton attention each pays for the chunk's length (its grid is as long as the longest row): a
# mixed step grows by ~0.018 ms per chunk token per decode on the H200 (~150 ms per decode beside an
# 8K chunk; results/h200-sglang0.5.15-mixed-qwen3-coder-30b-a3b/RUN.md), a term the cost model fits
# (0 where a backend schedules rows by their own length, as FlashAttention's varlen kernels do).
MIXED_RULE = ChunkRule(decodes_take_budget=True, decodes_in_chunk_step=True, decodes_pay_chunk_tokens=True)

# canonical name -> (kind, SGLang's sample base names)
METRIC_ALIASES: dict[str, tuple[MetricKind, tuple[str, ...]]] = {
    "num_requests_running": ("gauge", ("sglang:num_running_reqs",)),
    "num_requests_waiting": ("gauge", ("sglang:num_queue_reqs",)),
    "kv_cache_usage_perc": ("gauge", ("sglang:token_usage",)),
    "prompt_tokens_total": ("counter", ("sglang:prompt_tokens_total",)),
    "generation_tokens_total": ("counter", ("sglang:generation_tokens_total",)),
    "prefix_cache_hits_total": ("counter", ("sglang:cached_tokens_total",)),
    "num_preemptions_total": ("counter", ("sglang:num_retracted_requests_total",)),
    "request_success_total": ("counter", ("sglang:num_requests_total",)),
    "inter_token_latency_seconds": ("histogram", ("sglang:inter_token_latency_seconds",)),
    "time_to_first_token_seconds": ("histogram", ("sglang:time_to_first_token_seconds",)),
    "request_queue_time_seconds": ("histogram", ("sglang:queue_time_seconds",)),
    "e2e_request_latency_seconds": ("histogram", ("sglang:e2e_request_latency_seconds",)),
    "process_start_time_seconds": ("gauge", ("process_start_time_seconds",)),
}
# Series SGLang creates only once something happened (a cached prefix, a retraction); and the process
# collector's start time, absent where its metrics run in Prometheus' multiprocess mode.
OPTIONAL_METRICS = frozenset({"prefix_cache_hits_total", "num_preemptions_total", "process_start_time_seconds"})

# The gap before #running-req never crosses into another "Prefill batch": a line repeating the head
# without it (a logged prompt, `--log-requests`) was rescanned to its end from each one (68 s at 1 MB).
PREFILL_RE = re.compile(
    r"Prefill batch(?: \[(?P<iteration>\d+)\])?, #new-seq: (?P<seqs>\d+), #new-token: (?P<tokens>\d+), "
    r"#cached-token: (?P<cached>\d+),(?:(?!Prefill batch).)*?#running-req: (?P<running>\d+)"
)
DECODE_RE = re.compile(r"Decode batch(?: \[(?P<iteration>\d+)\])?, #running-req: (?P<running>\d+)")


def parse_step_log(lines: Iterable[str], mixed: bool) -> list[IterationStep]:
    """SGLang's `Prefill batch` / `Decode batch` lines as steps. A prefill line's running requests
    are decodes of that step only in mixed mode (`mixed`); in the default mode they paused."""
    steps = []
    count = 0
    for line in lines:
        if "batch" not in line:
            continue
        match = PREFILL_RE.search(line)
        if match:
            running = int(match["running"]) if mixed else 0
            steps.append(
                IterationStep(
                    iteration=int(match["iteration"]) if match["iteration"] else count,
                    context_requests=int(match["seqs"]),
                    context_tokens=int(match["tokens"]),
                    generation_requests=running,
                    generation_tokens=running,
                    elapsed_ms=0.0,
                )
            )
            count += 1
            continue
        match = DECODE_RE.search(line)
        if match:
            running = int(match["running"])
            steps.append(
                IterationStep(
                    iteration=int(match["iteration"]) if match["iteration"] else count,
                    context_requests=0,
                    context_tokens=0,
                    generation_requests=running,
                    generation_tokens=running,
                    elapsed_ms=0.0,
                )
            )
            count += 1
    return steps


def format_step(step: IterationStep) -> str:
    """The line SGLang prints for this step (the fields a step does not carry as SGLang prints
    them when idle; `parse_step_log` reads back the step)."""
    if step.context_tokens > 0:
        return (
            f"Prefill batch, #new-seq: {step.context_requests}, #new-token: {step.context_tokens}, "
            f"#cached-token: 0, token usage: 0.00, #running-req: {step.generation_requests}, #queue-req: 0, "
            f"#pending-token: 0, cuda graph: False, input throughput (token/s): 0.00"
        )
    return (
        f"Decode batch, #running-req: {step.generation_requests}, #token: 0, token usage: 0.00, "
        f"cuda graph: True, gen throughput (token/s): 0.00, #queue-req: 0"
    )


def log_prefix(wall_time: str) -> str:
    """`[YYYY-MM-DD HH:MM:SS] `: SGLang's logging format for a one-GPU scheduler."""
    return f"[{wall_time}] "


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# the launcher's error once a scheduler process failed (sglang/srt/entrypoints/engine.py): the root cause is
# the scheduler's exception above it
START_FAILURE_WRAPPERS = ("Initialization failed. Please see the error messages above",)


@register("sglang")
class SglangAdapter:
    """SGLang's default mode: chunks of B tokens, the running decodes paused for them."""

    name = "sglang"
    default_chunk_size = DEFAULT_CHUNK_SIZE
    candidate_chunk_sizes = CANDIDATE_CHUNK_SIZES
    chunk_flag = CHUNK_FLAG
    metric_aliases: Mapping[str, tuple[MetricKind, tuple[str, ...]]] = METRIC_ALIASES
    optional_metrics: frozenset[str] = OPTIONAL_METRICS
    request_span_name = ""
    request_span_attributes: Mapping[str, str] = {}
    tracing_imports: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cache_config_metric: str | None = None
    kv: KvSetup = COLOCATED
    chunk_rule: ChunkRule = PAUSE_RULE
    identity_path = "/server_info"
    # step times of SGLang 0.5.15 with triton attention and MoE on the H200, calibrated on both modes
    sim_profile: str | None = SIM_PROFILE
    # num_running_reqs / num_queue_reqs are set when a prefill batch or every 40th decode batch is
    # logged: one read 23 at D = 12 on the H200 (results/h200-sglang0.5.15-mixed-*/RUN.md)
    request_gauges_per_step = False
    mixed = False

    def chunk_schedule(self, prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
        return self.chunk_rule.schedule(prompt_tokens, chunk_size, running_decodes)

    def budget_problem(self, chunk_size: int, running_decodes: int) -> str | None:
        return self.chunk_rule.problem(chunk_size, running_decodes)

    def joint_prefill_tokens(self, prefills: Sequence[tuple[float, float, int]], step_ns: float) -> int | None:
        return None  # how SGLang batches waiting prefills is not checked here: overlapped runs stay "merged"

    def parse_step_log(self, lines: Iterable[str]) -> list[IterationStep]:
        return parse_step_log(lines, self.mixed)

    def format_step(self, step: IterationStep) -> str:
        return format_step(step)

    def cuda_graphs(self, argv: Sequence[str]) -> bool | None:
        """Decode steps replay CUDA graphs unless disabled (prefill chunks have their own graphs,
        `--disable-prefill-cuda-graph`; what pdexporter records is the decode side)."""
        words = list(argv)
        if "--disable-cuda-graph" in words or "--disable-decode-cuda-graph" in words:
            return False
        backend = flag_values(words, "--cuda-graph-backend-decode")
        return not backend or backend[0] != "disabled"

    def graph_sizes(self, argv: Sequence[str], chunk_size: int) -> tuple[int, ...] | None:
        """None: the rule's 0 stands. The sweeps run `--disable-prefill-cuda-graph`, so every chunk step is
        launched eagerly; SGLang's own prefill graphs (up to B tokens, captured at start-up) are not modelled."""
        return None

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        return (CHUNK_FLAG, str(chunk_size), "--decode-log-interval", "1", "--enable-metrics")

    def for_command(self, argv: Sequence[str], role: str | None = None) -> str:
        return "sglang-mixed" if MIXED_CHUNK_FLAG in argv else "sglang"

    def recognise(self, identity: Mapping[str, object]) -> bool:
        return (
            "version" in identity
            and "chunked_prefill_size" in identity
            and not identity.get("modelled")
            and bool(identity.get("enable_mixed_chunk")) == self.mixed
        )

    def served_chunk_size(self, identity: Mapping[str, object]) -> int | None:
        size = _int(identity.get("chunked_prefill_size"))
        return size if size is not None and size > 0 else None

    def setup_problems(self, identity: Mapping[str, object]) -> tuple[str, ...]:
        problems = []
        interval = _int(identity.get("decode_log_interval"))
        if interval is not None and interval != 1:
            problems.append(
                f"decode_log_interval={interval}: its log skips decode steps, so chunk steps cannot be "
                "counted from it; start it with --decode-log-interval 1"
            )
        if identity.get("enable_metrics") is False:
            problems.append("enable_metrics=false: no /metrics; start it with --enable-metrics")
        size = _int(identity.get("chunked_prefill_size"))
        if size is not None and size <= 0:
            problems.append(
                f"chunked_prefill_size={size}: chunked prefill is off, a prompt runs in one step; start "
                f"it with {CHUNK_FLAG} B"
            )
        return tuple(problems)

    def prefix_caching(self, identity: Mapping[str, object], metrics_text: str | None) -> bool | None:
        flag = identity.get("disable_radix_cache")
        return None if not isinstance(flag, bool) else not flag

    def start_failure(self, log_lines: Sequence[str]) -> str:
        return last_cause(log_lines, START_FAILURE_WRAPPERS)


@register("sglang-mixed")
class SglangMixedAdapter(SglangAdapter):
    """SGLang with --enable-mixed-chunk: the decodes join each chunk's step, chunks of B - D tokens."""

    name = "sglang-mixed"
    chunk_rule: ChunkRule = MIXED_RULE
    mixed = True

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        return (*super().chunk_size_flags(chunk_size), MIXED_CHUNK_FLAG)
