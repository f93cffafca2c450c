"""Where a real-time fast-mode sweep spends its time per repetition, against the embedded engine
served over HTTP (`pdexporter sim serve`, started by the `local` launcher exactly as vLLM is).

The virtual-clock benchmark (bench_sweep.py) models the engine's time; it cannot see the client's
own work between windows (record files, the window maths, /metrics parsing), which costs real
time on a GPU machine while the probes decode tokens nobody measures. This runs a small grid in
real time with `sweep_timing.PhaseTimer` and prints, per repetition, the engine-side waits and
the client-side work, on the event loop's clock and on the machine's.

    python tests/benchmarks/bench_sweep_realtime.py [--code DIR] [--reps 5] [--engines 1]
    python tests/benchmarks/bench_sweep_realtime.py --quick   # D 1 x P 512, 2048, 2 repetitions (CI)

`--code DIR` runs another checkout's pdexporter (e.g. an export of main) with this harness, for a
before/after comparison on the same machine. `--engines 2` runs the grid's chunk sizes side by
side on two embedded engines ("GPUs" 0 and 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=HERE.parents[1], help="checkout whose pdexporter runs")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--chunks", default="2048", help="comma-separated chunk sizes")
    parser.add_argument("--decodes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--prefills", type=int, nargs="+", default=[512, 2048, 8192])
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    from helpers import free_ports
    from quickmode import parse_args

    args = parse_args(parser, reps=2, decodes=[1], prefills=[512, 2048])
    code = args.code.resolve()
    sys.path[:0] = [str(code), str(HERE)]
    os.environ["PYTHONPATH"] = str(code)

    import asyncio

    from sweep_timing import PhaseTimer

    from pdexporter.measure.store import ResultsStore
    from pdexporter.sweep.controller import SweepController
    from pdexporter.sweep.spec import parse_sweep

    chunks = [int(c) for c in args.chunks.split(",")]
    port = free_ports(args.engines)  # outside the ephemeral range, as the tests pick theirs
    launcher: dict[str, object] = {
        "kind": "local", "health_timeout_s": 60, "stop_timeout_s": 10, "cwd": str(code),
        "command": "{python} -m pdexporter sim serve --max-num-batched-tokens {chunk} --port {port}",
    }
    if args.engines > 1:
        launcher.update(gpus=list(range(args.engines)), base_port=port, url="http://127.0.0.1:{port}")
    else:
        launcher.update(vars={"port": str(port)}, url=f"http://127.0.0.1:{port}")
    spec = parse_sweep({
        "grid": {"chunk_sizes": chunks, "decode_batch_sizes": args.decodes, "new_prefill_tokens": args.prefills},
        "reps": args.reps, "mode": "fast", "cv": {"max_reruns": 0}, "launcher": launcher,
    })
    load = os.getloadavg()[0]
    print(f"pdexporter from {code}; machine: {os.cpu_count()} CPUs, load average {load:.2f} at start")
    print(f"grid: chunk sizes {chunks} x D {args.decodes} x P {args.prefills}, {args.reps} reps, fast mode, "
          f"{args.engines} embedded engine(s) over HTTP in real time")
    with tempfile.TemporaryDirectory(prefix="bench-sweep-rt-") as tmp:
        store = ResultsStore(tmp)
        try:
            from pdexporter.sweep.providers import make_providers
            providers = make_providers(spec, store)
        except ImportError:  # an older checkout: one engine only
            from pdexporter.sweep.providers import make_provider
            providers = make_provider(spec, store)
        wall = time.perf_counter()
        with PhaseTimer().active() as timer:
            report = asyncio.run(SweepController(spec, store, providers).run())
        wall = time.perf_counter() - wall
        reps = sum(c.reps_run for c in report.chunks.values())
        sets = sum(c.probe_sets for c in report.chunks.values())
        retries = sum(c.retries for c in report.chunks.values())
        phase = {
            p: sum(c.wall_s[p] for c in report.chunks.values()) for p in ("engine_start", "warmup", "phase1", "phase2")
        }
        print(f"status {report.status}: {reps} repetitions, {sets} probe sets, {retries} retries, {wall:.1f} s wall "
              f"(" + ", ".join(f"{k} {v:.1f} s" for k, v in phase.items()) + ")")
        print(f"  per repetition ({'loop clock':>11s} {'machine':>11s}):")
        print("\n".join(timer.lines(reps)))
        print(f"  Phase 2 per repetition: {phase['phase2'] / max(reps, 1) * 1e3:.1f} ms; "
              f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
