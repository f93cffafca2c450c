"""Issues 30 and 32: what the host and the GPU do while a sweep measures, sampled beside it.

The eager chunk step of vLLM on the H200 runs at two levels (~45 and ~80 ms for one 512-token
chunk beside the decodes) that switch between repetitions and between campaigns; criterion 4's
exceptions and most of the held-out error sit on that switch. This sidecar records what could set
the level, on the clock the records use (CLOCK_MONOTONIC = the driver's perf_counter_ns), so a
repetition's window can be matched with it afterwards (`scripts/gpu/host_levels.py`):

- every CPU's counters from /proc/stat (user, nice, system, idle, iowait, irq, softirq, steal);
- every thread of the engine's processes (`-m vllm.…`, `VLLM::EngineCore`) and of the sweep
  (`-m pdexporter`): its CPU, its time on the CPU and its time waiting on the run queue
  (/proc/TID/schedstat), its user and system time;
- the GPU's SM and memory clocks, power, temperature and clock-event reasons (nvidia-smi, its own
  process, every 100 ms, with its own wall-clock stamps; the sidecar's lines carry both clocks);
- the host's CPU speed as this guest gets it (`spin`, GPU session 14): the nanoseconds a fixed loop of
  `SPIN_ITERATIONS` Python additions took (0.7-1.3 ms on the H200 machines), and the vCPU it ran on.
  Nothing inside the guest tracked the levels in session 12 (no run-queue waits, no steal, no vCPU's
  load); a launch-bound step is CPU work, so a host that slowed every guest core would show here too.
  In session 14 it did not: the loop flips between ~0.72 and ~1.2 ms from one sample to the next on
  every vCPU, uncorrelated with the engine's level (Pearson r 0.03 over 525 one-chunk repetitions).

    python3 scripts/gpu/host_monitor.py OUT.jsonl [--interval 0.1] &

One JSON line a sample: {"t": monotonic ns, "w": wall ns, "spin": [ns, vCPU], "cpu": [[8 counters]
per CPU, the first line the total], "thr": {"PID/TID": [comm, cpu, run_ns, wait_ns, utime, stime]}}, a thread
only where its counters moved since its last line. The GPU's lines go to OUT.gpu.csv, the guest's CPU
topology (sibling threads, model, MHz) once to OUT.topology.json. Stdlib only:
it runs on the GPU machine's own Python. SIGTERM (or Ctrl-C) ends it with the file closed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# Command lines (NUL-separated) of the engine's processes (`-m vllm.…`, the engine core's title
# `VLLM::EngineCore`) and of the sweep (`-m pdexporter`), not every path that holds the words
WATCH = (b"\x00vllm.", b"VLLM::", b"\x00pdexporter\x00")


SPIN_ITERATIONS = 20_000


def spin() -> list[int]:
    """[ns the fixed loop took, the vCPU it ended on]: the guest's CPU speed now."""
    t0, x = time.perf_counter_ns(), 0
    for i in range(SPIN_ITERATIONS):
        x += i
    ns = time.perf_counter_ns() - t0
    return [ns, _own_cpu()]


def _own_cpu() -> int:
    stat = Path("/proc/thread-self/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2 :].split()[36])


def topology() -> dict:
    """The guest's CPUs once: which vCPUs share a core (a sibling's load slows a launch-bound thread)
    and what /proc/cpuinfo calls them."""
    cpus: dict[str, str] = {}
    for d in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*")):
        try:
            cpus[d.name] = (d / "topology" / "thread_siblings_list").read_text().strip()
        except OSError:
            continue
    info = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), None)
    mhz = [float(line.split(":", 1)[1]) for line in info.splitlines() if line.startswith("cpu MHz")]
    return {"siblings": cpus, "model": model, "mhz": mhz}


def cpu_counters() -> list[list[int]]:
    rows = []
    with open("/proc/stat", "rb") as f:
        for line in f:
            if not line.startswith(b"cpu"):
                break
            rows.append([int(x) for x in line.split()[1:9]])
    return rows


def watched_pids() -> list[str]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if any(w in cmd + b"\x00" for w in WATCH) and b"host_monitor" not in cmd:
            pids.append(entry)
    return pids


def thread_ids(pids: list[str]) -> list[str]:
    tids = []
    for pid in pids:
        try:
            tids += [f"{pid}/task/{tid}" for tid in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
    return tids


def thread_sample(tid: str) -> list | None:
    base = f"/proc/{tid}"
    try:
        stat = Path(f"{base}/stat").read_bytes()
        sched = Path(f"{base}/schedstat").read_bytes().split()
    except OSError:
        return None
    comm = stat[stat.index(b"(") + 1 : stat.rindex(b")")].decode(errors="replace")
    rest = stat[stat.rindex(b")") + 2 :].split()
    # rest[0] is field 3 (state): utime 14, stime 15, processor 39 -> rest[11], rest[12], rest[36]
    return [comm, int(rest[36]), int(sched[0]), int(sched[1]), int(rest[11]), int(rest[12])]


def main() -> int:
    out = Path(sys.argv[1])
    interval = float(sys.argv[sys.argv.index("--interval") + 1]) if "--interval" in sys.argv else 0.1
    smi = shutil.which("nvidia-smi")
    gpu = smi and subprocess.Popen(
        [smi, "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,"
         "clocks_event_reasons.active", "--format=csv,noheader,nounits", "-lms", "100"],
        stdout=open(out.with_suffix(".gpu.csv"), "w"), stderr=subprocess.DEVNULL)
    out.with_suffix(".topology.json").write_text(json.dumps(topology()))
    tids: list[str] = []
    last: dict[str, list] = {}
    n = 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    with open(out, "w") as f:
        try:
            while True:
                if n % 20 == 0:  # new engines and threads appear (one engine per chunk size): look every 2 s
                    tids = thread_ids(watched_pids())
                thr: dict[str, list] = {}
                for tid in tids:
                    row = thread_sample(tid)
                    if row is not None and row != last.get(tid):  # only the threads that moved
                        thr[tid.replace("/task/", "/")] = last[tid] = row
                line = {"t": time.monotonic_ns(), "w": time.time_ns(), "spin": spin(), "cpu": cpu_counters(),
                        "thr": thr}
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
                n += 1
                if n % 50 == 0:
                    f.flush()
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
        finally:
            if gpu:
                gpu.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
