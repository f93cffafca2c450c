"""Passive mode's event-fitted model against the injected table of the same engine, as traffic comes.
Prints figures.

    python tests/benchmarks/bench_passive_model.py [--minutes 30] [--rate 1.5] [--seed 0] [--probes 4]
        [--chunk 8192] [--bootstrap 200] [--at 1 2 5 10 30] [--out DIR]
    python tests/benchmarks/bench_passive_model.py --quick   # 30 s of traffic, a 2 x 3 grid (CI)

1. A passive session (`predict.passive.passive_session`: the exporter's own tracker, the engine's
   request traces and /metrics) on the embedded engine (profile `h200-qwen3-coder-30b-a3b`) in
   virtual time, beside `pdexporter load`'s traffic (Poisson at --rate, the ShareGPT-like mix).
2. The injected table of the same engine at the same B over the seed's grid (D 1..12, P 512 ..
   32768): `predict.grid.predict_records`, the sweep controller on the embedded engine in fast mode,
   3 repetitions (what `pdexporter sim sweep` measures).
3. The event model (`analysis.passive_model`) refitted on the first 1, 2, 5, 10, 30 minutes of
   traffic (--at: other cut-offs, e.g. 3 to compare with a 3-minute run): events used, cells
   reached, the median 95 % interval half-width, and the error of its
   predicted aggregate interference against the injected table over the reached cells (mean,
   median, max |relative error|); then the cells it cannot reach and why, and the per-cell errors
   of the full fit. `--out DIR` also writes passive_model.json and the convergence plot there.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from quickmode import parse_args

from pdexporter._internal.vloop import run_virtual
from pdexporter.analysis.passive_model import CONVERGENCE_MINUTES, DEFAULT_D, DEFAULT_P, Grid, answer
from pdexporter.exporter.passive_live import fit_event
from pdexporter.load.mix import LoadSpec
from pdexporter.predict.grid import predict_records
from pdexporter.predict.passive import passive_session
from pdexporter.sim.profile import load_profile

PROFILE = "h200-qwen3-coder-30b-a3b"
GOAL = 0.15


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probes", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--at", type=float, nargs="+", default=list(CONVERGENCE_MINUTES))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--decodes", type=int, nargs="+", default=list(DEFAULT_D), help="the grid's D")
    parser.add_argument("--prefills", type=int, nargs="+", default=list(DEFAULT_P), help="the grid's P")
    args = parse_args(parser, minutes=0.5, bootstrap=5, at=[0.25, 0.5], decodes=[4, 6], prefills=[512, 2048, 8192])
    print(
        f"bench_passive_model: profile {PROFILE}, B = {args.chunk}, {args.probes} probes, load {args.rate:g} req/s "
        f"seed {args.seed}, {args.minutes:g} min (virtual time), machine load {os.getloadavg()[0]:.2f}"
    )
    started = time.perf_counter()
    load = LoadSpec(rate=args.rate, duration_s=args.minutes * 60, seed=args.seed)
    session = run_virtual(passive_session(PROFILE, args.chunk, load, probes=args.probes))
    assert session.load is not None
    published = session.published
    t0 = min((e.run.t_inject_ns for e in published if e.run is not None), default=0.0)
    events = [
        row
        for e in published
        if e.run is not None and (row := fit_event(e, (e.run.t_inject_ns - t0) / 1e9)) is not None
    ]
    print(
        f"session: {session.load.sent} requests, runs {dict(session.outcomes)}; published by source "
        f"{dict(collections.Counter(e.source for e in published))}; {time.perf_counter() - started:.0f} s wall"
    )

    grid = Grid((args.chunk,), tuple(args.decodes), tuple(args.prefills))
    started = time.perf_counter()
    records = predict_records(load_profile(PROFILE), grid.cells(), reps=3, mode="fast")
    injected = {
        k: r.derived.aggregate_interference_ms
        for k, r in records.items()
        if r.derived.aggregate_interference_ms is not None
    }
    print(
        f"injected table: {len(injected)} cells x 3 repetitions (fast mode) in {time.perf_counter() - started:.0f} s"
    )

    started = time.perf_counter()
    result = answer(events, grid, injected=injected, minutes=args.at, bootstrap=args.bootstrap)
    if result is None:
        print("no event model: too few events inside the grid's prompt span")
        return
    print(
        f"event model and its convergence ({args.bootstrap} bootstrap refits each) in "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print(
        "| minutes | events used | cells reached | 95 % half-width (median) | MAPE vs injected | median | max |"
    )
    print("|---|---|---|---|---|---|---|")
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x * 100:.1f} %"

    for c in result.convergence:
        e = c.errors
        print(
            f"| {c.minutes:g} | {c.events} | {c.reached} | {pct(c.halfwidth)} | {pct(e.mape if e else None)} | "
            f"{pct(e.median if e else None)} | {pct(e.worst if e else None)} |"
        )
    ten = next((c for c in result.convergence if c.minutes == 10.0), None)
    if ten is not None and ten.errors is not None and ten.errors.mape is not None:
        verdict = "within" if ten.errors.mape <= GOAL else "NOT within"
        print(
            f"\n10-minute goal: MAPE {ten.errors.mape:.1%} over {ten.errors.cells} reached cells: {verdict} "
            f"{GOAL:.0%}"
        )
    print("\ncells not reached:")
    for why, keys in result.not_reached.items():
        print(f"- {why}: {len(keys)} cells ({', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''})")
    if result.errors is not None:
        print("\nfull fit, per reached cell: predicted aggregate interference [95 % CI] vs injected, error")
        print("| D | P | events in bin | predicted ms | 95 % CI | injected ms | error |")
        print("|---|---|---|---|---|---|---|")
        for c in result.cells:
            if c.key in result.errors.by_cell:
                ci = "-" if c.low_ms is None else f"{c.low_ms:.0f}-{c.high_ms:.0f}"
                print(
                    f"| {c.key[1]} | {c.key[2]} | {c.events} | {c.aggregate_ms:.0f} | {ci} | "
                    f"{injected[c.key]:.0f} | {result.errors.by_cell[c.key] * 100:+.1f} % |"
                )
    coefficients = ", ".join(f"{c['name']} {'-' if c['value'] is None else format(c['value'], '.4g')}"
                             for c in result.model.coefficients())
    print(f"\nmodel: {coefficients}")
    if args.out is not None:
        from pdexporter.analysis.plots import passive_convergence, write_plots

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "passive_model.json").write_text(json.dumps(result.to_dict(), indent=1))
        write_plots([passive_convergence(result.convergence, True)], args.out)
        print(f"wrote {args.out}/passive_model.json and passive_convergence.png/svg")


if __name__ == "__main__":
    main()
