"""Soak: `pdexporter run --decode-batch-size 12` for a long time on the embedded engine, with injections.

    python tests/benchmarks/bench_soak.py [--minutes 30] [--d 12] [--inject-every 15s] [--prefill-tokens 8192]
                                          [--sample-every 60] [--burn 1]
    python tests/benchmarks/bench_soak.py --quick   # D = 2 for 6 s, a sample every 2 s, verdicts not judged (CI)

The real CLI in a child process (its embedded engine is its own child, `pdexporter sim serve`),
sampled every `--sample-every` seconds from /proc and from its own /metrics:

- RSS, open fds and threads of both processes, the exporter and the engine child;
- windows analysed, injections failed, and the exporter's errors, per sample period;
- `pdexporter_up` and its reason.

`--burn N` runs N busy-loop processes beside it (CPU contention: the case in which issue 13's
soak saw windows stop). At the end it prints the verdicts the issue asks for:

- memory levels off: RSS growth over the second half of the run, in MB/min, for both processes
  (a leak grows as fast in the second half as in the first; start-up allocation does not);
- windows keep coming: at least one window per two injection periods in every sample period
  after the first (the first holds the start-up and warm-ups).

Exit code 0 when both hold, 1 otherwise (the figures are printed either way).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import itertools

from quickmode import parse_args

from pdexporter._internal.durations import parse_duration
from tests.helpers import free_port


@dataclass
class ProcSample:
    rss_mb: float
    fds: int
    threads: int
    cpu_s: float


@dataclass
class Sample:
    t_s: float
    exporter: ProcSample | None
    engine: ProcSample | None
    windows: float
    injection_errors: float
    errors: float
    up: float
    reason: str
    load: float


def proc_sample(pid: int) -> ProcSample | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    rss = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) / 1024  # type: ignore[union-attr]
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.MULTILINE).group(1))  # type: ignore[union-attr]
    ticks = os.sysconf("SC_CLK_TCK")
    return ProcSample(rss, fds, threads, (int(stat[11]) + int(stat[12])) / ticks)


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
            out += [int(c) for c in text]
    except OSError:
        pass
    return out


def scrape(url: str) -> dict[str, float]:
    """Sums of the series this benchmark reads (over their labels), and the current up reason."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name == "pdexporter_up_reason" and float(value) == 1:
            values["reason:" + name_labels.split('reason="', 1)[1].split('"', 1)[0]] = 1
        if name == "pdexporter_injections_total" and 'outcome="error"' not in name_labels:
            continue
        values[name] = values.get(name, 0.0) + float(value)
    return values


def burners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run(args: argparse.Namespace) -> list[Sample]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pdexporter", "run", "--decode-batch-size", str(args.d), "--inject-every",
           args.inject_every, "--new-prefill-tokens", str(args.prefill_tokens), "--listen", f"127.0.0.1:{port}"]
    log = open(args.log, "wb") if args.log else subprocess.DEVNULL  # noqa: SIM115
    burn = burners(args.burn)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    samples: list[Sample] = []
    t0 = time.monotonic()
    try:
        while not scrape(url).get("pdexporter_up"):
            if proc.poll() is not None or time.monotonic() - t0 > 180:
                raise SystemExit(f"the exporter did not come up (exit code {proc.poll()})")
            time.sleep(1)
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        next_at = t0
        while True:
            now = time.monotonic()
            if now >= next_at:
                engine = next(iter(children(proc.pid)), None)
                values = scrape(url)
                reason = next((k[7:] for k in values if k.startswith("reason:")), "?")
                samples.append(Sample(
                    now - t0, proc_sample(proc.pid), proc_sample(engine) if engine else None,
                    values.get("pdexporter_windows_total", 0.0), values.get("pdexporter_injections_total", 0.0),
                    values.get("pdexporter_errors_total", 0.0), values.get("pdexporter_up", 0.0), reason,
                    os.getloadavg()[0],
                ))
                print(line(samples), flush=True)
                next_at += args.sample_every
            if now >= end or proc.poll() is not None:
                break
            time.sleep(min(1.0, max(0.0, next_at - now)))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        for b in burn:
            b.kill()
            b.wait()
    return samples


