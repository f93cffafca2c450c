"""Issues 30, 32 and 36 (GPU session 39's anatomy left one question): the engine core's main thread runs its CPU work
~1.7-2x slower for seconds at a time with nothing in the guest in its way. A lower clock, or fewer instructions a
cycle? This samples the thread's own counters through perf_event_open (ctypes: no perf binary to carry) beside a
sweep: task-clock (the guest kernel's CPU time of the thread), cycles, instructions and reference cycles (the
hardware counters a guest has only where the hypervisor gives it a virtual PMU; where it does not, the header line
says so and only task-clock is sampled).

    python3 scripts/gpu/thread_counters.py OUT.jsonl [--pattern '^VLLM::EngineCore'] [--interval 0.1] &
    python3 scripts/gpu/thread_counters.py --check       # which counters this machine gives a process; exit 0
    python3 scripts/gpu/thread_counters.py --find [--pattern …] [--wait S]   # print the process's pid (exit 1: none)

It waits for a process whose command line matches --pattern (its main thread: pid = tid), then writes one JSON line
a sample: {"t": monotonic ns, "w": wall ns, "task_ns": …, "cycles": …, "instructions": …, "ref_cycles": …} (the
counters' running totals, scaled as perf scales a multiplexed counter; absent where unavailable), after a header
{"pid", "available": {name: true | errno text}}. The counters count the thread in user space and the kernel alike
(exclude_hv only), so that its cycles and its task-clock cover the same time.
Stdlib only: it runs on the GPU machine's own Python. SIGTERM ends it with the file closed; so does the thread's end.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import signal
import struct
import sys
import time
from pathlib import Path

SYS_PERF_EVENT_OPEN = 298  # x86_64
PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
COUNTERS = {  # name: (type, config)
    "task_ns": (PERF_TYPE_SOFTWARE, 1),  # PERF_COUNT_SW_TASK_CLOCK
    "cycles": (PERF_TYPE_HARDWARE, 0),  # PERF_COUNT_HW_CPU_CYCLES
    "instructions": (PERF_TYPE_HARDWARE, 1),  # PERF_COUNT_HW_INSTRUCTIONS
    "ref_cycles": (PERF_TYPE_HARDWARE, 9),  # PERF_COUNT_HW_REF_CPU_CYCLES
}
_ATTR_SIZE = 128
_EXCLUDE_HV = 1 << 6
# each read returns (value, time enabled, time running): a counter the PMU multiplexed with others is scaled up by
# enabled / running, as perf does (a guest's virtual PMU may have fewer counters than the four asked for)
_READ_FORMAT = 1 | 2  # PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING


def open_counter(kind: int, config: int, tid: int) -> int:
    """A counting perf event for thread `tid` on any CPU; the fd, or raises OSError with the kernel's errno."""
    attr = bytearray(_ATTR_SIZE)
    struct.pack_into("IIQ", attr, 0, kind, _ATTR_SIZE, config)
    struct.pack_into("QQ", attr, 32, _READ_FORMAT, _EXCLUDE_HV)  # read_format, then the flags word
    libc = ctypes.CDLL(None, use_errno=True)
    buf = (ctypes.c_char * _ATTR_SIZE).from_buffer(attr)
    fd = libc.syscall(SYS_PERF_EVENT_OPEN, buf, tid, -1, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def open_all(tid: int) -> tuple[dict[str, int], dict[str, bool | str]]:
    fds: dict[str, int] = {}
    available: dict[str, bool | str] = {}
    for name, (kind, config) in COUNTERS.items():
        try:
            fds[name] = open_counter(kind, config, tid)
            available[name] = True
        except OSError as exc:
            available[name] = exc.strerror or str(exc)
    return fds, available


def read_all(fds: dict[str, int]) -> dict[str, int]:
    """Every counter's running total, scaled by enabled / running where the PMU multiplexed it."""
    out = {}
    for name, fd in fds.items():
        value, enabled, running = struct.unpack("QQQ", os.read(fd, 24))
        out[name] = value if running in (0, enabled) else round(value * enabled / running)
    return out


def find_pid(pattern: str, timeout_s: float, stop: list[bool]) -> int | None:
    """The first process whose command line matches `pattern`, looked for every 0.5 s until `timeout_s` or
    `stop[0]` (SIGTERM); never one running this script, whose own arguments name the pattern (GPU session 40:
    gil-dumps.sh's unanchored pgrep found the sampler's `--pattern=^VLLM::EngineCore` and py-spy dumped it)."""
    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout_s
    me = os.getpid()
    while time.monotonic() < deadline and not stop[0]:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if rx.search(cmd) and Path(__file__).name not in cmd:
                return int(entry.name)
        time.sleep(0.5)
    return None


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def sample(out: Path, pid: int, interval: float, stop: list[bool]) -> int:
    fds, available = open_all(pid)
    n = 0
    with out.open("a") as f:
        f.write(json.dumps({"pid": pid, "available": available}) + "\n")
        f.flush()
        while not stop[0] and fds and alive(pid):
            row = {"t": time.monotonic_ns(), "w": time.time_ns(), **read_all(fds)}
            f.write(json.dumps(row) + "\n")
            n += 1
            time.sleep(interval)
    for fd in fds.values():
        os.close(fd)
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--pattern", default=r"^VLLM::EngineCore")
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--wait", type=float, default=900.0, help="how long to wait for the process (s)")
    ap.add_argument("--check", action="store_true", help="which counters this machine gives a process of its own")
    ap.add_argument("--find", action="store_true", help="print the pid of the process --pattern matches, and exit")
    a = ap.parse_args(argv)
    if a.check:
        fds, available = open_all(os.getpid())
        for fd in fds.values():
            os.close(fd)
        print("thread counters: " + ", ".join(f"{k} {'yes' if v is True else 'no (' + str(v) + ')'}"
                                              for k, v in available.items()))
        return 0
    if a.out is None and not a.find:
        ap.error("OUT.jsonl is required (or --check, --find)")
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    pid = find_pid(a.pattern, a.wait, stop)
    if pid is None:
        why = "before it was stopped" if stop[0] else f"within {a.wait:g} s"
        print(f"thread_counters: no process matched {a.pattern!r} {why}", file=sys.stderr)
        return 1
    if a.find:
        print(pid)
        return 0
    n = sample(a.out, pid, a.interval, stop)
    print(f"thread_counters: {n} samples of pid {pid} in {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
