"""Token stamp error of the probe loop, kernel receive stamps vs today's wake-up stamps, in one run.

    python tests/benchmarks/bench_stamps.py [--d 16 64] [--seconds 8] [--rounds 2] [--burn 1]
    python tests/benchmarks/bench_stamps.py --quick   # D = 2, 1 s per phase, every path once, no burner (CI)

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
from quickmode import parse_args  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn  # noqa: E402

from pdexporter.client.client import EngineClient  # noqa: E402
from pdexporter.client.sse import SSEEvent  # noqa: E402
from pdexporter.client.stream import TokenStream  # noqa: E402
from pdexporter.exporter.probes import ProbeLoop  # noqa: E402
from pdexporter.launch import EngineHandle, SimLauncher  # noqa: E402
from pdexporter.measure.prompts import cold_prompt  # noqa: E402
from pdexporter.measure.protocol import ProtocolSettings  # noqa: E402
from pdexporter.sim.server import PREV_WRITTEN_KEY, SEND_STAMPS_HEADER, SENT_KEY, send_stamps  # noqa: E402

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
    # request id, tag, stamp, wake-up, comment, tokens, closing event (carries the finish reason)
    rows: list[tuple[str, str, int, int, str | None, int, bool]] = field(default_factory=list)

    def __call__(self, stream: TokenStream, event: SSEEvent, t_ns: int, n_tokens: int) -> None:
        if self.on and self.client is not None:
            # arrival_clock() here is the wake-up time of the loop iteration handling this read
            self.rows.append((stream.request_id, stream.tag, t_ns, self.client.arrival_clock(), event.comment,
                              n_tokens, '"finish_reason":"' in event.data))

    def configure(self, client: EngineClient) -> None:
        self.client = client  # the tap goes in for the stamp phase only: the CPU phase runs without it

    def start(self) -> None:
        """On the probe thread: ask the engine for send stamps from now on, and record."""
        assert self.client is not None
        self.client.extra_headers[SEND_STAMPS_HEADER] = "1"
        self.client.event_tap = self
        self.on = True


@dataclass(frozen=True)
class Ev:
    """A token event with the engine's bracket of the write that sent it."""

    rid: str
    tag: str
    t: int  # client stamp
    wake: int  # wake-up time of the loop iteration that handled the read
    pre: int  # engine: just before the write
    post: int | None  # engine: just after the write returned (from the stream's next write)
    closing: bool  # the stream's last token: its write is followed at once by usage + [DONE]
    merged: bool  # read together with the stream's next token event (same stamp): the loop was a step late


def _events(rows: list[tuple[str, str, int, int, str | None, int, bool]]) -> list[Ev]:
    by_stream: dict[str, list[tuple[str, int, int, dict[str, int], int, bool]]] = {}
    for rid, tag, t, wake, comment, n, closing in rows:
        by_stream.setdefault(rid, []).append((tag, t, wake, send_stamps(comment), n, closing))
    out = []
    for rid, seq in by_stream.items():
        for i, (tag, t, wake, stamps, n, closing) in enumerate(seq):
            if n <= 0 or SENT_KEY not in stamps:
                continue
            post = next((later[3].get(PREV_WRITTEN_KEY) for later in seq[i + 1:]
                         if later[3].get(SENT_KEY) != stamps[SENT_KEY]), None)
            following = next((later for later in seq[i + 1:] if later[4] > 0), None)
            merged = following is not None and following[1] == t
            out.append(Ev(rid, tag, t, wake, stamps[SENT_KEY], post, closing, merged))
    return out


def _thread_cpu_ns(thread: threading.Thread | None) -> int:
    assert thread is not None and thread.ident is not None
    return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def _summary(errors_ns: list[int]) -> dict[str, float]:
    e = np.asarray(errors_ns, dtype=np.float64) / 1e3
    return {"n": float(e.size), "p50": _pct(e, 50), "p99": _pct(e, 99),
            "max": float(e.max()) if e.size else float("nan"), "min": float(e.min()) if e.size else float("nan")}


def _interval_errors(events: list[Ev], wake: bool = False) -> list[int]:
    """|client interval - engine interval| between consecutive token events of each stream."""
    last: dict[str, Ev] = {}
    out = []
    for ev in events:
        prev = last.get(ev.rid)
        if prev is not None:
            client = (ev.wake - prev.wake) if wake else (ev.t - prev.t)
            out.append(abs(client - (ev.pre - prev.pre)))
        last[ev.rid] = ev
    return out