HEADER = (f"{'t min':>6} | {'exp RSS MB':>10} {'fds':>4} {'thr':>4} | {'eng RSS MB':>10} {'fds':>4} {'thr':>4} | "
          f"{'windows':>7} {'+':>4} {'inj err':>7} {'errors':>6} | {'up':>2} {'reason':<18} | {'load':>5}")


def line(samples: list[Sample]) -> str:
    s = samples[-1]
    prev = samples[-2] if len(samples) > 1 else None
    new = s.windows - prev.windows if prev else s.windows

    def proc(p: ProcSample | None) -> str:
        return f"{p.rss_mb:10.1f} {p.fds:4d} {p.threads:4d}" if p else f"{'-':>10} {'-':>4} {'-':>4}"

    if len(samples) == 1:
        print(HEADER)
    return (f"{s.t_s / 60:6.1f} | {proc(s.exporter)} | {proc(s.engine)} | {s.windows:7.0f} {new:4.0f} "
            f"{s.injection_errors:7.0f} {s.errors:6.0f} | {s.up:2.0f} {s.reason:<18} | {s.load:5.2f}")


def slope_mb_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t_s, MB) points, MB/min."""
    n = len(points)
    if n < 2:
        return float("nan")
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / den if den else float("nan")


def verdicts(samples: list[Sample], args: argparse.Namespace) -> bool:
    ok = True
    period_s = parse_duration(args.inject_every)
    half = samples[len(samples) // 2:]
    print()
    for who in ("exporter", "engine"):
        first = [(s.t_s, getattr(s, who).rss_mb) for s in samples[: len(samples) // 2 + 1] if getattr(s, who)]
        second = [(s.t_s, getattr(s, who).rss_mb) for s in half if getattr(s, who)]
        a, b = slope_mb_per_min(first), slope_mb_per_min(second)
        rss = [getattr(s, who).rss_mb for s in samples if getattr(s, who)]
        level = b <= max(0.25, 0.25 * a) if not (math.isnan(a) or math.isnan(b)) else False
        ok &= level
        print(f"{who}: RSS {rss[0]:.1f} -> {rss[-1]:.1f} MB (max {max(rss):.1f}); growth {a:+.2f} MB/min in the "
              f"first half, {b:+.2f} MB/min in the second: {'levels off' if level else 'STILL GROWING'}")
    needed = args.sample_every / (2 * period_s)
    starved = [(s.t_s / 60, s.windows - p.windows) for p, s in itertools.pairwise(samples)
               if s.windows - p.windows < needed]
    total_min = (samples[-1].t_s - samples[1].t_s) / 60 if len(samples) > 2 else 0
    rate = (samples[-1].windows - samples[1].windows) / total_min if total_min else float("nan")
    print(f"windows: {samples[-1].windows:.0f} in all, {rate:.2f}/min after the first sample (one injection every "
          f"{period_s:g} s: at most {60 / period_s:.1f}/min); periods with fewer than {needed:g}: "
          + (", ".join(f"{t:.0f} min ({n:.0f})" for t, n in starved) if starved else "none"))
    ok &= not starved
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--d", type=int, default=12)
    parser.add_argument("--inject-every", default="15s")
    parser.add_argument("--prefill-tokens", type=int, default=8192)
    parser.add_argument("--sample-every", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--burn", type=int, default=0, help="busy-loop processes beside it (CPU contention)")
    parser.add_argument("--log", default=None, help="write the exporter's output here")
    args = parse_args(parser, minutes=0.1, d=2, inject_every="2s", prefill_tokens=512, sample_every=2.0)
    print(f"pdexporter run --decode-batch-size {args.d} --inject-every {args.inject_every} --new-prefill-tokens "
          f"{args.prefill_tokens} on the embedded engine for {args.minutes:g} min, {args.burn} busy loop(s) beside it; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    samples = run(args)
    held = verdicts(samples, args)
    if args.quick:
        print("verdicts not judged (--quick: too short to tell a leak from start-up)")
    sys.exit(0 if held or args.quick else 1)


if __name__ == "__main__":
    main()
