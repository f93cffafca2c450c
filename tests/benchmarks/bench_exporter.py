"""Live exporter figures on this machine: events/s, CPU, timestamp jitter at D = 16 and D = 64.

    python tests/benchmarks/bench_exporter.py [--seconds 10] [--d 16 64] [--otlp] [--switch-interval 0.0005]
    python tests/benchmarks/bench_exporter.py --quick   # D = 2 for 1 s, one stamp, small span comparison (CI)

Each run starts the embedded engine (real time, real HTTP, B = 8192) and `Runner` with D probes
and no injection, for `--seconds` after the probes are running, then prints:

- events/s and tokens/s received on the probes;
- CPU: the exporter process (all threads), its probe thread alone, and the engine process, as %
  of one core over the run;
- timestamp jitter, three ways:
  * wake-up delay: the probe loop's sensor (a byte written to a socket pair every 10 ms by another
    thread, stamped when the probe loop sees it): what a token's stamp suffers after its socket
    became readable (p50 / p99 / max);
  * same-step spread: every decode of one engine step gets its token at the same instant, so the
    spread of the D arrival stamps of one step (last - first) is client-side jitter plus the
    engine's own write order (p50 / p99);
  * interval error: |interval - modelled decode step| over all post-warm-up intervals (p50 / p99)
    and the count of ~0 ms intervals (< 5 % of the step: the facts file's burst symptom), with the
    number of tokens the engine itself sent merged in one SSE event beside it (the rest would be
    the client's).
- the machine's load average before and after (other work on a shared box disturbs all of it).

Then a span-cost comparison for the OTel design choice: the CPU and OTLP bytes of one stream of
256 tokens as (a) 256 per-token spans, (b) one span with 256 events, measured here with the SDK
and the OTLP protobuf encoder, scaled to D = 64 at a 6 ms step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from quickmode import parse_args  # noqa: E402

from pdexporter.exporter import timeline  # noqa: E402
from pdexporter.exporter.config import build_config  # noqa: E402
from pdexporter.exporter.runner import ProbeState, Runner  # noqa: E402
from pdexporter.launch import SimLauncher  # noqa: E402

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

PROFILE = "h200-qwen3-coder-30b-a3b"
CHUNK = 8192


def _proc_cpu_s(pid: int, tid: int | None = None) -> float:
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _modelled_step_s(d: int, context: int) -> float:
    from pdexporter.sim.profile import load_profile
    from pdexporter.sim.steptime import StepTimeModel

    return StepTimeModel(load_profile(PROFILE)).decode_step_s(d, context)


async def _busy_main(period_s: float = 0.1, busy_s: float = 0.02) -> None:
    """Pure-Python work on the runner's loop (20 ms every 100 ms): a stand-in for a heavy window
    analysis or record write, to show what the GIL switch interval bounds."""
    while True:
        end = time.perf_counter() + busy_s
        x = 0
        while time.perf_counter() < end:
            x += 1
        await asyncio.sleep(period_s)


async def run_once(d: int, seconds: float, switch_interval: float, stamp: str, busy: bool = False) -> dict[str, float]:
    config = build_config(
        probe_streams=d, chunk_size=CHUNK, listen_host="127.0.0.1", listen_port=0, profile=PROFILE,
        scrape_interval_s=5.0, switch_interval_s=switch_interval, arrival_stamp=stamp,
    )
    streams: list[ProbeState] = []
    launcher = SimLauncher(profile=PROFILE)
    runner = Runner(config, launcher, on_stream=streams.append)
    delays: list[int] = []
    refresh = runner.book.refresh  # it drains the sensor's samples into the delay histogram

    def keep_sensor_samples() -> None:  # keep a copy of them first
        if runner.probes is not None:
            delays.extend(runner.probes.sensor.samples_ns)
        refresh()

    runner.book.refresh = keep_sensor_samples  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    await asyncio.wait_for(runner.ready.wait(), 120)
    await asyncio.sleep(1.0)  # let every probe pass its warm-up
    busy_task = asyncio.create_task(_busy_main()) if busy else None
    assert runner.probes is not None and launcher._proc is not None
    probe_thread = next(t for t in threading.enumerate() if t.name == "pdexporter-probes")
    engine_pid, tid = launcher._proc.pid, probe_thread.native_id
    tokens0 = runner.metrics.probe_tokens._value.get()  # type: ignore[attr-defined]
    delays.clear()
    t_start = time.perf_counter_ns()
    cpu0, probe0, engine0, wall0 = (
        _self_cpu_s(),
        _proc_cpu_s(os.getpid(), tid),
        _proc_cpu_s(engine_pid),
        time.monotonic(),
    )
    await asyncio.sleep(seconds)
    cpu1, probe1, engine1, wall1 = (
        _self_cpu_s(),
        _proc_cpu_s(os.getpid(), tid),
        _proc_cpu_s(engine_pid),
        time.monotonic(),
    )
    t_end = time.perf_counter_ns()
    tokens1 = runner.metrics.probe_tokens._value.get()  # type: ignore[attr-defined]
    window_delays = np.asarray(delays, dtype=np.float64)
    if busy_task is not None:
        busy_task.cancel()
    stop.set()
    await task
    wall = wall1 - wall0

    # Token arrival times inside the measured span, post warm-up.
    per_stream = []
    lengths = []
    events = 0
    merged = 0
    for s in streams:
        t = s.array()
        ev = np.asarray(s.stream.event_times_ns, dtype=np.float64)
        inside = (ev >= t_start) & (ev <= t_end)
        events += int(inside.sum())
        # Tokens that came inside one SSE event with others: the engine merged them (the embedded
        # engine does when a finishing request's output is delivered late, as vLLM does), so
        # their ~0 ms intervals are not the client's doing.
        merged += int((np.asarray(s.stream.event_tokens)[inside] - 1).clip(min=0).sum())
        t = t[config.protocol.warmup_tokens :]
        t = t[(t >= t_start) & (t <= t_end)]
        if t.size > 1:
            per_stream.append(t)
            lengths.append(np.diff(t))
    step = _modelled_step_s(d, 4096 + 128) * 1e9
    intervals = np.concatenate(lengths) if lengths else np.empty(0)
    spreads = timeline.step_spreads_ns(per_stream, step, min_streams=max(2, d // 2))
    return {
        "d": d,
        "wall_s": wall,
        "events_per_s": events / ((t_end - t_start) / 1e9),
        "tokens_per_s": (tokens1 - tokens0) / wall,
        "cpu_process_pct": 100 * (cpu1 - cpu0) / wall,
        "cpu_probe_thread_pct": 100 * (probe1 - probe0) / wall,
        "cpu_engine_pct": 100 * (engine1 - engine0) / wall,
        "modelled_step_ms": step / 1e6,
        "interval_p50_ms": float(np.median(intervals)) / 1e6 if intervals.size else float("nan"),
        "interval_err_p50_us": float(np.median(np.abs(intervals - step))) / 1e3 if intervals.size else float("nan"),
        "interval_err_p99_us": float(np.percentile(np.abs(intervals - step), 99)) / 1e3
        if intervals.size
        else float("nan"),
        "zero_intervals": int((intervals < 0.05 * step).sum()),
        "merged_tokens": merged,
        "intervals": int(intervals.size),
        "wakeup_p50_us": float(np.median(window_delays)) / 1e3 if window_delays.size else float("nan"),
        "wakeup_p99_us": float(np.percentile(window_delays, 99)) / 1e3 if window_delays.size else float("nan"),
        "wakeup_max_us": float(window_delays.max()) / 1e3 if window_delays.size else float("nan"),
        "spread_p50_us": float(np.median(spreads)) / 1e3 if spreads.size else float("nan"),
        "spread_p99_us": float(np.percentile(spreads, 99)) / 1e3 if spreads.size else float("nan"),
        "steps_seen": int(spreads.size),
    }


def _per_token_cost(build_cpu_s: float, spans: Sequence[ReadableSpan], tokens: int) -> tuple[float, float]:
    """(CPU µs, OTLP bytes) per token: building the spans (measured by the caller) plus encoding them."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    t0 = time.process_time()
    data = encode_spans(spans).SerializeToString()
    encode = time.process_time() - t0
    return (build_cpu_s + encode) / tokens * 1e6, len(data) / tokens


