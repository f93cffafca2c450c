"""Token stamp error of the probe loop, kernel receive stamps vs today's wake-up stamps, in one run.

    python tests/benchmarks/bench_stamps.py [--d 16 64] [--seconds 8] [--rounds 2] [--burn 1]

The embedded engine (`pdexporter sim serve`, its own process, B = 8192, real time) serves D probe
streams read by the exporter's own probe thread (`exporter.probes.ProbeLoop`: StampingSelector,
wake-up sensor, streams restarted as they end, GIL switch interval 0.5 ms as `pdexporter run` sets
it). The engine stamps each SSE write with its own `perf_counter_ns` just before writing it (opt-in
header, `sim.server.SEND_STAMPS_HEADER`); the same host's CLOCK_MONOTONIC is the client's clock,
so for every token event

    stamp error = client stamp - engine send stamp

is what the client adds: loopback delivery (µs), plus, for a wake-up or read stamp, the wake-up,
the GIL hand-over and the callbacks handled before it. Paths, measured in turn (interleaved, `--rounds`
times each) on the same engine:

- kernel-rx: the plain-socket path, SO_TIMESTAMPNS (the new default for http://); the same reads'
  wake-up stamps are printed beside it ("kernel-rx (its wake-up)": the fallback's figure);
- wakeup:    aiohttp, stamp = the probe loop's selector wake-up (the default until now);
- read:      aiohttp, stamp = when the reading task resumed.

Per row: events/s; stamp error p50 / p99 / max and min (a negative one would be a broken clock
conversion); |interval error| p50 / p99, where interval error = (client interval) - (engine
interval) between consecutive events of a stream: what enters TPOT; the wake-up sensor's delay
p50 / p99 / max over the same seconds; and the probe thread's CPU per event (thread CPU clock)
in a first phase of each run with no send stamps and no tap, i.e. the live exporter's exact work.
In the stamp phase a cold prefill is injected every `--inject-every` s from the probe loop, as the
exporter does; its first token's stamp error is printed apart.

`--burn N` runs N busy-loop processes beside it (default 1: the "loaded" case of the goal, one
core's worth of other work on this 2-core machine); `--burn 0` for an idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn  # noqa: E402

from pdexporter.engine.client import EngineClient  # noqa: E402
from pdexporter.engine.launcher import EngineHandle, SimLauncher  # noqa: E402
from pdexporter.engine.sse import SSEEvent  # noqa: E402
from pdexporter.engine.stream import TokenStream  # noqa: E402
from pdexporter.exporter.probes import ProbeLoop  # noqa: E402
from pdexporter.measure.prompts import cold_prompt  # noqa: E402
from pdexporter.measure.protocol import ProtocolSettings  # noqa: E402
from pdexporter.sim.server import SEND_STAMPS_HEADER, sent_ns  # noqa: E402

PROFILE = "h200-qwen3-coder-30b-a3b"
CHUNK = 8192
SWITCH_INTERVAL_S = 0.0005  # what `pdexporter run` sets (docs/exporter.md)
PATHS: dict[str, dict[str, bool]] = {
    "kernel-rx": {"rx_stamps": True, "stamp_at_wakeup": True},
    "wakeup": {"rx_stamps": False, "stamp_at_wakeup": True},
    "read": {"rx_stamps": False, "stamp_at_wakeup": False},
}


@dataclass
class Tap:
    """Sees every event on the probe thread; records only while `on` (set from the main thread)."""

    client: EngineClient | None = None
    on: bool = False
    # request id, tag, stamp, wake-up, comment
    rows: list[tuple[str, str, int, int, str | None]] = field(default_factory=list)

    def __call__(self, stream: TokenStream, event: SSEEvent, t_ns: int, n_tokens: int) -> None:
        if self.on and n_tokens > 0 and self.client is not None:
            # arrival_clock() here is the wake-up time of the loop iteration handling this read
            self.rows.append((stream.request_id, stream.tag, t_ns, self.client.arrival_clock(), event.comment))

    def configure(self, client: EngineClient) -> None:
        self.client = client  # the tap goes in for the stamp phase only: the CPU phase runs without it

    def start(self) -> None:
        """On the probe thread: ask the engine for send stamps from now on, and record."""
        assert self.client is not None
        self.client.extra_headers[SEND_STAMPS_HEADER] = "1"
        self.client.event_tap = self
        self.on = True


def _thread_cpu_ns(thread: threading.Thread | None) -> int:
    assert thread is not None and thread.ident is not None
    return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def _summary(errors_ns: list[int]) -> dict[str, float]:
    e = np.asarray(errors_ns, dtype=np.float64) / 1e3
    return {"n": float(e.size), "p50": _pct(e, 50), "p99": _pct(e, 99),
            "max": float(e.max()) if e.size else float("nan"), "min": float(e.min()) if e.size else float("nan")}


def _interval_errors(rows: list[tuple[str, int, int]]) -> list[int]:
    """(stream id, client stamp, engine stamp) in arrival order -> per-stream interval differences."""
    last: dict[str, tuple[int, int]] = {}
    out = []
    for rid, client, engine in rows:
        if rid in last:
            c0, e0 = last[rid]
            out.append(abs((client - c0) - (engine - e0)))
        last[rid] = (client, engine)
    return out


async def run_path(handle: EngineHandle, d: int, path: str, seconds: float, settle_s: float,
                   inject_every_s: float, prefill_tokens: int) -> dict[str, Any]:
    tap = Tap()
    settings = ProtocolSettings()
    probes = ProbeLoop(handle, d, settings, configure_client=tap.configure,
                       warm_prefill_tokens=prefill_tokens if inject_every_s else None, **PATHS[path])
    await probes.wait_started(timeout_s=300)
    streams: dict[str, TokenStream] = {}
    injected = 0

    async def drain_for(s: float, inject: bool = False) -> None:
        nonlocal injected
        end = time.monotonic() + s
        next_inject = time.monotonic() + inject_every_s / 2
        while time.monotonic() < end:
            await asyncio.sleep(0.1)
            while not probes.events.empty():
                stream = probes.events.get().stream
                streams[stream.request_id] = stream
            if inject and inject_every_s and time.monotonic() >= next_inject:
                # a cold prefill, encoded here, sent by the probe loop: its first token is the one to stamp
                prompt = cold_prompt(prefill_tokens, f"bench-{time.time_ns()}", settings.token_range)
                probes.inject(probes.prepare(prompt, 1, "prefill"))
                injected += 1
                next_inject += inject_every_s

    try:
        await drain_for(settle_s)
        # Phase 1: the live exporter's exact work (no send stamps asked, the tap off): CPU per event.
        t0, cpu0 = time.perf_counter_ns(), _thread_cpu_ns(probes._thread)
        await drain_for(seconds)
        t1, cpu1 = time.perf_counter_ns(), _thread_cpu_ns(probes._thread)
        events = sum(sum(1 for t in s.event_times_ns if t0 <= t < t1) for s in streams.values())
        # Phase 2: streams started from now on ask for send stamps; the tap records.
        assert probes.loop is not None and tap.client is not None
        client = tap.client
        probes.loop.call_soon_threadsafe(tap.start)
        probes.sensor.samples_ns.clear()
        await drain_for(seconds, inject=True)
        tap.on = False
        sensor = list(probes.sensor.samples_ns)
        clock_map = client._rx.clock_map if client._rx is not None else None
        stamping = probes.stamping
    finally:
        probes.stop()
    clocks: dict[str, int] = {}
    for s in streams.values():
        if s.n_tokens:
            clocks[str(s.stamp_clock)] = clocks.get(str(s.stamp_clock), 0) + 1
    stamped = [(rid, t, wake, sent) for rid, tag, t, wake, comment in tap.rows
               if tag == "probe" and (sent := sent_ns(comment)) is not None]
    first = [(t, wake, sent) for rid, tag, t, wake, comment in tap.rows
             if tag == "prefill" and (sent := sent_ns(comment)) is not None]
    result: dict[str, Any] = {
        "first_token": [t - sent for t, _, sent in first],
        "injected": injected,
        "events_per_s": events / ((t1 - t0) / 1e9),
        "cpu_us_per_event": (cpu1 - cpu0) / 1e3 / max(events, 1),
        "cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
        "stamp": [t - sent for _, t, _, sent in stamped],
        "interval": _interval_errors([(rid, t, sent) for rid, t, _, sent in stamped]),
        "sensor": sensor,
        "clocks": clocks,
        "stamping": stamping,
    }
    if path == "kernel-rx":
        result["wake_first_token"] = [wake - sent for _, wake, sent in first]
        result["wake_stamp"] = [wake - sent for _, _, wake, sent in stamped]
        result["wake_interval"] = _interval_errors([(rid, wake, sent) for rid, _, wake, sent in stamped])
    if clock_map is not None:
        result["clock_map"] = (clock_map.uncertainty_ns, clock_map.samples, clock_map.max_shift_ns)
    return result


def _burners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            for _ in range(n)]


async def main(args: argparse.Namespace) -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    launcher = SimLauncher(profile=PROFILE)
    handle = await launcher.start(CHUNK)
    burners = _burners(args.burn)
    runs = [(d, path) for d in args.d for _ in range(args.rounds) for path in args.paths]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    load_before = os.getloadavg()
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), TimeRemainingColumn(), transient=True) as progress:
            task = progress.add_task("runs", total=len(runs))
            for d, path in runs:
                progress.update(task, description=f"D={d} {path}")
                r = await run_path(handle, d, path, args.seconds, args.settle, args.inject_every, args.prefill)
                results.setdefault((d, path), []).append(r)
                progress.advance(task)
    finally:
        for proc in burners:
            proc.terminate()
        for proc in burners:
            proc.wait()
        await launcher.stop()
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, kernel {os.uname().release}; "
          f"load average before {tuple(round(x, 2) for x in load_before)}, after "
          f"{tuple(round(x, 2) for x in os.getloadavg())}")
    print(f"embedded engine {PROFILE}, B={CHUNK}, no injection; {args.burn} busy-loop process(es) beside it; "
          f"{args.rounds} round(s) x {args.seconds:g} s per path and D (CPU phase, then stamp phase)\n")
    header = (f"{'D':>3} {'path':<24} {'events/s':>8} {'stamp err p50/p99/max us':>26} {'min us':>7} "
              f"{'|interval err| p50/p99 us':>26} {'wake-up sensor p50/p99/max us':>30} {'CPU us/event':>12} "
              f"{'probe thr %':>11}")
    print(header)
    for d in args.d:
        for path in args.paths:
            rs = results[(d, path)]
            rows = [(path, "stamp", "interval")]
            if path == "kernel-rx":
                rows.append(("kernel-rx (its wake-up)", "wake_stamp", "wake_interval"))
            sensor = _summary([x for r in rs for x in r["sensor"]])
            cpu = np.mean([r["cpu_us_per_event"] for r in rs])
            cpu_pct = np.mean([r["cpu_pct"] for r in rs])
            rate = np.mean([r["events_per_s"] for r in rs])
            for name, stamp_key, interval_key in rows:
                s = _summary([x for r in rs for x in r[stamp_key]])
                i = _summary([x for r in rs for x in r[interval_key]])
                own = name == path
                print(f"{d:>3} {name:<24} {rate:>8.0f} {s['p50']:>8.1f}/{s['p99']:>7.1f}/{s['max']:>8.1f} "
                      f"{s['min']:>7.1f} {i['p50']:>12.1f}/{i['p99']:>12.1f} "
                      + (f"{sensor['p50']:>9.0f}/{sensor['p99']:>9.0f}/{sensor['max']:>10.0f} "
                         f"{cpu:>12.1f} {cpu_pct:>11.1f}" if own else f"{'':>30} {'':>12} {'':>11}"))
    if args.inject_every:
        print(f"\nfirst token of the injected prefills (P = {args.prefill}, one every {args.inject_every:g} s of the "
              "stamp phase): stamp error p50 / p99 / max us")
        for d in args.d:
            for path in args.paths:
                rs = results[(d, path)]
                keys = [(path, "first_token")] + ([("kernel-rx (its wake-up)", "wake_first_token")]
                                                  if path == "kernel-rx" else [])
                for name, key in keys:
                    f = _summary([x for r in rs for x in r[key]])
                    print(f"{d:>3} {name:<24} {int(f['n']):>4} of {sum(r['injected'] for r in rs):>4} "
                          f"{f['p50']:>8.1f}/{f['p99']:>8.1f}/{f['max']:>8.1f}")
    print()
    for d in args.d:
        for path in args.paths:
            r = results[(d, path)][-1]
            clocks = {}
            for rr in results[(d, path)]:
                for k, v in rr["clocks"].items():
                    clocks[k] = clocks.get(k, 0) + v
            n_events = sum(len(rr["stamp"]) for rr in results[(d, path)])
            extra = ""
            if "clock_map" in r:
                u, samples, shift = r["clock_map"]
                extra = f"; REALTIME->perf offset: +/-{u} ns, {samples} samples, max step {shift} ns"
            print(f"D={d} {path}: {r['stamping']}; streams by stamp_clock {clocks}; {n_events} stamped events{extra}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--seconds", type=float, default=8.0, help="per phase (CPU, then stamps) of each run")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after the probes start, before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each path per D, interleaved")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--burn", type=int, default=1, help="busy-loop processes beside the run (0: none)")
    parser.add_argument("--inject-every", type=float, default=1.0,
                        help="seconds between injected prefills in the stamp phase (0: none)")
    parser.add_argument("--prefill", type=int, default=2048, help="tokens of each injected prefill")
    asyncio.run(main(parser.parse_args()))
