"""Benchmark: `pdexporter sim calibrate` on the committed H200 sweep, wall time and time per stage.

    python tests/benchmarks/bench_calibrate.py                    # as CALIBRATION.md runs it
    python tests/benchmarks/bench_calibrate.py --short            # the short sweep: fit 32, predict 164 + 9
    python tests/benchmarks/bench_calibrate.py --generalisation   # plus leave-one-B-out / -D-out
    python tests/benchmarks/bench_calibrate.py --jobs 1 --base h200-qwen3-coder-30b-a3b
    python tests/benchmarks/bench_calibrate.py --quick   # 6 of the records (B 8192, D 1 and 4), 1 round (CI)

`--short` calibrates on the configurations of sweeps/calibrate-short.yaml (2 chunk sizes x 4 D x 4 P,
their first 3 repetitions: what ~5 GPU-minutes of a new model measure), predicts the other 164
configurations of the grid and the 9 of the generalisation run (B = 6144, D = 3/5/10), and prints
the held-out MAPE of the baseline, the penalty (p50 and mean), the prefill duration and the
aggregate interference, over all configurations and over those measured on a nominal host.

Runs the command as a user would (a subprocess, the default options unless given), from the
starting profile of CALIBRATION.md (`git show d892ed3:pdexporter/sim/profiles/...`) unless
`--base` names another, and prints the wall time, the stages' times from its `--report`, the
simulations run and the load average around it (the machine is shared: read the figures with it).
The target is under 2 minutes on 2 cores for the command without --generalisation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b"
GENERALISE = REPO / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-generalise"
HEADLINE = ("baseline_tpot", "penalty", "penalty_p50", "prefill_duration", "aggregate_interference")
START_COMMIT = "d892ed3"  # the profile CALIBRATION.md starts from
PROFILE_PATH = "pdexporter/sim/profiles/h200-qwen3-coder-30b-a3b.yaml"
SUBSET = [(8192, d, p) for d in (1, 4) for p in (512, 4096, 16384)]  # --subset: B, D, P of the records kept


def subset(into: Path) -> Path:
    """A results directory of `SUBSET`'s records of the H200 sweep (a copy, in `into`)."""
    for b, d, p in SUBSET:
        (into / str(b)).mkdir(parents=True, exist_ok=True)
        shutil.copy2(RESULTS / str(b) / f"D{d}_P{p}.json", into / str(b))
    return into


def starting_profile(into: Path) -> str:
    proc = subprocess.run(["git", "-C", str(REPO), "show", f"{START_COMMIT}:{PROFILE_PATH}"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        print(f"git show {START_COMMIT} failed ({proc.stderr.strip()}); starting from the shipped profile")
        return "h200-qwen3-coder-30b-a3b"
    path = into / "base.yaml"
    path.write_text(proc.stdout)
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="base profile (default: CALIBRATION.md's starting profile)")
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--generalisation", action="store_true")
    ap.add_argument("--short", action="store_true", help="fit the short sweep's configurations, predict the rest")
    ap.add_argument("--max-evaluations", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--subset", action="store_true", help=f"calibrate on {len(SUBSET)} records only (B 8192, D 1, 4)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quickmode import parse_args

    args = parse_args(ap, subset=True, jobs=1, rounds=1, max_evaluations=2)
    with tempfile.TemporaryDirectory(prefix="bench-calibrate-") as tmp:
        base = args.base or starting_profile(Path(tmp))
        report = Path(tmp) / "report.json"
        results = subset(Path(tmp) / "subset") if args.subset else RESULTS
        cmd = [sys.executable, "-m", "pdexporter", "sim", "calibrate", str(results), "--profile", base,
               "--out", str(Path(tmp) / "fitted.yaml"), "--report", str(report), "--jobs", str(args.jobs),
               "--force"]
        if args.generalisation:
            cmd.append("--generalisation")
        if args.short:
            cmd += ["--train-grid", str(REPO / "sweeps" / "calibrate-short.yaml"), "--train-reps", "3",
                    "--also-predict", str(GENERALISE)]
        if args.max_evaluations:
            cmd += ["--max-evaluations", str(args.max_evaluations)]
        if args.rounds:
            cmd += ["--rounds", str(args.rounds)]
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        cpu0 = os.times()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        wall = time.perf_counter() - t0
        cpu1 = os.times()
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
            return proc.returncode
        figures = json.loads(report.read_text())
    children_cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    print(f"sim calibrate {RESULTS.relative_to(REPO)}{f' ({len(SUBSET)} records)' if args.subset else ''} --profile "
          f"{args.base or START_COMMIT + ' (CALIBRATION.md)'}"
          f"{' --generalisation' if args.generalisation else ''}"
          f"{' --train-grid sweeps/calibrate-short.yaml --train-reps 3' if args.short else ''}")
    print(f"wall {wall:.1f} s, CPU {children_cpu:.1f} s (command and its workers), {figures['jobs']} worker(s), "
          f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after, {os.cpu_count()} CPUs")
    for stage, seconds in figures["timings_s"].items():
        print(f"  {stage:16s} {seconds:7.1f} s")
    print(f"  simulated (B, D) groups: {figures['simulated_groups']} ({figures['simulation_cpu_s']:.0f} s CPU), "
          f"stage-2 sweeps: {figures['stage2']['evaluations'] if figures['stage2'] else 0}")
    fitted = figures.get("held_out_fitted", {}).get("mape", {})
    nominal = figures.get("held_out_fitted", {}).get("mape_nominal_host", {})
    base = figures.get("held_out_base", {}).get("mape", {})
    n_held, n_slow = len(figures["held_out_configurations"]), len(figures["slow_host_held_out"])
    print(
        f"  host: slow_factor {figures['host']['slow_factor']:.2f}, "
        f"slow_fraction {figures['host']['slow_fraction']:.2f};"
        f" {n_slow} of the {n_held} held-out configurations ran on a slow host"
    )
    for metric in HEADLINE:
        if metric in fitted:
            print(f"  held-out MAPE {metric:24s} fitted {fitted[metric]['all']:5.1f} %  (nominal host "
                  f"{nominal.get(metric) or float('nan'):5.1f} %)  base {base[metric]['all']:5.1f} %")
    for extra in figures.get("also_predicted", []):
        print(f"  {Path(extra['results_dir']).name}:")
        for metric in HEADLINE:
            print(f"    MAPE {metric:24s} fitted {extra['fitted'][metric]['all']:5.1f} %  base "
                  f"{extra['base'][metric]['all']:5.1f} %")
    if not args.generalisation:
        verdict = "not judged (--quick)" if args.quick else "met" if wall < 120 else "NOT met"
        print(f"target: under 120 s on 2 cores for every record: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