def span_costs(tokens: int = 256, streams: int = 64) -> dict[str, float]:
    """CPU and OTLP bytes per token: per-token spans vs one span with token events."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pdexporter.client.stream import TokenStream
    from pdexporter.exporter.tracing import ClockOffset, OtlpTracing
    from pdexporter.measure.driver import EngineInfo

    info = EngineInfo(kind="vllm", model="qwen3-coder-30b-a3b", url="http://127.0.0.1:8000")
    step_ns = 6_000_000
    out: dict[str, float] = {}

    # (b) one span per stream with one event per token: the exporter's own code path.
    exporter = InMemorySpanExporter()
    tracing = OtlpTracing(info, max_tokens=tokens, clock=ClockOffset(0, 0), exporter=exporter)
    t0 = time.process_time()
    for i in range(streams):
        s = TokenStream(f"probe{i}", "probe")
        s.mark_sent(0)
        for k in range(tokens):
            s.record(1_000_000 + k * step_ns, 1)
        s.finish(tokens * step_ns + 2_000_000, "length", 4096)
        tracing.end_probe(tracing.start_probe(s, i), s)
    build = time.process_time() - t0
    tracing.provider.force_flush()
    out["events_cpu_us_per_token"], out["events_bytes_per_token"] = _per_token_cost(
        build, exporter.get_finished_spans(), streams * tokens)

    # (a) one span per token, same attributes as the stream span.
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    attrs = dict(tracing._base, **{"gen_ai.request.max_tokens": tokens, "pdexporter.stream.role": "probe"})
    per_token_streams = max(4, streams // 8)  # enough for a stable per-token figure
    t0 = time.process_time()
    for _ in range(per_token_streams):
        root = tracer.start_span("text_completion", start_time=0, attributes=attrs)
        from opentelemetry import trace

        ctx = trace.set_span_in_context(root)
        for k in range(tokens):
            child = tracer.start_span("gen_ai.token", context=ctx, start_time=k * step_ns,
                                      attributes={"pdexporter.token.index": k})
            child.end(end_time=(k + 1) * step_ns)
        root.end(end_time=tokens * step_ns)
    build = time.process_time() - t0
    out["spans_cpu_us_per_token"], out["spans_bytes_per_token"] = _per_token_cost(
        build, exporter.get_finished_spans(), per_token_streams * tokens)
    tracing.provider.shutdown()
    provider.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--d", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--switch-interval", type=float, default=0.0005)
    parser.add_argument("--stamp", nargs="+", default=["wakeup", "read"], choices=["wakeup", "read"],
                        help="arrival stamp: selector wake-up (the exporter's default) or task resume")
    parser.add_argument("--busy-main", action="store_true",
                        help="also keep the runner's loop busy (20 ms of Python every 100 ms)")
    parser.add_argument("--no-spans", action="store_true", help="skip the span-cost comparison")
    parser.add_argument("--otlp", action="store_true",
                        help="export spans to a real OTLP/HTTP receiver (its own process) during the runs")
    parser.add_argument("--span-tokens", type=int, default=256, help="tokens per stream in the span comparison")
    parser.add_argument("--span-streams", type=int, default=64, help="streams in the span comparison")
    args = parse_args(parser, seconds=1.0, d=[2], stamp=["wakeup"], span_tokens=32, span_streams=4)

    receiver = None
    if args.otlp:
        import tempfile

        from tests.integration.exporter.exporter_realparts import OtlpReceiver

        receiver = OtlpReceiver(Path(tempfile.mkdtemp(prefix="bench-otlp-")))
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint

    print(f"machine: {os.cpu_count()} CPUs, load average before {os.getloadavg()}, python {sys.version.split()[0]}")
    print(f"embedded engine {PROFILE}, B={CHUNK}, no injection, {args.seconds:g} s per run, "
          f"switch interval {args.switch_interval * 1e3:g} ms, OTLP export {'on' if receiver else 'off'}"
          f"{', runner loop busy 20 ms every 100 ms' if args.busy_main else ''}\n")
    header = (f"{'D':>3} {'stamp':>6} {'step ms':>8} {'p50 ms':>7} {'events/s':>9} {'CPU exp%':>9} {'probe thr%':>10} "
              f"{'engine%':>8} {'wake p50/p99/max us':>21} {'spread p50/p99 us':>18} {'|err| p50/p99 us':>17} "
              f"{'~0 ms (engine-merged)':>22}")
    print(header)
    for d in args.d:
        for stamp in args.stamp:
            r = asyncio.run(run_once(d, args.seconds, args.switch_interval, stamp, args.busy_main))
            print(
                f"{r['d']:>3} {stamp:>6} {r['modelled_step_ms']:>8.2f} {r['interval_p50_ms']:>7.2f} "
                f"{r['events_per_s']:>9.0f} "
                f"{r['cpu_process_pct']:>9.1f} {r['cpu_probe_thread_pct']:>10.1f} {r['cpu_engine_pct']:>8.1f} "
                f"{r['wakeup_p50_us']:>6.0f}/{r['wakeup_p99_us']:>6.0f}/{r['wakeup_max_us']:>7.0f} "
                f"{r['spread_p50_us']:>8.0f}/{r['spread_p99_us']:>8.0f} "
                f"{r['interval_err_p50_us']:>8.0f}/{r['interval_err_p99_us']:>8.0f} "
                f"{r['zero_intervals']:>12d} ({r['merged_tokens']:>7d})"
            )
    print(f"\nload average after {os.getloadavg()}")
    if receiver is not None:
        print(f"OTLP receiver got {len(receiver.spans())} spans in {len(receiver.requests())} requests")
        receiver.stop()
    if not args.no_spans:
        c = span_costs(args.span_tokens, args.span_streams)
        rate = 64 / 0.006  # tokens/s at D = 64, 6 ms step
        print("\nOTel shape at D = 64, 6 ms step (10,667 tokens/s), SDK + OTLP protobuf encoding on this CPU:")
        print(f"  per-token spans : {rate:8.0f} spans/s, {c['spans_cpu_us_per_token']:6.1f} us/token -> "
              f"{c['spans_cpu_us_per_token'] * rate / 1e4:5.1f} % of a core, "
              f"{c['spans_bytes_per_token'] * rate / 1e6:5.2f} MB/s OTLP")
        print(
            f"  stream span+events: {64 / (256 * 0.006):6.1f} spans/s, {c['events_cpu_us_per_token']:6.1f} us/token -> "
            f"{c['events_cpu_us_per_token'] * rate / 1e4:5.1f} % of a core, "
            f"{c['events_bytes_per_token'] * rate / 1e6:5.2f} MB/s OTLP"
        )


if __name__ == "__main__":
    main()
