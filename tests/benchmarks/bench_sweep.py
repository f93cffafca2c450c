"""The seed's full sweep (196 configs x 5 reps) on the embedded engine, faithful vs fast mode.

For each mode, the sweep controller runs the whole grid on the embedded engine's virtual clock
(profile h200-qwen3-coder-30b-a3b by default) and this prints

- the *modelled engine seconds* per phase (what the sweep would take on that GPU, by the model),
- the machine time it took to predict them,
- a projection of the real GPU run: modelled engine time + one engine start per chunk size
  (~100 s for vLLM 0.22 on the H200, ../shared/gpu/README.md) + an allowance of 10 s per engine
  stop + first-shape JIT in the warm-up (~1.3 s per P shape per start, docs/vllm-facts.md; the
  model does not include it), against the 20-minute goal. Client-side costs (HTTP, the two
  /metrics scrapes per window) are not in the model,
- how compact the raw timestamps are on disk (gzip + deltas) against plain absolute-ns JSON.

Then it times the CLI: `pdexporter sim sweep sweeps/seed.yaml --profile h20-qwen3-coder-30b-a3b`
(the seed's table predicted for the seed's GPU; goal: under 60 s on this machine).

    python tests/benchmarks/bench_sweep.py [--profile NAME] [--reps 5] [--skip-cli]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pdexporter._internal.vloop import run_virtual  # noqa: E402
from pdexporter.measure.store import ResultsStore  # noqa: E402
from pdexporter.sweep.controller import PHASES, SweepController, SweepReport  # noqa: E402
from pdexporter.launch.providers import make_provider  # noqa: E402
from pdexporter.sweep.spec import load_sweep  # noqa: E402

ENGINE_START_S = 100.0  # vLLM 0.22 + Qwen3-Coder-30B-A3B (dummy weights) to /health on the H200
ENGINE_STOP_S = 10.0  # SIGTERM to exit between chunk sizes: an allowance, not measured
FIRST_SHAPE_JIT_S = 1.3  # per new prefill shape after a start (docs/vllm-facts.md)
GOAL_S = 20 * 60


def run_mode(mode: str, profile: str, reps: int, out: Path) -> tuple[SweepReport, float, float]:
    spec = load_sweep(ROOT / "sweeps" / "seed.yaml", {
        "mode": mode, "reps": reps, "launcher": {"kind": "sim", "profile": profile, "clock": "virtual"},
    })
    store = ResultsStore(out)
    wall, cpu = time.perf_counter(), time.process_time()
    report = run_virtual(SweepController(spec, store, make_provider(spec, store)).run())
    return report, time.perf_counter() - wall, time.process_time() - cpu


def phase_totals(report: SweepReport) -> dict[str, float]:
    return {p: sum(c.engine_s[p] for c in report.chunks.values()) for p in PHASES}


def raw_sizes(root: Path) -> tuple[int, int, int, int]:
    """(files, bytes on disk, bytes as JSON with deltas, bytes as JSON with absolute ns)."""
    files = disk = delta_json = absolute_json = 0
    for path in root.glob("*/raw/D*_P*_r*.json.gz"):
        files += 1
        disk += path.stat().st_size
        raw = json.loads(gzip.decompress(path.read_bytes()))
        delta_json += len(json.dumps(raw, separators=(",", ":")))
        for probe in raw["probes"]:
            acc, absolute = 1_700_000_000_000_000_000, []
            for dt in probe["dt_ns"]:
                acc += dt
                absolute.append(acc)
            probe["t_ns"] = absolute
            del probe["dt_ns"]
        absolute_json += len(json.dumps(raw, separators=(",", ":")))
    return files, disk, delta_json, absolute_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200-qwen3-coder-30b-a3b")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--skip-cli", action="store_true")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print(f"grid: sweeps/seed.yaml, 196 configs x {args.reps} reps, profile {args.profile}, virtual clock\n")
    results: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        for mode in ("faithful", "fast"):
            report, wall, cpu = run_mode(mode, args.profile, args.reps, Path(tmp) / mode)
            assert report.complete, report.message
            results[mode] = (report, wall, cpu)
            totals = phase_totals(report)
            modelled = sum(totals.values())
            print(f"[{mode}] modelled engine time {modelled:8.1f} s  ("
                  + ", ".join(f"{p} {totals[p]:.1f}" for p in PHASES) + ")")
            print(f"[{mode}] machine time to predict it: {wall:.1f} s wall, {cpu:.1f} s CPU "
                  f"(load average now {os.getloadavg()[0]:.2f})")
            if mode == "fast":
                sets = sum(c.probe_sets for c in report.chunks.values())
                print(f"[{mode}] probe sets started: {sets} for {196 * args.reps} injections")
            if mode == "fast":
                a = {r.key: r for r in ResultsStore(Path(tmp) / "faithful").iter_records()}
                b = {r.key: r for r in ResultsStore(Path(tmp) / "fast").iter_records()}
                pen = [abs(b[k].derived.tpot_penalty_p50_ms / a[k].derived.tpot_penalty_p50_ms - 1)
                       for k in a if a[k].derived.tpot_penalty_p50_ms]
                dur = [abs(b[k].interference.prefill_duration_ms / a[k].interference.prefill_duration_ms - 1) for k in a]
                results["agreement"] = (max(pen), max(dur), len(a))  # type: ignore[assignment]
            files, disk, delta_json, absolute_json = raw_sizes(Path(tmp) / mode)
            print(f"[{mode}] raw timestamps: {files} files, {disk / files / 1024:.1f} KiB/rep on disk (gzip+deltas), "
                  f"{delta_json / files / 1024:.1f} KiB as delta JSON, {absolute_json / files / 1024:.1f} KiB as "
                  f"absolute-ns JSON; {disk / 1024 / 1024:.1f} MiB in all\n")

    print("projection for the real H200 (full grid, restarts included):")
    n_chunks = 4
    for mode in ("faithful", "fast"):
        report = results[mode][0]
        totals = phase_totals(report)
        modelled = sum(totals.values())
        no_cool = modelled - totals["cooldown"]
        restarts = n_chunks * ENGINE_START_S + (n_chunks - 1) * ENGINE_STOP_S
        jit = n_chunks * 7 * FIRST_SHAPE_JIT_S
        projected = modelled + restarts + jit
        verdict = "meets" if projected <= GOAL_S else "misses"
        print(f"  {mode:8s}: {modelled:7.0f} s modelled ({no_cool:.0f} s without cooldowns) + {restarts:.0f} s starts "
              f"and stops + {jit:.0f} s JIT = {projected:7.0f} s = {projected / 60:5.1f} min -> {verdict} the 20 min goal")
    agree = results.get("agreement")
    if agree:
        print(f"  fast vs faithful on the same model: largest relative difference {agree[0]:.2%} on penalty, "
              f"{agree[1]:.2%} on prefill duration (over {agree[2]} configurations)")
    f, g = phase_totals(results["faithful"][0]), phase_totals(results["fast"][0])
    print(f"  fast / faithful modelled time: {sum(g.values()) / sum(f.values()):.3f} "
          f"({sum(g.values()) / (sum(f.values()) - f['cooldown']):.3f} against faithful without its cooldowns)")

    if not args.skip_cli:
        with tempfile.TemporaryDirectory(prefix="bench-sim-sweep-") as tmp:
            cmd = [sys.executable, "-m", "pdexporter", "sim", "sweep", "sweeps/seed.yaml", "--profile",
                   "h20-qwen3-coder-30b-a3b", "--out", tmp]
            load = os.getloadavg()[0]
            wall = time.perf_counter()
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - wall
            ok = done.returncode == 0 and len(list(Path(tmp).glob("*/D*_P*.json"))) == 196
            print(f"\n`pdexporter sim sweep sweeps/seed.yaml --profile h20-qwen3-coder-30b-a3b`: "
                  f"{'196 records' if ok else 'FAILED: ' + done.stderr[-300:]}, {wall:.1f} s wall "
                  f"(goal < 60 s; load average {load:.2f} before)")


if __name__ == "__main__":
    main()