async def run_path(handle: EngineHandle, d: int, path: str, seconds: float, settle_s: float,
                   inject_every_s: float, prefill_tokens: int, output_tokens: int = 256) -> dict[str, Any]:
    tap = Tap()
    settings = ProtocolSettings(decode_output_tokens=output_tokens)
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
                probes.send(probes.prepare(prompt, 1, "prefill"), TokenStream(f"prefill-{injected}", "prefill"))
                injected += 1
                next_inject += inject_every_s

    try:
        await drain_for(settle_s)
        # Phase 1: the live exporter's exact work (no send stamps asked, the tap off): CPU per event.
        t0, cpu0 = time.perf_counter_ns(), _thread_cpu_ns(probes._thread)
        await drain_for(seconds)
        t1, cpu1 = time.perf_counter_ns(), _thread_cpu_ns(probes._thread)
        n_events = sum(sum(1 for t in s.event_times_ns if t0 <= t < t1) for s in streams.values())
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
    events = _events(tap.rows)
    probe = [e for e in events if e.tag == "probe"]
    first = [e for e in events if e.tag == "prefill"]
    result: dict[str, Any] = {
        "events_per_s": n_events / ((t1 - t0) / 1e9),
        "cpu_us_per_event": (cpu1 - cpu0) / 1e3 / max(n_events, 1),
        "cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
        "sensor": sensor,
        "clocks": clocks,
        "stamping": stamping,
        "injected": injected,
        "probe": probe,
        "first": first,
    }
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
                r = await run_path(handle, d, path, args.seconds, args.settle, args.inject_every, args.prefill,
                                   args.output_tokens)
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
    print(f"embedded engine {PROFILE}, B={CHUNK}; {args.burn} busy-loop process(es) beside it; {args.rounds} "
          f"round(s) x {args.seconds:g} s per path and D (CPU phase, then stamp phase)")
    report(args, results)


def _rows(path: str) -> list[tuple[str, bool]]:
    """(row name, use the wake-up stamp): the kernel path also shows its reads' wake-up stamps."""
    return [(path, False)] + ([("kernel-rx (its wake-up)", True)] if path == "kernel-rx" else [])


Results = dict[tuple[int, str], list[dict[str, Any]]]


def report(args: argparse.Namespace, results: Results) -> None:
    _stamp_errors(args, results)
    _error_sources(args, results)
    if args.inject_every:
        _first_tokens(args, results)
    print()
    _clocks(args, results)


def _stamp_errors(args: argparse.Namespace, results: Results) -> None:
    print("\nstamp error = client stamp - engine stamp just before its write; interval error = client interval"
          " - engine interval (us)")
    print(f"{'D':>3} {'path':<24} {'events/s':>8} {'stamp err p50/p99/max':>25} {'min':>8} "
          f"{'|interval err| p50/p99':>23} {'wake-up sensor p50/p99/max':>27} {'CPU us/event':>12} {'probe thr %':>11}")
    for d in args.d:
        for path in args.paths:
            rs = results[(d, path)]
            probe = [e for r in rs for e in r["probe"]]
            sensor = _summary([x for r in rs for x in r["sensor"]])
            for name, wake in _rows(path):
                s = _summary([(e.wake if wake else e.t) - e.pre for e in probe])
                i = _summary([x for r in rs for x in _interval_errors(r["probe"], wake)])
                own = (f"{sensor['p50']:>8.0f}/{sensor['p99']:>8.0f}/{sensor['max']:>9.0f} "
                       f"{np.mean([r['cpu_us_per_event'] for r in rs]):>12.1f} "
                       f"{np.mean([r['cpu_pct'] for r in rs]):>11.1f}") if not wake else ""
                print(f"{d:>3} {name:<24} {np.mean([r['events_per_s'] for r in rs]):>8.0f} "
                      f"{s['p50']:>7.1f}/{s['p99']:>7.1f}/{s['max']:>9.1f} {s['min']:>8.1f} "
                      f"{i['p50']:>10.1f}/{i['p99']:>12.1f} {own}")


