"""Issues 30 and 32: every repetition of a sweep beside what the host and the GPU did in its window.

Reads the records of a sweep (`{chunk}/D*_P*.json` with their `raw/` windows) and the samples of
`scripts/gpu/host_monitor.py` (`host-*.jsonl`, `host-*.gpu.csv`) and writes one row per repetition:
its window (the injection to the prefill's first token, on the driver's clock), the penalty and its
ratio to the median of its configuration's repetitions (the level), and, over the monitor's samples
that bracket the window, the engine core's main thread: its share of the window on a CPU and
waiting on the run queue, the CPU it ran on; the host's steal (all CPUs, and the engine core's CPU's); the
GPU's SM clock (mean, min), power and whether a clock-event reason (power cap, thermal) was active; the
guest's CPU speed (the monitor's fixed loop, `spin_us`, mean over the bracketing samples); and, where
`scripts/gpu/launch_probe.py` ran beside it (`launch-*.jsonl`), the host's CUDA launch speed from a process of
its own (`launch_us`, nanoseconds a launch in microseconds, over the probe's samples within one interval of the
window; the nearest within 5 s else).

    python3 scripts/gpu/host_levels.py RESULTS_DIR MONITOR_DIR [--csv OUT.csv]

It prints, per regime of the step (one eager chunk, several chunks), how the repetitions away
from their configuration's median (|ratio - 1| > 0.1) differ from the others in each of those.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

ENGINE_COMM = "VLLM::EngineCor"
FAST, SLOW = 0.9, 1.1  # the levels plans' fast and slow: a repetition's (or a step's) ratio to its median


Machine = tuple[list[int], list[dict], list[tuple[int, float, float, int]]]  # times, samples, GPU rows
Launches = dict[int, tuple[list[int], list[float]]]  # per machine: the probe's times and microseconds a launch


def load_launches(folder: Path, keys: list[int]) -> Launches:
    """The launch probe's samples (`launch-*.jsonl`) per machine, keyed as `load_monitor` keys them (wall minus
    monotonic time in whole seconds; a machine the monitor did not see gets a key of its own)."""
    pairs: dict[int, list[tuple[int, float]]] = {}
    for f in sorted(folder.glob("launch-*.jsonl")):
        part = [json.loads(line) for line in f.open() if line.strip()]
        if part:
            key = _machine_key(statistics.median(s["w"] - s["t"] for s in part) / 1e9, [*keys, *pairs])
            pairs.setdefault(key, []).extend((s["t"], s["launch"][0] / 1e3) for s in part)
    return {key: ([t for t, _ in sorted(p)], [v for _, v in sorted(p)]) for key, p in pairs.items()}


def _machine_key(off_s: float, keys: list[int]) -> int:
    """The machine a file's samples were taken on, from their wall minus monotonic time (`off_s`, one boot's): the
    key already seen within 2 s of it, else its own (whole seconds)."""
    return next((k for k in keys if abs(k - off_s) < 2), round(off_s))


def launch_at(series: tuple[list[int], list[float]], t0: int, t1: int) -> float | None:
    """The probe's microseconds a launch around the window [t0, t1]: the mean of its samples within one sampling
    interval of it, else the nearest sample within 5 s, else None."""
    times, values = series
    if not times:
        return None
    step = statistics.median(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else 5_000_000_000
    lo, hi = bisect.bisect_left(times, t0 - step), bisect.bisect_right(times, t1 + step)
    if hi > lo:
        return statistics.fmean(values[lo:hi])
    i = min(range(len(times)), key=lambda j: abs(times[j] - t0))
    return values[i] if abs(times[i] - t0) <= 5_000_000_000 else None


def load_monitor(folder: Path) -> dict[int, Machine]:
    """Monitor samples (sorted by monotonic time) and GPU rows (monotonic ns, SM MHz, W, reasons),
    per machine: the files of one boot share wall minus monotonic time (to a second), and each
    machine's monotonic clock starts at its own boot, so two machines' samples must not share an axis
    (GPU session 12's grid ran on three). Keyed by that offset in whole seconds."""
    machines: dict[int, Machine] = {}
    for f in sorted(folder.glob("host-*.jsonl")):
        part = [json.loads(line) for line in f.open() if line.strip()]
        if not part:
            continue
        off = statistics.median(s["w"] - s["t"] for s in part)  # wall minus monotonic, this file's
        key = _machine_key(off / 1e9, list(machines))
        _, samples, gpu = machines.setdefault(key, ([], [], []))
        samples += part
        g = f.with_suffix(".gpu.csv")
        for row in csv.reader(g.open()) if g.exists() else []:
            try:
                # nvidia-smi stamps local time; the GPU machine and this one both run on UTC
                wall = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                gpu.append((int(wall * 1e9) - off, float(row[1]), float(row[3]), int(row[6].strip(), 16)))
            except (ValueError, IndexError):
                continue
    for _, samples, gpu in machines.values():
        samples.sort(key=lambda s: s["t"])
        gpu.sort()
    return {k: ([s["t"] for s in samples], samples, gpu) for k, (_, samples, gpu) in machines.items()}


def machine_of(machines: dict[int, Machine] | dict[int, None], t_ns: int, wall_s: float) -> int | None:
    """The key of the machine whose monotonic clock reads `t_ns` at about wall time `wall_s` (a
    record's `started_at`, whole seconds, taken just before the window)."""
    return next((offset for offset in machines if abs(offset + t_ns / 1e9 - wall_s) < 10), None)


def engine_threads(samples: list[dict]) -> dict[str, tuple[list[int], list[list]]]:
    """Every engine core main thread's cumulative rows over time, as (times, rows) (a thread appears
    only when it moved)."""
    out: dict[str, tuple[list[int], list[list]]] = {}
    for s in samples:
        for key, row in s["thr"].items():
            pid, tid = key.split("/")
            if pid == tid and row[0] == ENGINE_COMM:
                times, rows_ = out.setdefault(key, ([], []))
                times.append(s["t"])
                rows_.append(row)
    return out


def at(series: tuple[list[int], list[list]], t: int) -> list | None:
    """The thread's last row at or before t."""
    times, rows_ = series
    i = bisect.bisect_right(times, t) - 1
    return rows_[i] if i >= 0 else None


def window_stats(t0: int, t1: int, times: list[int], samples: list[dict], threads: dict, gpu: list) -> dict:
    i0 = max(bisect.bisect_right(times, t0) - 1, 0)
    i1 = min(bisect.bisect_left(times, t1), len(times) - 1)
    a, b = samples[i0], samples[i1]
    span = max(b["t"] - a["t"], 1)
    best, moved = None, -1
    for series in threads.values():
        r0, r1 = at(series, a["t"]), at(series, b["t"])
        if r0 and r1 and r1[2] - r0[2] > moved:
            best, moved = (r0, r1), r1[2] - r0[2]
    steal = b["cpu"][0][7] - a["cpu"][0][7]  # the total line's steal ticks
    # the GPU rows within 100 ms of the window (sorted by time: a slice, not a scan of every row)
    g = gpu[bisect.bisect_left(gpu, (t0 - 100_000_000,)):bisect.bisect_right(gpu, (t1 + 100_000_000, float("inf")))]
    out = {"bracket_ms": span / 1e6, "steal_ticks": steal}
    spins = [s["spin"][0] for s in samples[i0:i1 + 1] if "spin" in s]  # the monitor's since session 14
    if spins:
        out["spin_us"] = statistics.fmean(spins) / 1e3
    if best:
        r0, r1 = best
        out |= {"engine_on_cpu": (r1[2] - r0[2]) / span, "engine_runq_wait": (r1[3] - r0[3]) / span,
                "engine_cpu": r1[1]}
        if len(b["cpu"]) > r1[1] + 1 and len(a["cpu"]) > r1[1] + 1:  # per-CPU lines after the total one
            out["engine_cpu_steal"] = b["cpu"][r1[1] + 1][7] - a["cpu"][r1[1] + 1][7]
    if g:
        out |= {"sm_mhz_mean": statistics.fmean(r[1] for r in g), "sm_mhz_min": min(r[1] for r in g),
                "power_w": statistics.fmean(r[2] for r in g), "clock_event": int(any(r[3] & ~1 for r in g))}
    return out


def rows(results: Path, monitor: Path) -> list[dict]:
    machines = load_monitor(monitor)
    threads = {k: engine_threads(m[1]) for k, m in machines.items()}
    launches = load_launches(monitor, list(machines))
    clocks = {**dict.fromkeys(launches), **dict.fromkeys(machines)}  # every machine's key: monitor, probe or both
    out = []
    for rec_path in sorted(results.glob("[0-9]*/D*_P*.json")):
        rec = json.loads(rec_path.read_text())
        c = rec["config"]
        if c["decode_batch_size"] == 0:
            continue
        reps = [r for r in rec["reps"] if r.get("derived", {}).get("tpot_penalty_ms") is not None]
        if not reps:
            continue
        med = statistics.median(r["derived"]["tpot_penalty_ms"] for r in reps)
        for r in reps:
            with gzip.open(rec_path.parent / r["raw"]) as f:
                raw = json.load(f)
            t0 = raw["t_inject_clock_ns"]
            t1 = t0 + int(raw["t_first_ns"])
            row = {"chunk_size": c["chunk_size"], "D": c["decode_batch_size"], "P": c["new_prefill_tokens"],
                   "rep": r["rep"], "chunks": r["interference"].get("num_chunks_actual"),
                   "penalty_ms": r["derived"]["tpot_penalty_ms"], "ratio": r["derived"]["tpot_penalty_ms"] / med,
                   "window_ms": (t1 - t0) / 1e6}
            key = machine_of(clocks, t0, datetime.fromisoformat(r["started_at"]).timestamp()) \
                if r.get("started_at") else None
            times, samples, gpu = machines.get(key, ([], [], [])) if key is not None else ([], [], [])
            if times and times[0] <= t0 <= times[-1]:
                row |= window_stats(t0, t1, times, samples, threads[key], gpu)
            launch = launch_at(launches[key], t0, t1) if key in launches else None
            if launch is not None:
                row["launch_us"] = launch
            out.append(row)
    return out


def summarise(table: list[dict]) -> None:
    regimes = (("one chunk", lambda r: r["chunks"] == 1), ("several chunks", lambda r: (r["chunks"] or 0) > 1))
    for label, keep in regimes:
        part = [r for r in table if keep(r) and "engine_runq_wait" in r]
        away = [r for r in part if abs(r["ratio"] - 1) > 0.1]
        near = [r for r in part if abs(r["ratio"] - 1) <= 0.1]
        print(f"{label}: {len(part)} repetitions with monitor samples, {len(away)} away from their median (>10 %)")
        for key in ("engine_on_cpu", "engine_runq_wait", "steal_ticks", "engine_cpu_steal", "spin_us", "sm_mhz_mean",
                    "sm_mhz_min", "power_w", "clock_event", "bracket_ms"):
            vals = [[r[key] for r in grp if key in r] for grp in (near, away)]
            if all(vals):
                print(f"  {key:18s} near {statistics.fmean(vals[0]):10.3f}   away {statistics.fmean(vals[1]):10.3f}")
        for key in ("spin_us", "launch_us"):
            probed = [r for r in table if keep(r) and key in r]  # the probe may have run without the monitor
            _correlate(f"  level ~ {key}", probed, key)
    # the launch probe per prompt length: the eager one-chunk prompts against a compute-bound control
    for p in sorted({r["P"] for r in table if "launch_us" in r}):
        _correlate(f"P = {p}: level ~ launch_us", [r for r in table if r["P"] == p and "launch_us" in r], "launch_us")


def _correlate(label: str, rows_: list[dict], key: str) -> None:
    """Pearson r of the level (a repetition's penalty over its configuration's median) with `key`, and `key`'s
    mean over the fast (level < 0.9), near (0.9-1.1) and slow (> 1.1) repetitions."""
    paired = [(r["ratio"], r[key]) for r in rows_]
    if len(paired) < 3 or len({v for _, v in paired}) < 2 or len({v for v, _ in paired}) < 2:
        return
    groups = {"fast": [v for q, v in paired if q < FAST], "near": [v for q, v in paired if FAST <= q <= SLOW],
              "slow": [v for q, v in paired if q > SLOW]}
    means = ", ".join(f"{name} {statistics.fmean(v):.3f} ({len(v)})" for name, v in groups.items() if v)
    print(f"{label}: Pearson r {statistics.correlation(*zip(*paired)):.2f} over {len(paired)}; {means}")


def main() -> int:
    results, monitor = Path(sys.argv[1]), Path(sys.argv[2])
    table = rows(results, monitor)
    if "--csv" in sys.argv:
        dest = Path(sys.argv[sys.argv.index("--csv") + 1])
        keys = list(dict.fromkeys(k for r in table for k in r))  # every column, in the order first seen
        with dest.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(table)
    summarise(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
