"""Sample the host beside a GPU sweep: per-core load and clock, and the CPU and run-queue time of
every busy thread of vLLM and of the client, as JSON lines on CLOCK_MONOTONIC (the clock the
records' raw files carry as `t_inject_clock_ns`), so a window can be lined up with what the host
was doing during it.

    python3 scripts/gpu/hostmon.py OUT.jsonl [--interval 0.25] [--match vllm,pdexporter,VLLM]

Runs until killed. A thread's run-queue wait (schedstat) is the time it was runnable but not
running: contention for its core shows there, not in its CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path


def read_cores() -> list[tuple[int, int]]:
    """(busy, total) jiffies per core from /proc/stat."""
    out = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]
            out.append((sum(v) - idle, sum(v)))
    return out


def read_mhz() -> list[float]:
    return [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("cpu MHz")]


def matching_pids(patterns: list[str]) -> dict[int, str]:
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            comm = Path(entry.path, "comm").read_text().strip()
        except OSError:
            continue
        if any(p in cmd or p in comm for p in patterns) and "hostmon" not in cmd:
            found[int(entry.name)] = comm
    return found


def read_threads(pid: int) -> dict[int, tuple[str, int, int, int]]:
    """tid -> (comm, last core, cpu ns, run-queue wait ns)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            stat = Path(base, "stat").read_text()
            run_ns, wait_ns, _ = Path(base, "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (comm, int(fields[36]), int(run_ns), int(wait_ns))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--match", default="vllm,VLLM,pdexporter")
    args = ap.parse_args()
    patterns = [p for p in args.match.split(",") if p]
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    prev_cores = read_cores()
    prev_threads: dict[tuple[int, int], tuple[int, int]] = {}
    pids: dict[int, str] = {}
    last_scan = 0.0
    with args.out.open("a", buffering=1) as fh:
        while not stop:
            time.sleep(args.interval)
            mono, wall = time.monotonic_ns(), time.time_ns()
            if mono / 1e9 - last_scan > 2.0:
                pids, last_scan = matching_pids(patterns), mono / 1e9
            cores = read_cores()
            load = [round((b - pb) / max(1, t - pt), 3) for (b, t), (pb, pt) in zip(cores, prev_cores)]
            prev_cores = cores
            threads = []
            for pid, pcomm in pids.items():
                for tid, (comm, core, run_ns, wait_ns) in read_threads(pid).items():
                    before = prev_threads.get((pid, tid))
                    prev_threads[(pid, tid)] = (run_ns, wait_ns)
                    if before is None:
                        continue
                    d_run, d_wait = run_ns - before[0], wait_ns - before[1]
                    if d_run > 1_000_000 or d_wait > 1_000_000:
                        threads.append([pid, pcomm, tid, comm, core, d_run, d_wait])
            fh.write(json.dumps({"mono_ns": mono, "wall_ns": wall, "core_load": load, "mhz": read_mhz(),
                                 "loadavg": Path("/proc/loadavg").read_text().split()[:3], "threads": threads}) + "\n")


if __name__ == "__main__":
    main()
