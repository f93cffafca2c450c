"""vLLM 0.22's Prometheus series, kept by the embedded engine under vLLM's own names.

Names, types, help texts, label sets (`engine="0"`, `model_name`) and bucket bounds are those of a
real vLLM 0.22.0 exposition (`fixtures/vllm-0.22/metrics.txt`), produced the same way vLLM does it:
prometheus_client metric objects in a registry. What each one counts follows vLLM's output
processor: `prompt_tokens_total` grows by a request's whole prompt (cached tokens included) in the
step where its first token comes out, and `iteration_tokens_total` observes, per step, the prompt
tokens of requests that got their first token plus the generated tokens (so it cannot verify
chunking; the iteration log can).

One registry per engine, so several engines (tests, a sweep) never share counters. The names of
the series pdexporter reads are the vLLM adapter's (`engines.metric_name`): declared once, there.
"""

from __future__ import annotations

import bisect

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pdexporter.engines import adapter, metric_name
from pdexporter.sim.families import MetricFamilies

__all__ = [
    "FINISH_REASONS", "ITERATION_BUCKETS", "ITL_BUCKETS", "LATENCY_BUCKETS", "NIXL_BYTES_BUCKETS",
    "NIXL_TIME_BUCKETS", "N_BUCKETS", "TOKEN_BUCKETS", "TTFT_BUCKETS", "VllmMetrics", "observe_many",
]

VLLM = "vllm"  # the adapter whose names these series carry (the ones pdexporter reads are declared there)


def _name(canonical: str) -> str:
    return metric_name(VLLM, canonical)

TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
N_BUCKETS = (1, 2, 5, 10, 20)
# NixlConnector's (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py, 0.22)
NIXL_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def observe_many(histogram: Histogram, value: float, count: int) -> None:
    """`count` observations of one value at the cost of one.

    All decodes of a step share one inter-token latency, so the engine observes each distinct value
    once per step. Same effect as `count` calls of `Histogram.observe`; this reaches into the child's
    `_sum`/`_buckets` (prometheus_client's layout since 0.4) and falls back to the loop if that moves.
    """
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    total = getattr(histogram, "_sum", None)
    if buckets is None or bounds is None or total is None:
        for _ in range(count):
            histogram.observe(value)
        return
    total.inc(value * count)
    buckets[bisect.bisect_left(bounds, value)].inc(count)


def _token_buckets(max_model_len: int) -> tuple[int, ...]:
    # vLLM's build_1_2_5_buckets(max_model_len)
    return tuple(b for b in TOKEN_BUCKETS if b <= max_model_len) or (max_model_len,)


