"""Serve the exporter's own registry (`ExporterMetrics`) through its own aiohttp adapter.

Used by the dashboard test only while `pdexporter run` is not on this branch: the names and types
come from the real registry and the exposition from the real server code, with two windows
published through the real `publish_window`. Run as `python -m tests.integration.grafana.registry_exporter PORT`.
"""

from __future__ import annotations

import asyncio
import sys

from pdexporter.exporter.metrics import ExporterMetrics, grid_labels, publish_window, set_engine_info
from pdexporter.exporter.server import metrics_app, start_metrics_server
from pdexporter.measure.records import RepRecord


def _rep(d: int, p: int, baseline_ms: float, during_ms: float, chunks: int) -> RepRecord:
    return RepRecord.model_validate({
        "rep": 0,
        "baseline": {"tpot_p50_ms": baseline_ms, "tpot_p90_ms": baseline_ms * 1.1, "tpot_p99_ms": baseline_ms * 1.2,
                     "step_time_ms": baseline_ms},
        "interference": {"tpot_during_prefill_p50_ms": during_ms, "tpot_during_prefill_p90_ms": during_ms * 1.1,
                         "tpot_during_prefill_mean_ms": during_ms,
                         "tpot_after_prefill_p50_ms": baseline_ms, "num_chunks_actual": chunks,
                         "num_chunks_expected": chunks, "prefill_duration_ms": during_ms * chunks,
                         "prefill_ttft_ms": during_ms * chunks},
        "derived": {"tpot_penalty_ms": during_ms - baseline_ms, "tpot_penalty_p50_ms": during_ms - baseline_ms,
                    "tpot_penalty_ratio": (during_ms - baseline_ms) / baseline_ms,
                    "total_interference_ms": (during_ms - baseline_ms) * chunks, "decode_tokens_delayed": d * chunks},
    })


async def serve(port: int) -> None:
    metrics = ExporterMetrics()
    metrics.up.set(1)
    metrics.probe_streams.set(2)
    set_engine_info(metrics, "vllm", "stand-in", 8192, True)
    for (d, p, chunks) in ((2, 4096, 1), (4, 8192, 2)):
        publish_window(metrics, grid_labels(8192, d, p, engine="vllm"), _rep(d, p, 6.0, 40.0, chunks))
    for phase, value in (("baseline", 0.006), ("prefill_window", 0.04), ("after_prefill", 0.0065)):
        metrics.probe_tpot.labels(phase=phase).observe(value)
    runner, _ = await start_metrics_server(metrics_app(metrics.registry), "127.0.0.1", port)
    try:
        while True:  # keep counters moving so rate() has something to say
            metrics.probe_tokens.inc(2)
            metrics.probe_tpot.labels(phase="baseline").observe(0.006)
            metrics.engine_running.set(2)
            metrics.engine_kv.set(0.1)
            metrics.engine_scrape_ok.set(1)
            metrics.engine_scrape_seconds.set(0.002)
            await asyncio.sleep(0.2)
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
