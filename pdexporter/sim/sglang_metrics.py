"""SGLang 0.5.15's Prometheus series (`--enable-metrics`), kept by the embedded engine when it
imitates SGLang, under SGLang's names, label sets and bucket bounds
(`python/sglang/srt/observability/metrics_collector.py`).

When each moves follows SGLang, not vLLM: the scheduler's gauges (`sglang:num_running_reqs`,
`num_queue_reqs`, `token_usage`, `num_used_tokens`) are set when a step is logged (every prefill
step, every `decode_log_interval`-th decode step), and the tokenizer's counters
(`sglang:prompt_tokens_total`, `generation_tokens_total`, `num_requests_total`,
`cached_tokens_total`) grow when a request *finishes*; `sglang:realtime_tokens_total{mode}` counts
the tokens of every step. Same interface as `vllm_metrics.VllmMetrics`, so the engine core
drives either (`engine.EngineMetrics`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pdexporter.engines import metric_name
from pdexporter.sim.families import MetricFamilies

__all__ = ["E2E_BUCKETS", "ITL_BUCKETS", "QUEUE_BUCKETS", "TTFT_BUCKETS", "SglangMetrics"]

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
)
QUEUE_BUCKETS = (
    0.0,
    0.001,
    0.005,
    0.010,
    0.050,
    0.100,
    0.200,
    0.500,
    1,
    2,
    3,
    4,
    5,
    10,
    15,
    20,
    30,
    40,
    50,
    60,
    70,
    80,
    90,
    100,
    200,
    300,
    400,
    500,
    600,
    700,
    800,
    900,
    1000,
    1200,
    1400,
    1600,
    1800,
    2000,
    2500,
    3000,
)


SGLANG = "sglang"  # the adapter whose names these series carry (the ones pdexporter reads are declared there)


def _name(canonical: str) -> str:
    return metric_name(SGLANG, canonical)


class SglangMetrics(MetricFamilies):
    """The `sglang:*` series pdexporter reads (and a few neighbours), bound to one engine's labels;
    the names of those it reads are the SGLang adapter's (`engines.metric_name`)."""

    def __init__(
        self,
        model_name: str,
        *,
        registry: CollectorRegistry | None = None,
        decode_log_interval: int = 1,
        max_total_tokens: int = 0,
    ) -> None:
        super().__init__(registry)
        r = self.registry
        self.decode_log_interval = max(1, decode_log_interval)
        self.max_total_tokens = max_total_tokens
        self._decodes = 0
        scheduler = {
            "model_name": model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        tokenizer = {"model_name": model_name, "engine_type": "unified"}

        keep = self.keep
        def gauge(name: str, doc: str) -> Gauge:
            return keep(Gauge(name, doc, list(scheduler), registry=r, multiprocess_mode="mostrecent")).labels(
                **scheduler
            )

        def counter(name: str, doc: str, labels: dict[str, str]) -> Counter:
            return keep(Counter(name, doc, list(labels), registry=r)).labels(**labels)

        def hist(name: str, doc: str, buckets: tuple[float, ...], labels: dict[str, str]) -> Histogram:
            return keep(Histogram(name, doc, list(labels), buckets=buckets, registry=r)).labels(**labels)

        self.num_running_reqs = gauge(_name("num_requests_running"), "The number of running requests.")
        self.num_queue_reqs = gauge(_name("num_requests_waiting"), "The number of requests in the waiting queue.")
        self.token_usage = gauge(_name("kv_cache_usage_perc"), "The token usage.")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        realtime = keep(
            Counter(
                "sglang:realtime_tokens",
                "Total number of tokens processed (updated on each log "
                "interval). mode: prefill_compute, prefill_cache, decode.",
                [*scheduler, "mode"],
                registry=r,
            )
        )
        self.realtime = {
            mode: realtime.labels(**scheduler, mode=mode)
            for mode in ("prefill_compute", "prefill_cache", "decode")
        }
        self.num_retracted_requests = counter(
            _name("num_preemptions_total"), "Total number of retracted requests.", scheduler
        )
        self.queue_time = hist(
            _name("request_queue_time_seconds"), "Histogram of queueing time in seconds.", QUEUE_BUCKETS, scheduler
        )
        self.prompt_tokens = counter(_name("prompt_tokens_total"), "Number of prefill tokens processed.", tokenizer)
        self.generation_tokens = counter(
            _name("generation_tokens_total"), "Number of generation tokens processed.", tokenizer
        )
        self.num_requests = counter(_name("request_success_total"), "Number of requests processed.", tokenizer)
        cached = keep(
            Counter(
                _name("prefix_cache_hits_total"),
                "Number of cached prompt tokens by source (device/host/storage).",
                [*tokenizer, "cache_source"],
                registry=r,
            )
        )
        self.cached_tokens = cached.labels(**tokenizer, cache_source="device")
        self.time_to_first_token = hist(
            _name("time_to_first_token_seconds"),
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
            tokenizer,
        )
        self.inter_token_latency = hist(
            _name("inter_token_latency_seconds"),
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
            tokenizer,
        )
        self.e2e_request_latency = hist(
            _name("e2e_request_latency_seconds"),
            "Histogram of End-to-end request latency in seconds",
            E2E_BUCKETS,
            tokenizer,
        )

    # The engine calls these (`engine.EngineMetrics`).

    def on_new_request(self, max_tokens: int) -> None:
        return None

    def on_step(
        self,
        *,
        prompt_tokens: int,
        generation_tokens: int,
        running: int,
        waiting: int,
        kv_usage: float,
        prefix_queries: int,
        prefix_hits: int,
        preemptions: int,
        context_tokens: int = 0,
        decode_tokens: int = 0,
    ) -> None:
        if context_tokens:
            self.realtime["prefill_compute"].inc(context_tokens)
        if decode_tokens:
            self.realtime["decode"].inc(decode_tokens)
        if prefix_hits:
            self.realtime["prefill_cache"].inc(prefix_hits)
        if preemptions:
            self.num_retracted_requests.inc(preemptions)
        if not context_tokens:  # a decode step: logged every decode_log_interval-th
            self._decodes += 1
            if self._decodes % self.decode_log_interval:
                return
        self.num_running_reqs.set(running)
        self.num_queue_reqs.set(waiting)
        self.token_usage.set(round(kv_usage, 2))
        self.num_used_tokens.set(round(kv_usage * self.max_total_tokens))
        if prefix_queries:
            self.cache_hit_rate.set(prefix_hits / prefix_queries)

    def on_queue(self, running: int, waiting: int) -> None:
        return None  # SGLang sets its gauges when it logs a step, not when a request arrives

    def on_finished(
        self,
        *,
        reason: str,
        e2e_s: float,
        queue_s: float | None,
        prefill_s: float | None,
        decode_s: float | None,
        inference_s: float | None,
        prompt_tokens: int,
        generation_tokens: int,
        computed_prompt_tokens: int,
    ) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        self.num_requests.inc()
        if prompt_tokens > computed_prompt_tokens:
            self.cached_tokens.inc(prompt_tokens - computed_prompt_tokens)
        self.e2e_request_latency.observe(e2e_s)
        if queue_s is not None:
            self.queue_time.observe(queue_s)

    def enable_kv_transfer(self) -> None:
        raise ValueError("the embedded engine imitates SGLang without a P/D role")

    def on_kv_transfer(self, seconds: float, nbytes: int) -> None:
        return None