class VllmMetrics(MetricFamilies):
    """The series pdexporter reads (and a few neighbours), bound to one engine's labels."""

    def __init__(
        self,
        model_name: str,
        *,
        max_model_len: int = 200_000,
        registry: CollectorRegistry | None = None,
        cache_config: dict[str, str] | None = None,
        engine: str = "0",
    ) -> None:
        super().__init__(registry)
        r = self.registry
        names = ["model_name", "engine"]
        lv = {"model_name": model_name, "engine": engine}
        self._gauges: tuple[int, int, float] = (0, 0, 0.0)

        keep = self.keep
        def gauge(name: str, doc: str) -> Gauge:
            return keep(Gauge(name, doc, names, registry=r, multiprocess_mode="mostrecent")).labels(**lv)

        def counter(name: str, doc: str) -> Counter:
            return keep(Counter(name, doc, names, registry=r)).labels(**lv)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return keep(Histogram(name, doc, names, buckets=buckets, registry=r)).labels(**lv)

        tokens = _token_buckets(max_model_len)
        self.num_requests_running = gauge(_name("num_requests_running"),
                                          "Number of requests in model execution batches.")
        self.num_requests_waiting = gauge(_name("num_requests_waiting"), "Number of requests waiting to be processed.")
        self.kv_cache_usage_perc = gauge(_name("kv_cache_usage_perc"), "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_cache_queries = counter(
            _name("prefix_cache_queries_total"), "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = counter(
            _name("prefix_cache_hits_total"), "Prefix cache hits, in terms of number of cached tokens."
        )
        self.num_preemptions = counter(_name("num_preemptions_total"),
                                       "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter(_name("prompt_tokens_total"), "Number of prefill tokens processed.")
        self.generation_tokens = counter(_name("generation_tokens_total"), "Number of generation tokens processed.")
        success = keep(Counter(_name("request_success_total"), "Count of successfully processed requests.",
                               [*names, "finished_reason"], registry=r))
        self.request_success = {reason: success.labels(finished_reason=reason, **lv) for reason in FINISH_REASONS}
        self.request_prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens)
        self.iteration_tokens = hist(
            _name("iteration_tokens"), "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS)
        self.request_max_num_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.", tokens)
        self.request_params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.request_params_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens)
        self.time_to_first_token = hist(
            _name("time_to_first_token_seconds"), "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.inter_token_latency = hist(
            _name("inter_token_latency_seconds"), "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.request_time_per_output_token = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e_request_latency = hist(
            _name("e2e_request_latency_seconds"), "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS)
        self.request_queue_time = hist(
            _name("request_queue_time_seconds"), "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS)
        self.request_inference_time = hist(
            "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS)
        self.request_prefill_time = hist(
            _name("request_prefill_time_seconds"), "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS)
        self.request_decode_time = hist(
            _name("request_decode_time_seconds"), "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS)
        self.request_prefill_kv_computed_tokens = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).", tokens)
        self._hist = hist
        self._counter = counter
        self.kv_transfer_time: Histogram | None = None
        self.kv_transfer_bytes: Histogram | None = None
        if cache_config:
            info = Gauge(adapter(VLLM).cache_config_metric or "",  "Information of the LLMEngine CacheConfig",
                         sorted([*cache_config, "engine"]), registry=r, multiprocess_mode="mostrecent")
            info.labels(engine=engine, **cache_config).set(1)

    def enable_kv_transfer(self) -> None:
        """NixlConnector's series, kept by the decode instance of a pair (the reader records them)."""
        if self.kv_transfer_time is not None:
            return
        self.kv_transfer_time = self._hist(
            _name("kv_transfer_time_seconds"), "Histogram of transfer duration for NIXL KV Cache transfers.",
            NIXL_TIME_BUCKETS)
        self.kv_transfer_bytes = self._hist(
            _name("kv_transfer_bytes"), "Histogram of bytes transferred per NIXL KV Cache transfers.",
            NIXL_BYTES_BUCKETS)
        self._counter(_name("kv_transfer_failures_total"), "Number of failed NIXL KV Cache transfers.")

    def on_kv_transfer(self, seconds: float, nbytes: int) -> None:
        if self.kv_transfer_time is not None and self.kv_transfer_bytes is not None:
            self.kv_transfer_time.observe(seconds)
            self.kv_transfer_bytes.observe(nbytes)

    # The engine calls these; each is a few counter/histogram updates.

    def on_new_request(self, max_tokens: int) -> None:
        self.request_params_n.observe(1)
        self.request_params_max_tokens.observe(max_tokens)
        self.request_max_num_generation_tokens.observe(max_tokens)

    def on_step(self, *, prompt_tokens: int, generation_tokens: int, running: int, waiting: int,
                kv_usage: float, prefix_queries: int, prefix_hits: int, preemptions: int,
                context_tokens: int = 0, decode_tokens: int = 0) -> None:
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)
        if generation_tokens:
            self.generation_tokens.inc(generation_tokens)
        self.iteration_tokens.observe(prompt_tokens + generation_tokens)
        gauges = (running, waiting, kv_usage)
        if gauges != self._gauges:  # most steps change none of them; a set() takes a lock
            self._gauges = gauges
            self.num_requests_running.set(running)
            self.num_requests_waiting.set(waiting)
            self.kv_cache_usage_perc.set(kv_usage)
        if prefix_queries:
            self.prefix_cache_queries.inc(prefix_queries)
        if prefix_hits:
            self.prefix_cache_hits.inc(prefix_hits)
        if preemptions:
            self.num_preemptions.inc(preemptions)

    def on_queue(self, running: int, waiting: int) -> None:
        self._gauges = (running, waiting, self._gauges[2])
        self.num_requests_running.set(running)
        self.num_requests_waiting.set(waiting)

    def on_finished(self, *, reason: str, e2e_s: float, queue_s: float | None, prefill_s: float | None,
                    decode_s: float | None, inference_s: float | None, prompt_tokens: int,
                    generation_tokens: int, computed_prompt_tokens: int) -> None:
        self.request_success[reason if reason in self.request_success else "error"].inc()
        self.e2e_request_latency.observe(e2e_s)
        if queue_s is not None:
            self.request_queue_time.observe(queue_s)
        if prefill_s is not None:
            self.request_prefill_time.observe(prefill_s)
        if decode_s is not None:
            self.request_decode_time.observe(decode_s)
            if generation_tokens > 1:
                self.request_time_per_output_token.observe(decode_s / (generation_tokens - 1))
        if inference_s is not None:
            self.request_inference_time.observe(inference_s)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(generation_tokens)
        if computed_prompt_tokens > 0:
            self.request_prefill_kv_computed_tokens.observe(computed_prompt_tokens)
