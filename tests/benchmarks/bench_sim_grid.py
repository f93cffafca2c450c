"""Virtual-time prediction of the seed's whole grid on the embedded engine: how long it takes.

196 configurations (chunk 2048/4096/8192/16384 x D 0,1,2,4,6,8,12 x P 512...32768) x 5 Phase-2
repetitions, each through `measure.point.measure_point` unchanged on `SimDriver` (virtual clock),
records and raw timestamps written to a results directory as a measured sweep would. Phase 1 runs
once per (chunk, D) and is shared, as the seed's optimisation says. One engine per chunk size
(the sweep restarts vLLM per chunk size).

    python tests/benchmarks/bench_sim_grid.py [--reps 5] [--profile NAME] [--out DIR] [--profile-cpu]
    python tests/benchmarks/bench_sim_grid.py --quick   # B 8192 x D 0, 2 x P 512, 4096, 1 repetition (CI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from quickmode import parse_args  # noqa: E402

from pdexporter._internal.vloop import run_virtual  # noqa: E402
from pdexporter.measure.point import PointSpec, measure_point  # noqa: E402
from pdexporter.measure.protocol import ProtocolSettings, run_baseline, warm_prefix  # noqa: E402
from pdexporter.measure.sim_driver import SimDriver  # noqa: E402
from pdexporter.measure.store import ResultsStore  # noqa: E402

CHUNKS = (2048, 4096, 8192, 16384)
# results/h200-vllm0.22-qwen3-coder-30b-a3b, 1,505 repetitions with D > 0: the launch of the first
# chunk holds back the decode step before it (+1), retiring the prompt can add a slow interval
# (+2), a tail as fast as a decode step is not slow (-1)
H200_CADENCE = "-1: 1 %, +0: 42 %, +1: 25 %, +2: 26 %, +3: 6 %"
DECODES = (0, 1, 2, 4, 6, 8, 12)
PREFILLS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


async def grid(profile: str, reps: int, store: ResultsStore, shared_baseline: bool = True,
               axes: tuple[Sequence[int], Sequence[int], Sequence[int]] = (CHUNKS, DECODES, PREFILLS),
               ) -> tuple[int, list[str], float, Counter[int]]:
    settings = ProtocolSettings()
    points = 0
    mismatched: list[str] = []
    cadence: Counter[int] = Counter()  # per repetition with D > 0: probes' slow steps - engine-log chunks
    virtual_s = 0.0
    chunks, decodes, prefills = axes
    for chunk in chunks:
        async with SimDriver.create(profile=profile, chunk_size=chunk) as driver:
            t0 = driver.engine.clock.now()
            await warm_prefix(driver, settings)
            for d in decodes:
                baseline = await run_baseline(driver, d, settings) if shared_baseline else None
                for p in prefills:
                    spec = PointSpec(chunk, d, p)
                    record = await measure_point(driver, spec, settings, store, reps=reps, baseline=baseline,
                                                 resume=False)
                    points += 1
                    i = record.interference
                    if d and i.num_chunks_actual != i.num_chunks_expected:
                        mismatched.append(f"B={chunk} D={d} P={p}: num_chunks_actual {i.num_chunks_actual} "
                                          f"({i.num_chunks_source}), expected {i.num_chunks_expected}, engine log "
                                          f"{i.chunk_tokens_engine_log}")
                    if d:
                        cadence.update(rep.interference.slow_steps - rep.interference.num_chunks_actual
                                       for rep in record.reps)
            virtual_s += driver.engine.clock.now() - t0
    return points, mismatched, virtual_s, cadence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", default="h200-qwen3-coder-30b-a3b")
    parser.add_argument("--out", type=Path, default=None, help="results directory (default: a temp dir)")
    parser.add_argument("--profile-cpu", action="store_true", help="print a cProfile of the run")
    parser.add_argument("--per-point-baseline", action="store_true",
                        help="run Phase 1 for every configuration instead of once per (chunk, D)")
    parser.add_argument("--chunks", type=int, nargs="+", default=list(CHUNKS))
    parser.add_argument("--decodes", type=int, nargs="+", default=list(DECODES))
    parser.add_argument("--prefills", type=int, nargs="+", default=list(PREFILLS))
    args = parse_args(parser, reps=1, chunks=[8192], decodes=[0, 2], prefills=[512, 4096])
    axes = (args.chunks, args.decodes, args.prefills)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-sim-grid-"))
    store = ResultsStore(out)
    load = os.getloadavg()
    wall = time.perf_counter()
    cpu = time.process_time()
    if args.profile_cpu:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        result = prof.runcall(run_virtual, grid(args.profile, args.reps, store, not args.per_point_baseline, axes))
        pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
    else:
        result = run_virtual(grid(args.profile, args.reps, store, not args.per_point_baseline, axes))
    points, mismatched, virtual_s, cadence = result
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    print(f"profile            {args.profile}")
    shared = len(args.chunks) * len(args.decodes)
    baselines = f"{shared} shared" if not args.per_point_baseline else f"{points} per-point"
    print(f"configurations     {points} x {args.reps} reps (+ {baselines} Phase-1 baselines)")
    print(f"virtual time       {virtual_s:,.0f} s of modelled engine time ({virtual_s / 3600:.2f} h)")
    print(f"wall time          {wall:.1f} s   (cpu {cpu:.1f} s; load average before {load[0]:.2f} on "
          f"{os.cpu_count()} cores)")
    print(f"speed-up           {virtual_s / wall:,.0f}x real time")
    print(f"chunks mismatched  {len(mismatched)} of {points - len(args.chunks) * len(args.prefills)} points with D > 0 "
          "(num_chunks_actual, from the engine log, vs ceil(P/(B-D)))")
    for line in mismatched:
        print(f"                   {line}")
    total = sum(cadence.values()) or 1
    print("cadence            probes' slow steps - chunks, per repetition: "
          + ", ".join(f"{k:+d}: {100 * v / total:.0f} %" for k, v in sorted(cadence.items()))
          + f"  (H200 sweep: {H200_CADENCE})")
    if args.quick and args.out is None:
        shutil.rmtree(out)  # a CI run leaves nothing behind
    else:
        print(f"records in         {out}")
    print(f"target             < 60 s for the seed's grid: "
          f"{'not judged (--quick)' if args.quick else 'MET' if wall < 60 else 'NOT MET'}")


if __name__ == "__main__":
    main()