def _error_sources(args: argparse.Namespace, results: Results) -> None:
    print("\nwhere the error comes from (us): engine write = its stamp before the write to its stamp after; "
          "stamp - write end: > 0 is the client's own lateness; in write: stamps inside the engine's write call; "
          "merged: token events read together with the stream's next one (the loop was a whole step late: both get "
          "the later stamp); stamp error p99 of token events read alone / merged / a stream's last token (its "
          "write is followed at once by usage + [DONE], read together when the client is later than that gap)")
    print(f"{'D':>3} {'path':<24} {'engine write p50/p99/max':>25} {'stamp - write end p50/p99/max':>30} "
          f"{'in write':>8} {'merged':>7} {'err p99 alone/merged/last':>27}")
    for d in args.d:
        for path in args.paths:
            probe = [e for r in results[(d, path)] for e in r["probe"]]
            bracketed = [e for e in probe if e.post is not None]
            w = _summary([e.post - e.pre for e in bracketed if e.post is not None])
            for name, wake in _rows(path):
                after = _summary([(e.wake if wake else e.t) - e.post for e in bracketed if e.post is not None])
                inside = np.mean([e.pre <= (e.wake if wake else e.t) <= (e.post or 0) + 1000 for e in bracketed])
                alone = _summary([(e.wake if wake else e.t) - e.pre for e in probe if not e.closing and not e.merged])
                merged = _summary([(e.wake if wake else e.t) - e.pre for e in probe if e.merged])
                last = _summary([(e.wake if wake else e.t) - e.pre for e in probe if e.closing])
                share = np.mean([e.merged for e in probe]) if probe else float("nan")
                engine = f"{w['p50']:>7.1f}/{w['p99']:>7.1f}/{w['max']:>9.1f}" if not wake else f"{'':>25}"
                print(f"{d:>3} {name:<24} {engine} {after['p50']:>8.1f}/{after['p99']:>9.1f}/{after['max']:>10.1f} "
                      f"{100 * inside:>7.1f}% {100 * share:>6.2f}% {alone['p99']:>8.1f}/{merged['p99']:>8.1f}/"
                      f"{last['p99']:>8.1f}")


def _first_tokens(args: argparse.Namespace, results: Results) -> None:
    print(f"\nfirst token of the injected prefills (P = {args.prefill}, max_tokens 1, one every "
          f"{args.inject_every:g} s of the stamp phase): stamp error (us)")
    print(f"{'D':>3} {'path':<24} {'got':>9} {'p50/p99/max':>26} {'engine write p50/max':>21}")
    for d in args.d:
        for path in args.paths:
            rs = results[(d, path)]
            first = [e for r in rs for e in r["first"]]
            w = _summary([e.post - e.pre for e in first if e.post is not None])
            for name, wake in _rows(path):
                f = _summary([(e.wake if wake else e.t) - e.pre for e in first])
                engine = f"{w['p50']:>9.1f}/{w['max']:>9.1f}" if not wake else ""
                print(f"{d:>3} {name:<24} {len(first):>4} of {sum(r['injected'] for r in rs):>2} "
                      f"{f['p50']:>8.1f}/{f['p99']:>8.1f}/{f['max']:>8.1f} {engine}")


def _clocks(args: argparse.Namespace, results: Results) -> None:
    for d in args.d:
        for path in args.paths:
            rs = results[(d, path)]
            clocks: dict[str, int] = {}
            for r in rs:
                for k, v in r["clocks"].items():
                    clocks[k] = clocks.get(k, 0) + v
            extra = ""
            if "clock_map" in rs[-1]:
                u, samples, shift = rs[-1]["clock_map"]
                extra = f"; REALTIME->perf offset +/-{u} ns, {samples} samples, largest change {shift} ns"
            print(f"D={d} {path}: {rs[-1]['stamping']}; streams by stamp_clock {clocks}; "
                  f"{sum(len(r['probe']) for r in rs)} stamped probe events{extra}")


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
    parser.add_argument("--output-tokens", type=int, default=256, help="tokens each probe stream decodes")
    asyncio.run(main(parse_args(parser, d=[2], seconds=1.0, settle=0.5, rounds=1, burn=0, inject_every=0.5,
                                prefill=512, output_tokens=80)))
