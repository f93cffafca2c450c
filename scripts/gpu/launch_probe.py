"""Issues 30 and 32: the host's CUDA launch speed, sampled from a process of its own beside the engine.

vLLM's eager chunk step (a one-chunk prompt that no CUDA graph covers) costs what launching its kernels from
Python costs, and that cost takes one of two levels (~x2 apart) from minute to minute and engine to engine on
every lent host (docs/status.md). Nothing the guest showed tracked it: run-queue waits, steal, the guest's CPU
speed (`host_monitor.py`'s fixed loop), the GPU's clocks. This asks the launch path itself: every `--interval`
seconds it launches `--launches` tiny kernels (an in-place add on a one-element tensor) on the same GPU and
synchronises, and writes the nanoseconds per launch. If the engine's level is the host's launch path (driver,
doorbell, IOMMU), this process sees it too and `host_levels.py` pairs each repetition with it (`launch_us`);
if the level is the engine process's own, it does not, and that is the answer.

    python3 scripts/gpu/launch_probe.py OUT/launch-<t>.jsonl [--interval 2] [--launches 200]
        [--wait-url http://127.0.0.1:8000/health] [--fake]

One JSON line a sample, on the clock the records use (CLOCK_MONOTONIC) and the wall clock:
{"t": ns, "w": ns, "launch": [ns per launch, launches]}. It starts timing only once `--wait-url` answers (the
engine up: its start-up and memory profiling are left alone); each burst keeps the GPU ~1 ms busy every
`--interval` s (200 launches of ~5 us), the whole perturbation it adds. `--fake` times a Python call in place of
a kernel launch (a test double for machines without CUDA: the file's form, not the launch path). SIGTERM (or
Ctrl-C) ends it with the file closed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path


def wait_for(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 (a local engine's /health)
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


def cuda_burst(launches: int) -> Callable[[], int]:
    """A function that launches `launches` tiny kernels, synchronises, and returns the nanoseconds it took."""
    import torch  # the GPU machine's (the vLLM bundle); imported here so --fake runs without it

    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()

    def burst() -> int:
        t0 = time.perf_counter_ns()
        for _ in range(launches):
            x.add_(1.0)
        torch.cuda.synchronize()
        return time.perf_counter_ns() - t0

    return burst


def fake_burst(launches: int) -> Callable[[], int]:
    def nothing(v: float) -> float:
        return v + 1.0

    def burst() -> int:
        t0, v = time.perf_counter_ns(), 0.0
        for _ in range(launches):
            v = nothing(v)
        return time.perf_counter_ns() - t0

    return burst


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--wait-url", default=None)
    ap.add_argument("--wait-s", type=float, default=900.0)
    ap.add_argument("--fake", action="store_true", help="time a Python call, not a CUDA launch (no GPU)")
    args = ap.parse_args(argv)
    if args.interval <= 0 or args.launches <= 0:
        raise SystemExit(f"--interval {args.interval} and --launches {args.launches}: both must be > 0")
    if args.wait_url and not wait_for(args.wait_url, args.wait_s):
        print(f"launch_probe: {args.wait_url} did not answer within {args.wait_s:g} s", file=sys.stderr)
        return 1
    burst = (fake_burst if args.fake else cuda_burst)(args.launches)
    burst()  # the first burst pays the kernel's first launch
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    with args.out.open("w") as f:
        try:
            while True:
                t, w = time.monotonic_ns(), time.time_ns()
                ns = burst()
                f.write(json.dumps({"t": t, "w": w, "launch": [round(ns / args.launches, 1), args.launches]}) + "\n")
                f.flush()
                time.sleep(args.interval)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
