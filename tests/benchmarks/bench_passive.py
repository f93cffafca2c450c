"""Passive mode vs injection on the same engine, and what passive mode costs. Prints figures.

    python tests/benchmarks/bench_passive.py [--minutes 30] [--rate 1.0] [--probes 4] [--chunk 8192]
        [--sources otlp metrics cadence] [--exact 60] [--overhead-seconds 60] [--seed 0]
    python tests/benchmarks/bench_passive.py --quick   # 30 s of traffic (otlp), 3 exact events, 5 s overhead runs (CI)

1. Passive sessions (`predict.passive.passive_sessions`, the exporter's own tracker) on the embedded
   engine in virtual time, beside a synthetic production load (`pdexporter.load`: Poisson arrivals
   at --rate, the ShareGPT-like mix), one engine run with a tracker per source setting:
   `otlp`: request traces + /metrics + cadence (what `run --passive` uses when vLLM sends traces);
   `metrics`: /metrics + cadence (no traces); `cadence`: the probes alone.
2. The injected table for the same engine and cells (`predict.grid.predict_records`, fast mode, 3
   repetitions: what `pdexporter sweep` measures there), and per cell with >= 5 events: the passive
   median, its bootstrap 95 % interval, the injected value, the error, and the minutes of traffic
   the cell needed until its running median stayed within 10 % of the injected value ("-": not
   within 10 % at the end), for the TPOT penalty and the aggregate interference.
3. `--exact N`: N published events compared with an injected window at their own exact (D, P):
   the measurement error without the binning error.
4. `--overhead-seconds S`: the real exporter (`Runner`, real time, real HTTP) on the embedded
   engine with `pdexporter load` in its own process at --rate, passive vs no injection at all:
   probe tokens/s, exporter process CPU (% of one core), and the tracker's own time per second.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from quickmode import parse_args  # noqa: E402

from pdexporter._internal.vloop import run_virtual  # noqa: E402
from pdexporter.analysis.passive import compare_cells  # noqa: E402
from pdexporter.load.mix import LoadSpec  # noqa: E402
from pdexporter.predict.grid import predict_records  # noqa: E402
from pdexporter.predict.passive import passive_sessions  # noqa: E402
from pdexporter.sim.profile import load_profile  # noqa: E402

PROFILE = "h200-qwen3-coder-30b-a3b"
SOURCE_SETS = {"otlp": ("otlp", "metrics", "cadence"), "metrics": ("metrics", "cadence"), "cadence": ("cadence",)}
# Per cell: the penalty, and the interference per decode stream (the aggregate is D times it, and a
# passive event's D is its own, not its bin's: per decode compares like with like). Per event at
# its exact (D, P): the penalty and the aggregate.
CELL_COLUMNS = (("tpot_penalty_ms", "TPOT penalty"), ("total_interference_ms", "interference per decode stream"))
EXACT_COLUMNS = (("tpot_penalty_ms", "TPOT penalty"), ("aggregate_interference_ms", "aggregate interference"))


def _events_by_cell(session) -> dict:  # type: ignore[no-untyped-def]
    cells: dict = collections.defaultdict(list)
    for e in session.published:
        cells[e.key].append(e)
    return cells


def _derived(derived, column: str) -> float | None:  # type: ignore[no-untyped-def]
    return derived.tpot_penalty_p50_ms if column == "tpot_penalty_ms" else getattr(derived, column)


def _metric(event, column: str) -> float | None:  # type: ignore[no-untyped-def]
    return _derived(event.rep.derived, column)


def _reference(record, column: str) -> float | None:  # type: ignore[no-untyped-def]
    return _derived(record.derived, column)


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def run_sessions(args: argparse.Namespace) -> dict:
    """One engine run, a tracker per source set beside it (`passive_sessions`)."""
    load = LoadSpec(rate=args.rate, duration_s=args.minutes * 60, seed=args.seed)
    started = time.perf_counter()
    runs = run_virtual(passive_sessions(PROFILE, args.chunk, load, [SOURCE_SETS[n] for n in args.sources],
                                        probes=args.probes))
    print(f"{args.minutes:g} min of traffic at {args.rate:g} req/s, {len(runs)} trackers beside one engine run, "
          f"in {time.perf_counter() - started:.0f} s wall")
    sessions = dict(zip(args.sources, runs))
    for name, session in sessions.items():
        sources = collections.Counter(e.source for e in session.published)
        print(f"[{name}] {session.load.sent} requests; runs: {dict(session.outcomes)}; published by source: "
              f"{dict(sources)}")
    return sessions


def injected_reference(keys: list, reps: int = 3) -> dict:  # type: ignore[type-arg]
    records = predict_records(load_profile(PROFILE), keys, reps=reps, mode="fast")
    return {k: r for k, r in records.items()}


def compare(args: argparse.Namespace, sessions: dict) -> None:
    cells_all = {name: _events_by_cell(s) for name, s in sessions.items()}
    keys = sorted({k for cells in cells_all.values() for k, ev in cells.items() if len(ev) >= args.min_events})
    started = time.perf_counter()
    injected = injected_reference(keys)
    print(
        f"\ninjected reference: {len(keys)} cells x 3 repetitions (fast mode) in {time.perf_counter() - started:.0f} s"
    )
    for name, cells in cells_all.items():
        session = sessions[name]
        t0 = min((e.run.t_inject_ns for e in session.published), default=0)
        for column, title in CELL_COLUMNS:
            ref = {k: _reference(injected[k], column) for k in keys if k in injected}
            passive = {k: [((e.run.t_inject_ns - t0) / 1e9, _metric(e, column)) for e in ev]
                       for k, ev in cells.items() if len(ev) >= args.min_events}
            rows = compare_cells(passive, {k: v for k, v in ref.items() if v is not None}, column, tolerance=0.10)
            print(f"\n[{name}] {title} (ms), cells with >= {args.min_events} events: passive median [95 % CI] vs "
                  "injected, error, minutes of traffic to stay within 10 %")
            print("| B | D | P | events | passive | 95 % CI | injected | error | minutes to 10 % |")
            print("|---|---|---|---|---|---|---|---|---|")
            errors = []
            for r in rows:
                b, d, p = r.key
                err = r.error
                errors.append(abs(err) if err is not None else None)
                minutes = "-" if r.time_to_tolerance_s is None else f"{r.time_to_tolerance_s / 60:.1f}"
                print(f"| {b} | {d} | {p} | {r.events} | {_fmt(r.passive)} | {_fmt(r.ci_low)}-{_fmt(r.ci_high)} | "
                      f"{_fmt(r.injected)} | {_fmt(None if err is None else err * 100)} % | {minutes} |")
            present = [e for e in errors if e is not None]
            if present:
                inside = sum(1 for e in present if e <= 0.10)
                reached = [r.time_to_tolerance_s / 60 for r in rows if r.time_to_tolerance_s is not None]
                print(
                    f"[{name}] {title}: {inside}/{len(present)} cells within 10 %; median |error| "
                    f"{statistics.median(present) * 100:.1f} %; minutes to 10 % (cells that got there): median "
                    f"{_fmt(statistics.median(reached) if reached else None)}, "
                    f"max {_fmt(max(reached) if reached else None)}"
                )


def exact(args: argparse.Namespace, session) -> None:  # type: ignore[no-untyped-def]
    """Published events against an injected window at their own exact (D, P)."""
    rng = random.Random(args.seed)
    events = [e for e in session.published if e.source in ("otlp", "metrics")]
    sample = rng.sample(events, min(args.exact, len(events)))
    keys = sorted({(args.chunk, e.decode_batch_size, e.attribution.prompt_tokens) for e in sample})
    started = time.perf_counter()
    injected = injected_reference(keys, reps=2)
    print(f"\nexact comparison: {len(sample)} events, {len(keys)} injected points x 2 repetitions in "
          f"{time.perf_counter() - started:.0f} s")
    for column, title in EXACT_COLUMNS:
        errs, sizes = [], []
        for e in sample:
            r = injected.get((args.chunk, e.decode_batch_size, e.attribution.prompt_tokens))
            ref = None if r is None else _reference(r, column)
            got = _metric(e, column)
            if ref and got is not None:
                errs.append((got - ref) / abs(ref))
                sizes.append(e.attribution.prompt_tokens)
        if errs:
            a = np.abs(errs) * 100
            print(
                f"{title} at the exact (D, P): |error| median {np.median(a):.1f} %, p90 {np.percentile(a, 90):.1f} %, "
                f"within 10 %: {int((a <= 10).sum())}/{a.size}; signed median {np.median(errs) * 100:+.1f} %"
            )
            big = np.abs([err for err, size in zip(errs, sizes) if size >= 512]) * 100
            if big.size:
                print(
                    f"  prompts >= 512 tokens: |error| median {np.median(big):.1f} %, "
                    f"p90 {np.percentile(big, 90):.1f} %, "
                    f"within 10 %: {int((big <= 10).sum())}/{big.size}"
                )


def overhead(args: argparse.Namespace) -> None:
    """Real time: the exporter with and without passive mode beside the same load."""
    from pdexporter.exporter.config import build_config
    from pdexporter.exporter.runner import Runner
    from pdexporter.launch import SimLauncher

    async def one(passive: bool) -> dict:
        config = build_config(probe_streams=args.probes, chunk_size=args.chunk, listen_host="127.0.0.1", listen_port=0,
                              profile=PROFILE, passive=passive, duration_s=args.overhead_seconds + 5.0)
        launcher = SimLauncher(profile=PROFILE)
        runner = Runner(config, launcher)
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        await asyncio.wait_for(runner.ready.wait(), 120)
        assert runner.handle is not None
        load = subprocess.Popen([sys.executable, "-m", "pdexporter", "load", "--target", runner.handle.url, "--rate",
                                 str(args.rate), "--duration", f"{args.overhead_seconds}s", "--seed", str(args.seed)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        await asyncio.sleep(2.0)
        tokens0 = runner.metrics.probe_tokens._value.get()  # type: ignore[attr-defined]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        poll = {"s": 0.0}
        if runner.passive is not None:
            tracker = runner.passive.tracker
            inner = tracker.poll

            def timed(*a, **k):  # type: ignore[no-untyped-def]
                t = time.perf_counter()
                try:
                    return inner(*a, **k)
                finally:
                    poll["s"] += time.perf_counter() - t

            tracker.poll = timed  # type: ignore[method-assign]
        await asyncio.sleep(args.overhead_seconds - 4.0)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        tokens = runner.metrics.probe_tokens._value.get() - tokens0  # type: ignore[attr-defined]
        windows = len(runner.windows)
        stop.set()
        await asyncio.wait_for(task, 60)
        load.wait(timeout=120)
        return {"cpu": cpu / wall * 100, "tokens_s": tokens / wall, "windows": windows,
                "poll_ms_per_s": poll["s"] / wall * 1e3,
                "outcomes": dict(runner.passive.outcomes) if runner.passive else {}}

    print(f"\noverhead, real time, {args.overhead_seconds:g} s beside {args.rate:g} req/s, {args.probes} probes, "
          f"load {os.getloadavg()[0]:.2f}")
    for passive in (False, True):
        r = asyncio.run(one(passive))
        print(f"{'passive' if passive else 'probes only'}: exporter CPU {r['cpu']:.1f} % of a core, probe tokens "
              f"{r['tokens_s']:.0f}/s, tracker {r['poll_ms_per_s']:.1f} ms per s, windows {r['windows']}, "
              f"outcomes {r['outcomes']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--probes", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-events", type=int, default=5)
    parser.add_argument("--sources", nargs="+", choices=sorted(SOURCE_SETS), default=["otlp", "metrics", "cadence"])
    parser.add_argument("--exact", type=int, default=60)
    parser.add_argument("--overhead-seconds", type=float, default=60.0)
    args = parse_args(parser, minutes=0.5, sources=["otlp"], min_events=2, exact=3, overhead_seconds=5.0)
    print(f"bench_passive: profile {PROFILE}, B = {args.chunk}, {args.probes} probes, load {args.rate:g} req/s, "
          f"{args.minutes:g} min (virtual time), machine load {os.getloadavg()[0]:.2f}")
    if args.minutes > 0:
        sessions = run_sessions(args)
        compare(args, sessions)
        if args.exact and "otlp" in sessions:
            exact(args, sessions["otlp"])
    if args.overhead_seconds > 0:
        overhead(args)


if __name__ == "__main__":
    main()
