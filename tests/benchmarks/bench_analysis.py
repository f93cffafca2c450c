"""Benchmark: the seed's full grid (196 configurations x 5 repetitions) -> table, fits and plots.

    python tests/benchmarks/bench_analysis.py [--repeat 3] [--reps 5] [--chunks ...] [--decodes ...] [--prefills ...]
    python tests/benchmarks/bench_analysis.py --quick   # 12 points x 2 repetitions, once (CI)

Records are generated first (not timed) through the same window maths as measured ones, written
to a temporary results directory, then the batch job runs as `export-table` runs it: load and
validate every record from disk, build the table, fit both cost models with their held-out
scores, write the decision and criteria, render and write the plots (PNG + SVG). Target: < 3 s.
Prints wall and CPU time and the 1-minute load average: on a shared machine the wall time
stretches with the other work while the CPU time stays what this job costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

t_import = time.perf_counter()
from quickmode import parse_args  # noqa: E402

from pdexporter.analysis import job  # noqa: E402
from pdexporter.analysis.plots import all_plots, write_plots  # noqa: E402
from pdexporter.analysis.synthetic import (  # noqa: E402
    SEED_CHUNKS,
    SEED_DECODES,
    SEED_PREFILLS,
    SyntheticTruth,
    seed_grid,
    synthetic_records,
)
from pdexporter.measure.store import ResultsStore  # noqa: E402

IMPORT_S = time.perf_counter() - t_import
TARGET_S = 3.0


def run_once(results: Path, out: Path) -> dict[str, float]:
    c0 = time.process_time()
    t0 = time.perf_counter()
    samples = job.load_results(results)
    t1 = time.perf_counter()
    analysis = job.analyse(samples, source=str(results))
    t2 = time.perf_counter()
    job.write_outputs(analysis, out, plots=False)
    t3 = time.perf_counter()
    plots = all_plots(analysis.table, analysis.fits.best.model if analysis.fits else None, analysis.transfer_ms)
    write_plots(plots, out / job.PLOTS_DIR)
    t4 = time.perf_counter()
    cpu = time.process_time() - c0
    for p in plots:
        p.figure.clear()
    return {"load": t1 - t0, "table+fits+criteria": t2 - t1, "write tables/json": t3 - t2, "plots": t4 - t3,
            "total": t4 - t0, "cpu": cpu, "points": len(samples), "reps": sum(len(s.reps) for s in samples),
            "r2": analysis.fits.held_out_r2() if analysis.fits else float("nan")}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--chunks", type=int, nargs="+", default=list(SEED_CHUNKS))
    parser.add_argument("--decodes", type=int, nargs="+", default=list(SEED_DECODES))
    parser.add_argument("--prefills", type=int, nargs="+", default=list(SEED_PREFILLS))
    args = parse_args(parser, repeat=1, reps=2, chunks=[8192], decodes=[1, 4, 8], prefills=[512, 2048, 8192, 32768])
    grid = list(seed_grid(args.chunks, args.decodes, args.prefills))
    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp:
        results, out = Path(tmp) / "results", Path(tmp) / "out"
        t = time.perf_counter()
        store = ResultsStore(results)
        for record in synthetic_records(SyntheticTruth(), grid, reps=args.reps):
            store.save_record(record)
        print(f"generated {len(grid)} x {args.reps} synthetic records in {time.perf_counter() - t:.2f} s (not timed)")
        runs = [run_once(results, out) for _ in range(args.repeat)]
    load = os.getloadavg()[0]
    first = runs[0]
    print(f"grid points {first['points']}, repetitions {first['reps']}, held-out R^2 {first['r2']:.4f}")
    print(f"imports (pandas, numpy, matplotlib, pydantic): {IMPORT_S:.2f} s, once per process")
    for key in ("load", "table+fits+criteria", "write tables/json", "plots", "total", "cpu"):
        values = [r[key] for r in runs]
        print(f"  {key:22s} median {statistics.median(values):6.3f} s  (min {min(values):.3f}, max {max(values):.3f})")
    best = statistics.median(r["total"] for r in runs)
    cpu = statistics.median(r["cpu"] for r in runs)
    verdict = "not judged (--quick)" if args.quick else "OK" if best < TARGET_S else "OVER"
    print(f"table, fits and plots for {len(grid)} x {args.reps} records: {best:.2f} s wall, {cpu:.2f} s CPU (median "
          f"of {len(runs)}), target < {TARGET_S:.0f} s for 196 x 5: {verdict}; load average {load:.2f} on "
          f"{os.cpu_count()} cores")
    return 0 if args.quick or best < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
